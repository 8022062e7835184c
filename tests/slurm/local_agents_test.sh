#!/usr/bin/env bash
# Several nodes on one machine without SLURM (the recipe in docs/operations.md, "Multi-node and
# SLURM"): a held `slime_train runtime-check` head waiting for 4 nodes, three
# `slime_train agent` processes with distinct --node-name and fake CPU slots that find the head
# through <run dir>/head.json, 8 test actors spread over all four nodes (checked with
# `slime_train status`), then SIGTERM to the head: exit 143, the agents exit, no worker is left.
#
# Usage: local_agents_test.sh SLIME_TRAIN_BIN      Exit: 0 pass, 1 fail.
set -uo pipefail
bin=${1:?usage: local_agents_test.sh SLIME_TRAIN_BIN}
failures=0
log() { echo "[local_agents_test $(date '+%H:%M:%S')] $*"; }
fail() { log "FAIL: $*"; failures=$((failures + 1)); }

run=$(mktemp -d /tmp/slime_local_agents.XXXXXX)
head_pid=""
agent_pids=()
cleanup() {
  for pid in "${agent_pids[@]}" $head_pid; do kill -KILL "$pid" 2> /dev/null; done
  wait 2> /dev/null
  if [ "$failures" -ne 0 ]; then
    for f in "$run"/*.out; do log "---- $f"; tail -n 30 "$f"; done
    log "kept $run"
  else
    rm -rf "$run"
  fi
}
trap cleanup EXIT

"$bin" runtime-check --run-dir "$run" --node-name n0 --nodes 4 --workers 8 --cpu-slots 2 \
  --hold --wait-timeout 120 > "$run/head.out" 2>&1 &
head_pid=$!
deadline=$((SECONDS + 60))
until [ -s "$run/head.json" ]; do
  [ "$SECONDS" -lt "$deadline" ] && kill -0 "$head_pid" 2> /dev/null || { fail "no head.json"; exit 1; }
  sleep 0.2
done
address=$(sed -n 's/.*"address"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' "$run/head.json")
log "head at $address"
for n in n1 n2 n3; do
  "$bin" agent --head "$address" --token-file "$run/head.json" --node-name "$n" --cpu-slots 2 \
    > "$run/agent-$n.out" 2>&1 &
  agent_pids+=($!)
done

deadline=$((SECONDS + 180))
until grep -q "runtime-check: holding" "$run/head.out"; do
  if [ "$SECONDS" -ge "$deadline" ] || ! kill -0 "$head_pid" 2> /dev/null; then
    fail "the job never reached 'holding'"
    exit 1
  fi
  sleep 0.5
done
grep -q "runtime-check: 8 workers alive on 4 node(s)" "$run/head.out" ||
  fail "head did not report 8 workers on 4 nodes"

"$bin" status --run-dir "$run" > "$run/status.out" 2>&1 || fail "slime_train status failed"
for n in n0 n1 n2 n3; do
  grep -qE "^$n +127\.0\.0\.1:[0-9]+ +0 +2 yes" "$run/status.out" || fail "status: node $n not alive"
  [ "$(grep -cE "^engine-[0-9]+ +engine +[0-9]+ $n +[01] +alive" "$run/status.out")" = 2 ] ||
    fail "status: node $n does not run 2 alive actors"
done
pids=$(awk '/^engine-[0-9]+ .* alive/ { print $7 }' "$run/status.out")
[ "$(echo "$pids" | wc -w)" = 8 ] || fail "status: expected 8 actor pids, got '$pids'"

kill -TERM "$head_pid"
wait "$head_pid"
rc=$?
head_pid=""
[ "$rc" = 143 ] || fail "head exit code $rc after SIGTERM, expected 143"
for i in "${!agent_pids[@]}"; do
  pid=${agent_pids[$i]}
  deadline=$((SECONDS + 30))
  while kill -0 "$pid" 2> /dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
  kill -0 "$pid" 2> /dev/null && fail "agent pid $pid still running 30 s after the head stopped"
done
for pid in $pids; do
  [ -d "/proc/$pid" ] && [ "$(awk '{print $3}' "/proc/$pid/stat" 2> /dev/null)" != Z ] &&
    fail "worker pid $pid left behind"
done

[ "$failures" -eq 0 ] || { log "$failures check(s) failed"; exit 1; }
log "all checks passed"
