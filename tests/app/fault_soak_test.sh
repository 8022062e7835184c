#!/usr/bin/env bash
# Load with faults on a real `slime_train serve` (bench/engine/fault_soak.py, smaller): a random
# tiny Qwen3 on CPU, 3 rounds of 90 concurrent clients of which a third close their stream after
# the first chunk and a third are aborted by rid. Passes when every other request is answered,
# no K/V page stays held after a round, /flush_cache frees every page and the resident memory
# returns to its post-warm-up value (within 128 MB: glibc keeps freed arenas, so the resident
# size swings by ~50 MB between rounds here).
#
# Usage: fault_soak_test.sh SLIME_TRAIN_BIN SOURCE_DIR      Exit: 0 pass, 1 fail, 77 skip.
set -uo pipefail
bin=${1:?usage: fault_soak_test.sh SLIME_TRAIN_BIN SOURCE_DIR}
src=${2:?usage: fault_soak_test.sh SLIME_TRAIN_BIN SOURCE_DIR}
tokenizer="${SLIME_TEST_DATA:-$src/.cache/testdata}/qwen3"
[ -f "$tokenizer/tokenizer.json" ] || { echo "skip: $tokenizer missing (scripts/fetch_test_data.sh)"; exit 77; }
work=$(mktemp -d /tmp/slime_fault_soak.XXXXXX)
serve_pid=""
cleanup() {
  [ -n "$serve_pid" ] && kill -TERM "$serve_pid" 2> /dev/null && wait "$serve_pid" 2> /dev/null
  rm -rf "$work"
}
trap cleanup EXIT

"$bin" init-model --config "$src/tests/data/model/configs/qwen3-tiny.json" --tokenizer "$tokenizer" \
  --out "$work/model" --dtype fp32 --seed 5 > "$work/init.out" 2>&1 || { cat "$work/init.out"; exit 1; }
"$bin" serve --model "$work/model" --port 0 --device cpu --dtype float32 --max-total-tokens 8192 \
  > "$work/serve.out" 2>&1 &
serve_pid=$!
address=""
for _ in $(seq 1 600); do
  address=$(grep -o 'listening on http://[0-9.]*:[0-9]*' "$work/serve.out" | head -1 | sed 's#.*http://##')
  [ -n "$address" ] && break
  kill -0 "$serve_pid" 2> /dev/null || break
  sleep 0.2
done
[ -n "$address" ] || { echo "FAIL: serve did not start"; cat "$work/serve.out"; exit 1; }
python3 "$src/bench/engine/fault_soak.py" --url "$address" --pid "$serve_pid" --rounds 3 \
  --clients 90 --new-tokens 24 --rss-slack-mb 128
rc=$?
kill -0 "$serve_pid" 2> /dev/null || { echo "FAIL: serve died during the soak"; tail -30 "$work/serve.out"; exit 1; }
[ "$rc" = 0 ] || { echo "FAIL: fault_soak.py exit $rc"; tail -30 "$work/serve.out"; exit 1; }
echo "PASS"
