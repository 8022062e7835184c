#!/usr/bin/env bash
# scripts/plot_metrics on a sample metrics.jsonl written here: a malformed line and a record
# without rollout_id (warned with their line numbers, skipped), a rollout_id repeated by a
# "resumed run" (the later value wins), eval records mixed in. Checks the PNG (magic bytes, IHDR
# size, non-trivial file size), the default output path, --keys globs, and the errors: no
# plottable key (exit 2, no PNG), missing input (exit 2), matplotlib missing (exit 3, names
# scripts/setup.sh; simulated with a matplotlib package that fails to import).
#
# Usage: plot_metrics_test.sh PATH/TO/scripts/plot_metrics      Exit: 0 pass, 1 fail.
set -uo pipefail
script=${1:?usage: plot_metrics_test.sh PATH/TO/plot_metrics}
failures=0
log() { echo "[plot_metrics_test] $*"; }
fail() { log "FAIL: $*"; failures=$((failures + 1)); }
expect_in() {  # expect_in FILE TEXT WHAT
  grep -qF -- "$2" "$1" || { fail "$3: '$2' not in $(basename "$1"):"; sed 's/^/    /' "$1"; }
}

dir=$(mktemp -d /tmp/slime_plot_metrics.XXXXXX)
trap 'rm -rf "$dir"' EXIT
run="$dir/run"
mkdir -p "$run"

# Lines 1-5: rollouts 0..4 (rollout 2 has an outlier reward 5.0 that the resumed run replaces);
# line 6: malformed; line 7: eval record; line 8: no rollout_id; line 9: rollout 2 again.
{
  for r in 0 1 2 3 4; do
    reward="0.$((r + 1))"
    [ "$r" = 2 ] && reward="5.0"
    printf '{"time": 1764489600.%d, "rollout_id": %d, "step": %d, "rollout/raw_reward": %s, ' "$r" "$r" "$r" "$reward"
    printf '"rollout/response_length": %d.5, "train/kl_loss": 0.0, "train/ppo_kl": 0.00%d, ' "$((10 + r))" "$r"
    printf '"train/pg_clipfrac": 0.01, "train/entropy_loss": 2.%d, "train/grad_norm": 0.8, ' "$((9 - r))"
    printf '"train/lr": 1e-05, "perf/step_time": 18.%d, "note": "text is ignored"}\n' "$r"
  done
  echo '{"time": 1764489601.0, "rollout_id": 5, "train/loss": '
  echo '{"time": 1764489602.0, "rollout_id": 4, "eval/add2": 0.35, "eval/add2-pass@4": 0.5, "eval/add2/response_len/mean": 9.0}'
  echo '{"event": "resumed"}'
  echo '{"time": 1764489603.0, "rollout_id": 2, "rollout/raw_reward": 0.3, "perf/step_time": 18.2}'
} > "$run/metrics.jsonl"

check_png() {  # check_png FILE: PNG signature, an IHDR with a non-zero size, more than 10 KB
  local f=$1
  [ -f "$f" ] || { fail "$f was not written"; return; }
  local magic
  magic=$(od -An -tx1 -N8 "$f" | tr -d ' \n')
  [ "$magic" = "89504e470d0a1a0a" ] || fail "$f: not a PNG (first bytes $magic)"
  [ "$(dd if="$f" bs=1 skip=12 count=4 2> /dev/null)" = "IHDR" ] || fail "$f: no IHDR chunk"
  local width height
  width=$(od -An -tu1 -j16 -N4 "$f" | awk '{print $1*16777216 + $2*65536 + $3*256 + $4}')
  height=$(od -An -tu1 -j20 -N4 "$f" | awk '{print $1*16777216 + $2*65536 + $3*256 + $4}')
  { [ "$width" -ge 400 ] && [ "$height" -ge 300 ]; } || fail "$f: image is ${width}x${height}"
  local size
  size=$(stat -c %s "$f")
  [ "$size" -gt 10000 ] || fail "$f: only $size bytes"
  log "$(basename "$f"): ${width}x${height}, $size bytes"
}

# 1. Default panels, output beside the input (<run>/metrics.png).
"$script" "$run" > "$dir/out1" 2> "$dir/err1"
rc=$?
if [ "$rc" = 3 ]; then
  cat "$dir/err1"
  log "FAIL: matplotlib is missing: run scripts/setup.sh (Debian package python3-matplotlib)"
  exit 1
fi
[ "$rc" = 0 ] || { fail "default run exited $rc"; cat "$dir/err1"; }
check_png "$run/metrics.png"
expect_in "$dir/err1" "metrics.jsonl:6: malformed JSON" "malformed line warning"
expect_in "$dir/err1" "1 record(s) without an integer rollout_id skipped (line 8)" "no-id warning"
[ "$(grep -c warning "$dir/err1")" = 2 ] || fail "expected exactly 2 warnings"
expect_in "$dir/out1" "7 panel(s) from 7 record(s)" "panel count"
# The resumed run's rollout 2 (0.3) replaced the first one (5.0): 5 points, max 0.5.
expect_in "$dir/out1" "rollout/raw_reward: 5 point(s), rollout 0..4, last 0.5, min 0.1, max 0.5" \
  "later record wins"
expect_in "$dir/out1" "eval/add2: 1 point(s), rollout 4..4" "eval reward panel"
# kl_loss is all zero here (KL loss off), so the KL panel shows ppo_kl.
expect_in "$dir/out1" "train/ppo_kl: 5 point(s)" "KL panel"
for key in rollout/response_length train/pg_clipfrac train/entropy_loss perf/step_time; do
  expect_in "$dir/out1" "$key: 5 point(s)" "default panel $key"
done
for key in eval/add2-pass@4 eval/add2/response_len train/kl_loss train/lr note: time: step:; do
  grep -qF "  $key" "$dir/out1" && fail "$key should not be a default panel"
done

# 2. --keys with a glob and an exact key, explicit output path.
"$script" "$run/metrics.jsonl" -o "$dir/sub/keys.png" --keys 'train/*,eval/add2-pass@4,nope' \
  > "$dir/out2" 2> "$dir/err2"
rc=$?
[ "$rc" = 0 ] || { fail "--keys run exited $rc"; cat "$dir/err2"; }
check_png "$dir/sub/keys.png"
expect_in "$dir/out2" "7 panel(s)" "--keys panel count (6 train/* + 1)"
expect_in "$dir/out2" "train/lr: 5 point(s)" "--keys glob"
expect_in "$dir/out2" "eval/add2-pass@4: 1 point(s)" "--keys exact key"
expect_in "$dir/err2" "no key matches 'nope'" "--keys unmatched warning"
ls -a "$dir/sub" | grep -q tmp && fail "a temporary file was left in $dir/sub"

# 3. No plottable key: exit 2, a message naming the file, no PNG.
printf '{"rollout_id": 0, "note": "x"}\n{"rollout_id": 1, "flag": true}\nnot json\n' > "$dir/empty.jsonl"
"$script" "$dir/empty.jsonl" > "$dir/out3" 2> "$dir/err3"
rc=$?
[ "$rc" = 2 ] || fail "no plottable key: exit $rc, expected 2"
expect_in "$dir/err3" "empty.jsonl: no plottable key of the default set in 2 record(s)" "no-key error"
expect_in "$dir/err3" "empty.jsonl:3: malformed JSON" "malformed line before the error"
[ -e "$dir/empty.png" ] && fail "a PNG was written for an input without plottable keys"
"$script" "$run" --keys 'perf/nothing*' > /dev/null 2> "$dir/err3b"
rc=$?
[ "$rc" = 2 ] || fail "--keys matching nothing: exit $rc, expected 2"
expect_in "$dir/err3b" "numeric keys: eval/add2" "the error lists the keys there are"

# 4. Missing input.
"$script" "$dir/missing" > /dev/null 2> "$dir/err4"
rc=$?
[ "$rc" = 2 ] || fail "missing input: exit $rc, expected 2"
expect_in "$dir/err4" "$dir/missing: no such file or directory" "missing input error"
mkdir -p "$dir/norun"
"$script" "$dir/norun" > /dev/null 2> "$dir/err4b"
[ $? = 2 ] || fail "run dir without metrics.jsonl: expected exit 2"
expect_in "$dir/err4b" "no metrics.jsonl in run directory $dir/norun" "run dir error"

# 5. matplotlib missing (a package of that name that fails to import shadows the real one).
mkdir -p "$dir/fake/matplotlib"
echo 'raise ImportError("simulated: no matplotlib")' > "$dir/fake/matplotlib/__init__.py"
PYTHONPATH="$dir/fake" "$script" "$run" -o "$dir/none.png" > /dev/null 2> "$dir/err5"
rc=$?
[ "$rc" = 3 ] || fail "matplotlib missing: exit $rc, expected 3"
expect_in "$dir/err5" "matplotlib is not installed" "missing matplotlib error"
expect_in "$dir/err5" "run scripts/setup.sh" "missing matplotlib error names setup.sh"

if [ "$failures" -ne 0 ]; then
  log "$failures failure(s)"
  exit 1
fi
log "all checks passed"
