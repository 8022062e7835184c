#!/usr/bin/env bash
# README command 1: install dependencies, build, warm-start a tiny model on the demo task and run
# slime_train's GRPO loop on it on the CPU (configs/grpo-tiny-cpu.yaml): 1 trainer + 2 engines as
# separate processes, Gloo weight sync. Prints rollout progress, one line per rollout, the eval
# reward before/after, and where the metrics and checkpoints are.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
./scripts/setup.sh
./scripts/build.sh
bin="${SLIME_BUILD_DIR:-$repo/build}/src/app/slime_train"
"$bin" --version
echo
echo "== warm start: Qwen3 tokenizer, a tiny random model, a short SFT on the demo task"
SLIME_BIN="$bin" ./scripts/warm_start.sh
echo
echo "== placement of configs/grpo-tiny-cpu.yaml"
"$bin" --config configs/grpo-tiny-cpu.yaml --dry-run | sed -n '/# placement plan/,$p'
echo
# A fresh demo run each time (the config resumes from runs/grpo-tiny-cpu/ckpt when it is there).
rm -rf runs/grpo-tiny-cpu
echo "== GRPO (slime_train --config configs/grpo-tiny-cpu.yaml)"
start=$(date +%s)
"$bin" --config configs/grpo-tiny-cpu.yaml
echo
echo "quickstart: GRPO took $(( $(date +%s) - start )) s. Metrics: runs/grpo-tiny-cpu/metrics.jsonl"
echo "quickstart: plot them with scripts/plot_metrics runs/grpo-tiny-cpu -o runs/grpo-tiny-cpu/curves.png"
echo "quickstart: checkpoints in runs/grpo-tiny-cpu/ckpt; to continue from them:"
echo "  $bin --config configs/grpo-tiny-cpu.yaml --set data.num_rollout=500 --set train.use_checkpoint_opt_param_scheduler=true"
