#!/usr/bin/env bash
# TLS between the runtime's processes (include/slime/runtime/rpc.h): a certificate authority and
# one node certificate (IP SAN 127.0.0.1) made here with openssl, then
#   1. mutual TLS (SLIME_TLS_CA/CERT/KEY, SLIME_TLS_MUTUAL=1): a held `runtime-check` head, one
#      `slime_train agent` and 4 test actors on 2 nodes — the workers inherit the variables and
#      talk TLS to the head; `slime_train status` with the same variables lists every actor;
#   2. against that head: `status` in plaintext fails, and so does `status` with the CA but no
#      client certificate (mutual TLS requires one);
#   3. SIGTERM stops the TLS job (exit 143), no worker left behind;
#   4. a plaintext job says so in its log; a half-set TLS environment is refused naming the
#      missing variable.
#
# Usage: tls_agents_test.sh SLIME_TRAIN_BIN      Exit: 0 pass, 1 fail, 77 skip (no openssl).
set -uo pipefail
bin=${1:?usage: tls_agents_test.sh SLIME_TRAIN_BIN}
failures=0
log() { echo "[tls_agents_test $(date '+%H:%M:%S')] $*"; }
fail() { log "FAIL: $*"; failures=$((failures + 1)); }
command -v openssl > /dev/null || { log "SKIP: openssl is not installed (scripts/setup.sh installs it)"; exit 77; }

dir=$(mktemp -d /tmp/slime_tls_agents.XXXXXX)
head_pid=""
agent_pid=""
cleanup() {
  for pid in $agent_pid $head_pid; do kill -KILL "$pid" 2> /dev/null; done
  wait 2> /dev/null
  if [ "$failures" -ne 0 ]; then
    for f in "$dir"/*.out "$dir"/run/logs/*.log; do [ -f "$f" ] && { log "---- $f"; tail -n 30 "$f"; }; done
    log "kept $dir"
  else
    rm -rf "$dir"
  fi
}
trap cleanup EXIT

# The certificate authority and a node certificate for 127.0.0.1 (server and client use).
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=slime-test-ca" \
  -keyout "$dir/ca.key" -out "$dir/ca.pem" > "$dir/openssl.out" 2>&1 || { fail "openssl: CA"; exit 1; }
openssl req -newkey rsa:2048 -nodes -subj "/CN=slime-node" -keyout "$dir/node.key" \
  -out "$dir/node.csr" >> "$dir/openssl.out" 2>&1 || { fail "openssl: node key"; exit 1; }
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' > "$dir/ext.cnf"
openssl x509 -req -in "$dir/node.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial \
  -days 2 -extfile "$dir/ext.cnf" -out "$dir/node.pem" >> "$dir/openssl.out" 2>&1 ||
  { fail "openssl: node certificate"; exit 1; }
tls=(SLIME_TLS_CA="$dir/ca.pem" SLIME_TLS_CERT="$dir/node.pem" SLIME_TLS_KEY="$dir/node.key"
     SLIME_TLS_MUTUAL=1)

# 1. Mutual TLS: head + one agent, 4 actors on 2 nodes.
run="$dir/run"
env "${tls[@]}" "$bin" runtime-check --run-dir "$run" --node-name n0 --nodes 2 --workers 4 \
  --cpu-slots 2 --hold --wait-timeout 120 > "$dir/head.out" 2>&1 &
head_pid=$!
deadline=$((SECONDS + 60))
until [ -s "$run/head.json" ]; do
  [ "$SECONDS" -lt "$deadline" ] && kill -0 "$head_pid" 2> /dev/null || { fail "no head.json"; exit 1; }
  sleep 0.2
done
address=$(sed -n 's/.*"address"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' "$run/head.json")
log "head at $address (mutual TLS)"
env "${tls[@]}" "$bin" agent --head "$address" --token-file "$run/head.json" --node-name n1 \
  --cpu-slots 2 > "$dir/agent.out" 2>&1 &
agent_pid=$!
deadline=$((SECONDS + 180))
until grep -q "runtime-check: holding" "$dir/head.out"; do
  if [ "$SECONDS" -ge "$deadline" ] || ! kill -0 "$head_pid" 2> /dev/null; then
    fail "the TLS job never reached 'holding'"
    exit 1
  fi
  sleep 0.5
done
grep -q "runtime-check: 4 workers alive on 2 node(s)" "$dir/head.out" ||
  fail "head did not report 4 workers on 2 nodes"
grep -q "with TLS (mutual" "$dir/head.out" || fail "the head's log does not say TLS (mutual)"
grep -q "with TLS (mutual" "$dir/agent.out" || fail "the agent's log does not say TLS (mutual)"
grep -q "in plaintext" "$dir/head.out" "$dir/agent.out" && fail "a server of the TLS job is plaintext"
grep -lq "with TLS (mutual" "$run"/logs/engine-*.log 2> /dev/null || fail "no worker log says TLS"

env "${tls[@]}" "$bin" status --run-dir "$run" > "$dir/status.out" 2>&1 || fail "status over TLS failed"
[ "$(grep -cE "^engine-[0-9]+ .* alive" "$dir/status.out")" = 4 ] || fail "status over TLS: not 4 alive actors"
pids=$(awk '/^engine-[0-9]+ .* alive/ { print $7 }' "$dir/status.out")

# 2. Plaintext, and TLS without a client certificate, are refused.
if "$bin" status --run-dir "$run" > "$dir/plain_status.out" 2>&1; then
  fail "status in plaintext against the TLS head succeeded"
fi
if env SLIME_TLS_CA="$dir/ca.pem" SLIME_TLS_CERT="$dir/node.pem" SLIME_TLS_KEY="$dir/node.key" \
    SLIME_TLS_MUTUAL=0 "$bin" status --run-dir "$run" > "$dir/nocert_status.out" 2>&1; then
  fail "status without a client certificate against the mutual-TLS head succeeded"
fi

# 3. SIGTERM stops it all.
kill -TERM "$head_pid"
wait "$head_pid"
rc=$?
head_pid=""
[ "$rc" = 143 ] || fail "head exit code $rc after SIGTERM, expected 143"
deadline=$((SECONDS + 30))
while kill -0 "$agent_pid" 2> /dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
kill -0 "$agent_pid" 2> /dev/null && fail "the agent still runs 30 s after the head stopped"
agent_pid=""
for pid in $pids; do
  [ -d "/proc/$pid" ] && [ "$(awk '{print $3}' "/proc/$pid/stat" 2> /dev/null)" != Z ] &&
    fail "worker pid $pid left behind"
done

# 4. Plaintext says so; a half-set TLS environment is refused.
"$bin" runtime-check --run-dir "$dir/plain" --workers 1 --cpu-slots 1 --wait-timeout 60 \
  > "$dir/plain.out" 2>&1 || fail "the plaintext runtime-check failed"
grep -q "in plaintext" "$dir/plain.out" || fail "the plaintext job does not say so in its log"
if env SLIME_TLS_CA="$dir/ca.pem" "$bin" runtime-check --run-dir "$dir/half" --workers 1 \
    --cpu-slots 1 --wait-timeout 30 > "$dir/half.out" 2>&1; then
  fail "a runtime-check with only SLIME_TLS_CA set succeeded"
fi
grep -q "SLIME_TLS_CERT is not set" "$dir/half.out" || fail "the half-set TLS error does not name SLIME_TLS_CERT"

[ "$failures" -eq 0 ] || { log "$failures check(s) failed"; exit 1; }
log "all checks passed"
