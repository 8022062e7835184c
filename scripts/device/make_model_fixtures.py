#!/usr/bin/env python3
"""Tiny random HF models + transformers reference logits for tests/model/hf_fixture_test.cc.

Builds three 2-layer GQA models with transformers (Qwen2 with QKV bias and tied embeddings,
Qwen3 with QK-norm and head_dim != hidden/heads, Llama 3 with llama3 rope scaling, attention
bias and head_dim != hidden/heads), randomises every bias and norm weight (random init would
leave them 0 / 1 and hide mistakes), saves each with save_pretrained (config.json +
model.safetensors, float32) under OUT/<name>/, and writes OUT/<name>/reference.safetensors with
"input_ids.<i>" (int64 [L]) and "logits.<i>" (float32 [L, vocab]) for a few sequences of
different lengths, each run alone through the model in float32 with eager attention.

Runs on CPU; needs torch, transformers (4.4x or 5.x) and safetensors, i.e. the GPU machine:
    python3 scripts/device/make_model_fixtures.py            # writes tests/data/model/
    python3 scripts/device/make_model_fixtures.py --out DIR
Deterministic for a given torch/transformers version. Total size about 0.7 MB.
"""

import argparse
import inspect
import json
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file

SEQ_LENS = [1, 5, 17, 40]

FIXTURES = {
    "tiny-qwen2": dict(
        arch="Qwen2",
        config=dict(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                    rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False),
        rope=dict(rope_type="default", rope_theta=10000.0),
    ),
    "tiny-qwen3": dict(
        arch="Qwen3",
        config=dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
                    attention_bias=False, use_sliding_window=False),
        rope=dict(rope_type="default", rope_theta=1000000.0),
    ),
    "tiny-llama3": dict(
        arch="Llama",
        config=dict(vocab_size=256, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
                    attention_bias=True, mlp_bias=False),
        # original_max_position_embeddings 64 with head_dim 16: wavelengths 6.3 (kept),
        # 32 (smoothed) and >= 167 (scaled) exercise every regime of the llama3 rule.
        rope=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                  high_freq_factor=4.0, original_max_position_embeddings=64),
    ),
}


def make_config(arch, fields, rope):
    cls = getattr(transformers, f"{arch}Config")
    params = inspect.signature(cls.__init__).parameters
    kwargs = dict(fields)
    major = int(transformers.__version__.split(".")[0])
    if major >= 5 or "rope_parameters" in params:  # transformers 5.x
        kwargs["rope_parameters"] = dict(rope)
    else:  # transformers 4.x
        kwargs["rope_theta"] = rope["rope_theta"]
        if rope["rope_type"] != "default":
            kwargs["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return cls(**kwargs)


def build(name, spec, out_root, seed):
    torch.manual_seed(seed)
    config = make_config(spec["arch"], spec["config"], spec["rope"])
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model = model.float().eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith(".bias"):
                p.normal_(0.0, 0.1)
            elif "norm" in pname:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))

    out = os.path.join(out_root, name)
    if os.path.isdir(out):
        shutil.rmtree(out)
    model.save_pretrained(out)
    for extra in os.listdir(out):  # keep only what the test reads
        if extra not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(out, extra))
    if not os.path.exists(os.path.join(out, "model.safetensors")):
        sys.exit(f"{name}: save_pretrained did not write model.safetensors")

    gen = torch.Generator().manual_seed(seed + 1)
    tensors = {}
    for i, n in enumerate(SEQ_LENS):
        ids = torch.randint(0, config.vocab_size, (n,), generator=gen, dtype=torch.int64)
        with torch.no_grad():
            logits = model(input_ids=ids[None], use_cache=False).logits[0].float()
        tensors[f"input_ids.{i}"] = ids.contiguous()
        tensors[f"logits.{i}"] = logits.contiguous()
    save_file(tensors, os.path.join(out, "reference.safetensors"),
              metadata={"torch": torch.__version__, "transformers": transformers.__version__,
                        "seed": str(seed)})

    with open(os.path.join(out, "config.json")) as f:
        saved = json.load(f)
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    max_logit = max(t.abs().max().item() for k, t in tensors.items() if k.startswith("logits"))
    params = sum(p.numel() for p in model.parameters())
    print(f"{name}: model_type={saved.get('model_type')} params={params} seqs={SEQ_LENS} "
          f"max|logit|={max_logit:.3f} size={size / 1024:.0f} KiB -> {out}")
    return size


def main():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(repo, "tests", "data", "model"))
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    total = 0
    for i, (name, spec) in enumerate(FIXTURES.items()):
        total += build(name, spec, args.out, args.seed + 100 * i)
    print(f"total {total / 1024:.0f} KiB; now: git add tests/data/model/tiny-* and re-run cmake "
          f"so model_hf_test joins ctest")


if __name__ == "__main__":
    main()
