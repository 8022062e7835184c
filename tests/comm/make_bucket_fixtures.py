#!/usr/bin/env python3
"""Writes the SGLang flattened-bucket fixtures of tests/comm/torch_pickle_test.cc into
tests/data/comm/ (each file: one serialized_named_tensors entry, base64 of the ForkingPickler
pickle, exactly as SGLang's MultiprocessingSerializer.serialize(..., output_str=True) makes it).

  cpu_shm.b64         a CPU bucket shared by torch's "file_system" strategy (a /dev/shm name),
                      bfloat16 and float32 tensors mixed in SGLang's uint8 form
  cuda_uuid.b64       a CUDA bucket with the device as a GPU UUID string (SGLang's
                      monkey-patched reduction, _rebuild_cuda_tensor_modified); the 64-byte IPC
                      handles are made up (this machine has no GPU), the argument layout is
                      torch's rebuild_cuda_tensor
  cuda_index.b64      the same with a device index (unpatched torch), no IPC event
  cuda_torch2.b64     as cuda_uuid.b64 with torch 2.x's storage handle: [version 2]['c'][64 bytes]
  cuda_expandable.b64 the same with type 'e' (an expandable segment: refused)
  cuda_empty.b64      an empty CUDA bucket (no handle: a rank with nothing to send)
  cpu_same_dtype.b64  SGLang's older form: one float32 flattened tensor, indices in elements

Run with the interpreter that has torch (Debian: /usr/bin/python3); the files are committed.
"""
import base64
import dataclasses
import io
import os
import sys
import types
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing
from torch.multiprocessing import reductions


def module(name):
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    return sys.modules[name]


bucket_module = module("sglang.srt.weight_sync.tensor_bucket")
patch_module = module("sglang.srt.utils.patch_torch")


@dataclasses.dataclass
class FlattenedTensorMetadata:
    name: str
    shape: torch.Size
    dtype: torch.dtype
    start_idx: int
    end_idx: int
    numel: int


FlattenedTensorMetadata.__module__ = bucket_module.__name__
bucket_module.FlattenedTensorMetadata = FlattenedTensorMetadata


def _rebuild_cuda_tensor_modified(*args):
    raise RuntimeError("fixture only")


_rebuild_cuda_tensor_modified.__module__ = patch_module.__name__
patch_module._rebuild_cuda_tensor_modified = _rebuild_cuda_tensor_modified


class FakeCudaTensor:
    """Pickles as torch pickles a CUDA tensor (reductions.reduce_tensor's CUDA branch)."""

    def __init__(self, numel, fn, device, prefix=b""):
        self.numel, self.fn, self.device, self.prefix = numel, fn, device, prefix

    def __reduce__(self):
        handle = self.prefix + bytes(range(64)) if self.numel else None
        event = bytes(range(64, 128)) if isinstance(self.device, str) else None
        return (self.fn, (torch.Tensor, torch.Size([self.numel]), (1,), 256 if self.numel else 0,
                          torch.storage.UntypedStorage if hasattr(torch.storage, "UntypedStorage")
                          else torch.cuda.ByteStorage,
                          torch.uint8, self.device, handle, 1 << 20 if self.numel else 0,
                          4096 if self.numel else 0, False, b"/torch_123_456_0" if self.numel else None,
                          7 if self.numel else None, event, event is not None))


def uint8_bucket(named, flat):
    metadata, at = [], 0
    for name, shape, dtype in named:
        n = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
        metadata.append(FlattenedTensorMetadata(name, torch.Size(shape), dtype, at, at + n, n))
        at += n
    return {"flattened_tensor": flat, "metadata": metadata}, at


def write(out_dir, name, obj):
    buf = io.BytesIO()
    ForkingPickler(buf).dump(obj)
    with open(os.path.join(out_dir, name), "w") as f:
        f.write(base64.b64encode(buf.getvalue()).decode("utf-8") + "\n")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "data", "comm")
    named = [("model.layers.0.self_attn.q_proj.weight", (4, 6), torch.bfloat16),
             ("model.layers.0.input_layernorm.weight", (6,), torch.float32),
             ("model.norm.weight", (6,), torch.bfloat16)]
    torch.multiprocessing.set_sharing_strategy("file_system")
    g = torch.Generator().manual_seed(0)
    parts = [torch.randn(s, generator=g).to(d).reshape(-1).view(torch.uint8) for _, s, d in named]
    flat = torch.cat(parts)
    bucket, total = uint8_bucket(named, flat)
    write(out_dir, "cpu_shm.b64", bucket)

    for file, fn, device in (("cuda_uuid.b64", _rebuild_cuda_tensor_modified,
                              "7f1c1f2e-3d4c-5b6a-7988-a1b2c3d4e5f6"),
                             ("cuda_index.b64", reductions.rebuild_cuda_tensor, 0)):
        bucket, total = uint8_bucket(named, FakeCudaTensor(total, fn, device))
        write(out_dir, file, bucket)
    for file, prefix in (("cuda_torch2.b64", b"\x02c"), ("cuda_expandable.b64", b"\x02e")):
        bucket, total = uint8_bucket(named, FakeCudaTensor(total, _rebuild_cuda_tensor_modified,
                                                           "7f1c1f2e-3d4c-5b6a-7988-a1b2c3d4e5f6",
                                                           prefix))
        write(out_dir, file, bucket)
    write(out_dir, "cuda_empty.b64", {"flattened_tensor": FakeCudaTensor(0, reductions.rebuild_cuda_tensor, 0),
                                      "metadata": []})

    same = [torch.randn(4, 6, generator=g), torch.randn(6, generator=g)]
    flat = torch.cat([t.reshape(-1) for t in same])
    meta = [FlattenedTensorMetadata("model.layers.0.mlp.down_proj.weight", torch.Size([4, 6]),
                                    torch.float32, 0, 24, 24),
            FlattenedTensorMetadata("model.norm.weight", torch.Size([6]), torch.float32, 24, 30, 6)]
    write(out_dir, "cpu_same_dtype.b64", {"flattened_tensor": flat, "metadata": meta})
    print(f"wrote 7 fixtures to {out_dir} (torch {torch.__version__})")


if __name__ == "__main__":
    main()
