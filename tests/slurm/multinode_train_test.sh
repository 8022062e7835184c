#!/usr/bin/env bash
# Real training jobs over several node agents on one host, without SLURM: the driver (the runtime
# head, with node 0's agent in-process) listens on 127.0.0.4 and each `slime_train agent` is a
# node of its own bound to its own loopback address (--bind 127.0.0.2, 127.0.0.3) with its own
# CPU slots. On one host every 127.x address reaches every process, so a job that dials
# 127.0.0.1 where it should dial a node's address would still work: the test asserts the
# addresses from the logs (every c10d store, every Gloo transport) and from the sockets the
# workers actually hold (tests/slurm/worker_sockets.py: their node's address or all interfaces,
# no connection to 127.0.0.1, no listening socket inherited from the agent or the driver), and
# that no log of a job mentions 127.0.0.1 at all. The tiny GRPO recipe (a random 2-layer Qwen3
# with a 288-token vocabulary; random reward, so that every step has a gradient;
# weight_sync.check_weight_update_equal on); three jobs:
#   1. dp: cluster.num_nodes 2 (node0 + agent nodeb), 2 data-parallel trainers and 2 engines,
#      one of each per node (placement_strategy: spread), 2 rollouts, a checkpoint per rollout:
#      exit 0, both rollouts trained (metrics JSONL, grad norm > 0), the trainers' DP group and
#      the weight-update group on node0's address with nodeb's ranks on 127.0.0.2, engines on
#      both nodes generating with the synced weights, checkpoints 0 and 1 written;
#   2. tp: cluster.num_nodes 3 (node0 + nodeb + nodec), 4 trainers = TP 2 × DP 2 and 3 engines,
#      one per node: the TP group of DP index 1 spans nodeb and nodec, its store on nodeb
#      (127.0.0.2); the DP groups span node0 and the agents; the engines get the TP-gathered full
#      weights (checksums equal after every sync);
#   3. resume: job 1's checkpoint resumed for one more rollout (data.num_rollout 3, the same
#      lr schedule through train.lr_decay_iters), with the second trainer on a new agent nodec
#      (127.0.0.3) this time: "resumed from .../iter_0000001 at rollout 2", both trainers
#      loaded rollout 1 / step 2, only rollout 2 runs, with the prompts an uninterrupted run
#      gives rollout 2, and the tracker then names iteration 2.
#   4. lost: job 1's layout for 40 rollouts with engine and trainer restarts allowed; agent
#      nodeb is SIGKILLed after rollout 0: the job fails (exit 1) within the heartbeat timeout,
#      naming the node, spends no restart on it and leaves no worker behind.
# Jobs 1-3 must exit 0, their agents must exit 0 on SIGTERM afterwards, and no worker may be left.
#
# Usage: multinode_train_test.sh SLIME_TRAIN_BIN SOURCE_DIR
# Exit: 0 pass, 1 fail, 77 skip (only when the Qwen3 tokenizer of scripts/fetch_test_data.sh is
# missing; says so).
set -uo pipefail
bin=${1:?usage: multinode_train_test.sh SLIME_TRAIN_BIN SOURCE_DIR}
src=${2:?usage: multinode_train_test.sh SLIME_TRAIN_BIN SOURCE_DIR}
sockets_py="$(cd "$(dirname "$0")" && pwd)/worker_sockets.py"
head_ip=127.0.0.4

failures=0
log() { echo "[multinode_train_test $(date '+%H:%M:%S')] $*"; }
fail() { log "FAIL: $*"; failures=$((failures + 1)); }

[ -x "$bin" ] || { log "FAIL: no slime_train binary at $bin"; exit 1; }
tokenizer="${SLIME_TEST_DATA:-$src/.cache/testdata}/qwen3"
if [ ! -f "$tokenizer/tokenizer.json" ]; then
  log "SKIP: $tokenizer/tokenizer.json is missing: run scripts/fetch_test_data.sh"
  exit 77
fi

tmp=$(mktemp -d /tmp/slime_multinode.XXXXXX)
# Every process this test starts carries this variable (workers inherit it from their agent),
# so the cleanup and the watchdog find them all, and nothing else.
export SLIME_MULTINODE_TEST_TAG="$tmp"
tagged_procs() {
  local file pid
  for file in $(grep -lzx "SLIME_MULTINODE_TEST_TAG=$tmp" /proc/[0-9]*/environ 2> /dev/null); do
    pid=${file#/proc/}
    pid=${pid%/environ}
    case " $$ $BASHPID " in *" $pid "*) continue ;; esac
    echo "$pid"
  done
}
cleanup() {
  for pid in $(tagged_procs); do kill -KILL "$pid" 2> /dev/null; done
  if [ "$failures" -ne 0 ] || [ -n "${SLIME_KEEP_TEST_DIR:-}" ]; then
    log "kept $tmp for inspection"
  else
    rm -rf "$tmp"
  fi
}
trap cleanup EXIT
# A ctest timeout SIGKILLs this script: a watchdog in its own session then kills what it started.
env -u SLIME_MULTINODE_TEST_TAG setsid bash -c '
  while kill -0 "$1" 2> /dev/null; do sleep 1; done
  for f in $(grep -lzx "SLIME_MULTINODE_TEST_TAG=$2" /proc/[0-9]*/environ 2> /dev/null); do
    p=${f#/proc/}
    kill -KILL "${p%/environ}"
  done' _ "$$" "$tmp" > /dev/null 2>&1 < /dev/null &

expect_grep() {  # expect_grep WHAT PATTERN FILE...
  local what=$1 pattern=$2
  shift 2
  grep -qE -- "$pattern" "$@" 2> /dev/null || fail "$what: /$pattern/ not found in $*"
}

# The model and its tokenizer: the quickstart's tiny shape over the byte-level subset of Qwen3's
# tokenizer (docs/data.md), random weights.
if ! "$bin" make-byte-tokenizer --from "$tokenizer" --out "$tmp/tokenizer" > "$tmp/init.log" 2>&1 ||
   ! "$bin" init-model --config "$src/configs/tiny-model/config.json" --tokenizer "$tmp/tokenizer" \
       --out "$tmp/model" --dtype fp32 --seed 3 >> "$tmp/init.log" 2>&1; then
  log "FAIL: the tiny model could not be made: $(tail -n 5 "$tmp/init.log")"
  failures=1
  exit 1
fi
data="$src/data/demo/train.jsonl"

# write_config NAME NUM_NODES SLOTS TRAINERS_PER_NODE ENGINES TP NUM_ROLLOUT [LOAD_DIR]
# The job's YAML: 4 prompts × 8 samples of at most 4 tokens per rollout, one optimizer step each.
write_config() {
  local name=$1 nodes=$2 slots=$3 per_node=$4 engines=$5 tp=$6 rollouts=$7 load=${8:-}
  local run="$tmp/$name" save="$tmp/$name/ckpt"
  local load_line=""
  if [ -n "$load" ]; then
    save=$load
    load_line="  load: $load"
  fi
  mkdir -p "$run"
  cat > "$tmp/$name.yaml" << EOF
cluster:
  device: cpu
  num_nodes: $nodes
  cpu_slots_per_node: $slots
  placement_strategy: spread
  actor_num_nodes: 2
  actor_num_gpus_per_node: $per_node
  rollout_num_gpus: $engines
  rollout_num_gpus_per_engine: 1
  head_address: $head_ip:0
  run_dir: $run
model:
  hf_checkpoint: $tmp/model
data:
  prompt_data: $data@[0:16]
  input_key: input
  label_key: label
  apply_chat_template: true
  rollout_batch_size: 4
  n_samples_per_prompt: 8
  num_rollout: $rollouts
rollout:
  max_response_len: 4
  skip_special_tokens: true
reward:
  rm_type: random
algorithm:
  use_kl_loss: false
train:
  bf16: false
  lr: 1.0e-4
  lr_decay_iters: 64
  global_batch_size: 32
  micro_batch_size: 8
  tensor_model_parallel_size: $tp
weight_sync:
  check_weight_update_equal: true
metrics:
  prometheus_host: $head_ip
checkpoint:
  save: $save
  save_interval: 1
$load_line
debug:
  save_debug_rollout_data: $run/dump/rollout_{rollout_id}.json
EOF
}

# run_job NAME AGENT... (AGENT = node-name=address=slots). Starts the driver, then the agents one
# by one (each registered before the next: node order, hence placement, is fixed), samples the
# workers' sockets while the job runs, waits for the driver (rc in job_rc), then stops the agents
# with SIGTERM and checks they exit 0 and no worker is left.
job_rc=""
run_job() {
  local name=$1
  shift
  local run="$tmp/$name" head_out="$tmp/$name/head.out"
  local head_pid spec node addr slots address deadline rc pid
  local agent_pids=() watch_args=()
  log "job $name: driver on $head_ip, agents: $*"
  "$bin" --config "$tmp/$name.yaml" > "$head_out" 2>&1 &
  head_pid=$!
  watch_args+=("$head_pid=$head_ip")
  deadline=$((SECONDS + 60))
  until [ -s "$run/head.json" ]; do
    if [ "$SECONDS" -ge "$deadline" ] || ! kill -0 "$head_pid" 2> /dev/null; then
      fail "job $name: the driver wrote no $run/head.json"
      break
    fi
    sleep 0.1
  done
  address=$(sed -n 's/.*"address"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' "$run/head.json" 2> /dev/null)
  [[ "$address" == "$head_ip":[0-9]* ]] || fail "job $name: head.json names '$address', expected $head_ip:PORT"
  for spec in "$@"; do
    IFS== read -r node addr slots <<< "$spec"
    "$bin" agent --head "$address" --token-file "$run/head.json" --node-name "$node" \
      --bind "$addr" --cpu-slots "$slots" > "$run/agent-$node.out" 2>&1 &
    agent_pids+=($!)
    watch_args+=("$!=$addr")
    deadline=$((SECONDS + 60))
    until grep -q "node $node registered" "$head_out"; do
      if [ "$SECONDS" -ge "$deadline" ] || ! kill -0 "$head_pid" 2> /dev/null; then
        fail "job $name: agent $node never registered"
        break
      fi
      sleep 0.1
    done
  done
  python3 "$sockets_py" watch "$run/sockets.json" "${watch_args[@]}" &
  local watch_pid=$!
  deadline=$((SECONDS + 150))
  while kill -0 "$head_pid" 2> /dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
  if kill -0 "$head_pid" 2> /dev/null; then
    fail "job $name: the driver still runs after 150 s; stopping it"
    kill -TERM "$head_pid"
  fi
  wait "$head_pid"
  job_rc=$?
  for pid in "${agent_pids[@]}"; do kill -TERM "$pid" 2> /dev/null; done
  for i in "${!agent_pids[@]}"; do
    wait "${agent_pids[$i]}"
    rc=$?
    [ "$rc" = 0 ] || fail "job $name: agent $((i + 1)) exited with $rc after SIGTERM, expected 0"
  done
  wait "$watch_pid"
  for pid in $(sed -n 's/.*actor [a-z]*-[0-9]* alive: pid \([0-9]*\) .*/\1/p' "$head_out"); do
    [ -d "/proc/$pid" ] && [ "$(awk '{print $3}' "/proc/$pid/stat" 2> /dev/null)" != Z ] &&
      fail "job $name: worker pid $pid left behind"
  done
  log "job $name: driver exit code $job_rc"
}

# check_common NAME NUM_ENGINES NUM_WORKERS NUM_SYNCS: what every job must show.
check_common() {
  local name=$1 engines=$2 workers=$3 syncs=$4
  local run="$tmp/$name" out
  [ "$job_rc" = 0 ] || fail "job $name: driver exit code $job_rc, expected 0"
  expect_grep "job $name: head on $head_ip" "runtime head listening on $head_ip:[0-9]+" "$run/head.out"
  # Nothing of the job is on, or dials, 127.0.0.1: the head, the agents, the workers, the
  # stores, the Gloo transports, the engines, the metrics server (the logs name them all).
  out=$(grep -l "127\.0\.0\.1" "$run/head.out" "$run"/agent-*.out "$run"/logs/*.log 2> /dev/null)
  [ -z "$out" ] || fail "job $name: 127.0.0.1 appears in $(echo $out): $(grep -h "127\.0\.0\.1" $out | head -n 3)"
  if ! out=$(python3 "$sockets_py" check "$run/sockets.json" --min-workers "$workers" 2>&1); then
    fail "job $name: the workers' sockets:
$out"
  fi
  # Every engine holds the trainer's tensors after the initial push and after each rollout's sync.
  local synced
  synced=$(grep -cE "weight sync: the $engines engine\(s\) hold the trainer's [0-9]+ tensors \(checksums equal" \
    "$run/logs/trainer-0.log" 2> /dev/null)
  [ "${synced:-0}" = "$syncs" ] ||
    fail "job $name: trainer-0 logged ${synced:-0} equal-checksum checks of $engines engines, expected $syncs"
}

# check_metrics NAME ROLLOUT...: each rollout trained exactly there (a step with a non-zero
# gradient, 32 samples), and no other rollout id in the run's metrics.
check_metrics() {
  local name=$1
  shift
  local out
  if ! out=$(python3 - "$tmp/$name/metrics.jsonl" "$@" << 'EOF'
import json, sys
path, want = sys.argv[1], sorted(int(r) for r in sys.argv[2:])
records = [json.loads(line) for line in open(path) if line.strip()]
ids = sorted({r["rollout_id"] for r in records if "rollout_id" in r})
problems = [] if ids == want else [f"rollout ids {ids}, expected {want}"]
for rid in want:
    summary = [r for r in records if r.get("rollout_id") == rid and "rollout/samples" in r]
    if not summary:
        problems.append(f"rollout {rid}: no summary record")
        continue
    s = summary[-1]
    if s["rollout/samples"] != 32:
        problems.append(f"rollout {rid}: {s['rollout/samples']} samples, expected 32")
    if not s.get("train/grad_norm", 0) > 0:
        problems.append(f"rollout {rid}: train/grad_norm {s.get('train/grad_norm')}, expected > 0")
print("; ".join(problems))
sys.exit(1 if problems else 0)
EOF
  ); then
    fail "job $name: metrics: $out"
  fi
}

# check_dump NAME ROLLOUT ENGINE_HOSTS: the rollout's prompts are rows [4r, 4r+4) of the data
# (what an uninterrupted run draws), generated by engines on each of ENGINE_HOSTS (space-separated
# IPs) with the weights of version r.
check_dump() {
  local name=$1 rollout=$2 hosts=$3 out
  if ! out=$(python3 - "$tmp/$name/dump/rollout_$rollout.json" "$data" "$rollout" "$hosts" << 'EOF'
import json, sys
dump, data, rollout, hosts = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split()
d = json.load(open(dump))
rows = [json.loads(line)["input"] for line in open(data) if line.strip()]
samples = [s for group in d["samples"] for s in group]
prompts = [group[0]["prompt"] for group in d["samples"]]
problems = []
if prompts != rows[4 * rollout:4 * rollout + 4]:
    problems.append(f"prompts {prompts}, expected rows {4 * rollout}..{4 * rollout + 3}: "
                    f"{rows[4 * rollout:4 * rollout + 4]}")
used = sorted({s["metadata"]["engine"].rsplit(":", 1)[0] for s in samples})
if used != sorted(hosts):
    problems.append(f"generated by engines on {used}, expected {sorted(hosts)}")
versions = sorted({v for s in samples for v in s["weight_versions"]})
if versions != [str(rollout)]:
    problems.append(f"weight versions {versions}, expected ['{rollout}']")
print("; ".join(problems))
sys.exit(1 if problems else 0)
EOF
  ); then
    fail "job $name: rollout $rollout data: $out"
  fi
}

# actor_on NAME ACTOR NODE ADDRESS: the head placed ACTOR on NODE, its worker serving on ADDRESS.
actor_on() {
  expect_grep "job $1: $2 on $3 ($4)" "actor $2 alive: pid [0-9]+ on node $3 at ${4//./\\.}:[0-9]+ " \
    "$tmp/$1/head.out"
}

# group_line NAME ACTOR GROUP RANK SIZE STORE_IP TRANSPORT_IP: the actor joined GROUP as RANK of
# SIZE, its store (the group leader's address, i.e. the master address) on STORE_IP and its own
# Gloo transport on TRANSPORT_IP. Sets `port` to the store's port.
port=""
group_line() {
  local name=$1 actor=$2 group=$3 rank=$4 size=$5 store=$6 transport=$7 line
  port="none"
  local pattern="comm: joined group '$group' \(gloo, rank $rank of $size, store ${store//./\\.}:[0-9]+\)"
  pattern+="; gloo transport on ${transport//./\\.}$"
  line=$(grep -E "$pattern" "$tmp/$name/logs/$actor.log" 2> /dev/null | tail -n 1)
  if [ -z "$line" ]; then
    fail "job $name: $actor did not join '$group' as rank $rank of $size, store on $store," \
      "transport on $transport: $(grep -h "joined group '$group'" "$tmp/$name/logs/$actor.log" 2> /dev/null)"
    return
  fi
  port=$(echo "$line" | sed -n 's/.*store [0-9.]*:\([0-9]*\)).*/\1/p')
}

same_port() {  # same_port WHAT PORT...: every rank names the same store
  local what=$1 first=$2
  shift 2
  for p in "$@"; do [ "$p" = "$first" ] || fail "$what: ranks name different stores ($first vs $p)"; done
}

# ---- 1. dp: two nodes, two data-parallel trainers and two engines, one of each per node.
write_config dp 2 2 1 2 1 2
run_job dp nodeb=127.0.0.2=2
check_common dp 2 4 3
expect_grep "job dp: two nodes" "starting 2 trainer\(s\) and 2 engine\(s\) on 2 node\(s\)" "$tmp/dp/head.out"
actor_on dp trainer-0 node0 "$head_ip"
actor_on dp trainer-1 nodeb 127.0.0.2
actor_on dp engine-0 node0 "$head_ip"
actor_on dp engine-1 nodeb 127.0.0.2
expect_grep "job dp: DP 2 groups" \
  "tensor-parallel size 1 × data-parallel size 2 × pipeline-parallel size 1 \(2 ranks\): groups formed" \
  "$tmp/dp/head.out"
group_line dp trainer-0 slime_trainer_dp0 0 2 "$head_ip" "$head_ip"
p0=$port
group_line dp trainer-1 slime_trainer_dp0 1 2 "$head_ip" 127.0.0.2
p1=$port
same_port "job dp: the DP group" "$p0" "$p1"
group_line dp trainer-0 weight_update_group 0 3 "$head_ip" "$head_ip"
w0=$port
group_line dp engine-0 weight_update_group 1 3 "$head_ip" "$head_ip"
w1=$port
group_line dp engine-1 weight_update_group 2 3 "$head_ip" 127.0.0.2
w2=$port
same_port "job dp: the weight-update group" "$w0" "$w1" "$w2"
expect_grep "job dp: trainer-1 is DP rank 1" "dp rank 1/2, tp rank 0/1" "$tmp/dp/logs/trainer-1.log"
check_metrics dp 0 1
check_dump dp 0 "$head_ip 127.0.0.2"
check_dump dp 1 "$head_ip 127.0.0.2"
expect_grep "job dp: finished" "^done: rollouts 0\.\.1 " "$tmp/dp/head.out"
for i in 0 1; do
  [ -f "$tmp/dp/ckpt/iter_000000$i/trainer_state.json" ] || fail "job dp: no checkpoint iter_000000$i"
done
[ "$(cat "$tmp/dp/ckpt/latest_checkpointed_iteration.txt" 2> /dev/null)" = 1 ] ||
  fail "job dp: the tracker names '$(cat "$tmp/dp/ckpt/latest_checkpointed_iteration.txt" 2> /dev/null)', expected 1"
dp_failed=$failures

# ---- 2. tp: three nodes, TP 2 × DP 2 trainers (the TP group of DP index 1 spans the two
# agents), three engines, one per node.
write_config tp 3 3 2 3 2 2
run_job tp nodeb=127.0.0.2=3 nodec=127.0.0.3=3
check_common tp 3 7 3
expect_grep "job tp: three nodes" "starting 4 trainer\(s\) and 3 engine\(s\) on 3 node\(s\)" "$tmp/tp/head.out"
actor_on tp trainer-0 node0 "$head_ip"
actor_on tp trainer-1 node0 "$head_ip"
actor_on tp trainer-2 nodeb 127.0.0.2
actor_on tp trainer-3 nodec 127.0.0.3
actor_on tp engine-0 node0 "$head_ip"
actor_on tp engine-1 nodeb 127.0.0.2
actor_on tp engine-2 nodec 127.0.0.3
expect_grep "job tp: TP 2 × DP 2 groups" \
  "tensor-parallel size 2 × data-parallel size 2 × pipeline-parallel size 1 \(4 ranks\): groups formed" \
  "$tmp/tp/head.out"
expect_grep "job tp: trainer-3's coordinates" "dp rank 1/2, tp rank 1/2" "$tmp/tp/logs/trainer-3.log"
# The TP group across nodes: led by trainer-2 on nodeb, its store on nodeb's address.
group_line tp trainer-2 slime_trainer_tp1 0 2 127.0.0.2 127.0.0.2
t2=$port
group_line tp trainer-3 slime_trainer_tp1 1 2 127.0.0.2 127.0.0.3
t3=$port
same_port "job tp: the TP group of nodeb and nodec" "$t2" "$t3"
group_line tp trainer-0 slime_trainer_tp0 0 2 "$head_ip" "$head_ip"
t0=$port
group_line tp trainer-1 slime_trainer_tp0 1 2 "$head_ip" "$head_ip"
t1=$port
same_port "job tp: the TP group of node0" "$t0" "$t1"
# The DP groups: node0's ranks lead, the agents' ranks join from their own addresses.
group_line tp trainer-0 slime_trainer_dp0 0 2 "$head_ip" "$head_ip"
d0=$port
group_line tp trainer-2 slime_trainer_dp0 1 2 "$head_ip" 127.0.0.2
d2=$port
same_port "job tp: DP group 0" "$d0" "$d2"
group_line tp trainer-1 slime_trainer_dp1 0 2 "$head_ip" "$head_ip"
d1=$port
group_line tp trainer-3 slime_trainer_dp1 1 2 "$head_ip" 127.0.0.3
d3=$port
same_port "job tp: DP group 1" "$d1" "$d3"
group_line tp engine-1 weight_update_group 2 4 "$head_ip" 127.0.0.2
e1=$port
group_line tp engine-2 weight_update_group 3 4 "$head_ip" 127.0.0.3
e2=$port
same_port "job tp: the weight-update group" "$e1" "$e2"
check_metrics tp 0 1
check_dump tp 1 "$head_ip 127.0.0.2 127.0.0.3"
expect_grep "job tp: finished" "^done: rollouts 0\.\.1 " "$tmp/tp/head.out"

# ---- 3. resume: job 1's checkpoint, one more rollout, the second trainer on another agent.
if [ "$dp_failed" -ne 0 ]; then
  fail "job resume: not run (job dp failed, its checkpoint is not trusted)"
else
  write_config resume 2 2 1 2 1 3 "$tmp/dp/ckpt"
  run_job resume nodec=127.0.0.3=2
  check_common resume 2 4 2
  actor_on resume trainer-1 nodec 127.0.0.3
  expect_grep "job resume: resumed at rollout 2" \
    "^resumed from $tmp/dp/ckpt/iter_0000001 at rollout 2$" "$tmp/resume/head.out"
  for t in 0 1; do
    expect_grep "job resume: trainer-$t loaded rollout 1" \
      "trainer: resumed from $tmp/dp/ckpt/iter_0000001 \(rollout 1, step 2\)" "$tmp/resume/logs/trainer-$t.log"
  done
  expect_grep "job resume: only rollout 2 ran" "^done: rollouts 2\.\.2 " "$tmp/resume/head.out"
  check_metrics resume 2
  check_dump resume 2 "$head_ip 127.0.0.3"
  [ "$(cat "$tmp/dp/ckpt/latest_checkpointed_iteration.txt" 2> /dev/null)" = 2 ] ||
    fail "job resume: the tracker names '$(cat "$tmp/dp/ckpt/latest_checkpointed_iteration.txt" 2> /dev/null)', expected 2"
fi

# ---- 4. lost: job 1's layout with 40 rollouts and restarts allowed; agent nodeb is SIGKILLed
# once rollout 0 is done. Its workers die with it and the node cannot come back (placement is
# fixed), so the job must fail within the head's heartbeat timeout (10 s), naming the node, with
# no restart spent on it and no worker left on node0.
write_config lost 2 2 1 2 1 40
cat >> "$tmp/lost.yaml" << EOF
fault_tolerance:
  max_engine_restarts: 3
  max_trainer_restarts: 2
EOF
lost_out="$tmp/lost/head.out"
log "job lost: driver on $head_ip, agent nodeb=127.0.0.2 (SIGKILLed after rollout 0)"
"$bin" --config "$tmp/lost.yaml" > "$lost_out" 2>&1 &
lost_pid=$!
deadline=$((SECONDS + 60))
until [ -s "$tmp/lost/head.json" ] || [ "$SECONDS" -ge "$deadline" ]; do sleep 0.1; done
address=$(sed -n 's/.*"address"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' "$tmp/lost/head.json" 2> /dev/null)
"$bin" agent --head "$address" --token-file "$tmp/lost/head.json" --node-name nodeb \
  --bind 127.0.0.2 --cpu-slots 2 > "$tmp/lost/agent-nodeb.out" 2>&1 &
lost_agent=$!
deadline=$((SECONDS + 150))
until grep -q "rollout 0/40 |" "$lost_out" || [ "$SECONDS" -ge "$deadline" ] ||
      ! kill -0 "$lost_pid" 2> /dev/null; do sleep 0.1; done
if ! grep -q "rollout 0/40 |" "$lost_out"; then
  fail "job lost: rollout 0 never finished"
  kill -KILL "$lost_pid" "$lost_agent" 2> /dev/null
else
  kill -KILL "$lost_agent"
  killed_ms=$(($(date +%s%N) / 1000000))
  deadline=$((SECONDS + 60))
  while kill -0 "$lost_pid" 2> /dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
  took_ms=$(($(date +%s%N) / 1000000 - killed_ms))
  if kill -0 "$lost_pid" 2> /dev/null; then
    fail "job lost: the driver still runs 60 s after agent nodeb was killed"
    kill -KILL "$lost_pid"
  fi
  wait "$lost_pid"
  rc=$?
  log "job lost: driver exit code $rc, $took_ms ms after the agent was killed"
  [ "$rc" = 1 ] || fail "job lost: driver exit code $rc, expected 1"
  # The heartbeat timeout (10 s), then the driver's shutdown: well under 25 s.
  [ "$took_ms" -lt 25000 ] || fail "job lost: the job took $took_ms ms to fail, expected < 25 s"
  expect_grep "job lost: the node is named lost" "node nodeb lost: no agent heartbeat for [0-9.]+ s" "$lost_out"
  expect_grep "job lost: the failure names the node" \
    "on node nodeb died: its node nodeb was lost .*its node nodeb is lost and no other node has its devices" "$lost_out"
  grep -q "restart 1/" "$lost_out" && fail "job lost: a restart was spent on the lost node: $(grep "restart 1/" "$lost_out" | head -n 1)"
  for pid in $(sed -n 's/.*actor [a-z]*-[0-9]* alive: pid \([0-9]*\) .*/\1/p' "$lost_out"); do
    [ -d "/proc/$pid" ] && [ "$(awk '{print $3}' "/proc/$pid/stat" 2> /dev/null)" != Z ] &&
      fail "job lost: worker pid $pid left behind"
  done
fi

if [ "$failures" -ne 0 ]; then
  for f in "$tmp"/*/head.out; do log "---- $f"; tail -n 25 "$f"; done
  log "$failures check(s) failed"
  exit 1
fi
log "all checks passed"
exit 0
