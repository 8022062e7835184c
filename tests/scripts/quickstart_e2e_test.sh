#!/usr/bin/env bash
# The quickstart's demonstration, end to end (issue: "the eval reward must rise clearly and the run
# must be resumable"): scripts/warm_start.sh, then `slime_train --config configs/grpo-tiny-cpu.yaml`
# exactly as scripts/quickstart.sh runs it (2 engines + 1 trainer as worker processes, Gloo weight
# sync), with its outputs redirected to a temporary directory. Checks, from metrics.jsonl:
#   - the greedy exact-match accuracy on the 80 RL prompts (eval/add1_train), the best of the
#     last three evals (rollouts 300, 350, 399), is >= 0.15 above the accuracy before training,
#     and so is the sampled reward (rollout/raw_reward, mean of the last 20 rollouts vs the first
#     20); the held-out accuracy (eval/add1, 20 problems, best of the last three) ends above where
#     it started. Best of three, not the last eval alone: GRPO at this learning rate oscillates,
#     and one eval can land in a dip (one CI run measured 0.338 -> 0.34 at rollout 350 and 0.625
#     at 399); the sampled-reward check averages 160 samples per rollout over 20 rollouts. Measured on this VM:
#     RL prompts +0.30 to +0.37, sampled ~+0.4, held out +0.33 to +0.38; on the GPU machine's
#     CPUs (other float rounding, another warm start): +0.31, held out +0.10 (docs/data.md);
#   - a second invocation with two more rollouts resumes from the checkpoint at rollout 400.
#
# usage: quickstart_e2e_test.sh SLIME_TRAIN_BINARY REPO_ROOT
set -euo pipefail
bin="$1"
repo="$2"
cd "${repo}"
tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT
export SLIME_RUNS="${tmp}/runs"
export SLIME_TINY_MODEL="${tmp}/runs/tiny-model"
export SLIME_TINY_DATA="${tmp}/runs/demo-add1/train.jsonl"
export SLIME_TINY_EVAL="${tmp}/runs/demo-add1/eval.jsonl"
run_dir="${tmp}/grpo"
sets=(--set "cluster.run_dir=${run_dir}" --set "checkpoint.save=${run_dir}/ckpt"
      --set "checkpoint.load=${run_dir}/ckpt")

SLIME_BIN="${bin}" scripts/warm_start.sh
start=$(date +%s)
"${bin}" --config configs/grpo-tiny-cpu.yaml "${sets[@]}" > "${tmp}/grpo.log" 2>&1 || {
  echo "FAIL: the GRPO run exited $?; its last lines:"; tail -n 40 "${tmp}/grpo.log"; exit 1; }
echo "GRPO: $(( $(date +%s) - start )) s"
grep -E "^eval @ rollout [0-9]+ \||^done:" "${tmp}/grpo.log"

python3 - "${run_dir}/metrics.jsonl" <<'EOF'
import json, sys
evals, sampled = {}, {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "eval/add1" in r:
        evals[r["rollout_id"]] = (r["eval/add1"], r["eval/add1_train"])
    if "rollout/raw_reward" in r:
        sampled[r["rollout_id"]] = r["rollout/raw_reward"]
ids = sorted(evals)
assert ids and ids[0] == 0 and ids[-1] == 399, f"eval rollouts {ids}: want 0 ... 399"
assert sorted(sampled) == list(range(400)), "want rollout/raw_reward for rollouts 0..399"
def mean(xs): return sum(xs) / len(xs)
checks = [
    ("eval/add1_train (RL prompts, greedy, best of the last 3 evals)", evals[0][1],
     max(evals[i][1] for i in ids[-3:]), 0.15),
    ("rollout/raw_reward (sampled)", mean([sampled[i] for i in range(20)]),
     mean([sampled[i] for i in range(380, 400)]), 0.15),
    ("eval/add1 (held out, greedy, best of the last 3 evals)", evals[0][0],
     max(evals[i][0] for i in ids[-3:]), 0.01),
]
for name, before, after, rise in checks:
    print(f"{name}: {before:.3f} -> {after:.3f}; evals {[round(evals[i][1], 3) for i in ids]}"
          if "add1_train" in name else f"{name}: {before:.3f} -> {after:.3f}")
    assert after >= before + rise, f"{name} did not rise by {rise}: {before:.3f} -> {after:.3f}"
EOF

lines_before=$(wc -l < "${run_dir}/metrics.jsonl")
# A longer run changes the LR schedule's length: continue the checkpoint's schedule.
"${bin}" --config configs/grpo-tiny-cpu.yaml "${sets[@]}" --set data.num_rollout=402 \
  --set train.use_checkpoint_opt_param_scheduler=true \
  > "${tmp}/resume.log" 2>&1 || {
  echo "FAIL: the resumed run exited $?; its last lines:"; tail -n 40 "${tmp}/resume.log"; exit 1; }
python3 - "${run_dir}/metrics.jsonl" "${lines_before}" <<'EOF'
import json, sys
lines = open(sys.argv[1]).read().splitlines()[int(sys.argv[2]):]
ids = sorted({json.loads(l)["rollout_id"] for l in lines if "rollout_id" in json.loads(l)})
assert ids == [400, 401], f"the resumed run logged rollouts {ids}, want [400, 401]"
print("resume: rollouts 400 and 401 ran after the checkpoint at 399")
EOF
grep -E "^rollout 400/|resum" "${tmp}/resume.log" | head -3
echo "PASS"
