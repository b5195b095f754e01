#!/usr/bin/env python3
"""PyTorch peer of the GPU MoE layer benchmark (called by `megamoe bench moe --backend gpu`).

Reads, for each token count T, the benchmark's own inputs (x BF16 [T, D], topk_idx int32 [T, K],
topk_w float32 [T, K]) from --dir, and times the same layer written with PyTorch's grouped GEMMs:

  bf16: tokens sorted by expert (groups padded to 16 rows), torch._grouped_mm for L1 (gate|up)
        and L2 against BF16 weights, SwiGLU with clamp 10 and the routing weight in FP32, the
        shared expert as two plain matmuls, index_add combine in FP32, one BF16 cast.
  fp8:  the same with FP8 E4M3 weights and activations (row-wise FP32 scales) through
        torch._scaled_grouped_mm / torch._scaled_mm, BF16 outputs.

The weights are random (same shapes and experts, not the MXFP4 values: PyTorch has no MXFP4
grouped GEMM on SM90).  Each layer call is timed with CUDA events around the whole call
(routing bookkeeping included), median of --iters calls after 3 warm-up calls.
Prints one line per T: "PEER T=<T> bf16_us=<median> fp8_us=<median>" (-1 when a peer failed,
with the reason on a line before it).  Exits 77 when torch or CUDA is missing.
"""
import argparse
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as exc:  # pragma: no cover
    print(f"torch peer unavailable: {exc}")
    sys.exit(77)


def median_time_us(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1000.0)
    times.sort()
    return times[len(times) // 2]


def group_layout(idx, E, align=16):
    """Pairs sorted by expert, each expert's rows padded to `align`; no host synchronisation."""
    flat = idx.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    e_sorted = flat[order]
    counts = torch.bincount(flat, minlength=E)
    padded = (counts + align - 1) // align * align
    pstart = torch.cumsum(padded, 0) - padded
    cstart = torch.cumsum(counts, 0) - counts
    rank = torch.arange(flat.numel(), device=idx.device) - cstart[e_sorted]
    dest = pstart[e_sorted] + rank
    offs = torch.cumsum(padded, 0).to(torch.int32)
    rows = flat.numel() + E * (align - 1)
    return order, dest, offs, rows


def swiglu(h, I, wrow):
    g = h[:, :I].float().clamp(max=10.0)
    u = h[:, I:].float().clamp(-10.0, 10.0)
    return F.silu(g) * u * wrow[:, None]


def quant_rows(a):
    amax = a.abs().amax(dim=1).float().clamp(min=1e-4)
    s = amax / 448.0
    q = (a.float() / s[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q, s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    for k in ("D", "I", "E", "topk", "SI", "iters"):
        ap.add_argument("--" + k, type=int, required=True)
    ap.add_argument("--tokens", required=True)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch peer unavailable: no CUDA device")
        sys.exit(77)
    dev = "cuda"
    D, I, E, K, SI = a.D, a.I, a.E, a.topk, a.SI
    torch.manual_seed(0)
    W13 = (torch.randn(E, 2 * I, D, device=dev, dtype=torch.bfloat16) * 0.02)
    W2 = (torch.randn(E, D, I, device=dev, dtype=torch.bfloat16) * 0.02)
    S13 = (torch.randn(2 * SI, D, device=dev, dtype=torch.bfloat16) * 0.02)
    S2 = (torch.randn(D, SI, device=dev, dtype=torch.bfloat16) * 0.02)
    W13t, W2t = W13.transpose(-2, -1), W2.transpose(-2, -1)  # [E, K, N], K contiguous
    # FP8 copies with per-output-row scales
    W13q = (W13.float() * 50).to(torch.float8_e4m3fn)
    W2q = (W2.float() * 50).to(torch.float8_e4m3fn)
    S13q = (S13.float() * 50).to(torch.float8_e4m3fn)
    S2q = (S2.float() * 50).to(torch.float8_e4m3fn)
    sb13 = torch.full((E, 2 * I), 0.02, device=dev)
    sb2 = torch.full((E, D), 0.02, device=dev)
    ss13 = torch.full((1, 2 * SI), 0.02, device=dev)
    ss2 = torch.full((1, D), 0.02, device=dev)
    W13qt, W2qt = W13q.transpose(-2, -1), W2q.transpose(-2, -1)
    torch.cuda.synchronize()

    for T in [int(t) for t in a.tokens.split(",")]:
        try:
            x = torch.from_numpy(np.fromfile(f"{a.dir}/x_{T}.bin", dtype=np.int16).reshape(T, D)).to(dev)
            x = x.view(torch.bfloat16)
            idx = torch.from_numpy(np.fromfile(f"{a.dir}/idx_{T}.bin", dtype=np.int32).reshape(T, K)).to(dev)
            tw = torch.from_numpy(np.fromfile(f"{a.dir}/w_{T}.bin", dtype=np.float32).reshape(T, K)).to(dev)
        except OSError as exc:
            print(f"inputs for T={T} missing: {exc}")
            continue

        def layer_bf16():
            order, dest, offs, rows = group_layout(idx, E)
            tok = order // K
            xa = torch.zeros(rows, D, device=dev, dtype=torch.bfloat16)
            xa[dest] = x[tok]
            wa = torch.zeros(rows, device=dev)
            wa[dest] = tw.reshape(-1)[order]
            h = torch._grouped_mm(xa, W13t, offs=offs)
            act = swiglu(h, I, wa).to(torch.bfloat16)
            o = torch._grouped_mm(act, W2t, offs=offs)
            y = torch.zeros(T, D, device=dev)
            y.index_add_(0, tok, o[dest].float())
            hs = x @ S13.t()
            ys = swiglu(hs, SI, torch.ones(T, device=dev)).to(torch.bfloat16) @ S2.t()
            return (y + ys.float()).to(torch.bfloat16)

        def layer_fp8():
            order, dest, offs, rows = group_layout(idx, E)
            tok = order // K
            xq, xs = quant_rows(x)
            xa = torch.zeros(rows, D, device=dev, dtype=torch.uint8)
            xa[dest] = xq.view(torch.uint8)[tok]  # FP8 indexing through byte views
            xa = xa.view(torch.float8_e4m3fn)
            sa = torch.ones(rows, device=dev)
            sa[dest] = xs[tok]
            wa = torch.zeros(rows, device=dev)
            wa[dest] = tw.reshape(-1)[order]
            h = torch._scaled_grouped_mm(xa, W13qt, sa, sb13, offs=offs, out_dtype=torch.bfloat16)
            act = swiglu(h, I, wa)
            aq, asc = quant_rows(act)
            o = torch._scaled_grouped_mm(aq, W2qt, asc, sb2, offs=offs, out_dtype=torch.bfloat16)
            y = torch.zeros(T, D, device=dev)
            y.index_add_(0, tok, o[dest].float())
            hs = torch._scaled_mm(xq, S13q.t(), scale_a=xs[:, None], scale_b=ss13, out_dtype=torch.bfloat16)
            sq, sc = quant_rows(swiglu(hs, SI, torch.ones(T, device=dev)))
            ys = torch._scaled_mm(sq, S2q.t(), scale_a=sc[:, None], scale_b=ss2, out_dtype=torch.bfloat16)
            return (y + ys.float()).to(torch.bfloat16)

        n = max(5, a.iters // 4) if T >= 2048 else a.iters
        res = {}
        for name, fn in (("bf16", layer_bf16), ("fp8", layer_fp8)):
            try:
                res[name] = median_time_us(fn, n)
            except Exception as exc:  # report and go on: one failing peer must not hide the other
                print(f"{name} peer failed at T={T}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
                res[name] = -1.0
        print(f"PEER T={T} bf16_us={res['bf16']:.1f} fp8_us={res['fp8']:.1f}", flush=True)


if __name__ == "__main__":
    main()
