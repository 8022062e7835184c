#!/usr/bin/env bash
# The step-time stall of checkpoint saves, synchronous vs checkpoint.async_save
# (docs/benchmarks.md "Checkpoint saves: synchronous vs checkpoint.async_save"). Runs the same
# `slime_train --config` job twice, saving after every rollout — once with synchronous saves,
# once with checkpoint.async_save: true — and prints per mode, over rollouts 1..N-1 (rollout 0
# warms up allocators and, on GPU, CUDA graphs):
#   save     perf/save_time: the time the loop spends in the save call (the stall)
#   wait     perf/save_wait_time: of which waiting for the previous background write (async)
#   write    perf/save_background_time: how long a background write ran (async; reported by
#            the save after it)
#   step     perf/step_time; train perf/train_time
# and the job's wall time (the async run includes the wait for its last write at the end).
#
#   bench/train/checkpoint_save_bench.sh cpu [ROLLOUTS]   # here: configs/grpo-tiny-cpu.yaml
#       (1 trainer + 2 engines on CPU slots) on a random tiny Qwen3 with the full 151,936-token
#       vocabulary (tests/data/model/configs/qwen3-tiny.json, fp32: 19.8 M parameters, a 0.24 GB
#       checkpoint with the Adam moments), prompts from data/demo/train.jsonl
#   bench/train/checkpoint_save_bench.sh gpu [ROLLOUTS]   # the GPU machine, inside
#       scripts/device/run.sh (SLIME_BUILD set): the colocated Qwen3-0.6B job of
#       scripts/device/e2e_bench.sh (configs/qwen3-0.6b-grpo.yaml, random weights, bf16, 32
#       prompts × 8 samples × 1,024 tokens; an 8.3 GB checkpoint)
#
# ROLLOUTS per run: default 6 (cpu 12). checkpoint.keep_last is 2 (disk), and a run's
# checkpoints are deleted after it. Environment: SLIME_BIN (default $SLIME_BUILD or build,
# /src/app/slime_train); BENCH_DIR (default /tmp/checkpoint-save-bench) holds both runs (their
# logs, metrics.jsonl and checkpoints; removed and remade at the start); with SLIME_LOGS set
# (scripts/device/run.sh) each run's log and metrics are copied there too.
# GPU (device tool, one H200; carry the .debs and the Qwen3 tokenizer):
#   scripts/device/run.sh --no-tests --targets slime_train \
#     --run 'bench/train/checkpoint_save_bench.sh gpu 6'
#   (run(..., carry=["third_party_debs", ".cache/testdata/qwen3"]))
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
preset="${1:?usage: $0 cpu|gpu [ROLLOUTS]}"
case "$preset" in
  cpu) rollouts="${2:-12}" ;;
  gpu) rollouts="${2:-6}" ;;
  *) echo "checkpoint_save_bench: preset '$preset' is not cpu or gpu" >&2; exit 2 ;;
esac
bin="${SLIME_BIN:-${SLIME_BUILD:-$repo/build}/src/app/slime_train}"
[ -x "$bin" ] || { echo "checkpoint_save_bench: $bin is not built" >&2; exit 2; }
out="${BENCH_DIR:-/tmp/checkpoint-save-bench}"
rm -rf "$out"
mkdir -p "$out"

if [ "$preset" = cpu ]; then
  model="$out/tiny-qwen3"
  "$bin" init-model --config tests/data/model/configs/qwen3-tiny.json \
    --tokenizer .cache/testdata/qwen3 --out "$model" --dtype fp32 --seed 3 > "$out/init.log" 2>&1 ||
    { cat "$out/init.log"; exit 1; }
  job=(--config configs/grpo-tiny-cpu.yaml --set "model.hf_checkpoint=$model"
       --set data.prompt_data=data/demo/train.jsonl --set data.input_key=input
       --set "eval.datasets=[]" --set eval.interval=null)
  export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-4294967296}"
  export MALLOC_TRIM_THRESHOLD_="${MALLOC_TRIM_THRESHOLD_:-4294967296}"
  export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
else
  model=/tmp/qwen3-0.6b
  if [ ! -f "$model/model.safetensors" ]; then
    "$bin" init-model --config tests/data/model/configs/qwen3-0.6b.json \
      --tokenizer .cache/testdata/qwen3 --out "$model" --dtype bf16 || exit 1
  fi
  export QWEN3_0_6B="$model" CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
  job=(--config configs/qwen3-0.6b-grpo.yaml --set "eval.datasets=[]" --set eval.interval=null
       --set data.prompt_data=data/demo/train.jsonl --set data.input_key=input
       --set reward.rm_type=exact_match --set rollout.max_response_len=1024
       --set data.rollout_batch_size=32 --set train.global_batch_size=256
       --set train.max_tokens_per_gpu=16384)
fi

for mode in sync async; do
  run="$out/$mode"
  args=("${job[@]}" --set "cluster.run_dir=$run" --set "checkpoint.save=$run/ckpt"
        --set "checkpoint.load=$run/ckpt" --set checkpoint.save_interval=1
        --set checkpoint.keep_last=2 --set "data.num_rollout=$rollouts"
        --set "checkpoint.async_save=$([ "$mode" = async ] && echo true || echo false)")
  echo "== $mode: slime_train ${args[*]}"
  start=$(date +%s.%N)
  "$bin" "${args[@]}" > "$out/$mode.log" 2>&1
  rc=$?
  wall=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  echo "$mode: exit $rc, job wall time $wall s"
  [ "$rc" = 0 ] || { tail -30 "$out/$mode.log"; exit 1; }
  grep -E "^done|background write finished" "$out/$mode.log" | cut -c1-200
  cp "$run/metrics.jsonl" "$out/$mode.jsonl"
  rm -rf "$run/ckpt"  # the GPU job's checkpoints are 8.3 GB each
  [ -n "${SLIME_LOGS:-}" ] && cp "$out/$mode.log" "$out/$mode.jsonl" "$SLIME_LOGS/"
done

python3 - "$out/sync.jsonl" "$out/async.jsonl" <<'EOF'
import json, sys
keys = [("save", "perf/save_time"), ("wait", "perf/save_wait_time"),
        ("write", "perf/save_background_time"), ("step", "perf/step_time"),
        ("train", "perf/train_time")]
print("| mode | rollouts | " + " | ".join(f"{k} mean (min-max) s" for k, _ in keys) + " |")
print("|---|---:|" + "---:|" * len(keys))
for path in sys.argv[1:]:
    mode = path.rsplit("/", 1)[-1].split(".")[0]
    rows = [json.loads(l) for l in open(path) if '"perf/step_time"' in l]
    rows = [r for r in rows if r["rollout_id"] > 0]
    cells = []
    for _, key in keys:
        vals = [r[key] for r in rows if key in r]
        cells.append(f"{sum(vals) / len(vals):.3f} ({min(vals):.3f}-{max(vals):.3f})" if vals else "-")
    print(f"| {mode} | 1..{len(rows)} | " + " | ".join(cells) + " |")
EOF
