#!/usr/bin/env python3
"""Greedy tokens of HF transformers for one prompt: the reference the interop GPU tests compare
a `slime_train serve` with after a weight update (tests/comm/torch_interop_util.h).

  hf_greedy.py --model DIR --device cuda --input-ids 11,22,33 --max-new-tokens 12

Loads DIR (config.json + safetensors) with AutoModelForCausalLM in float32, runs the full
sequence each step (no KV cache, no generation config: EOS does not stop it) and prints the new
token ids as one JSON list on the last line of stdout.
"""
import argparse
import json

import torch


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--input-ids", required=True, help="comma-separated token ids")
    p.add_argument("--max-new-tokens", type=int, default=12)
    a = p.parse_args()
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32)
    model.to(a.device).eval()
    ids = torch.tensor([[int(t) for t in a.input_ids.split(",")]], device=a.device)
    new = []
    with torch.no_grad():
        for _ in range(a.max_new_tokens):
            logits = model(ids).logits[0, -1]
            nxt = int(torch.argmax(logits))
            new.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]], device=a.device)], dim=1)
    print(json.dumps(new), flush=True)


if __name__ == "__main__":
    main()
