#!/usr/bin/env python3
"""What a kernel's warps execute, by opcode and by loop, from an Nsight Compute source page.

Usage: ncu_sass_mix.py PAGE.csv [--per N] [--body COUNT]
PAGE.csv is the page tools/ncu_sass_stalls.py reads (`ncu --import R --page source --print-source
sass --csv`, a report with the SourceCounters section).  Its "Instructions Executed" column counts
the warp instructions issued at each SASS address, so the instructions of one loop body share a
count (the loop's trips times the warps that ran it).  Prints, per kernel table:
  - the warp instructions in all and, with --per N (the work items of the launch, e.g. its
    weights), per item;
  - the warp instructions per opcode (predicated-off ones included: they take an issue slot);
  - the execution counts that hold the most instructions (the loop bodies), with how many
    addresses each has and their share of the whole;
  - with --body COUNT, the instructions executed COUNT times, in address order (one loop body).
"""
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ncu_sass_stalls import no_column, number, opcode, run, text_and_address  # noqa: E402  (the page's parsing, written once)


def report(rows, name, per, body):
    """Print one kernel's table (@p rows) as the module's docstring says."""
    header = list(rows[0].keys())
    col = next((c for c in header if c.strip() == "Instructions Executed"), None)
    if col is None:
        return no_column("ncu_sass_mix.py", name, "'Instructions Executed'", header)
    text, addr = text_and_address(header)
    total = sum(number(r[col]) for r in rows)
    line = "%s: %.0f warp instructions" % (name, total)
    if per:
        line += ", %.2f per item (%g items)" % (total / per, per)
    print(line)
    per_op = defaultdict(float)
    per_count = defaultdict(list)
    for r in rows:
        n = number(r[col])
        per_op[opcode(r[text])] += n
        if n > 0:
            per_count[n].append(r)
    print("\nwarp instructions per opcode:")
    for op, n in sorted(per_op.items(), key=lambda kv: -kv[1])[:20]:
        print("%12.0f %5.1f%%  %s" % (n, 100.0 * n / total if total else 0.0, op))
    print("\nexecution counts holding the most instructions (loop bodies):")
    ranked = sorted(per_count.items(), key=lambda kv: -kv[0] * len(kv[1]))[:8]
    for n, rs in ranked:
        share = 100.0 * n * len(rs) / total if total else 0.0
        print("%12.0f times: %4d addresses, %5.1f%% of all" % (n, len(rs), share))
    if body is not None:
        rs = per_count.get(float(body), [])
        print("\nthe %d instructions executed %g times:" % (len(rs), body))
        for r in rs:
            print("  %-8s %s" % (r[addr][-6:], r[text].strip()[:90]))
    print()
    return True


def main():
    args = sys.argv[1:]
    per = body = None
    if "--per" in args:
        i = args.index("--per")
        per = float(args[i + 1])
        del args[i:i + 2]
    if "--body" in args:
        i = args.index("--body")
        body = float(args[i + 1])
        del args[i:i + 2]
    if len(args) != 1:
        sys.exit("usage: ncu_sass_mix.py PAGE.csv [--per N] [--body COUNT]")
    run("ncu_sass_mix.py", args[0], lambda rows, name: report(rows, name, per, body))


if __name__ == "__main__":
    main()
