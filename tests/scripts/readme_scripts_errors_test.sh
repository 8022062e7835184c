#!/usr/bin/env bash
# The README's two scripts say what failed when they stop early (no silent exit status):
#   1. quickstart.sh with a SLIME_BIN that is not a binary names it;
#   2. quickstart.sh whose warm start fails (a slime_train stand-in that exits 3 on
#      make-byte-tokenizer, the first command of the warm start) names the warm start's failed
#      command and then quickstart's own failed step;
#   3. build.sh with a build directory that cannot be configured says cmake failed;
#   4. test.sh stopped by that build names its failed step.
# Each case must exit non-zero and print its FAILED line. Runs on the real scripts of REPO_ROOT,
# with outputs in a temporary directory (setup.sh runs too: a no-op with every package installed).
#
# usage: readme_scripts_errors_test.sh REPO_ROOT
set -uo pipefail
repo="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT
fails=0

# expect NAME PATTERN... -- COMMAND...: COMMAND exits non-zero and its output matches each PATTERN.
expect() {
  local name="$1"; shift
  local patterns=()
  while [[ "$1" != "--" ]]; do patterns+=("$1"); shift; done
  shift
  local log="${tmp}/${name}.log"
  if "$@" > "${log}" 2>&1; then
    echo "FAIL ${name}: exited 0"; tail -n 20 "${log}"; fails=$((fails + 1)); return
  fi
  for p in "${patterns[@]}"; do
    if ! grep -qE "${p}" "${log}"; then
      echo "FAIL ${name}: no line matching '${p}' in:"; tail -n 20 "${log}"
      fails=$((fails + 1)); return
    fi
  done
  echo "ok ${name}: $(grep -E "${patterns[-1]}" "${log}" | tail -n 1)"
}

expect bad_bin "quickstart: FAILED: /nonexistent/slime_train is not an executable" -- \
  env SLIME_BIN=/nonexistent/slime_train "${repo}/scripts/quickstart.sh"

# A stand-in whose only job is to fail the warm start's first slime_train call.
cat > "${tmp}/failing_slime_train" <<'SH'
#!/bin/sh
[ "$1" = --version ] && { echo "slime_train (stand-in that fails)"; exit 0; }
echo "stand-in: $1 fails on purpose" >&2
exit 3
SH
chmod +x "${tmp}/failing_slime_train"
data="${repo}/.cache/testdata"
[[ -f "${data}/qwen3/tokenizer.json" ]] || data="${tmp}/testdata"
expect warm_start_fails \
  'warm_start: FAILED: `"\$\{bin\}" make-byte-tokenizer .*` exited 3' \
  'quickstart: FAILED: `SLIME_BIN="\$bin" ./scripts/warm_start.sh` exited 3' -- \
  env SLIME_BIN="${tmp}/failing_slime_train" SLIME_RUNS="${tmp}/runs" SLIME_TEST_DATA="${data}" \
  "${repo}/scripts/quickstart.sh"

touch "${tmp}/not-a-directory"
expect build_fails "build: FAILED: cmake could not configure ${tmp}/not-a-directory" -- \
  env SLIME_BUILD_DIR="${tmp}/not-a-directory" "${repo}/scripts/build.sh"

expect test_fails "build: FAILED: cmake could not configure" \
  'test: FAILED: `./scripts/build.sh` exited 1' -- \
  env SLIME_BUILD_DIR="${tmp}/not-a-directory" "${repo}/scripts/test.sh"

if ((fails > 0)); then echo "${fails} case(s) failed"; exit 1; fi
echo "PASS"
