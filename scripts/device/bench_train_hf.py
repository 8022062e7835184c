#!/usr/bin/env python3
"""HF transformers side of bench/train/train_bench: forward/backward + AdamW on the same ids.

Loads the HF directory given by --model (the one train_bench trains) with
AutoModelForCausalLM in --dtype, once per --attn implementation (default "eager,sdpa", one
table row each), and times optimizer steps on exactly the token ids train_bench uses:

  per step: --samples-per-step samples of --seq-len ids, in micro-batches of
            B = --max-tokens-per-gpu // --seq-len samples ([B, seq_len]: HF cannot pack without
            varlen attention, so 8192 tokens at 4k sequences are a 2 x 4096 batch);
  per micro-batch: logits = model(ids).logits -> log_softmax in float32 of the positions
            0..L-2 -> gather of the next ids -> loss = -mean -> (loss / micro-batches).backward();
  then clip_grad_norm_(1.0) and torch.optim.AdamW (lr 1e-6, betas 0.9/0.999, eps 1e-8, weight
  decay 0.01 on >= 2-D parameters only, as the Trainer's AdamW), zero_grad(set_to_none=True).

The loss is train_bench's SFT objective on the same data (every position but the last
predicts its next token; all samples have equal length, so the per-sample and per-token means
agree). Differences left on purpose: the Trainer keeps float32 master weights and moments for
bf16 parameters, torch's AdamW keeps them in the parameters' dtype.

Token ids: with --data FILE, the file train_bench --write-data wrote (its header must match
--seq-len, the model's vocabulary and hold the warm-up + timed steps); otherwise the same
SplitMix64 generator as train_bench (see token_ids() and the header of
bench/train/train_bench.cc) with --seed. Step s uses samples [s * n, (s + 1) * n).

Timing and columns as train_bench: device synchronisation around each optimizer step, --warmup
steps not counted, tokens/s = samples * seq_len / mean step time, FLOPs per step =
3 * samples * forward_flops(seq_len) (the formula of train_core's EstimateForwardFlops),
MFU = TFLOP/s / --peak-tflops (989 = H200 dense bf16 spec; CUDA only), peak memory =
torch.cuda.max_memory_allocated over the timed steps. A CUDA out-of-memory error becomes an
"OOM" row and the script goes on.

Run on the GPU machine right after train_bench (docs/benchmarks.md, "Trainer"):
    python3 scripts/device/bench_train_hf.py --model /tmp/qwen3-0.6b --data /tmp/ids.bin
CPU smoke run on a tiny model:
    python3 scripts/device/bench_train_hf.py --model DIR --device cpu --dtype float32 \
        --seq-len 32 --max-tokens-per-gpu 64 --samples-per-step 4 --steps 2 --warmup 1
"""

import argparse
import datetime
import json
import math
import os
import sys
import time

import numpy as np
import torch

DATA_MAGIC = "slime-train-bench-ids v1"
H200_DENSE_BF16_TFLOPS = 989.0


def token_ids(seed, vocab, seq_len, first_sample, count):
    """[count, seq_len] int64 ids of samples first_sample.. (train_bench's generator): token
    i = sample * seq_len + t is SplitMix64(seed + (i + 1) * 0x9E3779B97F4A7C15) % vocab,
    all arithmetic mod 2**64."""
    i = np.arange(first_sample * seq_len, (first_sample + count) * seq_len, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + (i + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(vocab)).astype(np.int64).reshape(count, seq_len)


def read_data(path):
    """(fields of the header, [samples, seq_len] int64 ids) of a train_bench --write-data file."""
    with open(path, "rb") as f:
        line = f.readline().decode("ascii", errors="replace").strip()
        if not line.startswith(DATA_MAGIC + " "):
            sys.exit(f"bench_train_hf.py: --data {path}: not a train_bench id file "
                     f"(first line {line[:60]!r}, expected '{DATA_MAGIC} ...')")
        fields = {}
        for kv in line[len(DATA_MAGIC) + 1:].split():
            k, _, v = kv.partition("=")
            fields[k] = int(v)
        body = f.read()
    n, seq_len = fields.get("samples", -1), fields.get("seq_len", -1)
    if n < 1 or seq_len < 1 or len(body) != 4 * n * seq_len:
        sys.exit(f"bench_train_hf.py: --data {path}: header says {n} x {seq_len} ids, the file "
                 f"holds {len(body)} bytes of ids")
    ids = np.frombuffer(body, dtype="<i4").astype(np.int64).reshape(n, seq_len)
    return fields, ids


def forward_flops(cfg, tokens):
    """Forward FLOPs of one sequence (train_core's EstimateForwardFlops, batching.h)."""
    h = cfg.hidden_size
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or h // heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    q, kv, f, layers = heads * head_dim, kv_heads * head_dim, cfg.intermediate_size, \
        cfg.num_hidden_layers
    linear = layers * (2 * h * (q + 2 * kv) + 2 * q * h + 6 * h * f) + 2 * h * cfg.vocab_size
    quadratic = 2 * layers * q
    return float(linear) * tokens + float(quadratic) * tokens * tokens


def load_model(path, dtype, attn, device):
    import transformers
    kwargs = dict(attn_implementation=attn)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    except TypeError:  # transformers < 4.56 calls it torch_dtype
        model = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype, **kwargs)
    model.config.use_cache = False
    return model.to(device).train()


def make_optimizer(model):
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return torch.optim.AdamW([dict(params=decay, weight_decay=0.01),
                              dict(params=no_decay, weight_decay=0.0)],
                             lr=1e-6, betas=(0.9, 0.999), eps=1e-8)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="HF directory (config.json + safetensors)")
    ap.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "bf16", "float32", "fp32"])
    ap.add_argument("--attn", default="eager,sdpa", help="attn_implementation values, one row each")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--max-tokens-per-gpu", type=int, default=8192,
                    help="tokens of one micro-batch: max_tokens_per_gpu // seq_len samples")
    ap.add_argument("--samples-per-step", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5, help="timed optimizer steps per row")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    ap.add_argument("--seed", type=int, default=0, help="seed of the generated ids")
    ap.add_argument("--data", help="token ids written by train_bench --write-data")
    ap.add_argument("--peak-tflops", type=float, default=H200_DENSE_BF16_TFLOPS)
    ap.add_argument("--json", help="also write the results as JSON to this file")
    args = ap.parse_args()
    if args.seq_len < 2 or args.samples_per_step < 1 or args.steps < 1 or args.warmup < 0:
        sys.exit("bench_train_hf.py: --seq-len >= 2, --samples-per-step >= 1, --steps >= 1 and "
                 "--warmup >= 0 are required")
    if args.seq_len > args.max_tokens_per_gpu:
        sys.exit(f"bench_train_hf.py: --seq-len {args.seq_len} exceeds --max-tokens-per-gpu "
                 f"{args.max_tokens_per_gpu}: a sample must fit one micro-batch")

    import transformers
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_train_hf.py: CUDA is not available (use --device cpu for a smoke run)")
    dtype = torch.bfloat16 if args.dtype in ("bfloat16", "bf16") else torch.float32
    cfg = transformers.AutoConfig.from_pretrained(args.model)
    n = args.samples_per_step
    total = (args.warmup + args.steps) * n
    if args.data:
        fields, data = read_data(args.data)
        if fields.get("seq_len") != args.seq_len or fields.get("vocab") != cfg.vocab_size:
            sys.exit(f"bench_train_hf.py: --data {args.data}: seq_len {fields.get('seq_len')} / "
                     f"vocab {fields.get('vocab')}, this run has --seq-len {args.seq_len} and a "
                     f"model vocabulary of {cfg.vocab_size}")
        if data.shape[0] < total:
            sys.exit(f"bench_train_hf.py: --data {args.data} holds {data.shape[0]} samples, "
                     f"{args.warmup} + {args.steps} steps of {n} need {total}")
        # The file must be what the generator gives: both sides then provably train on it.
        check = token_ids(fields.get("seed", 0), cfg.vocab_size, args.seq_len, 0, min(total, 4))
        if not np.array_equal(check, data[:check.shape[0]]):
            sys.exit(f"bench_train_hf.py: --data {args.data}: ids differ from the generator "
                     f"with seed {fields.get('seed')}")
        source = f"--data {args.data} (seed {fields.get('seed')})"
    else:
        data = token_ids(args.seed, cfg.vocab_size, args.seq_len, 0, total)
        source = f"generated, seed {args.seed}"
    data = torch.from_numpy(np.ascontiguousarray(data[:total]))
    mb = min(n, max(1, args.max_tokens_per_gpu // args.seq_len))  # samples per micro-batch
    micro = [(s, min(s + mb, n)) for s in range(0, n, mb)]
    flops_per_step = 3.0 * n * forward_flops(cfg, args.seq_len)
    peak = args.peak_tflops if device.type == "cuda" else 0.0
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        device_desc = f"{props.name} ({props.total_memory >> 20} MiB)"
    else:
        device_desc = f"cpu ({os.cpu_count()} hardware threads)"

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    rows = []
    n_params = 0
    for attn in [a.strip() for a in args.attn.split(",") if a.strip()]:
        row = dict(name=f"HF transformers {attn}", attn=attn, samples_per_step=n,
                   seq_len=args.seq_len, micro_batches_per_step=len(micro), step_s=[],
                   flops_per_step=flops_per_step, note="")
        model = opt = None
        try:
            torch.manual_seed(args.seed)
            model = load_model(args.model, dtype, attn, device)
            n_params = sum(p.numel() for p in model.parameters())
            opt = make_optimizer(model)
            for step in range(args.warmup + args.steps):
                timed = step >= args.warmup
                if step == args.warmup and device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                ids = data[step * n:(step + 1) * n].to(device)
                sync()
                t0 = time.perf_counter()
                loss_sum = torch.zeros((), device=device)
                for lo, hi in micro:
                    x = ids[lo:hi]  # [B, L]
                    logits = model(input_ids=x, use_cache=False).logits  # [B, L, V]
                    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
                    logp = logp.gather(-1, x[:, 1:].unsqueeze(-1)).squeeze(-1)  # [B, L-1]
                    loss = -logp.mean()
                    (loss / len(micro)).backward()
                    loss_sum += loss.detach() / len(micro)
                    del logits, logp, loss
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                sync()
                dt = time.perf_counter() - t0
                row["loss_last"] = float(loss_sum)
                row["grad_norm_last"] = float(grad_norm)
                if timed:
                    row["step_s"].append(dt)
                print(f"bench_train_hf.py: {attn} step {step}{'' if timed else ' (warm-up)'}: "
                      f"{dt:.3f} s, {n * args.seq_len / dt:.0f} tokens/s, loss "
                      f"{row['loss_last']:.4f}, grad_norm {row['grad_norm_last']:.4f}",
                      file=sys.stderr, flush=True)
            row["peak_memory_bytes"] = (torch.cuda.max_memory_allocated(device)
                                        if device.type == "cuda" else None)
        except torch.cuda.OutOfMemoryError as e:
            row["note"] = "OOM"
            row["error"] = str(e).splitlines()[0]
            print(f"bench_train_hf.py: {attn}: OOM", file=sys.stderr, flush=True)
        finally:
            del model, opt
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if row["step_s"] and len(row["step_s"]) == args.steps:
            mean = sum(row["step_s"]) / len(row["step_s"])
            row.update(step_s_mean=mean, step_s_min=min(row["step_s"]),
                       tokens_per_s=n * args.seq_len / mean,
                       tflops=flops_per_step / mean / 1e12)
            row["mfu"] = row["tflops"] / peak if peak > 0 else None
        rows.append(row)

    print(f"HF transformers {transformers.__version__} | {cfg.model_type} "
          f"{cfg.num_hidden_layers} layers, {n_params / 1e6:.1f}M params | device {device_desc} | "
          f"dtype {args.dtype} | {args.steps} timed steps after {args.warmup} warm-up | "
          f"FLOPs/token (fwd+bwd) {3 * forward_flops(cfg, args.seq_len) / args.seq_len / 1e9:.3f} "
          f"GFLOP | peak {f'{peak:g} TFLOP/s' if peak > 0 else '– (no MFU on the CPU)'} | "
          f"torch {torch.__version__} | ids {source}")
    print("| case | samples/step | seq len | micro-batch tokens | micro-batches | step s (mean) | "
          "step s (min) | tokens/s | TFLOP/s | MFU % | peak mem GiB | loss (last) | note |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        if "tokens_per_s" not in r:
            cells = ["–"] * 7
        else:
            mem = r.get("peak_memory_bytes")
            cells = [f"{r['step_s_mean']:.3f}", f"{r['step_s_min']:.3f}",
                     f"{r['tokens_per_s']:,.0f}", f"{r['tflops']:.1f}",
                     f"{100 * r['mfu']:.1f}" if r["mfu"] is not None else "–",
                     f"{mem / 2**30:.1f}" if mem is not None else "–",
                     f"{r['loss_last']:.4f}"]
        print(f"| {r['name']} | {n} | {args.seq_len} | {mb * args.seq_len} | {len(micro)} | " +
              " | ".join(cells) + f" | {r['note']} |")

    if args.json:
        out = dict(bench="bench_train_hf", date=datetime.datetime.now(datetime.timezone.utc)
                   .strftime("%Y-%m-%dT%H:%M:%SZ"), model=args.model, model_type=cfg.model_type,
                   num_parameters=n_params, device=device_desc, dtype=args.dtype,
                   torch=torch.__version__, transformers=transformers.__version__,
                   peak_tflops=peak if peak > 0 else None,
                   forward_flops_per_sample=forward_flops(cfg, args.seq_len), ids=source,
                   options=dict(seq_len=args.seq_len, max_tokens_per_gpu=args.max_tokens_per_gpu,
                                micro_batch_tokens=mb * args.seq_len, samples_per_step=n,
                                steps=args.steps, warmup=args.warmup, seed=args.seed),
                   rows=rows)
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f, indent=2, default=lambda v: None if isinstance(v, float) and
                      math.isnan(v) else str(v))
            f.write("\n")
        os.replace(tmp, args.json)


if __name__ == "__main__":
    main()
