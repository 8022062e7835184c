#!/usr/bin/env bash
# Deterministic mode against the default (fast) mode, side by side on one machine
# (docs/benchmarks.md "Deterministic mode"). Runs the same `slime_train --config` job twice —
# debug.deterministic_mode false, then true — and prints per mode, over rollouts 1..N-1
# (rollout 0 warms up): the mean step, rollout (generation) and train times, and every step's
# train/train_rollout_logprob_abs_diff (the mean |trainer − engine| log-prob of the step's
# samples; exactly 0 in deterministic mode).
#
#   bench/train/deterministic_bench.sh cpu [ROLLOUTS]   # configs/grpo-tiny-cpu.yaml (1 trainer
#       + 2 engines on CPU slots, 8 prompts × 8 samples of up to 12 tokens, one optimizer step a
#       rollout) on a random tiny Qwen3 (tests/data/model/configs/qwen3-tiny.json, fp32, the full
#       151,936-token vocabulary), prompts from data/demo/train.jsonl
#
#   bench/train/deterministic_bench.sh gpu [ROLLOUTS]   # the GPU machine, inside
#       scripts/device/run.sh (SLIME_BUILD set): the colocated Qwen3-0.6B job
#       (configs/qwen3-0.6b-grpo.yaml, random weights, bf16, 32 prompts × 8 samples × up to
#       RESPONSE_LEN tokens, default 1,024)
#
# ROLLOUTS per run: default 8 (gpu 4). Environment: SLIME_BIN (default $SLIME_BUILD or build,
# /src/app/slime_train); BENCH_DIR (default /tmp/deterministic-bench) holds both runs (removed
# and remade at the start); with SLIME_LOGS set (scripts/device/run.sh) each run's log and
# metrics are copied there too.
# GPU (device tool, one H200; carry the .debs and the Qwen3 tokenizer):
#   scripts/device/run.sh --no-tests --targets slime_train \
#     --run 'bench/train/deterministic_bench.sh gpu 4'
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
preset="${1:?usage: $0 cpu|gpu [ROLLOUTS]}"
case "$preset" in
  cpu) rollouts="${2:-8}" ;;
  gpu) rollouts="${2:-4}" ;;
  *) echo "deterministic_bench: preset '$preset' is not cpu or gpu" >&2; exit 2 ;;
esac
bin="${SLIME_BIN:-${SLIME_BUILD:-$repo/build}/src/app/slime_train}"
[ -x "$bin" ] || { echo "deterministic_bench: $bin is not built" >&2; exit 2; }
out="${BENCH_DIR:-/tmp/deterministic-bench}"
rm -rf "$out"
mkdir -p "$out"

if [ "$preset" = cpu ]; then
  model="$out/tiny-qwen3"
  "$bin" init-model --config tests/data/model/configs/qwen3-tiny.json \
    --tokenizer .cache/testdata/qwen3 --out "$model" --dtype fp32 --seed 3 > "$out/init.log" 2>&1 ||
    { cat "$out/init.log"; exit 1; }
  job=(--config configs/grpo-tiny-cpu.yaml --set "model.hf_checkpoint=$model"
       --set data.prompt_data=data/demo/train.jsonl --set data.input_key=input)
else
  model=/tmp/qwen3-0.6b
  if [ ! -f "$model/model.safetensors" ]; then
    "$bin" init-model --config tests/data/model/configs/qwen3-0.6b.json \
      --tokenizer .cache/testdata/qwen3 --out "$model" --dtype bf16 || exit 1
  fi
  export QWEN3_0_6B="$model" CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
  job=(--config configs/qwen3-0.6b-grpo.yaml
       --set data.prompt_data=data/demo/train.jsonl --set data.input_key=input
       --set reward.rm_type=exact_match --set "rollout.max_response_len=${RESPONSE_LEN:-1024}"
       --set data.rollout_batch_size=32 --set train.global_batch_size=256
       --set train.max_tokens_per_gpu=16384)
fi
job+=(--set "eval.datasets=[]" --set eval.interval=null --set checkpoint.save=null
      --set checkpoint.save_interval=null --set checkpoint.load=null
      --set "data.num_rollout=$rollouts")

for mode in fast deterministic; do
  run="$out/$mode"
  args=("${job[@]}" --set "cluster.run_dir=$run"
        --set "debug.deterministic_mode=$([ "$mode" = deterministic ] && echo true || echo false)")
  echo "== $mode: slime_train ${args[*]}"
  start=$(date +%s.%N)
  "$bin" "${args[@]}" > "$out/$mode.log" 2>&1
  rc=$?
  wall=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  echo "$mode: exit $rc, job wall time $wall s"
  [ "$rc" = 0 ] || { tail -30 "$out/$mode.log"; exit 1; }
  cp "$run/metrics.jsonl" "$out/$mode.jsonl"
  [ -n "${SLIME_LOGS:-}" ] && cp "$out/$mode.log" "$out/$mode.jsonl" "$SLIME_LOGS/"
done

python3 - "$out/fast.jsonl" "$out/deterministic.jsonl" <<'EOF'
import json, sys
keys = [("step", "perf/step_time"), ("rollout", "perf/rollout_time"), ("train", "perf/train_time")]
print("| mode | rollouts | " + " | ".join(f"{k} mean (min-max) s" for k, _ in keys) +
      " | train_rollout_logprob_abs_diff per step |")
print("|---|---:|" + "---:|" * len(keys) + "---|")
for path in sys.argv[1:]:
    mode = path.rsplit("/", 1)[-1].split(".")[0]
    lines = [json.loads(l) for l in open(path)]
    rows = [r for r in lines if "perf/step_time" in r and r["rollout_id"] > 0]
    diffs = [r["train/train_rollout_logprob_abs_diff"] for r in lines
             if "step" in r and "train/train_rollout_logprob_abs_diff" in r]
    cells = []
    for _, key in keys:
        vals = [r[key] for r in rows if key in r]
        cells.append(f"{sum(vals) / len(vals):.3f} ({min(vals):.3f}-{max(vals):.3f})" if vals else "-")
    shown = ", ".join(f"{d:.3g}" for d in diffs)
    print(f"| {mode} | 1..{len(rows)} | " + " | ".join(cells) + f" | {shown} |")
EOF
