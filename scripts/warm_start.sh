#!/usr/bin/env bash
# Builds the quickstart's warm-started tiny model (docs/data.md "Warm start"):
#
#   scripts/warm_start.sh            # -> runs/tiny-model (model.hf_checkpoint of grpo-tiny-cpu)
#
# 1. the Qwen3 tokenizer (scripts/fetch_test_data.sh, into .cache/testdata/qwen3);
# 2. `slime_train make-byte-tokenizer`: its byte-level subset (256 byte tokens + the special
#    tokens, same chat template) into runs/tiny-tokenizer, the tiny model's 282-id vocabulary;
# 3. `slime_train make-demo-data --digits 1` into runs/demo-add1 (the quickstart's prompts: 80
#    train, 20 held-out eval, the 80 train problems as SFT conversations);
# 4. `slime_train init-model` of configs/tiny-model/config.json into runs/tiny-model-init;
# 5. `slime_train sft` on runs/demo-add1/sft.jsonl into runs/tiny-model (HF directory): a short
#    SFT that leaves the model partly right, so that GRPO has room to raise the accuracy.
# Idempotent: a step is skipped when its output directory exists with a stamp file
# (runs/<name>.done) holding the same recipe; a missing or different stamp (interrupted run,
# changed recipe) redoes the step and everything after it.
#
# Environment: SLIME_BIN (default build/src/app/slime_train); SLIME_WARM_START_EPOCHS (SFT
# passes over the 80 conversations, default 28); SLIME_RUNS (default runs).
# OPENBLAS_NUM_THREADS defaults to 1: the recipe was measured so, and one BLAS thread per
# process keeps the two-core machine's other processes responsive.
set -Eeuo pipefail
trap 'rc=$?; echo "warm_start: FAILED: \`${BASH_COMMAND}\` exited ${rc} (scripts/warm_start.sh line ${LINENO})" >&2' ERR

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${repo_root}"
bin="${SLIME_BIN:-build/src/app/slime_train}"
runs="${SLIME_RUNS:-runs}"
epochs="${SLIME_WARM_START_EPOCHS:-28}"
qwen3_dir="${SLIME_TEST_DATA:-.cache/testdata}/qwen3"
tok_dir="${runs}/tiny-tokenizer"
model_config="configs/tiny-model/config.json"
data_dir="${runs}/demo-add1"
sft_data="${data_dir}/sft.jsonl"
init_dir="${runs}/tiny-model-init"
sft_dir="${runs}/tiny-model"
ckpt_dir="${runs}/tiny-model-sft-checkpoint"

if [[ ! -x "${bin}" ]]; then
  echo "warm_start: ${bin} is not an executable; build it (scripts/build.sh) or set SLIME_BIN" >&2
  exit 1
fi
for f in "${model_config}"; do
  [[ -f "${f}" ]] || { echo "warm_start: ${f} is missing" >&2; exit 1; }
done
if ! [[ "${epochs}" =~ ^[1-9][0-9]*$ ]]; then
  echo "warm_start: SLIME_WARM_START_EPOCHS must be a positive integer, got '${epochs}'" >&2
  exit 1
fi

# The torch CPU kernels allocate and free tens of MB per step (the 151,936-row LM head and its
# gradient); with glibc's defaults every such block is a fresh mmap and page faults cost ~3x the
# step time. Keep freed memory in the heap instead.
export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-4294967296}"
export MALLOC_TRIM_THRESHOLD_="${MALLOC_TRIM_THRESHOLD_:-4294967296}"
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"

sft_args=(--device cpu --dtype fp32 --epochs "${epochs}" --batch-size 8 --micro-batch-size 8
          --lr 1e-2 --min-lr 1e-3 --lr-decay-style cosine --warmup-steps 20 --clip-grad 1.0
          --seed 1234)
init_args=(--seed 1 --dtype fp32)
data_args=(--digits 1 --train 80 --eval 20 --sft 80 --seed 1)
hash_of() { sha256sum | cut -c1-16; }

# done_with NAME RECIPE: the output directory and its stamp with this recipe exist.
done_with() {
  [[ -d "${runs}/$1" && -f "${runs}/$1.done" && "$(cat "${runs}/$1.done")" == "$2" ]]
}
now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

start_all="$(now)"
echo "warm_start: load $(cut -d' ' -f1-3 /proc/loadavg), ${bin}"

t="$(now)"
echo "warm_start: [1/5] Qwen3 tokenizer -> ${qwen3_dir}"
if [[ -f "${qwen3_dir}/tokenizer.json" && -f "${qwen3_dir}/tokenizer_config.json" ]]; then
  echo "warm_start:       present"
else
  scripts/fetch_test_data.sh
fi
echo "warm_start:       $(took "${t}")"

# Each step's recipe: its inputs' hashes and arguments (computed once the tokenizer is there).
data_recipe="make-demo-data ${data_args[*]}"
tok_recipe="make-byte-tokenizer $(cat "${qwen3_dir}/tokenizer.json" "${qwen3_dir}/tokenizer_config.json" | hash_of)"
init_recipe="${tok_recipe} | init $(hash_of < "${model_config}") ${init_args[*]}"
sft_recipe="${init_recipe} | ${data_recipe} | sft ${sft_args[*]}"

mkdir -p "${runs}"
t="$(now)"
echo "warm_start: [2/5] make-byte-tokenizer ${qwen3_dir} -> ${tok_dir}"
if done_with tiny-tokenizer "${tok_recipe}"; then
  echo "warm_start:       up to date"
else
  rm -rf "${tok_dir}" "${runs}/tiny-tokenizer.done" "${runs}/tiny-model-init.done" "${runs}/tiny-model.done"
  "${bin}" make-byte-tokenizer --from "${qwen3_dir}" --out "${tok_dir}"
  echo "${tok_recipe}" > "${runs}/tiny-tokenizer.done"
fi
echo "warm_start:       $(took "${t}")"

t="$(now)"
echo "warm_start: [3/5] make-demo-data ${data_args[*]} -> ${data_dir}"
if done_with demo-add1 "${data_recipe}"; then
  echo "warm_start:       up to date"
else
  rm -rf "${data_dir}" "${runs}/demo-add1.done" "${runs}/tiny-model.done"
  "${bin}" make-demo-data --out "${data_dir}" "${data_args[@]}"
  echo "${data_recipe}" > "${runs}/demo-add1.done"
fi
echo "warm_start:       $(took "${t}")"

t="$(now)"
echo "warm_start: [4/5] init-model ${model_config} -> ${init_dir}"
if done_with tiny-model-init "${init_recipe}"; then
  echo "warm_start:       up to date"
else
  rm -rf "${init_dir}" "${runs}/tiny-model-init.done" "${runs}/tiny-model.done"
  "${bin}" init-model --config "${model_config}" --tokenizer "${tok_dir}" --out "${init_dir}" \
    "${init_args[@]}"
  echo "${init_recipe}" > "${runs}/tiny-model-init.done"
fi
echo "warm_start:       $(took "${t}")"

t="$(now)"
echo "warm_start: [5/5] sft ${sft_data} (${epochs} epochs) -> ${sft_dir}"
if done_with tiny-model "${sft_recipe}"; then
  echo "warm_start:       up to date"
else
  rm -rf "${sft_dir}" "${ckpt_dir}" "${runs}/tiny-model.done"
  log="${runs}/tiny-model-sft.log"
  # One line per step goes to the log; the progress shown here is every 25th step. The log
  # exists before the job starts, or `tail -f` below could look for it first and fail.
  : > "${log}"
  "${bin}" sft --model "${init_dir}" --data "${sft_data}" --save "${ckpt_dir}" \
    --save-hf "${sft_dir}" "${sft_args[@]}" \
    > "${log}" 2>&1 &
  sft_pid=$!
  trap 'kill "${sft_pid}" 2>/dev/null || true' EXIT INT TERM
  tail -n +1 -f --pid="${sft_pid}" "${log}" 2>/dev/null |
    awk '/^sft step/ { split($3, s, "/"); if (s[1] % 25 == 0 || s[1] == s[2]) print "warm_start:       " $0; fflush() }'
  if ! wait "${sft_pid}"; then
    trap - EXIT INT TERM
    echo "warm_start: sft failed; the last lines of ${log}:" >&2
    tail -n 20 "${log}" >&2
    exit 1
  fi
  trap - EXIT INT TERM
  rm -rf "${ckpt_dir}"
  echo "${sft_recipe}" > "${runs}/tiny-model.done"
fi
echo "warm_start:       $(took "${t}")"
echo "warm_start: ${sft_dir} ready ($(took "${start_all}") in all)"
