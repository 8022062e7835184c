#!/usr/bin/env bash
# The engine benchmark on the GPU machine in one command, side by side with HF transformers:
#   1. scripts/device/run.sh builds slime_train and engine_bench (no tests),
#   2. `slime_train init-model` writes the random-weight Qwen3-0.6B-shaped model (bf16) to
#      $MODEL (default /tmp/qwen3-0.6b; reused when it is already there),
#   3. build-gpu/bench/engine/engine_bench runs on it (in-process Engine, no HTTP),
#   4. scripts/device/bench_engine_hf.py runs HF `generate` on the same directory.
# Results: the two tables in $OUT/summary.txt, JSON in $OUT/engine_bench.json and
# $OUT/bench_engine_hf.json, every log in $OUT/logs.tgz.
#
#   scripts/device/engine_bench.sh [--quick] [--engine-budget S] [--hf-budget S]
#                                  [--model-config F] [--layers N] [--new-tokens L]
#                                  [--concurrency L] [--grpo PxN]
#                                  [--engine-args "..."] [--hf-args "..."] [run.sh args...]
#
# --quick: a ~1-minute sanity run (64 new tokens, 16 and 64 requests, GRPO 8x4).
# --engine-budget / --hf-budget: seconds for each side's points (defaults 170 / 170), so that the
# whole call fits the device tool's 10-minute limit with the build; a point past its side's
# budget (or past --max-seconds 90) is cut or skipped and its row says so.
# --model-config F: the HF config.json to init (default tests/data/model/configs/qwen3-0.6b.json);
# --layers N: that config cut to its first N layers (a deep shape that would not fit the disk
# twice, e.g. Qwen3-30B-A3B: --model-config tests/data/model/configs/qwen3-30b-a3b.json --layers 8
# with MODEL=/tmp/qwen3-30b-a3b-8l).
# --new-tokens / --concurrency / --grpo: the points of both sides (comma lists), replacing the
# defaults (or --quick's).
# --engine-args / --hf-args: appended to the engine_bench / bench_engine_hf.py command lines.
# Device call (carry the .debs and the Qwen3 tokenizer, both git-ignored):
#   run(command="scripts/device/engine_bench.sh",
#       carry=["third_party_debs", ".cache/testdata/qwen3"])
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
model="${MODEL:-/tmp/qwen3-0.6b}"
engine_budget=170
hf_budget=170
engine_extra=""
hf_extra=""
quick=0
model_config=tests/data/model/configs/qwen3-0.6b.json
layers=""
new_tokens=""
concurrency=""
grpo_points=""
run_args=()
while (($#)); do
  case "$1" in
    --quick) quick=1; shift ;;
    --engine-budget) engine_budget="$2"; shift 2 ;;
    --hf-budget) hf_budget="$2"; shift 2 ;;
    --model-config) model_config="$2"; shift 2 ;;
    --layers) layers="$2"; shift 2 ;;
    --new-tokens) new_tokens="$2"; shift 2 ;;
    --concurrency) concurrency="$2"; shift 2 ;;
    --grpo) grpo_points="$2"; shift 2 ;;
    --engine-args) engine_extra="$2"; shift 2 ;;
    --hf-args) hf_extra="$2"; shift 2 ;;
    *) run_args+=("$1"); shift ;;
  esac
done

if ((quick)); then
  points="--new-tokens 64 --concurrency 16,64"
  hf_points="--new-tokens 64 --batch-sizes 16,64"
  grpo="--grpo 8x4"
else
  points="--new-tokens 256,1024 --concurrency 64,256,1024"
  hf_points="--new-tokens 256,1024 --batch-sizes 64,256,1024"
  grpo="--grpo 64x8"
fi

source "$repo/scripts/device/model_init.sh"
init=$(init_model_command "$model" "$model_config" "$layers") || exit 1

engine="engine/engine_bench --model $model --dtype bfloat16 --prompt-len 128 $points --batch1"
engine+=" $grpo --max-running-requests 1024 --max-seconds 90 --budget-seconds $engine_budget"
engine+=" --json \$SLIME_OUT/engine_bench.json $engine_extra"

hf="scripts/device/bench_engine_hf.py --model $model --dtype bf16 --attn sdpa --prompt-len 128"
hf+=" $hf_points --batch1 --batch1-caches dynamic,static --max-seconds 90"
hf+=" --budget-seconds $hf_budget --json \$SLIME_OUT/bench_engine_hf.json $hf_extra"

exec "$repo/scripts/device/run.sh" --no-tests --targets "slime_train engine_bench" \
  --run "$init" --bench "$engine" --py "$hf" "${run_args[@]}"
