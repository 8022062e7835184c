#!/usr/bin/env bash
# One command on the GPU machine: unpack the carried .debs into a prefix, configure against the
# CUDA LibTorch of the machine's PyTorch, build, print `slime_train --version`, run the
# gpu-labelled tests and any named benchmarks. Logs go to the output folder.
#
#   scripts/device/run.sh [--out DIR] [--tests REGEX | --no-tests] [--all-tests]
#                         [--run CMD]... [--bench CMD]... [--targets "t1 t2"]
#                         [--py SCRIPT [ARGS]]...
#
# After the build (and tests), each --run CMD runs in the repository root (a shell command line,
# e.g. writing a model the benchmarks read), then each --bench (build-gpu/bench/CMD), then each
# --py (python3 SCRIPT ARGS). These command lines are expanded when they run, with
# SLIME_BUILD (the build folder), SLIME_OUT (the output folder) and SLIME_LOGS (its logs/,
# packed into logs.tgz) set: quote them ('$SLIME_OUT/x.json') so they expand there.
#
# Carry third_party_debs/ (made by scripts/device/fetch_debs.sh on a Debian machine) with the
# call. Environment: NCCL_NVLS_ENABLE=0 is always set (NVLink multicast stays off).
# Logs are written under DIR/logs/ and packed into DIR/logs.tgz at exit (the device tool brings
# back at most 8 files), with the console summary also in DIR/summary.txt.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out="${OUT:-$repo/build-gpu/out}"
tests_regex=""
run_tests=1
label="gpu"
benches=()
pys=()
runs=()
targets=""
while (($#)); do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --tests) tests_regex="$2"; shift 2 ;;
    --no-tests) run_tests=0; shift ;;
    --all-tests) label=""; shift ;;
    --run) runs+=("$2"); shift 2 ;;
    --bench) benches+=("$2"); shift 2 ;;
    --py) pys+=("$2"); shift 2 ;;
    --targets) targets="$2"; shift 2 ;;
    *) echo "run.sh: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
final_out="$out"
out="$final_out/logs"
mkdir -p "$out"
pack_logs() { tar czf "$final_out/logs.tgz" -C "$final_out" logs && rm -rf "$out"; }
trap pack_logs EXIT
exec > >(tee "$final_out/summary.txt") 2>&1
export NCCL_NVLS_ENABLE=0

# 1. Prefix with gRPC/Abseil/RE2/c-ares/PCRE2/prometheus-cpp from the carried Debian packages
# (CMAKE_PREFIX_PATH below; cmake/SlimeDeps.cmake says how prometheus-cpp is found).
prefix=/tmp/slime-prefix
if true; then  # always: dpkg -x of ~12 MB takes a second
  shopt -s nullglob
  debs=("$repo"/third_party_debs/*.deb)
  if ((${#debs[@]} == 0)); then
    echo "run.sh: no .debs in third_party_debs/: run scripts/device/fetch_debs.sh here and carry it" >&2
    exit 2
  fi
  mkdir -p "$prefix"
  for d in "${debs[@]}"; do
    dpkg -x "$d" "$prefix"
  done
  # PyTorch wheels ship c10d headers but not Gloo's: Debian's libgloo-dev supplies them.
fi
lib="$prefix/usr/lib/x86_64-linux-gnu"
export PATH="$prefix/usr/bin:$PATH"
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LIBRARY_PATH="$lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
export PKG_CONFIG_PATH="$lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"

# 2. Configure and build against the CUDA LibTorch.
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
build="$repo/build-gpu"
{
  echo "== machine"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
} 2>&1 | tee "$out/machine.txt"
# The distribution's g++ links libstdc++ dynamically, like LibTorch; a toolchain that links it
# statically (the machine's /opt/gcc does) leaves two C++ runtimes in one process, which crashed
# tests that mix iostreams and std::filesystem. SLIME_CXX / SLIME_CC override.
cxx="${SLIME_CXX:-/usr/bin/g++}"
cc="${SLIME_CC:-/usr/bin/gcc}"
if [ -f "$build/CMakeCache.txt" ] && ! grep -q "CMAKE_CXX_COMPILER:[A-Z]*=$cxx\$" "$build/CMakeCache.txt"; then
  rm -rf "$build"
fi
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc" -DCMAKE_CUDA_HOST_COMPILER="$cxx" \
  -DCMAKE_PREFIX_PATH="$prefix/usr;$torch_prefix" \
  -DCMAKE_CUDA_ARCHITECTURES=90 > "$out/configure.log" 2>&1
rc=$?
grep -E "^-- slime:" "$out/configure.log"
if ((rc != 0)); then tail -40 "$out/configure.log"; echo "configure failed"; exit $rc; fi
start=$(date +%s)
ninja -C "$build" -j"$(nproc)" $targets > "$out/build.log" 2>&1
rc=$?
echo "build: rc=$rc in $(( $(date +%s) - start )) s"
if ((rc != 0)); then grep -E "error|FAILED" "$out/build.log" | head -40; exit $rc; fi

# 3. Version report, gpu tests, benchmarks, python side-by-side scripts.
"$build/src/app/slime_train" --version | tee "$out/version.txt"
status=0
if ((run_tests)); then
  args=(--output-on-failure --timeout 600 -j"${SLIME_TEST_JOBS:-8}")
  [ -n "$label" ] && args+=(-L "$label")
  [ -n "$tests_regex" ] && args+=(-R "$tests_regex")
  (cd "$build" && ctest "${args[@]}") > "$out/ctest.log" 2>&1 || status=1
  tail -15 "$out/ctest.log"
fi
export SLIME_BUILD="$build" SLIME_OUT="$final_out" SLIME_LOGS="$out"
for i in "${!runs[@]}"; do
  c="${runs[$i]}"
  echo "== run $c"
  (cd "$repo" && eval "$c") 2>&1 | tee "$out/run_$i.log" || status=1
done
for b in "${benches[@]}"; do
  name=$(echo "$b" | awk '{print $1}' | tr '/' '_')
  echo "== bench $b"
  (cd "$repo" && eval "$build/bench/$b") 2>&1 | tee "$out/bench_${name}.log" || status=1
done
for p in "${pys[@]}"; do
  name=$(basename "$(echo "$p" | awk '{print $1}')" .py)
  echo "== python $p"
  (cd "$repo" && PYTHONUNBUFFERED=1 eval "python3 $p") 2>&1 | tee "$out/py_${name}.log" || status=1
done
exit $status
