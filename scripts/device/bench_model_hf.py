#!/usr/bin/env python3
"""HF transformers side of bench/model/model_bench: the same cases, printed as the same table.

Random-weight model from a config.json (default: tests/data/model/configs/qwen3-0.6b.json),
bf16 on CUDA, attention "sdpa" (or --attn eager / flash_attention_2 where installed). Run on
the GPU machine right after model_bench so the two tables are side by side:
    build/bench/model/model_bench
    python3 scripts/device/bench_model_hf.py

Cases (tokens/s counts the tokens processed per iteration):
  prefill 1xL      one sequence, use_cache=True (DynamicCache), logits of the last token only
  prefill BxL      B equal-length sequences as one [B, L] batch (HF has no packed path with
                   sdpa), no cache, logits of each sequence's last token
  decode 1 seq     batch-1 decode steps after a 128-token prompt with the KV cache (prompt time
                   subtracted), logits every step
  train fwd BxL    [B, L] forward with autograd, logits of every token
  train fwd+bwd    the same plus backward of logits.sum()
TFLOP/s counts matmul FLOPs exactly as model_bench does.
"""

import argparse
import json
import os
import time

import torch
import transformers


def forward_flops(cfg, seqs, length, logit_rows, past=0):
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    d = cfg.get("head_dim") or h // heads
    q_size, kv_size = heads * d, kv * d
    per_token_layer = 2.0 * (h * q_size + 2 * h * kv_size + q_size * h +
                             3 * h * cfg["intermediate_size"])
    visible = seqs * (length * past + length * (length + 1) / 2.0)
    attn = 4.0 * heads * d * visible
    return (cfg["num_hidden_layers"] * (per_token_layer * seqs * length + attn) +
            2.0 * h * cfg["vocab_size"] * logit_rows)


def time_ms(device, iters, fn):
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / iters


def main():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config",
                    default=os.path.join(repo, "tests/data/model/configs/qwen3-0.6b.json"))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()

    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    with open(args.config) as f:
        cfg = json.load(f)
    config_cls = transformers.CONFIG_MAPPING[cfg["model_type"]]
    config = config_cls.from_dict(cfg)
    torch.manual_seed(0)
    t_init = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=args.attn)
    model = model.to(device=device, dtype=dtype).eval()
    init_s = time.perf_counter() - t_init
    n_params = sum(p.numel() for p in model.parameters())
    vocab = cfg["vocab_size"]

    def ids(*shape):
        return torch.randint(0, vocab, shape, device=device)

    def last_logits(x, **kw):
        try:
            return model(input_ids=x, logits_to_keep=1, **kw)
        except TypeError:  # transformers < 4.50
            return model(input_ids=x, **kw)

    rows = []
    for length in ([32, 128] if args.quick else [128, 1024, 4096]):
        x = ids(1, length)
        with torch.no_grad():
            ms = time_ms(device, args.iters, lambda: last_logits(x, use_cache=True))
        rows.append((f"prefill 1x{length} (kv cache)", length, ms,
                     forward_flops(cfg, 1, length, 1)))

    b, l = (2, 64) if args.quick else (8, 1024)
    x = ids(b, l)
    with torch.no_grad():
        ms = time_ms(device, args.iters, lambda: last_logits(x, use_cache=False))
    rows.append((f"prefill {b}x{l} (batch)", b * l, ms, forward_flops(cfg, b, l, b)))

    prompt, steps = (16, 16) if args.quick else (128, 128)
    x = ids(1, prompt + steps)

    def decode():
        out = last_logits(x[:, :prompt], use_cache=True)
        past = out.past_key_values
        for s in range(steps):
            out = model(input_ids=x[:, prompt + s:prompt + s + 1], past_key_values=past,
                        use_cache=True)
            past = out.past_key_values

    with torch.no_grad():
        total = time_ms(device, max(1, args.iters // 2), decode)
        pre = time_ms(device, args.iters, lambda: last_logits(x[:, :prompt], use_cache=True))
    flops = sum(forward_flops(cfg, 1, 1, 1, prompt + s) for s in range(steps))
    rows.append((f"decode 1 seq, {steps} steps", steps, total - pre, flops))

    model.train()
    for b, l in ([(2, 64)] if args.quick else [(8, 1024), (4, 4096)]):
        x = ids(b, l)
        fwd = time_ms(device, args.iters, lambda: model(input_ids=x, use_cache=False).logits)
        rows.append((f"train fwd {b}x{l}", b * l, fwd, forward_flops(cfg, b, l, b * l)))

        def fwd_bwd():
            model(input_ids=x, use_cache=False).logits.sum().backward()
            model.zero_grad(set_to_none=True)

        ms = time_ms(device, args.iters, fwd_bwd)
        rows.append((f"train fwd+bwd {b}x{l}", b * l, ms, 3 * forward_flops(cfg, b, l, b * l)))

    print(f"HF transformers {transformers.__version__} | {cfg['model_type']} "
          f"{cfg['num_hidden_layers']} layers, {n_params / 1e6:.1f}M params | {args.dtype} | "
          f"{args.device} | attention={args.attn} | torch {torch.__version__} | "
          f"random init {init_s:.1f}s")
    print(f"| {'case':<28} | {'tokens/iter':>11} | {'ms/iter':>10} | {'tokens/s':>12} | "
          f"{'TFLOP/s':>8} |")
    print(f"|{'-' * 30}|{'-' * 13}|{'-' * 12}|{'-' * 14}|{'-' * 10}|")
    for name, tokens, ms, fl in rows:
        print(f"| {name:<28} | {tokens:>11} | {ms:>10.2f} | {tokens / (ms / 1e3):>12.0f} | "
              f"{fl / (ms / 1e3) / 1e12:>8.1f} |")


if __name__ == "__main__":
    main()
