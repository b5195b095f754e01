#!/usr/bin/env python3
"""Plot benchmark JSON lines (`megamoe bench moe --json`) as SVG (and PNG with matplotlib).

Each input line is one JSON object for one token count:

    {"bench": "moe", "backend": "cpu" | "gpu", "shape": "v4-flash", "tokens": T,
     "median_ms": ..., "tflops": ..., "peer": "name", "peer_median_ms": ...,
     "ratio_to_peer": ..., "sol_ms": ...  (gpu only, optional)}

Lines are grouped by (bench, backend, shape); each group gives two figures:
  <out>/<bench>_<backend>_<shape>_time.svg   median time per call against T (log-log), ours,
                                             each peer, and the speed-of-light time when given;
  <out>/<bench>_<backend>_<shape>_ratio.svg  peer time / our time against T (> 1: ours faster).
A key that a line does not have, or that is null, is left out of the plot (never assumed).
A line that is not valid JSON, or lacks bench/backend/shape/tokens/median_ms, is an error
naming the file and line; nothing is written then.

With matplotlib installed the figures are drawn by it (SVG and PNG); without it, by the small
SVG writer below (SVG only), and the script says so on stderr.

Usage: plot_bench.py --out DIR FILE.jsonl [FILE.jsonl ...]
"""

import argparse
import json
import math
import os
import sys

REQUIRED = ("bench", "backend", "shape", "tokens", "median_ms")


def read_lines(paths):
    """All records of all files; raises ValueError naming the file and line of a bad one."""
    records = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not JSON: {e}") from e
                if not isinstance(rec, dict):
                    raise ValueError(f"{path}:{n}: not a JSON object")
                missing = [k for k in REQUIRED if rec.get(k) is None]
                if missing:
                    raise ValueError(f"{path}:{n}: missing key(s) {', '.join(missing)}")
                if not isinstance(rec["tokens"], int) or rec["tokens"] < 1:
                    raise ValueError(f"{path}:{n}: tokens must be a positive integer, found {rec['tokens']!r}")
                rec["_source"] = f"{os.path.basename(path)}"
                records.append(rec)
    return records


def series(records):
    """{group: {"ours": [(T, ms)], "peer:<name>": [(T, ms)], "sol": [(T, ms)], "ratio:<name>": [(T, r)]}}."""
    groups = {}
    for r in records:
        g = groups.setdefault((r["bench"], r["backend"], r["shape"]), {})
        g.setdefault("ours", {})[r["tokens"]] = float(r["median_ms"])
        if r.get("peer") is not None and r.get("peer_median_ms") is not None:
            g.setdefault("peer:" + str(r["peer"]), {})[r["tokens"]] = float(r["peer_median_ms"])
        if r.get("peer") is not None and r.get("ratio_to_peer") is not None:
            g.setdefault("ratio:" + str(r["peer"]), {})[r["tokens"]] = float(r["ratio_to_peer"])
        if r.get("sol_ms") is not None:
            g.setdefault("sol", {})[r["tokens"]] = float(r["sol_ms"])
    return {k: {s: sorted(v.items()) for s, v in g.items()} for k, g in groups.items()}


def label_of(name):
    if name == "ours":
        return "megamoe"
    if name == "sol":
        return "speed of light"
    return name.split(":", 1)[1]


# ------------------------------------------------------------------ a minimal SVG writer

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
_color_of = {}


def color_of(label):
    """One color per series label, the same in every figure."""
    return _color_of.setdefault(label, COLORS[len(_color_of) % len(COLORS)])


def svg_plot(path, title, ylabel, lines, logy, hline=None):
    """Line plot with a log x axis (tokens) in plain SVG; lines = [(label, [(x, y)])]."""
    w, h, ml, mr, mt, mb = 720, 400, 70, 250, 40, 50
    xs = [x for _, pts in lines for x, _ in pts]
    ys = [y for _, pts in lines for _, y in pts if y > 0 or not logy]
    if hline is not None:
        ys.append(hline)
    fx = lambda v: math.log10(v)
    fy = (lambda v: math.log10(v)) if logy else (lambda v: v)
    x0, x1 = fx(min(xs)), fx(max(xs))
    y0, y1 = fy(min(ys)), fy(max(ys))
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y1 = y0 + 1
    pad = 0.05 * (y1 - y0)
    y0, y1 = y0 - pad, y1 + pad
    if not logy:
        y0 = min(y0, 0.0)
    px = lambda v: ml + (fx(v) - x0) / (x1 - x0) * (w - ml - mr)
    py = lambda v: mt + (1 - (fy(v) - y0) / (y1 - y0)) * (h - mt - mb)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="Helvetica" font-size="11">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="13">{title}</text>',
           f'<line x1="{ml}" y1="{h - mb}" x2="{w - mr}" y2="{h - mb}" stroke="black"/>',
           f'<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{h - mb}" stroke="black"/>',
           f'<text x="{(ml + w - mr) / 2}" y="{h - 12}" text-anchor="middle">tokens per call (log)</text>',
           f'<text x="16" y="{(mt + h - mb) / 2}" text-anchor="middle" transform="rotate(-90 16 {(mt + h - mb) / 2})">{ylabel}</text>']
    for x in sorted(set(xs)):
        out.append(f'<line x1="{px(x):.1f}" y1="{h - mb}" x2="{px(x):.1f}" y2="{h - mb + 4}" stroke="black"/>')
        out.append(f'<text x="{px(x):.1f}" y="{h - mb + 16}" text-anchor="middle">{x}</text>')
    if logy:
        ticks = [m * 10.0 ** e for e in range(math.floor(y0), math.ceil(y1) + 1) for m in (1, 2, 5)
                 if y0 <= e + math.log10(m) <= y1]
    else:
        step = 10 ** math.floor(math.log10(max(y1 - y0, 1e-9))) / 2
        ticks = [step * i for i in range(math.ceil(y0 / step), math.floor(y1 / step) + 1)]
    for t in ticks:
        out.append(f'<line x1="{ml - 4}" y1="{py(t):.1f}" x2="{w - mr}" y2="{py(t):.1f}" stroke="#dddddd"/>')
        out.append(f'<text x="{ml - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    if hline is not None:
        out.append(f'<line x1="{ml}" y1="{py(hline):.1f}" x2="{w - mr}" y2="{py(hline):.1f}" stroke="gray" stroke-dasharray="4 3"/>')
    for i, (label, pts) in enumerate(lines):
        c = color_of(label)
        pts = [(x, y) for x, y in pts if y > 0 or not logy]
        d = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        out.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="2"/>')
        for x, y in pts:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{c}"/>')
        ly = mt + 10 + 18 * i
        out.append(f'<line x1="{w - mr + 10}" y1="{ly}" x2="{w - mr + 30}" y2="{ly}" stroke="{c}" stroke-width="2"/>')
        out.append(f'<text x="{w - mr + 35}" y="{ly + 4}">{label}</text>')
    out.append("</svg>")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")


def mpl_plot(plt, base, title, ylabel, lines, logy, hline=None):
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for label, pts in lines:
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=label, color=color_of(label))
    if hline is not None:
        ax.axhline(hline, color="gray", linestyle="--")
    ax.set_xscale("log")
    ticks = sorted({x for _, pts in lines for x, _ in pts})
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    ax.minorticks_off()
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("tokens per call (log)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(base + ".svg")
    fig.savefig(base + ".png", dpi=100)
    plt.close(fig)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for the figures (created)")
    ap.add_argument("files", nargs="+", help="JSON-lines files")
    a = ap.parse_args(argv)
    try:
        groups = series(read_lines(a.files))
    except (OSError, ValueError) as e:
        print(f"plot_bench: {e}", file=sys.stderr)
        return 1
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        plt = None
        print("plot_bench: matplotlib is not installed: drawing SVG only, with the built-in writer",
              file=sys.stderr)
    os.makedirs(a.out, exist_ok=True)
    for (bench, backend, shape), g in sorted(groups.items()):
        base = os.path.join(a.out, f"{bench}_{backend}_{shape}")
        times = [(label_of(k), v) for k, v in g.items() if k == "ours" or k.startswith("peer:") or k == "sol"]
        ratios = [(label_of(k), v) for k, v in g.items() if k.startswith("ratio:")]
        plots = [(base + "_time", f"{bench} on {backend}, {shape}: median time per call", "ms (log)", times, True, None)]
        if ratios:
            plots.append((base + "_ratio", f"{bench} on {backend}, {shape}: peer time / our time",
                          "ratio (> 1: megamoe faster)", ratios, False, 1.0))
        for path, title, ylabel, lines, logy, hline in plots:
            if plt is not None:
                mpl_plot(plt, path, title, ylabel, lines, logy, hline)
            else:
                svg_plot(path + ".svg", title, ylabel, lines, logy, hline)
            print(f"plot_bench: {path}.svg")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
