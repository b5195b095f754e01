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
sample column is found, so that a new name can be added here.  A page of several profiled
kernels holds one table per kernel, each opening with its header (the same first column): each
table is reported on its own.
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


def tables(lines):
    """The page's tables as (kernel name, rows as dicts): a table opens with a "Kernel Name" row
    (newer Nsight Compute: the name, then the header) or with a header row (its first cell the
    first header's, as older versions write several kernels)."""
    out, header, name, want_header = [], None, None, False
    for cells in csv.reader(lines):
        if cells and cells[0] == "Kernel Name":
            name = cells[1] if len(cells) > 1 else None
            want_header = True
            continue
        if want_header or header is None or (cells and cells[0] == header[0]):
            header, want_header = cells, False
            out.append((name, []))
            continue
        out[-1][1].append(dict(zip(header, cells)))
    return [(n, t) for n, t in out if t]


def opcode(text):
    """The opcode of a SASS line without its predicate and modifiers ("@!P0 LDG.E.128 .." -> LDG)."""
    words = text.split()
    if words and words[0].startswith("@") and len(words) > 1:
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def text_and_address(header):
    """The columns of a row's SASS text and of its address, by their names in @p header."""
    text = next((c for c in header if c.strip().lower() in ("source", "sass")), header[1])
    addr = next((c for c in header if "Address" in c), header[0])
    return text, addr


def no_column(tool, name, what, header):
    """Say that kernel table @p name has no @p what column, print its @p header; False."""
    print("%s: %s: no %s column; the header is:" % (tool, name, what))
    for c in header:
        print("  " + c)
    return False


def run(tool, path, report_table):
    """Read the source page @p path and report each of its kernel tables with report_table(rows,
    name); exit 0 when every table was reported, 1 otherwise."""
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu's own messages start with ==PROF==
    found = tables(lines)
    if not found:
        sys.exit("%s: no rows in %s" % (tool, path))
    ok = [report_table(rows, "kernel %d of %d%s" % (i + 1, len(found), " (%s)" % n if n else ""))
          for i, (n, rows) in enumerate(found)]
    sys.exit(0 if all(ok) else 1)


def report(rows, top, name):
    """Print one kernel's table (@p rows) as the module's docstring says."""
    header = list(rows[0].keys())
    sample = next((c for c in header if "Warp Stall Sampling" in c and "All" in c), None)
    if sample is None:
        sample = next((c for c in header if "Stall Sampling" in c or "pcsamp" in c), None)
    if sample is None:
        return no_column("ncu_sass_stalls.py", name, "stall-sample", header)
    text, addr = text_and_address(header)
    reasons = [c for c in header if c != sample and (c.startswith("stall_") or ("Stall" in c and "Sampling" not in c))]
    total = sum(number(r[sample]) for r in rows)
    print("%s: %d instructions, %.0f stall samples in all (column '%s')" % (name, len(rows), total, sample))
    ranked = sorted(rows, key=lambda r: -number(r[sample]))[:top]
    for r in ranked:
        n = number(r[sample])
        why = ", ".join("%s %.0f" % (c, number(r[c])) for c in reasons if number(r[c]) > 0)
        print("%6.0f %5.1f%%  %-8s %-60s %s" % (n, 100.0 * n / total if total else 0.0, r[addr], r[text][:60], why))
    per_op = defaultdict(float)
    for r in rows:
        per_op[opcode(r[text])] += number(r[sample])
    print("\nsamples per opcode:")
    for op, n in sorted(per_op.items(), key=lambda kv: -kv[1])[:20]:
        print("%8.0f %5.1f%%  %s" % (n, 100.0 * n / total if total else 0.0, op))
    print()
    return True


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: ncu_sass_stalls.py PAGE.csv [TOP]")
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    run("ncu_sass_stalls.py", sys.argv[1], lambda rows, name: report(rows, top, name))


if __name__ == "__main__":
    main()
