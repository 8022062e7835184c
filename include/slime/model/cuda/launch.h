// The published host interface of the model's CUDA kernel library (slime_model_cuda, CUDA builds
// only; plain C++, no CUDA or LibTorch headers): the storage dtypes the kernels take and the
// process-wide launch switches. With dtype.cuh and pdl.cuh beside it, this is what another
// kernel library builds on — the engine's kernels (src/engine/cuda) launch with the same
// programmatic dependent launch and honour the same A/B switches as the decoder's. The kernels
// themselves are internal to the module whose code launches them (docs/architecture.md, "CUDA
// code").
//
// Thread-safety: the switches are process-wide atomics (DecodeFusionEnabled reads the
// environment once); set them before any CUDA graph capture.
#ifndef SLIME_MODEL_CUDA_LAUNCH_H_
#define SLIME_MODEL_CUDA_LAUNCH_H_

namespace slime::model::cuda {

// The storage dtype of a kernel's tensors (float arithmetic inside).
enum class DType { kFloat32, kFloat16, kBFloat16 };

// Programmatic dependent launch (pdl.cuh) for the decoder's kernels and the engine's: on by
// default where the device supports it (sm_90+); SLIME_PDL=0 in the environment or
// SetProgrammaticLaunch(false) turns it off (A/B measurements); SetProgrammaticLaunch(true)
// restores that default. Set before any CUDA graph capture.
bool ProgrammaticLaunchEnabled();
void SetProgrammaticLaunch(bool enabled);

// Decode-step fusions that can be switched off one by one for A/B measurements: `name` is
// "silu_gemm" (SiLU·up inside the gate/up small-m GEMM), "qk_wide" (q/k norm + RoPE with a warp
// per head instead of 8 warps looping over the heads, at <= 8 tokens), "attn_prefetch" (the
// paged decode kernel loads cached K/V before its grid dependency wait, when the batch is small
// enough to be split), "attn_merge" (its split-K partials merged by the last block of each KV
// head instead of a second kernel) or "attn_qkv" (the paged decode kernel applies q/k norm +
// RoPE to the raw projection rows and stores the new K/V itself, at <= 8 decode rows),
// "norm_prefetch" (add + RMSNorm reads the residual before its grid dependency wait; see
// LaunchAddRmsNorm in src/model/cuda/fused_ops.h), "norm_gemm" (RMSNorm inside the q|k|v and
// gate|up decode GEMMs, the residual add inside the o and down GEMMs; LaunchNormSmallGemm) or
// "slab" (the small-m GEMMs from shared-memory weight slabs; SetSlabGemm). All are on unless
// SLIME_DECODE_UNFUSE in the environment lists the name (comma-separated, read once per process).
bool DecodeFusionEnabled(const char* name);

}  // namespace slime::model::cuda

#endif  // SLIME_MODEL_CUDA_LAUNCH_H_
