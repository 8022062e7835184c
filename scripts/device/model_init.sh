# Sourced by the device benchmark scripts (engine_bench.sh, train_bench.sh).
#
#   init_model_command MODEL CONFIG [LAYERS]
# prints the run.sh --run command line that writes the random-weight bf16 model of the HF config
# CONFIG to MODEL with `slime_train init-model` (reused when MODEL already holds a model), with
# CONFIG cut to its first LAYERS layers when LAYERS is given (a deep shape that would not fit the
# machine's disk twice, e.g. Qwen3-30B-A3B). Returns non-zero when the cut config cannot be
# written.
init_model_command() {
  local model="$1" config="$2" layers="${3:-}"
  if [ -n "$layers" ]; then
    local cut="/tmp/$(basename "$config" .json)-${layers}l.json"
    python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
c["num_hidden_layers"] = int(sys.argv[2])
json.dump(c, open(sys.argv[3], "w"), indent=1)' "$config" "$layers" "$cut" || return 1
    config="$cut"
  fi
  printf '%s' "if [ -f $model/config.json ]; then echo 'reusing $model'; else" \
    " \$SLIME_BUILD/src/app/slime_train init-model --config $config" \
    " --tokenizer .cache/testdata/qwen3 --out $model --seed 0 --dtype bf16; fi"
}
