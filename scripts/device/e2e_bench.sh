#!/usr/bin/env bash
# The end-to-end GRPO loop on the 2×H200 machine (docs/benchmarks.md "End-to-end GRPO loop"):
# configs/qwen3-0.6b-grpo-2gpu.yaml (trainer GPU + engine GPU, NCCL sync) on a random-weight
# Qwen3-0.6B, run synchronously, with --async (one step off policy), and synchronously with the
# engine worker SIGKILLed 3 s into rollout 2's generation (restart, resync, retried groups), and
# colocated on one GPU (configs/qwen3-0.6b-grpo.yaml: offloads both ways, CUDA IPC weight sync)
# with the same batch shape. Mode colocate-4b: slime's Qwen3-4B recipe
# (configs/qwen3-4b-grpo-8gpu.yaml) squeezed onto one GPU — random-weight Qwen3-4B shape
# (tests/data/model/configs/qwen3-4b.json), TP 1, one engine, 32 prompts × 8 samples of
# SLIME_4B_RESPONSE_LEN (default 1024) tokens — the single-GPU slice of issue 9's runs.
# Modes shared-sync, shared-async and fully-async-N: the colocate mode's job with engine and
# trainer sharing the GPU at once (no offload; the engine takes rollout.mem_fraction_static
# 0.5), run synchronously, with --async, and with --fully-async at rollout.max_staleness N —
# the side-by-side of docs/benchmarks.md "Fully asynchronous training".
# Run inside scripts/device/run.sh (it sets SLIME_BUILD and SLIME_LOGS):
#
#   scripts/device/run.sh --no-tests --run 'scripts/device/e2e_bench.sh [ROLLOUTS] [MODES]'
#
# ROLLOUTS per run (default 5), MODES a subset of "sync async kill colocate colocate-4b
# shared-sync shared-async fully-async-1 fully-async-2 fully-async-4" (default the first four).
# Per mode: <mode>.log (console) and <mode>.jsonl (metrics) in $SLIME_LOGS, and a summary of the
# per-rollout times on stdout.
set -uo pipefail
rollouts="${1:-5}"
modes="${2:-sync async kill colocate}"
bin="${SLIME_BUILD:?run inside scripts/device/run.sh}/src/app/slime_train"
logs="${SLIME_LOGS:-/tmp}"
model=/tmp/qwen3-0.6b
if [ "${modes}" != colocate-4b ] && [ ! -f "${model}/model.safetensors" ]; then
  "${bin}" init-model --config tests/data/model/configs/qwen3-0.6b.json \
    --tokenizer .cache/testdata/qwen3 --out "${model}" --dtype bf16 || exit 1
fi
export QWEN3_0_6B="${model}" SLIME_NUM_ROLLOUT="${rollouts}" SLIME_SAVE_INTERVAL=1000

summary() {  # the per-rollout console lines and the metrics that matter
  grep -E "^rollout [0-9]+/|^done|engine .*(died|restart|back)|recover" "$1" | cut -c1-260
  python3 - "$2" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"perf/step_time"' in l]
keys = ["perf/rollout_time", "perf/train_time", "perf/update_weights_time", "perf/step_time",
        "perf/rollout_wait_time", "perf/rollout_train_overlap_time", "perf/tokens_per_sec",
        "train/train_rollout_logprob_abs_diff", "rollout/engine_restarts", "rollout/weight_staleness/max",
        "rollout/weight_staleness/mean", "async/producer_wait_time", "async/queue_depth",
        "perf/offload_rollout_time", "perf/onload_rollout_time", "perf/onload_train_time",
        "perf/offload_train_time"]
for r in rows:
    print(r["rollout_id"], " ".join(f"{k.split('/')[-1]}={r[k]:.3f}" for k in keys if k in r))
EOF
}

# Trained samples per second over the loop ("done: rollouts a..b in S s") and the idle shares:
# the trainer waits for rollouts (sync: the whole generation), the engines wait on the
# staleness bound (fully async) or for training and the sync (sync).
throughput() {  # log jsonl samples_per_rollout
  python3 - "$1" "$2" "$3" <<'EOF'
import json, re, sys
done = [l for l in open(sys.argv[1]) if l.startswith("done: rollouts")]
if not done:
    print("throughput: no 'done' line"); sys.exit(0)
a, b, secs = re.match(r"done: rollouts (\d+)\.\.(\d+) in (\d+) s", done[-1]).groups()
n, secs = int(b) - int(a) + 1, float(secs)
rows = [json.loads(l) for l in open(sys.argv[2]) if '"perf/step_time"' in l]
total = lambda k: sum(r.get(k, 0.0) for r in rows)
if any("timeline/train_start_s" in r for r in rows):  # --async, --fully-async
    trainer_idle = total("perf/rollout_wait_time")
    engine_idle = total("async/producer_wait_time") + total("perf/update_weights_time")
else:
    trainer_idle = total("perf/rollout_time")
    engine_idle = total("perf/step_time") - total("perf/rollout_time")
per = int(sys.argv[3])
print(f"throughput: {n} rollouts x {per} samples in {secs:.0f} s = {n * per / secs:.2f} "
      f"trained samples/s; trainer idle {trainer_idle / secs:.0%}, engine idle {engine_idle / secs:.0%}")
EOF
}

for mode in ${modes}; do
  run_dir="/tmp/e2e-${mode}"
  rm -rf "${run_dir}"
  args=(--config configs/qwen3-0.6b-grpo-2gpu.yaml --set "cluster.run_dir=${run_dir}"
        --set "checkpoint.save=${run_dir}/ckpt")
  [ "${mode}" = async ] && args+=(--async)
  if [ "${mode}" = colocate-4b ]; then  # the 8-GPU recipe on one GPU
    model4b=/tmp/qwen3-4b
    if [ ! -f "${model4b}/config.json" ]; then
      "${bin}" init-model --config tests/data/model/configs/qwen3-4b.json \
        --tokenizer .cache/testdata/qwen3 --out "${model4b}" --dtype bf16 || exit 1
    fi
    args=(--config configs/qwen3-4b-grpo-8gpu.yaml --set "cluster.run_dir=${run_dir}"
          --set model.hf_checkpoint="${model4b}" --set checkpoint.ref_load="${model4b}"
          --set checkpoint.load=null --set "checkpoint.save=${run_dir}/ckpt"
          --set checkpoint.save_interval=1000
          --set cluster.num_gpus_per_node=1 --set cluster.actor_num_gpus_per_node=1
          --set cluster.rollout_num_gpus_per_engine=1 --set train.tensor_model_parallel_size=1
          --set train.sequence_parallel=false --set "eval.datasets=[]" --set eval.interval=null
          --set data.prompt_data=data/demo/train.jsonl --set data.input_key=input
          --set reward.rm_type=exact_match
          --set "rollout.max_response_len=${SLIME_4B_RESPONSE_LEN:-1024}"
          --set "data.num_rollout=${rollouts}" --set train.max_tokens_per_gpu=8192
          --set rollout.mem_fraction_static=0.45)  # 0.7 is per GPU of TP 2; the whole
                                                  # trainer (56 GB at init) shares this one
  fi
  if [ "${mode}" = colocate ] || [[ "${mode}" == shared-* || "${mode}" == fully-async-* ]]; then
    # one GPU; the 2-GPU job's batch shape and data
    args=(--config configs/qwen3-0.6b-grpo.yaml --set "cluster.run_dir=${run_dir}"
          --set "checkpoint.save=${run_dir}/ckpt" --set "eval.datasets=[]" --set eval.interval=null
          --set data.prompt_data=data/demo/train.jsonl --set data.input_key=input
          --set reward.rm_type=exact_match --set rollout.max_response_len=1024
          --set data.rollout_batch_size=32 --set train.global_batch_size=256
          --set "data.num_rollout=${rollouts}" --set checkpoint.save_interval=1000
          --set train.max_tokens_per_gpu=16384)
    if [ "${mode}" != colocate ]; then  # engine and trainer share the GPU at once
      args+=(--set cluster.offload_train=false --set cluster.offload_rollout=false)
      # SLIME_SHARED_SETS: more --set pairs for the shared modes (an 80 GB card needs a smaller
      # engine share and trainer micro-batch than the H200 the defaults fit).
      read -r -a extra <<< "${SLIME_SHARED_SETS:-}"
      args+=("${extra[@]}")
    fi
    [ "${mode}" = shared-async ] && args+=(--async)
    if [[ "${mode}" == fully-async-* ]]; then
      args+=(--fully-async --set "rollout.max_staleness=${mode#fully-async-}")
    fi
  fi
  echo "== ${mode}: slime_train ${args[*]}"
  start=$(date +%s)
  if [ "${mode}" = colocate ] || [ "${mode}" = colocate-4b ] || [[ "${mode}" == shared-* ]] ||
     [[ "${mode}" == fully-async-* ]]; then
    (while sleep 1; do nvidia-smi --query-gpu=index,memory.used --format=csv,noheader -i 0; done) \
      > "${logs}/${mode}.mem" 2>&1 &
    (while sleep 1; do echo "$(date +%T) $(free -m | awk '/Mem:/{print $3}')"; done) \
      > "${logs}/${mode}.host" 2>&1 &
    host_pid=$!
    mem_pid=$!
    CUDA_VISIBLE_DEVICES=0 "${bin}" "${args[@]}" > "${logs}/${mode}.log" 2>&1
    rc=$?
    kill "${mem_pid}" "${host_pid}" 2>/dev/null
    echo "colocate: host memory used (MiB, free -m) max over the run: $(awk '{print $2}' "${logs}/${mode}.host" | sort -n | tail -1)"
    echo "colocate: GPU 0 memory used (MiB) min/max over the run: $(awk -F', ' '{gsub(/ MiB/,"",$2); print $2}' "${logs}/${mode}.mem" | sort -n | sed -n '1p;$p' | tr '\n' ' ')"
  elif [ "${mode}" = kill ]; then
    "${bin}" "${args[@]}" > "${logs}/${mode}.log" 2>&1 &
    pid=$!
    # SIGKILL the engine worker 3 s into rollout 2's generation (~8 s long): rollout 1's
    # summary line is printed after its weight sync, right before rollout 2 starts.
    for _ in $(seq 1 1200); do
      grep -qE "^rollout 1/" "${logs}/${mode}.log" && break
      sleep 0.25
    done
    sleep 3
    victim=$(pgrep -f -- "--actor engine-0" | head -1)
    echo "killing engine-0 worker pid ${victim} at $(date +%T)"
    [ -n "${victim}" ] && kill -9 "${victim}"
    wait "${pid}"
    rc=$?
  else
    "${bin}" "${args[@]}" > "${logs}/${mode}.log" 2>&1
    rc=$?
  fi
  echo "${mode}: exit ${rc} in $(( $(date +%s) - start )) s"
  cp "${run_dir}/metrics.jsonl" "${logs}/${mode}.jsonl" 2>/dev/null
  summary "${logs}/${mode}.log" "${logs}/${mode}.jsonl"
  if [[ "${mode}" == shared-* || "${mode}" == fully-async-* || "${mode}" == colocate ]]; then
    throughput "${logs}/${mode}.log" "${logs}/${mode}.jsonl" 256
  fi
done
