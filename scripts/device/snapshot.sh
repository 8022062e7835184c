#!/usr/bin/env bash
# Builds and runs from a committed snapshot instead of the working tree, for when the working tree
# holds other people's unfinished files (the device tool always sends the whole working tree).
#
#   here:   scripts/device/snapshot.sh --make [REV]     writes .devsnap.tar (git archive of REV,
#                                                       default HEAD; ignored via .git/info/exclude)
#   there:  scripts/device/snapshot.sh -- RUN.SH-ARGS   unpacks it into /tmp/snap (kept between
#                                                       calls while the machine is warm, so the
#                                                       build is incremental), links the carried
#                                                       third_party_debs/ and .cache/, runs
#                                                       scripts/device/run.sh RUN.SH-ARGS there
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
if [ "${1:-}" = "--make" ]; then
  git -C "$repo" archive --format=tar "${2:-HEAD}" > "$repo/.devsnap.tar"
  grep -qx '/.devsnap.tar' "$repo/.git/info/exclude" 2>/dev/null ||
    { mkdir -p "$repo/.git/info"; echo '/.devsnap.tar' >> "$repo/.git/info/exclude"; }
  echo "snapshot: $(git -C "$repo" rev-parse --short "${2:-HEAD}") -> $repo/.devsnap.tar"
  exit 0
fi
[ "${1:-}" = "--" ] && shift
snap=/tmp/snap
mkdir -p "$snap"
tar xf "$repo/.devsnap.tar" -C "$snap"
for d in third_party_debs .cache; do
  rm -rf "${snap:?}/$d"
  [ -e "$repo/$d" ] && ln -s "$repo/$d" "$snap/$d"
done
cd "$snap"
exec scripts/device/run.sh "$@"
