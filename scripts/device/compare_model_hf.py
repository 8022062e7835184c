#!/usr/bin/env python3
"""HF transformers reference logits for bench/model/model_compare.

Loads an HF model directory (e.g. one written by `slime_train init-model`) with
AutoModelForCausalLM (attn_implementation "sdpa", CUDA), runs random token ids of each length
alone (no cache) and saves, for sequence i, "input_ids.<i>" (int64 [L]) and "logits.<i>"
(float32 [L, vocab]) to --out with safetensors. Then:
    model_compare --model DIR --reference OUT
"""

import argparse

import safetensors.torch
import torch
import transformers


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--seqs", default="1,17,128,1024")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")
    args = p.parse_args()

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.model, dtype=dtype, attn_implementation="sdpa").to(args.device).eval()
    vocab = model.config.vocab_size
    lengths = [int(s) for s in args.seqs.split(",") if s]
    gen = torch.Generator().manual_seed(args.seed)
    tensors = {}
    with torch.no_grad():
        for i, length in enumerate(lengths):
            ids = torch.randint(0, vocab, (length,), generator=gen, dtype=torch.int64)
            out = model(input_ids=ids.unsqueeze(0).to(args.device), use_cache=False)
            tensors[f"input_ids.{i}"] = ids.contiguous()
            tensors[f"logits.{i}"] = out.logits[0].float().cpu().contiguous()
    safetensors.torch.save_file(tensors, args.out)
    print(f"compare_model_hf: {args.model} ({args.dtype}, sdpa, transformers "
          f"{transformers.__version__}, torch {torch.__version__}) -> {args.out}: "
          f"{len(lengths)} sequences, lengths {lengths}, vocab {vocab}")


if __name__ == "__main__":
    main()
