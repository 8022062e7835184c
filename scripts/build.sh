#!/usr/bin/env bash
# Configures and builds slime-cpp into ${SLIME_BUILD_DIR:-build} (CPU LibTorch from Debian unless
# SLIME_TORCH_DIR or a PyTorch install says otherwise). Extra arguments go to cmake.
# SLIME_BUILD_TARGETS (space-separated ninja targets, e.g. "slime_train") builds only those;
# the default builds everything (tests and benchmarks included).
set -Eeuo pipefail
trap 'rc=$?; echo "build: FAILED: \`${BASH_COMMAND}\` exited ${rc} (scripts/build.sh line ${LINENO})" >&2' ERR
repo=$(cd "$(dirname "$0")/.." && pwd)
build="${SLIME_BUILD_DIR:-$repo/build}"
jobs="${SLIME_JOBS:-$(nproc)}"
read -r -a targets <<< "${SLIME_BUILD_TARGETS:-}"
# Let ccache share results between checkouts in different directories (CI clones afresh).
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$repo}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-8G}"
# The LibTorch translation units use a precompiled <torch/torch.h> (cmake/SlimeModule.cmake);
# without this ccache refuses them all ("could not use precompiled header") and every build
# recompiles them. A fresh clone's files are all new, hence the include-file time checks off.
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
start=$(date +%s)
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${SLIME_BUILD_TYPE:-RelWithDebInfo}" "$@" \
  > "$build.configure.log" 2>&1 || {
  cat "$build.configure.log" >&2
  echo "build: FAILED: cmake could not configure $build (its log is above and in $build.configure.log)" >&2
  exit 1
}
grep -E "^-- slime:" "$build.configure.log" || true
what="${targets[*]:-everything (tests and benchmarks included)}"
echo "build: $what in $build with $jobs jobs; ninja prints [done/total] per step"
ninja -C "$build" -j"$jobs" "${targets[@]}"
echo "build: $what ready in $(( $(date +%s) - start )) s"
