#!/usr/bin/env bash
# Configures and builds slime-cpp into ${SLIME_BUILD_DIR:-build} (CPU LibTorch from Debian unless
# SLIME_TORCH_DIR or a PyTorch install says otherwise). Extra arguments go to cmake.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build="${SLIME_BUILD_DIR:-$repo/build}"
jobs="${SLIME_JOBS:-$(nproc)}"
# Let ccache share results between checkouts in different directories (CI clones afresh).
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$repo}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-8G}"
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${SLIME_BUILD_TYPE:-RelWithDebInfo}" "$@" \
  > "$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
grep -E "^-- slime:" "$build.configure.log" || true
ninja -C "$build" -j"$jobs"
