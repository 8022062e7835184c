#!/usr/bin/env bash
# The trainer benchmark on the GPU machine in one command, side by side with HF transformers:
#   1. scripts/device/run.sh builds slime_train and train_bench (no tests),
#   2. `slime_train init-model` writes the random-weight Qwen3-0.6B-shaped model (bf16) to
#      $MODEL (default /tmp/qwen3-0.6b; reused when it is already there),
#   3. build-gpu/bench/train/train_bench trains it (Trainer RL step and SFT step, packed
#      micro-batches) and writes the token ids it used to /tmp/train_bench_ids.bin,
#   4. scripts/device/bench_train_hf.py runs HF forward/backward + AdamW (eager and sdpa) on
#      the same directory and the same ids.
# Results: the two tables in $OUT/summary.txt, JSON in $OUT/train_bench.json and
# $OUT/bench_train_hf.json, every log in $OUT/logs.tgz.
#
#   scripts/device/train_bench.sh [--quick] [--model-config F] [--layers N] [--bench-args "..."]
#                                 [--hf-args "..."] [run.sh args...]
#
# --quick: 1 warm-up + 2 timed steps of 4 samples (a sanity run).
# --model-config F / --layers N: the HF config to init (default qwen3-0.6b.json), cut to its
# first N layers (set MODEL to a directory of its own), as in engine_bench.sh.
# --bench-args / --hf-args: appended to the train_bench / bench_train_hf.py command lines.
# Device call (carry the .debs and the Qwen3 tokenizer, both git-ignored):
#   run(command="scripts/device/train_bench.sh",
#       carry=["third_party_debs", ".cache/testdata/qwen3"])
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
model="${MODEL:-/tmp/qwen3-0.6b}"
ids=/tmp/train_bench_ids.bin
bench_extra=""
hf_extra=""
steps="--samples-per-step 16 --steps 5 --warmup 2"
model_config=tests/data/model/configs/qwen3-0.6b.json
layers=""
run_args=()
while (($#)); do
  case "$1" in
    --model-config) model_config="$2"; shift 2 ;;
    --layers) layers="$2"; shift 2 ;;
    --quick) steps="--samples-per-step 4 --steps 2 --warmup 1"; shift ;;
    --bench-args) bench_extra="$2"; shift 2 ;;
    --hf-args) hf_extra="$2"; shift 2 ;;
    *) run_args+=("$1"); shift ;;
  esac
done
shape="--seq-len 4096 --max-tokens-per-gpu 8192 $steps"

source "$repo/scripts/device/model_init.sh"
init=$(init_model_command "$model" "$model_config" "$layers") || exit 1

bench="train/train_bench --model $model --device cuda --dtype bfloat16 $shape --mode rl,sft"
bench+=" --write-data $ids --json \$SLIME_OUT/train_bench.json $bench_extra"

hf="scripts/device/bench_train_hf.py --model $model --device cuda --dtype bfloat16 $shape"
hf+=" --attn eager,sdpa --data $ids --json \$SLIME_OUT/bench_train_hf.json $hf_extra"

exec "$repo/scripts/device/run.sh" --no-tests --targets "slime_train train_bench" \
  --run "$init" --bench "$bench" --py "$hf" "${run_args[@]}"
