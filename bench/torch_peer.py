#!/usr/bin/env python3
"""PyTorch peer of the GPU MoE layer benchmark (called by `megamoe bench moe --backend gpu`).

Reads, for each token count T, the benchmark's own inputs (x BF16 [T, D], topk_idx int32 [T, K],
topk_w float32 [T, K]) from --dir and times the same layer written as well as PyTorch allows on
SM90, each variant's whole call captured in one CUDA graph and replayed (as ours is):

  fp8_grouped:  weights converted once to FP8 E4M3 with one FP32 scale per output row and kept
                resident; routing done on the device (pairs sorted by expert, groups padded to 16
                rows), torch._scaled_grouped_mm for L1 (gate|up) and L2, SwiGLU with clamp 10 and
                the routing weight in FP32, per-token FP32 requantization, the shared expert as two
                torch._scaled_mm, index_add combine in FP32, one BF16 cast.
  fp8_expert:   the same weights, one torch._scaled_mm pair per active expert, the routing read on
                the host before capture (an advantage ours does not take: our graph is valid for
                any routing).
  bf16_grouped: fp8_grouped with BF16 weights and activations through torch._grouped_mm.

PyTorch has no MXFP4 grouped GEMM on SM90, so the peer reads twice (FP8) or four times (BF16)
the weight bytes ours does; the bytes are printed.  The weights are random (same shapes).

It also measures the two ceilings of the speed-of-light columns in the same process: the
device-to-device copy bandwidth (bytes read + written over the time of a 2 GiB copy) and the
dense FP8 GEMM rate (torch._scaled_mm 8192^3 with one scale per tensor, fast accumulation on and
off; the faster is the ceiling).

Prints (parsed by src/cli/bench_moe_gpu.c):
  CEIL copy_gbps=<GB/s> fp8_tflops=<TFLOP/s> fp8_tflops_promoted=<TFLOP/s>
  PEERBYTES fp8=<bytes> bf16=<bytes>
  PEER T=<T> fp8_grouped_us=<median> fp8_expert_us=<median> bf16_grouped_us=<median> graph=<0|1>
(-1 when a variant failed, with the reason on a line before it).  Exits 77 without torch or CUDA.
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

ALIGN = 16


def time_us(fn, iters):
    """Median of `iters` calls of fn, each between two CUDA events, after 3 warm-up calls."""
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


def graphed(fn):
    """fn captured into a CUDA graph (returns replay, True), or fn itself (eager, False) if capture fails."""
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        return g.replay, True
    except Exception as exc:  # report, then time the eager call
        print(f"graph capture failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); eager")
        torch.cuda.synchronize()
        return fn, False


def ceilings():
    n = 1 << 31
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.random_(0, 255)
    copy_us = time_us(lambda: b.copy_(a), 10)
    del a, b
    m = 8192
    x = torch.randn(m, m, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(m, m, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    rates = []
    for fast in (True, False):
        us = time_us(lambda: torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                              use_fast_accum=fast), 10)
        rates.append(2.0 * m * m * m / (us * 1e-6) / 1e12)
    del x, w
    return 2.0 * n / (copy_us * 1e-6) / 1e9, rates[0], rates[1]


def fp8_rows(n, k, dev):
    """Random FP8 E4M3 weights [n, k] (resident) and their per-row FP32 scales."""
    return (torch.randn(n, k, device=dev) * 2).to(torch.float8_e4m3fn), torch.full((n,), 0.01, device=dev)


def quant_rows(a):
    """Per-row FP32 scale (amax / 448, amax clamped to 1e-4) and E4M3 values."""
    amax = a.abs().amax(dim=1).float().clamp(min=1e-4)
    s = amax / 448.0
    q = (a.float() / s[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q, s


def swiglu(h, I, wrow):
    g = h[:, :I].float().clamp(max=10.0)
    u = h[:, I:].float().clamp(-10.0, 10.0)
    return F.silu(g) * u * wrow[:, None]


def group_layout(idx, E):
    """Pairs sorted by expert, each expert's rows padded to ALIGN; device only (no host sync)."""
    flat = idx.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    e_sorted = flat[order]
    counts = torch.zeros(E, dtype=torch.long, device=idx.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + ALIGN - 1) // ALIGN * ALIGN
    pstart = torch.cumsum(padded, 0) - padded
    cstart = torch.cumsum(counts, 0) - counts
    rank = torch.arange(flat.numel(), device=idx.device) - cstart[e_sorted]
    dest = pstart[e_sorted] + rank
    offs = torch.cumsum(padded, 0).to(torch.int32)
    return order, dest, offs


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
    copy_gbps, fp8_fast, fp8_promoted = ceilings()
    print(f"CEIL copy_gbps={copy_gbps:.1f} fp8_tflops={max(fp8_fast, fp8_promoted):.1f} "
          f"fp8_tflops_promoted={fp8_promoted:.1f}", flush=True)

    # FP8 weights, converted once, resident: [E, N, K] row-major, used as [E, K, N] column-major
    W13q, sb13 = fp8_rows(E * 2 * I, D, dev)
    W13q, sb13 = W13q.view(E, 2 * I, D), sb13.view(E, 2 * I)
    W2q, sb2 = fp8_rows(E * D, I, dev)
    W2q, sb2 = W2q.view(E, D, I), sb2.view(E, D)
    S13q, ss13 = fp8_rows(2 * SI, D, dev)
    S2q, ss2 = fp8_rows(D, SI, dev)
    W13qt, W2qt = W13q.transpose(-2, -1), W2q.transpose(-2, -1)
    ss13r, ss2r = ss13[None, :], ss2[None, :]
    # BF16 weights for the bf16 variant
    W13 = (torch.randn(E, 2 * I, D, device=dev) * 0.02).to(torch.bfloat16)
    W2 = (torch.randn(E, D, I, device=dev) * 0.02).to(torch.bfloat16)
    S13 = (torch.randn(2 * SI, D, device=dev) * 0.02).to(torch.bfloat16)
    S2 = (torch.randn(D, SI, device=dev) * 0.02).to(torch.bfloat16)
    W13t, W2t = W13.transpose(-2, -1), W2.transpose(-2, -1)
    fp8_bytes = E * 3 * I * D + E * (2 * I + D) * 4 + 3 * SI * D + (2 * SI + D) * 4
    print(f"PEERBYTES fp8={fp8_bytes} bf16={2 * (E * 3 * I * D + 3 * SI * D)}", flush=True)
    torch.cuda.synchronize()

    for T in [int(t) for t in a.tokens.split(",")]:
        try:
            x = torch.from_numpy(np.fromfile(f"{a.dir}/x_{T}.bin", dtype=np.int16).reshape(T, D)).to(dev)
            x = x.view(torch.bfloat16)
            idx_h = np.fromfile(f"{a.dir}/idx_{T}.bin", dtype=np.int32).reshape(T, K)
            idx = torch.from_numpy(idx_h).to(dev)
            tw_h = np.fromfile(f"{a.dir}/w_{T}.bin", dtype=np.float32).reshape(T, K)
            tw = torch.from_numpy(tw_h).to(dev)
        except OSError as exc:
            print(f"inputs for T={T} missing: {exc}")
            continue
        rows = T * K + E * (ALIGN - 1)
        ones_t = torch.ones(T, device=dev)

        def shared_fp8(xq, xs):
            hs = torch._scaled_mm(xq, S13q.t(), scale_a=xs[:, None], scale_b=ss13r, out_dtype=torch.bfloat16)
            sq, sc = quant_rows(swiglu(hs, SI, ones_t))
            return torch._scaled_mm(sq, S2q.t(), scale_a=sc[:, None], scale_b=ss2r, out_dtype=torch.bfloat16)

        def fp8_grouped():
            order, dest, offs = group_layout(idx, E)
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
            aq, asc = quant_rows(swiglu(h, I, wa))
            o = torch._scaled_grouped_mm(aq, W2qt, asc, sb2, offs=offs, out_dtype=torch.bfloat16)
            y = torch.zeros(T, D, device=dev)
            y.index_add_(0, tok, o[dest].float())
            return (y + shared_fp8(xq, xs).float()).to(torch.bfloat16)

        # host-side routing for the per-expert variant: token lists and weights per active expert
        per_expert = []
        for e in np.unique(idx_h):
            t_of, k_of = np.nonzero(idx_h == e)
            per_expert.append((int(e), torch.from_numpy(t_of.astype(np.int64)).to(dev),
                               torch.from_numpy(tw_h[t_of, k_of].astype(np.float32)).to(dev)))

        def fp8_expert():
            xq, xs = quant_rows(x)
            y = torch.zeros(T, D, device=dev)
            for e, tok, we in per_expert:
                h = torch._scaled_mm(xq[tok], W13q[e].t(), scale_a=xs[tok][:, None], scale_b=sb13[e][None, :],
                                     out_dtype=torch.bfloat16)
                aq, asc = quant_rows(swiglu(h, I, we))
                o = torch._scaled_mm(aq, W2q[e].t(), scale_a=asc[:, None], scale_b=sb2[e][None, :],
                                     out_dtype=torch.bfloat16)
                y.index_add_(0, tok, o.float())
            return (y + shared_fp8(xq, xs).float()).to(torch.bfloat16)

        def bf16_grouped():
            order, dest, offs = group_layout(idx, E)
            tok = order // K
            xa = torch.zeros(rows, D, device=dev, dtype=torch.bfloat16)
            xa[dest] = x[tok]
            wa = torch.zeros(rows, device=dev)
            wa[dest] = tw.reshape(-1)[order]
            h = torch._grouped_mm(xa, W13t, offs=offs)
            o = torch._grouped_mm(swiglu(h, I, wa).to(torch.bfloat16), W2t, offs=offs)
            y = torch.zeros(T, D, device=dev)
            y.index_add_(0, tok, o[dest].float())
            ys = swiglu(x @ S13.t(), SI, ones_t).to(torch.bfloat16) @ S2.t()
            return (y + ys.float()).to(torch.bfloat16)

        n = max(5, a.iters // 4) if T >= 2048 else a.iters
        res, all_graphed = {}, 1
        for name, fn in (("fp8_grouped", fp8_grouped), ("fp8_expert", fp8_expert), ("bf16_grouped", bf16_grouped)):
            try:
                call, ok = graphed(fn)
                all_graphed &= int(ok)
                res[name] = time_us(call, n)
            except Exception as exc:  # report and go on: one failing variant must not hide the others
                print(f"{name} peer failed at T={T}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
                torch.cuda.synchronize()
                res[name] = -1.0
        print(f"PEER T={T} fp8_grouped_us={res['fp8_grouped']:.1f} fp8_expert_us={res['fp8_expert']:.1f} "
              f"bf16_grouped_us={res['bf16_grouped']:.1f} graph={all_graphed}", flush=True)


if __name__ == "__main__":
    main()
