#!/usr/bin/env bash
# README command 1: install dependencies, build slime_train, warm-start a tiny model on the demo
# task and run slime_train's GRPO loop on it on the CPU (configs/grpo-tiny-cpu.yaml): 1 trainer +
# 2 engines as separate processes, Gloo weight sync. Prints each step's progress, one line per
# rollout, and ends with a summary: accuracy before and after, time, where the curves are.
#
# Builds only slime_train (./scripts/test.sh builds the tests and benchmarks). SLIME_BIN=PATH uses
# that slime_train instead and skips the build (the CI test of a fresh checkout does so).
# Outputs go to runs/ (warm start) and runs/grpo-tiny-cpu (the GRPO run), both re-creatable.
set -Eeuo pipefail
trap 'rc=$?; echo "quickstart: FAILED: \`${BASH_COMMAND}\` exited ${rc} (scripts/quickstart.sh line ${LINENO})" >&2' ERR
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
start=$(date +%s)
run_dir=runs/grpo-tiny-cpu

echo "== [1/5] dependencies (scripts/setup.sh)"
./scripts/setup.sh

echo
if [[ -n "${SLIME_BIN:-}" ]]; then
  echo "== [2/5] build: skipped, SLIME_BIN=${SLIME_BIN}"
  bin="${SLIME_BIN}"
else
  echo "== [2/5] build slime_train (scripts/build.sh)"
  SLIME_BUILD_TARGETS=slime_train ./scripts/build.sh
  bin="${SLIME_BUILD_DIR:-$repo/build}/src/app/slime_train"
fi
if [[ ! -x "$bin" ]]; then
  echo "quickstart: FAILED: $bin is not an executable slime_train" >&2
  exit 1
fi
"$bin" --version
built=$(date +%s)

echo
echo "== [3/5] warm start: Qwen3 tokenizer, a tiny random model, a short SFT on the demo task"
SLIME_BIN="$bin" ./scripts/warm_start.sh
warm=$(date +%s)

echo
echo "== [4/5] placement of configs/grpo-tiny-cpu.yaml"
"$bin" --config configs/grpo-tiny-cpu.yaml --dry-run | sed -n '/# placement plan/,$p'

echo
# A fresh demo run each time (the config resumes from runs/grpo-tiny-cpu/ckpt when it is there).
rm -rf "$run_dir"
echo "== [5/5] GRPO (slime_train --config configs/grpo-tiny-cpu.yaml)"
"$bin" --config configs/grpo-tiny-cpu.yaml
done_at=$(date +%s)

curves="$run_dir/curves.png"
if ! scripts/plot_metrics "$run_dir" -o "$curves" > "$run_dir/plot.log" 2>&1; then
  echo "quickstart: no curves: scripts/plot_metrics failed ($run_dir/plot.log); the run itself is fine"
  curves=""
fi

echo
echo "== summary"
python3 - "$run_dir/metrics.jsonl" <<'PY'
import json, sys
evals, sampled = {}, {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    rid = r.get("rollout_id")
    for k, v in r.items():
        if k.startswith("eval/") and isinstance(v, (int, float)) and k.count("/") == 1:
            evals.setdefault(k, {})[rid] = v
    if "rollout/raw_reward" in r:
        sampled[rid] = r["rollout/raw_reward"]
names = {"eval/add1": "held-out problems (20)", "eval/add1_train": "RL prompts (80)"}
# eval/<dataset> is the accuracy; eval/<dataset>-pass@k, -truncated_ratio, ... are derived.
for key in sorted(k for k in evals if "-" not in k or k.rsplit("-", 1)[0] not in evals):
    by_id = evals[key]
    ids = sorted(by_id)
    first, last = ids[0], ids[-1]
    best = max(by_id.values())
    print(f"quickstart: greedy accuracy on the {names.get(key, key)}: "
          f"{100 * by_id[first]:.1f}% at rollout {first} -> {100 * by_id[last]:.1f}% at rollout {last} "
          f"(best {100 * best:.1f}%)")
if sampled:
    ids = sorted(sampled)
    head, tail = ids[:10], ids[-10:]
    mean = lambda xs: sum(sampled[i] for i in xs) / len(xs)
    print(f"quickstart: sampled reward (temperature 1): {mean(head):.2f} in rollouts "
          f"{head[0]}-{head[-1]} -> {mean(tail):.2f} in rollouts {tail[0]}-{tail[-1]}")
PY
echo "quickstart: time: $(( built - start )) s setup and build, $(( warm - built )) s warm start, $(( done_at - warm )) s GRPO, $(( $(date +%s) - start )) s in all"
if [[ -n "$curves" ]]; then echo "quickstart: curves: $curves (scripts/plot_metrics $run_dir -o FILE redraws them)"; fi
echo "quickstart: metrics: $run_dir/metrics.jsonl; checkpoints: $run_dir/ckpt; to continue from them:"
echo "  $bin --config configs/grpo-tiny-cpu.yaml --set data.num_rollout=500 --set train.use_checkpoint_opt_param_scheduler=true"
