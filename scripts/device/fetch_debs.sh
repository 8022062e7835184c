#!/usr/bin/env bash
# Downloads, on a Debian 12 machine with apt, the .deb files the GPU machine lacks (gRPC, Abseil,
# RE2, c-ares, PCRE2, Gloo headers, prometheus-cpp) into third_party_debs/ (git-ignored).
# scripts/device/run.sh unpacks them into a prefix there. Idempotent: already-downloaded files
# are kept.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
dest="$repo/third_party_debs"
mkdir -p "$dest"
packages=(
  libgrpc++-dev libgrpc++1.51 libgrpc29 libgrpc-dev protobuf-compiler-grpc
  libabsl20220623 libabsl-dev libre2-9 libre2-dev libc-ares2 libc-ares-dev
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libgloo-dev libbenchmark-dev libbenchmark1debian
  # prometheus-cpp: we link its core library; the pull/push libraries and civetweb are carried so
  # that its CMake package (which checks for them) loads where CURL and ZLIB are installed.
  prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0
  libprometheus-cpp-push1.0 libcivetweb-dev libcivetweb1 civetweb
)
missing=()
for p in "${packages[@]}"; do
  compgen -G "$dest/${p}_*.deb" > /dev/null || missing+=("$p")
done
if ((${#missing[@]})); then
  [ -n "$(ls -A /var/lib/apt/lists 2>/dev/null | grep -v lock)" ] || apt-get update -q
  (cd "$dest" && apt-get download "${missing[@]}")
fi
echo "debs in $dest: $(ls "$dest" | wc -l) files, $(du -sh "$dest" | cut -f1)"
