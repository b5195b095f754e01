#!/usr/bin/env python3
"""The timeline of one CUDA graph's launches from tools/kernel_trace.c's CSV: which kernel
runs when, which overlap, and which part of the graph's time each kernel holds alone.

    python3 tools/kernel_trace.py TRACE.csv [--graph ID] [--skip N] [--json]

The graph is the one launched most often (a decode step's graph), unless --graph names it;
the first --skip launches (default 2) are left out as warm-up.  For every node, in the
order of its median start, over the launches:

  start      median start after the launch's first kernel started (us)
  dur        median duration, start to end (us)
  exposed    median time by which the kernel's end moved the latest end of all kernels that
             started before it: the part of the launch's busy time that is this kernel's alone
             (the exposed times and the idle gaps add up to the launch's span)
  idle       median time before its start in which no kernel of the launch ran

A kernel launched programmatically starts while the one before still runs, so its duration
counts time it spends waiting; its exposed time does not.  The totals compare the span with
the sum of the durations (what a serialized profile adds up).

    python3 tools/kernel_trace.py TRACE.csv --base BASE.csv

compares two trees' traces of the same run instead: the span of each, then for every kernel
name the exposed time summed over the graph in BASE and in TRACE, their difference, the
summed durations and the launches, by BASE's exposed time (a kernel of one tree only shows 0
in the other).
"""
import argparse
import collections
import csv
import json
import signal
import statistics
import subprocess
import sys


def demangle(names):
    """Readable names: c++filt where present, then without argument lists."""
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                             check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        out = list(names)
    short = {}
    for raw, dem in zip(names, out):
        depth, base = 0, []
        for ch in dem:  # drop the parameter list, keep template arguments
            if ch == "(" and depth == 0:
                break
            depth += ch == "<"
            depth -= ch == ">"
            base.append(ch)
        name = "".join(base).strip()
        short[raw] = name.replace("void ", "", 1) if name.startswith("void ") else name
    return short


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"{path}: no kernels recorded")
    for r in rows:
        for k in ("start", "end", "stream", "graph", "node", "corr", "gx", "bx", "dsmem"):
            r[k] = int(r[k])
    return rows


def launches_of(rows, graph):
    by = collections.defaultdict(list)
    for r in rows:
        if r["graph"] == graph:
            by[r["corr"]].append(r)
    return [sorted(v, key=lambda r: r["start"]) for _, v in sorted(by.items())]


def timeline(launch):
    """Per kernel of one launch: start offset, duration, exposed time, idle gap before it (ns)."""
    t0 = launch[0]["start"]
    latest = t0
    out = {}
    for r in launch:
        idle = max(0, r["start"] - latest)
        exposed = max(0, r["end"] - max(latest, r["start"]))
        out[r["node"]] = (r["start"] - t0, r["end"] - r["start"], exposed, idle)
        latest = max(latest, r["end"])
    return out, latest - t0


def analyse(path, graph=None, skip=2):
    """The median timeline of the graph launched most often (or @p graph) of one trace."""
    rows = load(path)
    graphs = collections.Counter()
    for g, c in {(r["graph"], r["corr"]) for r in rows if r["graph"]}:
        graphs[g] += 1
    if not graphs:
        sys.exit(f"{path}: no kernel ran inside a CUDA graph")
    graph = graph if graph is not None else graphs.most_common(1)[0][0]
    if graph not in graphs:
        sys.exit(f"{path}: no launch of graph {graph} (graphs: {dict(graphs)})")
    launches = launches_of(rows, graph)
    nodes = collections.Counter(len(l) for l in launches)
    size = nodes.most_common(1)[0][0]
    launches = [l for l in launches if len(l) == size][skip:]
    if not launches:
        sys.exit(f"{path}: graph {graph} has no launch left after --skip {skip}")
    names = demangle(sorted({r["name"] for l in launches for r in l}))
    per = collections.defaultdict(list)
    spans = []
    for l in launches:
        tl, span = timeline(l)
        spans.append(span)
        for node, v in tl.items():
            per[node].append(v)
    info = {r["node"]: r for r in launches[-1]}
    med = {n: [statistics.median(x[i] for x in v) for i in range(4)] for n, v in per.items()}
    order = sorted(med, key=lambda n: med[n][0])
    res = {
        "graph": graph, "graphs": dict(graphs), "launches": len(launches), "kernels": size,
        "span_us": statistics.median(spans) / 1e3,
        "sum_dur_us": sum(med[n][1] for n in order) / 1e3,
        "sum_exposed_us": sum(med[n][2] for n in order) / 1e3,
        "sum_idle_us": sum(med[n][3] for n in order) / 1e3,
        "nodes": [{"node": n, "name": names[info[n]["name"]], "grid": info[n]["gx"], "block": info[n]["bx"],
                   "stream": info[n]["stream"], "start_us": med[n][0] / 1e3, "dur_us": med[n][1] / 1e3,
                   "exposed_us": med[n][2] / 1e3, "idle_us": med[n][3] / 1e3} for n in order],
    }
    by_name = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for n in res["nodes"]:
        b = by_name[n["name"]]
        b[0] += 1
        b[1] += n["dur_us"]
        b[2] += n["exposed_us"]
    res["by_name"] = {k: {"count": v[0], "dur_us": v[1], "exposed_us": v[2]} for k, v in by_name.items()}
    return res


def print_timeline(res):
    print(f"graph {res['graph']}: {res['launches']} launches of {res['kernels']} kernels "
          f"(graphs seen: {res['graphs']})")
    print(f"span {res['span_us']:.1f} us (median); sum of durations {res['sum_dur_us']:.1f}; "
          f"exposed {res['sum_exposed_us']:.1f} + idle {res['sum_idle_us']:.1f}")
    print(f"{'start':>8} {'dur':>7} {'exposed':>7} {'idle':>5} {'grid':>5} {'str':>4}  kernel")
    for n in res["nodes"]:
        print(f"{n['start_us']:8.1f} {n['dur_us']:7.1f} {n['exposed_us']:7.1f} {n['idle_us']:5.1f} "
              f"{n['grid']:5d} {n['stream']:4d}  {n['name'][:90]}")
    print("\nby kernel (exposed time, descending):")
    for k, v in sorted(res["by_name"].items(), key=lambda kv: -kv[1]["exposed_us"]):
        print(f"{v['exposed_us']:8.1f} exposed {v['dur_us']:8.1f} dur {v['count']:4d}x  {k[:90]}")


def compare(base, res):
    """The per-kernel-name comparison of two analyses: {name: (base, this)} of (count, dur, exposed)."""
    none = {"count": 0, "dur_us": 0.0, "exposed_us": 0.0}
    names = set(base["by_name"]) | set(res["by_name"])
    return {k: (base["by_name"].get(k, none), res["by_name"].get(k, none)) for k in names}


def print_compare(base, res):
    print(f"span {base['span_us']:.1f} -> {res['span_us']:.1f} us ({res['span_us'] - base['span_us']:+.1f}); "
          f"kernels {base['kernels']} -> {res['kernels']}; launches {base['launches']}, {res['launches']}")
    print(f"{'exposed':>8} {'->':>8} {'diff':>7} | {'dur':>8} {'->':>8} | {'n':>3} {'->':>3}  kernel")
    rows = compare(base, res)
    for k, (b, t) in sorted(rows.items(), key=lambda kv: (-kv[1][0]["exposed_us"], -kv[1][1]["exposed_us"])):
        print(f"{b['exposed_us']:8.1f} {t['exposed_us']:8.1f} {t['exposed_us'] - b['exposed_us']:+7.1f} | "
              f"{b['dur_us']:8.1f} {t['dur_us']:8.1f} | {b['count']:3d} {t['count']:3d}  {k[:80]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--graph", type=int, help="graph id (default: the one launched most often)")
    ap.add_argument("--skip", type=int, default=2, help="launches left out at the start (default 2)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    ap.add_argument("--base", help="a second trace (another tree, the same run) to compare with, by kernel name")
    a = ap.parse_args()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # a reader that stops early (head) ends this quietly
    res = analyse(a.trace, a.graph, a.skip)
    base = analyse(a.base, None, a.skip) if a.base else None
    if a.json:
        if base is not None:
            res = {"base": base, "this": res, "by_name": {k: {"base": b, "this": t} for k, (b, t)
                                                           in compare(base, res).items()}}
        print(json.dumps(res, indent=1))
    elif base is not None:
        print_compare(base, res)
    else:
        print_timeline(res)


if __name__ == "__main__":
    main()
