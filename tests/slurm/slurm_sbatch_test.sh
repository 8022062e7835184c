#!/usr/bin/env bash
# scripts/slurm/slime_train.sbatch on a real one-node SLURM cluster that this test starts:
# slurmctld -D and slurmd -D on localhost (auth/none, state, spool and logs in a temp dir, ports
# picked free), then five jobs:
#   1. runtime-check with two agents on the node acting as separate nodes (3 runtime nodes,
#      6 test actors): COMPLETED, exit code 0, head started, both agents registered, every
#      actor answered, per-node logs in the run dir;
#   2. the same job held up, `slime_train status` on it, then `scancel --batch --signal=TERM`:
#      the script forwards SIGTERM to the head, which stops every actor; exit code 143;
#   3. a head that fails (more actors than slots): the job's exit code is the head's (2);
#   4. train mode without SLIME_CONFIG: refused with a message naming it, exit code 2;
#   5. a real training job (train mode): the tiny GRPO recipe, 2 rollouts, on the head's node and
#      one agent node, actors on both: COMPLETED, both rollouts trained, a checkpoint written.
# Every daemon and job process is gone at the end (cancel, kill, /proc sweep).
#
# Usage: slurm_sbatch_test.sh SLIME_TRAIN_BIN SOURCE_DIR
# Exit: 0 pass, 1 fail, 77 skip (only when slurmctld/slurmd cannot run here; says why).
set -uo pipefail
PATH="$PATH:/usr/sbin:/sbin"
bin=${1:?usage: slurm_sbatch_test.sh SLIME_TRAIN_BIN SOURCE_DIR}
src=${2:?usage: slurm_sbatch_test.sh SLIME_TRAIN_BIN SOURCE_DIR}
sbatch_script="$src/scripts/slurm/slime_train.sbatch"

failures=0
log() { echo "[slurm_test $(date '+%H:%M:%S')] $*"; }
fail() { log "FAIL: $*"; failures=$((failures + 1)); }
skip() { log "SKIP: $*"; exit 77; }

for tool in slurmctld slurmd sinfo sbatch scontrol scancel squeue srun; do
  command -v "$tool" > /dev/null ||
    skip "SLURM cannot start here: '$tool' is not installed (scripts/setup.sh installs slurmctld, slurmd and slurm-client)"
done
[ -x "$bin" ] || { log "FAIL: no slime_train binary at $bin"; exit 1; }

tmp=$(mktemp -d /tmp/slime_slurm_test.XXXXXX)
export SLURM_CONF="$tmp/slurm.conf"
ctld_pid=""
slurmd_pid=""

# Pids of the processes whose environment names this cluster's slurm.conf (jobs and their
# children, slurmstepd), other than this script and the daemons.
cluster_procs() {
  local file pid
  for file in $(grep -lzx "SLURM_CONF=$SLURM_CONF" /proc/[0-9]*/environ 2> /dev/null); do
    pid=${file#/proc/}
    pid=${pid%/environ}
    case " $$ $BASHPID $ctld_pid $slurmd_pid " in *" $pid "*) continue ;; esac
    # slurmctld's own helper (slurmscriptd) lives as long as the daemon.
    [ -n "$ctld_pid" ] && grep -qx "PPid:[[:space:]]*$ctld_pid" "/proc/$pid/status" 2> /dev/null && continue
    echo "$pid"
  done
}

# Cancels every job, stops the daemons and kills whatever is left. Runs on every exit path.
cleanup() {
  if [ -n "$ctld_pid" ]; then
    scancel --quiet --user="$(id -un)" 2> /dev/null
    for _ in $(seq 100); do [ -z "$(squeue -h 2> /dev/null)" ] && break; sleep 0.2; done
  fi
  for pid in $slurmd_pid $ctld_pid; do kill -TERM "$pid" 2> /dev/null; done
  for pid in $slurmd_pid $ctld_pid; do
    for _ in $(seq 50); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2> /dev/null
    wait "$pid" 2> /dev/null
  done
  for pid in $(cluster_procs); do kill -KILL "$pid" 2> /dev/null; done
  if [ "$failures" -ne 0 ] || [ -n "${SLIME_KEEP_TEST_DIR:-}" ]; then
    log "kept $tmp for inspection"
  else
    rm -rf "$tmp"
  fi
}
trap cleanup EXIT
# When this script is SIGKILLed (a ctest timeout), a watchdog in its own session kills the
# daemons and the job processes: everything whose environment names this slurm.conf.
env -u SLURM_CONF setsid bash -c '
  while kill -0 "$1" 2> /dev/null; do sleep 1; done
  for f in $(grep -lzx "SLURM_CONF=$2" /proc/[0-9]*/environ 2> /dev/null); do
    p=${f#/proc/}
    kill -KILL "${p%/environ}"
  done' _ "$$" "$SLURM_CONF" > /dev/null 2>&1 < /dev/null &

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

node=$(hostname -s)
cpus=$(slurmd -C 2> /dev/null | sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' | head -n 1)
[ -n "$cpus" ] || cpus=$(nproc)
mkdir -p "$tmp/state" "$tmp/spool" "$tmp/log" "$tmp/runs"
cat > "$SLURM_CONF" << EOF
# A one-node cluster for slime-cpp's tests (tests/slurm/slurm_sbatch_test.sh).
ClusterName=slimetest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=$(id -un)
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
KillWait=10
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF

slurmctld -D -i -f "$SLURM_CONF" > "$tmp/log/slurmctld.out" 2>&1 &
ctld_pid=$!
slurmd -D -N "$node" -f "$SLURM_CONF" > "$tmp/log/slurmd.out" 2>&1 &
slurmd_pid=$!

# SLURM is up when the node is idle; a daemon that exits or a node that never gets idle means
# SLURM cannot run on this machine (the only reason to skip).
up=0
for _ in $(seq 150); do
  if ! kill -0 "$ctld_pid" 2> /dev/null || ! kill -0 "$slurmd_pid" 2> /dev/null; then break; fi
  if [ "$(sinfo -h -n "$node" -o %t 2> /dev/null)" = idle ]; then up=1; break; fi
  sleep 0.2
done
if [ "$up" != 1 ]; then
  why=$(tail -n 5 "$tmp/log/slurmctld.out" "$tmp/log/slurmd.out" "$tmp/log/"*.log 2> /dev/null)
  failures=1  # keep the logs
  skip "slurmctld/slurmd did not bring node $node up within 30 s on this machine:
$why"
fi
log "SLURM up: node $node idle ($cpus CPUs), conf $SLURM_CONF"
cd "$tmp" || exit 1  # submit from outside the checkout: the script finds agent.sh by itself

# Submits the sbatch script with the given environment (VAR=value ...) and prints the job id.
submit() {
  local name=$1
  shift
  env SLIME_MODE=runtime-check "$@" SLIME_TRAIN_BIN="$bin" SLIME_RUN_DIR="$tmp/runs/$name" \
    sbatch --parsable --job-name="slime-$name" --output="$tmp/runs/$name.out" "$sbatch_script"
}

job_field() {  # job_field JOBID FIELD -> value from scontrol show job
  scontrol show job "$1" 2> /dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}

# Waits until the job leaves PENDING/RUNNING/COMPLETING; prints its state.
wait_job() {
  local id=$1 timeout_s=$2 state=""
  local deadline=$((SECONDS + timeout_s))
  while [ "$SECONDS" -lt "$deadline" ]; do
    state=$(job_field "$id" JobState)
    case "$state" in PENDING | RUNNING | COMPLETING | CONFIGURING | "") sleep 0.5 ;; *) break ;; esac
  done
  echo "$state"
}

expect_grep() {  # expect_grep WHAT PATTERN FILE...
  local what=$1 pattern=$2
  shift 2
  grep -qE -- "$pattern" "$@" 2> /dev/null || fail "$what: /$pattern/ not found in $*"
}

show_logs() {
  local name=$1
  log "---- $name: sbatch output"
  cat "$tmp/runs/$name.out" 2> /dev/null
  for f in "$tmp/runs/$name/logs/"head-*.log "$tmp/runs/$name/logs/"agent-*.log; do
    [ -f "$f" ] && { log "---- $f"; tail -n 40 "$f"; }
  done
}

# 1. A job that runs to completion: the head plus two agents acting as nodes.
log "job 1: runtime-check, 6 actors on 3 runtime nodes (head + 2 agents)"
job=$(submit complete SLIME_AGENTS_ON_HEAD_NODE=1 SLIME_AGENTS_PER_NODE=2 \
  SLIME_ARGS="--workers 6 --cpu-slots 2 --wait-timeout 120" SLIME_AGENT_ARGS="--cpu-slots 2")
state=$(wait_job "$job" 240)
run="$tmp/runs/complete"
[ "$state" = COMPLETED ] || fail "job 1 state $state, expected COMPLETED"
[ "$(job_field "$job" ExitCode)" = "0:0" ] || fail "job 1 exit code $(job_field "$job" ExitCode)"
expect_grep "head started" "runtime head listening on 127\.0\.0\.1:[0-9]+" "$run/logs/head-$node.log"
expect_grep "all actors answered" "runtime-check: 6 workers alive on 3 node\(s\)" "$run/logs/head-$node.log"
for a in 0 1; do
  expect_grep "agent $a registered" "agent $node-a$a registered with head" "$run/logs/agent-$node-$a.log"
  expect_grep "head saw agent $a" "node $node-a$a registered" "$run/logs/head-$node.log"
  expect_grep "actors placed on agent $a" "^engine-[0-9]+ +engine +[0-9]+ $node-a$a +[0-9]+ +alive" \
    "$run/logs/head-$node.log"
done
expect_grep "job exit code" "job exit code 0" "$tmp/runs/complete.out"
expect_grep "agents stopped cleanly by SIGTERM" "agents stopped \(srun exit 0\)" "$tmp/runs/complete.out"
[ -f "$run/logs/engine-5.log" ] || fail "job 1: no per-actor log $run/logs/engine-5.log"
[ "$(stat -c %a "$run/head.json" 2> /dev/null)" = 600 ] || fail "job 1: head.json is not mode 0600"
[ "$failures" -eq 0 ] || show_logs complete

# 2. A held job: status view, then scancel --batch --signal=TERM reaches the head via the script.
log "job 2: held runtime-check, status, scancel --batch --signal=TERM"
f0=$failures
job=$(submit cancel SLIME_AGENTS_ON_HEAD_NODE=1 SLIME_AGENTS_PER_NODE=1 \
  SLIME_ARGS="--workers 2 --cpu-slots 1 --hold --wait-timeout 120" SLIME_AGENT_ARGS="--cpu-slots 1")
run="$tmp/runs/cancel"
deadline=$((SECONDS + 180))
until grep -q "runtime-check: holding" "$run/logs/head-$node.log" 2> /dev/null; do
  [ "$SECONDS" -lt "$deadline" ] || { fail "job 2 never reached 'holding'"; break; }
  case "$(job_field "$job" JobState)" in PENDING | RUNNING | CONFIGURING) ;; *) fail "job 2 ended early"; break ;; esac
  sleep 0.5
done
if "$bin" status --run-dir "$run" > "$tmp/status.out" 2>&1; then
  expect_grep "status lists the agent node" "^$node-a0 +127\.0\.0\.1:[0-9]+ +0 +1 yes" "$tmp/status.out"
  expect_grep "status lists alive actors" "^engine-1 .* alive" "$tmp/status.out"
else
  fail "slime_train status --run-dir failed: $(cat "$tmp/status.out")"
fi
pids=$(sed -n 's/.*actor engine-[0-9]* alive: pid \([0-9]*\).*/\1/p' "$run/logs/head-$node.log")
scancel --batch --signal=TERM "$job"
state=$(wait_job "$job" 120)
[ "$(job_field "$job" ExitCode)" = "143:0" ] ||
  fail "job 2 exit code $(job_field "$job" ExitCode) (state $state), expected 143:0 (SIGTERM)"
expect_grep "script forwarded SIGTERM" "received SIGTERM: sending SIGTERM to the head" "$tmp/runs/cancel.out"
expect_grep "head stopped on SIGTERM" "received signal 15; stopping all actors" "$run/logs/head-$node.log"
expect_grep "agent stopped" "agents stopped" "$tmp/runs/cancel.out"
[ -n "$pids" ] || fail "job 2: no actor pids in the head log"
for pid in $pids; do
  [ -d "/proc/$pid" ] && [ "$(awk '{print $3}' "/proc/$pid/stat" 2> /dev/null)" != Z ] &&
    fail "job 2: actor pid $pid still running after the job ended"
done
[ "$failures" -eq "$f0" ] || show_logs cancel

# 3. The head fails: the job's exit code is the head's.
log "job 3: runtime-check asking for more actors than slots"
f0=$failures
job=$(submit failing SLIME_ARGS="--workers 9 --cpu-slots 1 --wait-timeout 60")
state=$(wait_job "$job" 120)
[ "$state" = FAILED ] || fail "job 3 state $state, expected FAILED"
[ "$(job_field "$job" ExitCode)" = "2:0" ] || fail "job 3 exit code $(job_field "$job" ExitCode), expected 2:0"
expect_grep "head says why" "--workers 9: the 1 node\(s\) offer only 1 devices" "$tmp/runs/failing/logs/head-$node.log"
[ "$failures" -eq "$f0" ] || show_logs failing

# 4. Train mode without SLIME_CONFIG: the script refuses with a clear message and exit code 2.
log "job 4: train mode without SLIME_CONFIG"
job=$(submit noconfig SLIME_MODE=train)
state=$(wait_job "$job" 60)
[ "$(job_field "$job" ExitCode)" = "2:0" ] || fail "job 4 exit code $(job_field "$job" ExitCode), expected 2:0"
expect_grep "job 4 names the missing variable" "error: set SLIME_CONFIG to the job YAML" "$tmp/runs/noconfig.out"

# 5. A real training job through sbatch: the tiny GRPO recipe (a random tiny Qwen3, 2 rollouts)
# on 2 runtime nodes (the head's own + one agent), 2 CPU slots each, so the trainer and the two
# engines cannot all sit on one node: generation, training, the weight sync and a checkpoint
# cross nodes. Needs the Qwen3 tokenizer of scripts/fetch_test_data.sh (CI has it).
tokenizer="${SLIME_TEST_DATA:-$src/.cache/testdata}/qwen3"
if [ ! -f "$tokenizer/tokenizer.json" ]; then
  fail "job 5 needs $tokenizer/tokenizer.json: run scripts/fetch_test_data.sh"
else
  log "job 5: train mode, the tiny GRPO recipe for 2 rollouts on 2 runtime nodes"
  f0=$failures
  if ! "$bin" init-model --config "$src/tests/data/model/configs/qwen3-tiny.json" \
      --tokenizer "$tokenizer" --out "$tmp/model" --dtype fp32 --seed 3 > "$tmp/init.log" 2>&1; then
    fail "job 5: init-model failed: $(tail -n 5 "$tmp/init.log")"
  fi
  cat > "$tmp/train.yaml" << EOF
cluster:
  device: cpu
  cpu_slots_per_node: 2
  actor_num_nodes: 1
  actor_num_gpus_per_node: 1
  rollout_num_gpus: 2
  rollout_num_gpus_per_engine: 1
model:
  hf_checkpoint: $tmp/model
data:
  prompt_data: $src/data/demo/train.jsonl@[0:16]
  label_key: label
  apply_chat_template: true
  rollout_batch_size: 4
  n_samples_per_prompt: 2
  num_rollout: 2
rollout:
  max_response_len: 6
reward:
  rm_type: exact_match
train:
  bf16: false
  lr: 1.0e-4
  global_batch_size: 8
  micro_batch_size: 4
checkpoint:
  save: $tmp/runs/train/ckpt
  save_interval: 1
EOF
  job=$(submit train SLIME_MODE=train SLIME_CONFIG="$tmp/train.yaml" SLIME_AGENTS_ON_HEAD_NODE=1 \
    SLIME_AGENTS_PER_NODE=1 SLIME_AGENT_ARGS="--cpu-slots 2")
  state=$(wait_job "$job" 400)
  run="$tmp/runs/train"
  [ "$state" = COMPLETED ] || fail "job 5 state $state, expected COMPLETED"
  [ "$(job_field "$job" ExitCode)" = "0:0" ] || fail "job 5 exit code $(job_field "$job" ExitCode)"
  head_log="$run/logs/head-$node.log"
  expect_grep "job 5: two runtime nodes" "starting 1 trainer\(s\) and 2 engine\(s\) on 2 node\(s\)" "$head_log"
  expect_grep "job 5: an actor on the agent's node" "actor (trainer|engine)-[0-9]+ alive: pid [0-9]+ on node $node-a0 " "$head_log"
  expect_grep "job 5: an actor on the head's node" "actor (trainer|engine)-[0-9]+ alive: pid [0-9]+ on node node0 " "$head_log"
  expect_grep "job 5: rollout 1 trained" "rollout 1/2 \|" "$head_log"
  expect_grep "job 5: the run finished" "done: rollouts 0\.\.1" "$head_log"
  [ -f "$run/ckpt/latest_checkpointed_iteration.txt" ] || fail "job 5: no checkpoint in $run/ckpt"
  expect_grep "job 5 exit code" "job exit code 0" "$tmp/runs/train.out"
  [ "$failures" -eq "$f0" ] || show_logs train
fi

# No job left a process behind (the jobs are over; slurmstepd gets a few seconds to exit).
sleep_until=$((SECONDS + 15))
while [ -n "$(cluster_procs)" ] && [ "$SECONDS" -lt "$sleep_until" ]; do sleep 0.5; done
for pid in $(cluster_procs); do
  fail "process left behind by a job: $pid $(tr '\0' ' ' < "/proc/$pid/cmdline" 2> /dev/null)"
done

if [ "$failures" -ne 0 ]; then
  log "$failures check(s) failed; SLURM logs in $tmp/log"
  exit 1
fi
log "all checks passed"
exit 0
