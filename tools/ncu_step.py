#!/usr/bin/env python3
"""Kernel durations of the last forward step in an Nsight Compute CSV log.

Usage: ncu_step.py LOG.csv [FIRST_KERNEL]
LOG.csv comes from `ncu --csv --metrics gpu__time_duration.sum` of a command whose last forward
call is the step to look at (`megamoe logits --decode`: one token per call).  Every call starts
with the embedding (FIRST_KERNEL, default k_embed), so the step is the launches from the last
one of those to the end.  Prints them in launch order (name, grid, block, us), then the total
and the sum per kernel name.
"""
import csv
import sys


def to_us(value, unit):
    """The duration @p value in @p unit (ncu writes nsecond, usecond, msecond or second) in us."""
    u = unit.strip().lower()
    for prefix, scale in (("n", 1e-3), ("u", 1.0), ("\u00b5", 1.0), ("m", 1e3), ("s", 1e6)):
        if u.startswith(prefix):
            return value * scale
    sys.exit("ncu_step.py: unknown time unit %r" % unit)


def launches(path):
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu's own messages start with ==PROF==
    rows = []
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        us = to_us(float(r["Metric Value"].replace(",", "")), r.get("Metric Unit", "nsecond"))
        rows.append((r["Kernel Name"].split("(")[0].strip(), r.get("Grid Size", ""), r.get("Block Size", ""), us))
    return rows


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    first = sys.argv[2] if len(sys.argv) == 3 else "k_embed"
    rows = launches(sys.argv[1])
    starts = [i for i, r in enumerate(rows) if r[0].split()[-1].split("<")[0] == first]
    if not starts:
        sys.exit("ncu_step.py: no launch of %s in %s" % (first, sys.argv[1]))
    step = rows[starts[-1]:]
    print("| # | kernel | grid | block | us |")
    print("|---:|---|---|---|---:|")
    for i, (name, grid, block, us) in enumerate(step):
        print("| %d | %s | %s | %s | %.1f |" % (i, name, grid, block, us))
    print("\n%d launches, %.1f us in all (serialized)\n" % (len(step), sum(s[3] for s in step)))
    per = {}
    for name, _, _, us in step:
        c, t = per.get(name, (0, 0.0))
        per[name] = (c + 1, t + us)
    for name, (c, t) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print("%-40s %3d launches %8.1f us" % (name, c, t))


if __name__ == "__main__":
    main()
