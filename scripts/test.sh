#!/usr/bin/env bash
# README command 2: install dependencies, build, and run every CPU test with ctest.
# Tests labelled `gpu` are excluded here; they run on the GPU machine (scripts/device/run.sh).
set -Eeuo pipefail
trap 'rc=$?; echo "test: FAILED: \`${BASH_COMMAND}\` exited ${rc} (scripts/test.sh line ${LINENO})" >&2' ERR
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
start=$(date +%s)
./scripts/setup.sh
./scripts/build.sh
./scripts/fetch_test_data.sh
./scripts/fetch_tools.sh
build="${SLIME_BUILD_DIR:-$repo/build}"
echo "test: build ready after $(( $(date +%s) - start )) s"
cd "$build"
# Every test's scratch files go to one fresh directory: removed when all pass, kept (and named)
# when one fails, so repeated runs never fill the disk's temp dir.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/slime-test.XXXXXX")
if TMPDIR="$scratch" ctest --output-on-failure -LE gpu -j"${SLIME_TEST_JOBS:-2}" --timeout 900; then
  rm -rf "$scratch"
else
  rc=$?
  echo "test: failed; scratch files kept in $scratch" >&2
  exit "$rc"
fi
echo "test: done in $(( $(date +%s) - start )) s"
