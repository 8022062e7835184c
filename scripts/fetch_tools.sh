#!/usr/bin/env bash
# Fetches tools the tests run but that must not be installed system-wide:
#   promtool   Prometheus' exposition checker (`promtool check metrics`), from Debian's
#              `prometheus` package. Installing that package would also install and start a
#              Prometheus server, so the .deb is downloaded and only promtool is extracted.
#
#   scripts/fetch_tools.sh        # into ${SLIME_TOOLS_DIR:-<repo>/.cache/tools}/bin
# Idempotent; needs apt-get (download only, nothing is installed) and dpkg-deb.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${SLIME_TOOLS_DIR:-${repo_root}/.cache/tools}"
if [[ -x "${dest}/bin/promtool" ]]; then
  echo "fetch_tools: up to date in ${dest}"
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
(cd "${work}" && apt-get download prometheus >/dev/null 2>&1) || {
  # apt-get download needs package lists; refresh them once (root) and retry.
  if [[ "$(id -u)" -eq 0 ]]; then apt-get update -q >/dev/null; fi
  (cd "${work}" && apt-get download prometheus >/dev/null)
}
deb=$(ls "${work}"/prometheus_*.deb)
dpkg-deb -x "${deb}" "${work}/x"
mkdir -p "${dest}/bin"
mv "${work}/x/usr/bin/promtool" "${dest}/bin/promtool.new"
mv "${dest}/bin/promtool.new" "${dest}/bin/promtool"
echo "fetch_tools: promtool $("${dest}/bin/promtool" --version 2>&1 | head -1 | awk '{print $3}') in ${dest}/bin"
