#!/usr/bin/env bash
# Runs the libFuzzer targets of tests/fuzz/ (issue 29; docs/benchmarks.md "Fuzzing") for a bounded
# time each: configures a clang build with SLIME_FUZZ=ON (ASan + libFuzzer coverage on every
# library the targets link) in its own build directory, builds only the fuzz_<target> binaries,
# runs each from a scratch copy of its committed corpus tests/fuzz/corpus/<target>/, copies every
# crash / timeout / leak input found into that corpus directory (it then becomes a regression
# input of fuzz_replay_test, which runs with g++ in CI) and prints a summary table.
#
#   bench/fuzz/run_fuzzers.sh [TARGET...]     # default: all six targets
#
# Environment:
#   FUZZ_SECONDS   -max_total_time per target (default 60)
#   FUZZ_BUILD     the build directory (default build-fuzz)
#   FUZZ_JOBS      ninja -j (default: nproc)
#   FUZZ_WORK      scratch directory for the growing corpora and logs (default /tmp/slime-fuzz)
#   CXX / CC       the clang to use (default clang++ / clang)
#   FUZZ_ARGS      extra libFuzzer flags (default: -rss_limit_mb=4096 -timeout=10 -max_len=65536)
# Exit status: 0 when no target crashed, 1 otherwise.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SECONDS_PER_TARGET="${FUZZ_SECONDS:-60}"
BUILD="${FUZZ_BUILD:-$ROOT/build-fuzz}"
JOBS="${FUZZ_JOBS:-$(nproc)}"
WORK="${FUZZ_WORK:-/tmp/slime-fuzz}"
FUZZ_ARGS="${FUZZ_ARGS:--rss_limit_mb=4096 -timeout=10 -max_len=65536}"
ALL_TARGETS=(http_request generate_json chat_json config safetensors tokenizer_json)
if [[ $# -gt 0 ]]; then TARGETS=("$@"); else TARGETS=("${ALL_TARGETS[@]}"); fi

CXX="${CXX:-clang++}"
CC="${CC:-clang}"
if ! command -v "$CXX" >/dev/null; then
  echo "run_fuzzers.sh: $CXX not found (apt-get install clang); fuzz_replay_test still covers" \
       "the corpus with g++" >&2
  exit 2
fi

cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_C_COMPILER="$CC" -DSLIME_FUZZ=ON \
  -DSLIME_BUILD_BENCH=OFF -DSLIME_USE_PCH=OFF >"$BUILD.configure.log" 2>&1 ||
  { tail -30 "$BUILD.configure.log"; exit 1; }
ninja -C "$BUILD" -j "$JOBS" "${TARGETS[@]/#/fuzz_}"

mkdir -p "$WORK"
declare -A EXECS CRASHES COV
status=0
for t in "${TARGETS[@]}"; do
  corpus="$ROOT/tests/fuzz/corpus/$t"
  run="$WORK/$t"
  rm -rf "$run" && mkdir -p "$run/corpus" "$run/artifacts"
  cp "$corpus"/* "$run/corpus/" 2>/dev/null || true
  echo "== fuzz_$t for ${SECONDS_PER_TARGET}s"
  # libFuzzer exits non-zero on the first crash; keep going to the next target.
  # shellcheck disable=SC2086
  ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1" \
  "$BUILD/tests/fuzz/fuzz_$t" "$run/corpus" -max_total_time="$SECONDS_PER_TARGET" \
    -artifact_prefix="$run/artifacts/" -print_final_stats=1 $FUZZ_ARGS \
    >"$run/log" 2>&1 || true
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$run/log" | grep -o '[0-9]*$' || true)
  cov=$(grep -o 'cov: [0-9]*' "$run/log" | tail -1 | grep -o '[0-9]*' || true)
  found=0
  for f in "$run/artifacts"/*; do
    [[ -f "$f" ]] || continue
    found=$((found + 1))
    cp "$f" "$corpus/regress_$(basename "$f")"
    echo "   found: $(basename "$f") -> tests/fuzz/corpus/$t/regress_$(basename "$f")"
  done
  if ((found > 0)); then status=1; grep -m1 -A12 'ERROR:\|==ERROR\|deadly signal\|timeout' "$run/log" || true; fi
  EXECS[$t]="${execs:-?}"; CRASHES[$t]=$found; COV[$t]="${cov:-?}"
done

echo
printf '%-16s %10s %12s %10s %8s\n' target seconds executions exec/s crashes
for t in "${TARGETS[@]}"; do
  e="${EXECS[$t]}"
  rate="?"; [[ "$e" =~ ^[0-9]+$ ]] && rate=$((e / SECONDS_PER_TARGET))
  printf '%-16s %10s %12s %10s %8s\n' "$t" "$SECONDS_PER_TARGET" "$e" "$rate" "${CRASHES[$t]}"
done
echo "(coverage counters per target: $(for t in "${TARGETS[@]}"; do printf '%s=%s ' "$t" "${COV[$t]}"; done))"
exit $status
