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
# ROLLOUTS per run: default 8. Environment: SLIME_BIN (default build/src/app/slime_train);
# BENCH_DIR (default /tmp/deterministic-bench) holds both runs (removed and remade at the
# start). The CUDA preset comes with the CUDA batch-invariant kernels (the mode is CPU-only so
# far).
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
preset="${1:?usage: $0 cpu [ROLLOUTS]}"
[ "$preset" = cpu ] || { echo "deterministic_bench: preset '$preset' is not cpu" >&2; exit 2; }
rollouts="${2:-8}"
bin="${SLIME_BIN:-${SLIME_BUILD:-$repo/build}/src/app/slime_train}"
[ -x "$bin" ] || { echo "deterministic_bench: $bin is not built" >&2; exit 2; }
out="${BENCH_DIR:-/tmp/deterministic-bench}"
rm -rf "$out"
mkdir -p "$out"

model="$out/tiny-qwen3"
"$bin" init-model --config tests/data/model/configs/qwen3-tiny.json \
  --tokenizer .cache/testdata/qwen3 --out "$model" --dtype fp32 --seed 3 > "$out/init.log" 2>&1 ||
  { cat "$out/init.log"; exit 1; }
job=(--config configs/grpo-tiny-cpu.yaml --set "model.hf_checkpoint=$model"
     --set data.prompt_data=data/demo/train.jsonl --set data.input_key=input
     --set "eval.datasets=[]" --set eval.interval=null --set checkpoint.save=null --set checkpoint.save_interval=null
     --set checkpoint.load=null
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
