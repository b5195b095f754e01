#!/usr/bin/env python3
"""The SASS instructions of a kernel where its warps stall, from an Nsight Compute source page.

Usage: ncu_sass_stalls.py PAGE.csv [TOP]
PAGE.csv comes from `ncu --import REPORT.ncu-rep --page source --print-source sass --csv` of a
report collected with the SourceCounters section (`--set full`).  Nsight Compute writes one row
per SASS instruction with its address, its text and, among other counters, the warp stall
samples at it.  Prints the TOP (default 40) instructions with the most samples, each with its
share of all samples and, where the page has them, its stall reasons in samples, then the
samples per opcode.  The column names differ between Nsight Compute versions: a column is taken
as the sample count when its name says "Warp Stall Sampling" and "All", as a reason when it
starts with "stall_" or holds "Stall" and a reason's name; the header is printed when no
sample column is found, so that a new name can be added here.
"""
import csv
import sys
from collections import defaultdict


def number(text):
    """A counter's cell as a float (empty or non-numeric: 0)."""
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return 0.0


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: ncu_sass_stalls.py PAGE.csv [TOP]")
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with open(sys.argv[1], newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu's own messages start with ==PROF==
    rows = list(csv.DictReader(lines))
    if not rows:
        sys.exit("ncu_sass_stalls.py: no rows in %s" % sys.argv[1])
    header = list(rows[0].keys())
    sample = next((c for c in header if "Warp Stall Sampling" in c and "All" in c), None)
    if sample is None:
        sample = next((c for c in header if "Stall Sampling" in c or "pcsamp" in c), None)
    if sample is None:
        print("ncu_sass_stalls.py: no stall-sample column; the header is:")
        for c in header:
            print("  " + c)
        sys.exit(1)
    text = next((c for c in header if c.strip().lower() in ("source", "sass")), header[1])
    addr = next((c for c in header if "Address" in c), header[0])
    reasons = [c for c in header if c != sample and (c.startswith("stall_") or ("Stall" in c and "Sampling" not in c))]
    total = sum(number(r[sample]) for r in rows)
    print("%d instructions, %.0f stall samples in all (column '%s')" % (len(rows), total, sample))
    ranked = sorted(rows, key=lambda r: -number(r[sample]))[:top]
    for r in ranked:
        n = number(r[sample])
        why = ", ".join("%s %.0f" % (c, number(r[c])) for c in reasons if number(r[c]) > 0)
        print("%6.0f %5.1f%%  %-8s %-60s %s" % (n, 100.0 * n / total if total else 0.0, r[addr], r[text][:60], why))
    per_op = defaultdict(float)
    for r in rows:
        op = r[text].split()[0] if r[text].split() else "?"
        if op.startswith("@") and len(r[text].split()) > 1:
            op = r[text].split()[1]
        per_op[op.split(".")[0]] += number(r[sample])
    print("\nsamples per opcode:")
    for op, n in sorted(per_op.items(), key=lambda kv: -kv[1])[:20]:
        print("%8.0f %5.1f%%  %s" % (n, 100.0 * n / total if total else 0.0, op))


if __name__ == "__main__":
    main()
