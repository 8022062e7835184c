#!/usr/bin/env python3
"""Reads a run's TensorBoard event files with TensorBoard's own reader (EventAccumulator, the
`tensorboard` pip package) and checks they carry the scalars of the run's metrics.jsonl:
per tag, the same steps (a record's "step", else its "rollout_id"), values (as 32-bit floats;
a JSON null is a NaN) and wall times, in the same order (docs/operations.md "TensorBoard").

  check_tensorboard.py --logdir DIR --jsonl RUN_DIR/metrics.jsonl
  check_tensorboard.py --run BUILD/src/app/slime_train [--rollouts N]

--run first makes a tiny random Qwen3 model (`slime_train init-model`, tokenizer from
$SLIME_TEST_DATA or .cache/testdata/qwen3) and runs the quickstart's job
(configs/grpo-tiny-cpu.yaml, CPU slots, N rollouts, default 2) with metrics.tensorboard_dir set,
in a temporary directory, from the repository root. On the GPU machine:

  scripts/device/run.sh --no-tests --targets slime_train \\
      --py 'scripts/device/check_tensorboard.py --run $SLIME_BUILD/src/app/slime_train'

Exit 0: the same scalars; 1: differences (listed); 2: bad input, a failed run or no tensorboard.
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AXES = ("time", "step", "rollout_id")


def fail(message, code=2):
    print(f"check_tensorboard: {message}", file=sys.stderr)
    sys.exit(code)


def as_float32(x):
    """x rounded to a 32-bit float, as the writer's simple_value holds it."""
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:  # beyond float's range: infinity, as the C++ cast gives
        return math.copysign(math.inf, x)


def expected_from_jsonl(path):
    """tag -> [(step, wall_time, value)] in line order, as the event files should hold them."""
    out = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                step = r["step"] if "step" in r else r["rollout_id"]
                time = r["time"]
            except (ValueError, KeyError) as e:
                fail(f"{path}:{n}: not a metrics record ({e})")
            for key, value in r.items():
                if key in AXES:
                    continue
                if isinstance(value, bool):
                    value = 1.0 if value else 0.0
                elif value is None:
                    value = math.nan
                elif not isinstance(value, (int, float)):
                    continue  # strings, lists, objects: not scalars
                out.setdefault(key, []).append((step, time, as_float32(value)))
    return out


def actual_from_tensorboard(logdir):
    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError as e:
        fail(f"the tensorboard package is not importable ({e}): pip install tensorboard")
    files = sorted(f for f in os.listdir(logdir) if "tfevents" in f)
    if not files:
        fail(f"{logdir}: no event files (names with 'tfevents')")
    # size_guidance 0: keep every scalar (the default samples 10,000 per tag).
    acc = event_accumulator.EventAccumulator(logdir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["scalars"]:
        out[tag] = [(e.step, e.wall_time, e.value) for e in acc.Scalars(tag)]
    return files, out


def same(a, b):
    return (a[0] == b[0] and a[1] == b[1] and
            (a[2] == b[2] or (math.isnan(a[2]) and math.isnan(b[2]))))


def compare(expected, actual):
    problems = []
    for tag in sorted(set(expected) | set(actual)):
        want, got = expected.get(tag), actual.get(tag)
        if want is None:
            problems.append(f"{tag}: in the event files, not in metrics.jsonl")
        elif got is None:
            problems.append(f"{tag}: in metrics.jsonl, not in the event files")
        elif len(want) != len(got) or not all(same(w, g) for w, g in zip(want, got)):
            problems.append(f"{tag}:\n  metrics.jsonl (step, time, value): {want}\n"
                            f"  event files:                       {got}")
    return problems


def run_job(binary, rollouts, work):
    tokenizer = os.path.join(os.environ.get("SLIME_TEST_DATA") or
                             os.path.join(REPO, ".cache", "testdata"), "qwen3")
    if not os.path.isfile(os.path.join(tokenizer, "tokenizer.json")):
        fail(f"{tokenizer}/tokenizer.json missing: run scripts/fetch_test_data.sh")
    model = os.path.join(work, "model")
    steps = [
        ("init-model", [binary, "init-model", "--config",
                        os.path.join(REPO, "tests/data/model/configs/qwen3-tiny.json"),
                        "--tokenizer", tokenizer, "--out", model, "--dtype", "fp32",
                        "--seed", "3"]),
        ("the quickstart's job", [binary, "--config", "configs/grpo-tiny-cpu.yaml",
                                  "--set", f"cluster.run_dir={work}/run",
                                  "--set", f"checkpoint.save={work}/ckpt",
                                  "--set", f"checkpoint.load={work}/ckpt",
                                  "--set", f"data.num_rollout={rollouts}",
                                  "--set", f"metrics.tensorboard_dir={work}/tb"]),
    ]
    env = dict(os.environ,
               SLIME_TINY_MODEL=model,
               SLIME_TINY_DATA=os.path.join(REPO, "data/demo/train.jsonl@[0:64]"),
               SLIME_TINY_EVAL=os.path.join(REPO, "data/demo/eval.jsonl@[0:8]"))
    for name, cmd in steps:
        print(f"check_tensorboard: {name}: {' '.join(cmd)}", flush=True)
        done = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            print(done.stdout[-6000:], file=sys.stderr)
            fail(f"{name} exited {done.returncode}")
    return os.path.join(work, "tb"), os.path.join(work, "run", "metrics.jsonl")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--logdir", help="the run's metrics.tensorboard_dir")
    p.add_argument("--jsonl", help="the run's metrics.jsonl")
    p.add_argument("--run", metavar="SLIME_TRAIN", help="run the quickstart's job first")
    p.add_argument("--rollouts", type=int, default=2)
    args = p.parse_args()
    if bool(args.run) == bool(args.logdir or args.jsonl) or (not args.run and not
                                                              (args.logdir and args.jsonl)):
        fail("give either --logdir and --jsonl, or --run SLIME_TRAIN")
    with tempfile.TemporaryDirectory(prefix="check_tensorboard_") as work:
        logdir, jsonl = (run_job(os.path.abspath(args.run), args.rollouts, work) if args.run
                         else (args.logdir, args.jsonl))
        expected = expected_from_jsonl(jsonl)
        files, actual = actual_from_tensorboard(logdir)
    if not expected:
        fail(f"{jsonl}: no scalars")
    problems = compare(expected, actual)
    points = sum(len(v) for v in expected.values())
    if problems:
        print("\n".join(problems))
        fail(f"{len(problems)} of {len(set(expected) | set(actual))} tags differ", 1)
    print(f"check_tensorboard: OK: {len(files)} event file(s), {len(expected)} tags, {points} "
          f"points, the same as {os.path.basename(jsonl)} (tensorboard's EventAccumulator)")


if __name__ == "__main__":
    main()
