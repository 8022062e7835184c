#!/usr/bin/env bash
# Activation recomputation on the GPU machine (train.recompute_*; docs/benchmarks.md, "Activation
# recomputation in the trainer"): train_bench on the random-weight Qwen3-0.6B-shaped model, one
# Trainer per setting — tokens/s and peak memory of GRPO steps of 16 × 4,096 tokens, and with
# --search CAP the longest single sequence (up to CAP tokens) that trains one step per setting.
#   1. scripts/device/run.sh builds slime_train and train_bench (no tests),
#   2. `slime_train init-model` writes the model (bf16) to $MODEL (default /tmp/qwen3-0.6b;
#      reused when it is already there),
#   3. build-gpu/bench/train/train_bench --recompute SETTINGS [--find-max-seq-len CAP].
# Results: the tables in $OUT/summary.txt, JSON in $OUT/recompute_bench.json, logs in
# $OUT/logs.tgz.
#
#   scripts/device/recompute_bench.sh [--settings LIST] [--search CAP] [--quick]
#                                     [--bench-args "..."] [run.sh args...]
#
# --settings: train_bench --recompute (default none,full:uniform:1,full:block:14,selective).
# --search CAP: also train_bench --find-max-seq-len CAP (several minutes at CAP = 262144: the
#   probes near the limit take tens of seconds each; run it as its own device call).
# --quick: 1 warm-up + 2 timed steps of 4 samples.
# Device call (carry the .debs and the Qwen3 tokenizer, both git-ignored):
#   run(command="scripts/device/recompute_bench.sh",
#       carry=["third_party_debs", ".cache/testdata/qwen3"])
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
model="${MODEL:-/tmp/qwen3-0.6b}"
settings="none,full:uniform:1,full:block:14,selective"
search=""
bench_extra=""
steps="--samples-per-step 16 --steps 5 --warmup 2"
run_args=()
while (($#)); do
  case "$1" in
    --settings) settings="$2"; shift 2 ;;
    --search) search="--find-max-seq-len $2"; shift 2 ;;
    --quick) steps="--samples-per-step 4 --steps 2 --warmup 1"; shift ;;
    --bench-args) bench_extra="$2"; shift 2 ;;
    *) run_args+=("$1"); shift ;;
  esac
done

init="if [ -f $model/model.safetensors ]; then echo 'reusing $model'; else"
init+=" \$SLIME_BUILD/src/app/slime_train init-model"
init+=" --config tests/data/model/configs/qwen3-0.6b.json --tokenizer .cache/testdata/qwen3"
init+=" --out $model --seed 0 --dtype bf16; fi"

bench="train/train_bench --model $model --device cuda --dtype bfloat16 --seq-len 4096"
bench+=" --max-tokens-per-gpu 8192 $steps --mode rl --recompute $settings $search"
bench+=" --json \$SLIME_OUT/recompute_bench.json $bench_extra"

exec "$repo/scripts/device/run.sh" --no-tests --targets "slime_train train_bench" \
  --run "$init" --bench "$bench" "${run_args[@]}"
