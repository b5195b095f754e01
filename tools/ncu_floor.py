#!/usr/bin/env python3
"""The last decode step's kernels against two floors: their instructions and their DRAM bytes.

    python3 tools/ncu_floor.py CENSUS.csv [--trace TRACE.json] [--layers N] [--sms S] [--mhz F] [--tbs B]

CENSUS.csv is `ncu --csv --print-units base --metrics gpu__time_duration.sum,smsp__inst_executed.sum,
dram__bytes_read.sum,dram__bytes_write.sum` of a `megamoe bench forward ... --cuda-graph off` run
(tools/gpu-floor.sh); its last step is the launches from the last k_embed on.  TRACE.json is
`tools/kernel_trace.py --json` of the same model's graphed run (the exposed time of each kernel
in the graphed step).  For every kernel name of the step:

  exposed   the graphed step's time that is this kernel's alone (trace; 0 when not traced)
  ncu       its serialized durations (cold caches, the clocks ncu sets)
  Minst     warp instructions issued, millions
  issue     those at the full issue rate: 4 warp instructions a cycle on each of S SMs at F MHz
  MB        DRAM bytes read and written
  bytes     those at B TB/s (tools/stream_probe.cu's cold 512 MB read rate)

A kernel can take no less than the larger of its two floors whatever its schedule; the sum of
the floors is what the step's kernels, as they are written, need at the least on one GPU.
"""
import argparse
import collections
import csv
import json
import re
import sys

CAST = re.compile(r"\((?:[A-Za-z_][A-Za-z_0-9: ]*)\)(?=-?[0-9])")


def norm(name):
    """A kernel name without 'void ', integer casts of template arguments, arguments or spaces."""
    n = CAST.sub("", name.strip())
    if n.startswith("void "):
        n = n[5:]
    depth, out = 0, []
    for ch in n:
        if ch == "(" and depth == 0:
            break
        depth += ch == "<"
        depth -= ch == ">"
        out.append(ch)
    return "".join(out).replace(" ", "")


SCALE = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9,
         "byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "kib": 1024.0, "mib": 1024.0 ** 2,
         "gib": 1024.0 ** 3}


def in_base(value, unit):
    """@p value in nanoseconds, bytes or a plain count, whatever the unit ncu wrote."""
    u = unit.strip().lower()
    return value * SCALE.get(u, 1.0)


def census(path):
    """The launches of the CSV in order: (name, {metric: value in ns, bytes or a count})."""
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    by_id = collections.OrderedDict()
    for r in csv.DictReader(lines):
        k = r["ID"]
        if k not in by_id:
            by_id[k] = (norm(r["Kernel Name"]), {})
        by_id[k][1][r["Metric Name"]] = in_base(float(r["Metric Value"].replace(",", "") or 0), r.get("Metric Unit", ""))
    return list(by_id.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("census")
    ap.add_argument("--trace", help="tools/kernel_trace.py --json of the graphed run")
    ap.add_argument("--layers", type=int, default=1, help="layers of the model (per-layer totals)")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--mhz", type=float, default=1980.0, help="the maximum SM clock")
    ap.add_argument("--tbs", type=float, default=4.0, help="the cold read rate, TB/s")
    ap.add_argument("--first", default="k_embed", help="the kernel that starts a step")
    a = ap.parse_args()
    rows = census(a.census)
    starts = [i for i, (n, _) in enumerate(rows) if n.split("<")[0] == a.first]
    if not starts:
        sys.exit(f"ncu_floor.py: no launch of {a.first} in {a.census}")
    step = rows[starts[-1]:]
    exposed = {}
    if a.trace:
        with open(a.trace) as f:
            tr = json.load(f)
        for k, v in tr["by_name"].items():
            exposed[norm(k)] = exposed.get(norm(k), 0.0) + v["exposed_us"]
    inst_per_us = a.sms * 4 * a.mhz
    bytes_per_us = a.tbs * 1e6
    per = collections.OrderedDict()
    for name, m in step:
        p = per.setdefault(name, [0, 0.0, 0.0, 0.0])
        p[0] += 1
        p[1] += m.get("gpu__time_duration.sum", 0.0) / 1e3
        p[2] += m.get("smsp__inst_executed.sum", 0.0)
        p[3] += m.get("dram__bytes_read.sum", 0.0) + m.get("dram__bytes_write.sum", 0.0)
    print(f"last step of {a.census}: {len(step)} launches; issue rate {a.sms} SMs x 4 x {a.mhz:.0f} MHz = "
          f"{inst_per_us / 1e6:.3f} G warp instructions/ms; bytes at {a.tbs:.2f} TB/s")
    print(f"{'exposed':>8} {'ncu':>8} {'Minst':>7} {'issue':>7} {'MB':>7} {'bytes':>7} {'floor':>7} {'n':>3}  kernel (us)")
    tot = [0.0] * 7
    for name, (n, dur, inst, byt) in sorted(per.items(), key=lambda kv: -exposed.get(kv[0], 0.0)):
        e = exposed.get(name, 0.0)
        iss, bt = inst / inst_per_us, byt / bytes_per_us
        fl = max(iss, bt)
        print(f"{e:8.1f} {dur:8.1f} {inst / 1e6:7.2f} {iss:7.1f} {byt / 1e6:7.1f} {bt:7.1f} {fl:7.1f} {n:3d}  {name[:70]}")
        for i, v in enumerate((e, dur, inst / 1e6, iss, byt / 1e6, bt, fl)):
            tot[i] += v
    traced = sum(exposed.values())
    print(f"{tot[0]:8.1f} {tot[1]:8.1f} {tot[2]:7.2f} {tot[3]:7.1f} {tot[4]:7.1f} {tot[5]:7.1f} {tot[6]:7.1f}      all "
          f"(the trace's exposed time in all: {traced:.1f} us)")
    L = max(a.layers, 1)
    print(f"a layer (/{L}): exposed {tot[0] / L:.1f} us, issue floor {tot[3] / L:.1f}, byte floor {tot[5] / L:.1f}, "
          f"sum of the larger floors {tot[6] / L:.1f}")
    if a.trace:
        missing = sorted(set(exposed) - set(per))
        if missing:
            print("traced but not in the census step: " + ", ".join(f"{k} {exposed[k]:.1f}" for k in missing))


if __name__ == "__main__":
    main()
