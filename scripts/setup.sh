#!/usr/bin/env bash
# Installs everything slime-cpp needs to build and test on Debian 12, with apt. Idempotent: when
# every package is already installed it does nothing. Run as root (or with sudo available).
set -euo pipefail
packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev libgloo-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libyaml-cpp-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev
  libpcre2-dev libboost-dev libboost-system-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  prometheus-cpp-dev  # metrics registry and text exposition (we link its core library only)
  nodejs npm python3 curl ca-certificates
  python3-matplotlib  # scripts/plot_metrics
  python3-torch  # tests/comm/torch_interop_test: real PyTorch peers of the weight plane
  # An optimized BLAS behind Debian's LibTorch (the reference BLAS is ~6x slower on the tiny
  # models' 151k-vocabulary output layer); it becomes the libblas.so.3 alternative.
  libopenblas0-pthread
  # tests/slurm: a one-node SLURM cluster started by the test (munge comes as a dependency)
  slurmctld slurmd slurm-client
  openssl  # tests/slurm/tls_agents_test.sh makes its certificate authority and node certificates
  # tests/scripts/prometheus_e2e_test.sh scrapes a job with a real Prometheus server (its own
  # config and storage; the package's service is not started, see policy-rc.d below)
  prometheus
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js may come from elsewhere than Debian (a newer build); npm is what we need from it.
if command -v npm > /dev/null 2>&1; then
  filtered=()
  for p in "${missing[@]}"; do [[ "$p" == nodejs || "$p" == npm ]] || filtered+=("$p"); done
  missing=("${filtered[@]}")
fi
if ((${#missing[@]} == 0)); then
  echo "setup: all dependencies present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q || { echo "setup: FAILED: apt-get update (is Debian's package registry reachable?)" >&2; exit 1; }
# The SLURM, munge and Prometheus packages enable services; installing them must not start
# daemons (the tests start their own with a private config): a policy-rc.d that denies starts,
# unless one is already there, for the duration of the install.
policy=/usr/sbin/policy-rc.d
added_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# scripts/setup.sh: no service starts during package installs\nexit 101\n' |
    $sudo tee "$policy" > /dev/null
  $sudo chmod 755 "$policy"
  added_policy=1
fi
status=0
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}" || status=$?
[ "$added_policy" = 0 ] || $sudo rm -f "$policy"
[ "$status" = 0 ] || echo "setup: FAILED: apt-get install exited $status (packages: ${missing[*]})" >&2
exit "$status"
