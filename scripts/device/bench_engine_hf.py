#!/usr/bin/env python3
"""HF transformers side of bench/engine/engine_bench: `generate` on the same weights, same table.

Loads the HF directory given by --model (the one engine_bench serves), bf16 on CUDA, attention
"sdpa", and times `generate` on random prompts (--prompt-len ids drawn uniformly from the
vocabulary with --seed), EOS ignored (min_new_tokens = max_new_tokens), sampling at temperature
1 over the whole vocabulary (top_k=0, top_p=1) or --greedy:

  throughput BxM     one `generate` call on a [B, prompt] batch (dynamic cache), M new tokens.
                     All B sequences finish together, so e2e p50 = p99 = wall.
  batch-1 decode M   one sequence, dynamic cache and cache_implementation="static" (which
                     transformers compiles; a warm-up call of the same shape runs first).
                     decode tok/s = (M - 1) / (wall - TTFT).

TTFT = start of `generate` to the first sampled token (a stopping criterion records it).
Runtime is bounded: a point is skipped (and its row says so) when a finished point of the same
batch size and cache predicts it to run longer than --max-seconds, or when the --budget-seconds
of the whole script are spent; a point still running after --max-seconds (or at the end of the
budget) is cut by a stopping criterion, and its throughput counts the tokens produced until
then. A CUDA out-of-memory error is reported as "OOM" and the script goes on.

Run on the GPU machine right after engine_bench (scripts/device/engine_bench.sh does both):
    python3 scripts/device/bench_engine_hf.py --model /tmp/qwen3-0.6b --json hf.json
"""

import argparse
import datetime
import json
import math
import os
import sys
import time

import torch
import transformers


def parse_list(text):
    return [int(x) for x in text.split(",") if x.strip()] if text else []


class Timing(transformers.StoppingCriteria):
    """Records the time of the first sampled token, counts steps, and cuts at a deadline."""

    def __init__(self, device, deadline=None, max_steps=None):
        self.device = device
        self.deadline = deadline
        self.max_steps = max_steps
        self.first_token = None
        self.steps = 0
        self.cut = False

    def __call__(self, input_ids, scores, **kwargs):
        self.steps += 1
        if self.first_token is None:
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            self.first_token = time.perf_counter()
        stop = False
        if self.deadline is not None and time.perf_counter() > self.deadline:
            stop = self.cut = True
        if self.max_steps is not None and self.steps >= self.max_steps:
            stop = True
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


def load_model(path, dtype, attn, device):
    kwargs = dict(attn_implementation=attn)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    except TypeError:  # transformers < 4.56 calls it torch_dtype
        model = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype, **kwargs)
    return model.to(device).eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="HF directory (config.json + safetensors)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", default="256,1024", help="max_new_tokens values")
    ap.add_argument("--batch-sizes", "--concurrency", dest="batch_sizes", default="64,256,1024",
                    help="throughput batch sizes (empty = none)")
    ap.add_argument("--batch1", action="store_true", help="also batch-1 decode tokens/s")
    ap.add_argument("--batch1-caches", default="dynamic,static",
                    help="cache implementations for --batch1")
    ap.add_argument("--greedy", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-seconds", type=float, default=120.0, help="per point")
    ap.add_argument("--budget-seconds", type=float, default=1e9,
                    help="whole script: points predicted to end past it are skipped")
    ap.add_argument("--json", help="also write the results as JSON to this file")
    args = ap.parse_args()

    t_script = time.perf_counter()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_engine_hf.py: CUDA is not available (use --device cpu for a smoke run)")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    new_tokens = parse_list(args.new_tokens)
    batch_sizes = parse_list(args.batch_sizes)
    torch.manual_seed(args.seed)
    t_load = time.perf_counter()
    model = load_model(args.model, dtype, args.attn, device)
    load_s = time.perf_counter() - t_load
    n_params = sum(p.numel() for p in model.parameters())
    cfg = model.config
    vocab = cfg.vocab_size
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        device_desc = f"{props.name} ({props.total_memory >> 20} MiB)"
    else:
        device_desc = f"cpu ({os.cpu_count()} hardware threads)"
    gen = torch.Generator(device="cpu").manual_seed(args.seed)

    def prompts(batch):
        return torch.randint(0, vocab, (batch, args.prompt_len), generator=gen).to(device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def generate(batch, m, cache=None, deadline=None, max_steps=None):
        """One generate call; returns (wall, ttft, steps, cut)."""
        x = prompts(batch)
        timing = Timing(device, deadline, max_steps)
        kw = dict(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=m,
            min_new_tokens=m,
            do_sample=not args.greedy,
            pad_token_id=0,
            stopping_criteria=transformers.StoppingCriteriaList([timing]),
        )
        if not args.greedy:
            kw.update(temperature=1.0, top_k=0, top_p=1.0)
        if cache is not None:
            kw["cache_implementation"] = cache
        sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(**kw)
        sync()
        wall = time.perf_counter() - t0
        ttft = (timing.first_token - t0) if timing.first_token is not None else wall
        return wall, ttft, timing.steps, timing.cut

    rows = []
    step_model = {}  # (batch, cache) -> (ttft s, seconds per decode step)
    oom = {}  # (batch, cache) -> the smallest max_new_tokens that ran out of memory

    def predict(batch, cache, m):
        if (batch, cache) not in step_model:
            return None
        ttft, step = step_model[(batch, cache)]
        return ttft + (m - 1) * step

    def run_point(name, kind, batch, m, cache=None, warm_shape=False):
        row = dict(name=name, kind=kind, requests=batch, max_running_requests=batch,
                   prompt_len=args.prompt_len, new_tokens=m, cache=cache or "dynamic",
                   note="")
        left = args.budget_seconds - (time.perf_counter() - t_script)
        guess = predict(batch, cache, m)
        if (batch, cache) in oom and m >= oom[(batch, cache)]:
            row["note"] = f"skipped: OOM at {batch}x{oom[(batch, cache)]}"
        elif guess is not None and guess > args.max_seconds:
            row["note"] = (f"skipped: predicted {guess:.1f} s > --max-seconds "
                           f"{args.max_seconds:g}")
        elif left <= 1:
            row["note"] = "skipped: --budget-seconds spent"
        else:
            try:
                if warm_shape:  # compile / capture the same shapes before timing
                    t_w = time.perf_counter()
                    generate(batch, m, cache, max_steps=8)
                    row["warmup_s"] = time.perf_counter() - t_w
                    left -= row["warmup_s"]
                limit = max(1.0, min(args.max_seconds, left))
                wall, ttft, steps, cut = generate(batch, m, cache,
                                                  deadline=time.perf_counter() + limit)
                out_tokens = steps * batch
                row.update(wall_s=wall, ttft_mean_s=ttft, e2e_p50_s=wall, e2e_p99_s=wall,
                           prompt_tokens=batch * args.prompt_len, output_tokens=out_tokens,
                           output_tokens_per_s=out_tokens / wall,
                           total_tokens_per_s=(out_tokens + batch * args.prompt_len) / wall,
                           mean_decode_batch=batch, cut=cut)
                if kind == "batch1":
                    row["decode_tokens_per_s"] = ((steps - 1) / (wall - ttft)
                                                  if steps > 1 and wall > ttft else None)
                if cut:
                    row["note"] = f"cut (time limit) after {steps} tokens: tokens until then"
                if steps > 1:
                    step_model[(batch, cache)] = (ttft, (wall - ttft) / (steps - 1))
            except torch.cuda.OutOfMemoryError as e:
                row["note"] = "OOM"
                row["error"] = str(e).splitlines()[0]
                oom[(batch, cache)] = min(m, oom.get((batch, cache), m))
            finally:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        msg = (f"{row['wall_s']:.2f}s, {row['output_tokens_per_s']:.0f} tok/s"
               if "wall_s" in row else "")
        print(f"bench_engine_hf.py: {name}: {msg} {row['note']}".rstrip(), file=sys.stderr,
              flush=True)
        rows.append(row)

    # Warm-up: kernels, allocator, generate's first-call setup.
    generate(min(8, max(batch_sizes or [1])), 8)

    # Same order as engine_bench: for each M its throughput points, then batch-1 decode.
    for m in new_tokens:
        for b in batch_sizes:
            run_point(f"throughput {b}x{m}", "throughput", b, m)
        if args.batch1:
            for cache in [c.strip() for c in args.batch1_caches.split(",") if c.strip()]:
                run_point(f"batch-1 decode {m} ({cache})", "batch1", 1, m,
                          cache=None if cache == "dynamic" else cache,
                          warm_shape=cache != "dynamic")

    print(f"HF transformers {transformers.__version__} generate | {cfg.model_type} "
          f"{cfg.num_hidden_layers} layers, {n_params / 1e6:.1f}M params | device {device_desc} | "
          f"{args.dtype} | attention={args.attn} | "
          f"{'greedy' if args.greedy else 'temperature 1'} | torch {torch.__version__} | "
          f"load {load_s:.1f}s")
    print("| case | requests | max run | prompt | new | wall s | output tok/s | total tok/s | "
          "decode tok/s | mean TTFT ms | e2e p50 s | e2e p99 s | cached % | mean batch | note |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        if "wall_s" not in r:
            cells = ["–"] * 9
        else:
            d = r.get("decode_tokens_per_s")
            cells = [f"{r['wall_s']:.2f}", f"{r['output_tokens_per_s']:,.0f}",
                     f"{r['total_tokens_per_s']:,.0f}",
                     f"{d:.1f}" if d is not None else "–",
                     f"{r['ttft_mean_s'] * 1e3:.1f}", f"{r['e2e_p50_s']:.2f}",
                     f"{r['e2e_p99_s']:.2f}", "–", f"{r['mean_decode_batch']:.1f}"]
        print(f"| {r['name']} | {r['requests']} | {r['max_running_requests']} | "
              f"{r['prompt_len']} | {r['new_tokens']} | " + " | ".join(cells) +
              f" | {r['note']} |")

    if args.json:
        out = dict(bench="bench_engine_hf", date=datetime.datetime.now(datetime.timezone.utc)
                   .strftime("%Y-%m-%dT%H:%M:%SZ"), model=args.model, model_type=cfg.model_type,
                   num_parameters=n_params, device=device_desc, dtype=args.dtype,
                   attention=args.attn, torch=torch.__version__,
                   transformers=transformers.__version__,
                   options=dict(prompt_len=args.prompt_len, greedy=args.greedy, seed=args.seed,
                                max_seconds=args.max_seconds,
                                budget_seconds=args.budget_seconds),
                   rows=rows)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2, default=lambda v: None if isinstance(v, float) and
                      math.isnan(v) else str(v))
            f.write("\n")


if __name__ == "__main__":
    main()
