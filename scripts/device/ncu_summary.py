#!/usr/bin/env python3
"""Per-kernel time summary of an `ncu --csv --metrics gpu__time_duration.sum` log.

    ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file K.csv PROGRAM...
    python3 scripts/device/ncu_summary.py K.csv [--steps N] [--top 30]

Groups kernels by (shortened) name and prints count, total and mean microseconds, sorted by
total; --steps divides counts and totals by the number of decode steps profiled, which gives
kernels per step and microseconds per step.
"""
import argparse
import csv
import collections
import re
import sys


def short(name: str) -> str:
    name = re.sub(r"\(.*", "", name)  # drop the argument list
    return name[:110]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--steps", type=float, default=1.0)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    rows = []
    with open(a.csv, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prefixes log lines with ==PROF==
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "nsecond")
        v = float(r["Metric Value"].replace(",", ""))
        us = v / 1000.0 if unit.startswith("n") else (v * 1000.0 if unit.startswith("m") else v)
        rows.append((short(r["Kernel Name"]), us))
    agg = collections.defaultdict(lambda: [0, 0.0])
    for n, us in rows:
        agg[n][0] += 1
        agg[n][1] += us
    total = sum(v[1] for v in agg.values())
    print(f"{len(rows)} kernels, {total:.1f} us total; per step (/{a.steps:g}): "
          f"{len(rows) / a.steps:.1f} kernels, {total / a.steps:.1f} us")
    print(f"{'count/step':>10} {'us/step':>9} {'mean us':>8}  kernel")
    for n, (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[: a.top]:
        print(f"{c / a.steps:10.1f} {t / a.steps:9.1f} {t / c:8.2f}  {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
