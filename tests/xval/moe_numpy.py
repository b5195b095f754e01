#!/usr/bin/env python3
"""Cross-check of `megamoe moe` against an independent NumPy implementation of each recipe.

Written from the specification (docs/spec/moe-layer.md, docs/spec/architecture.md and
docs/spec/formats.md), not from the C code.  For each recipe (sm100, sm90, dsv4-ref) and shared
path (fused, serial), on random small layers made by `megamoe synth-layer --values dyadic`
(values for which every L1 sum is exact in FP32), the script

  1. reads the layer and the input with its own safetensors reader,
  2. checks the routing that `megamoe moe` reports (expert ids exactly, weights within 4 ulp),
  3. recomputes y with float64 GEMMs and the recipe's rounding steps in float32 / BF16 / E4M3
     (ml_dtypes), using the routing from step 2,
  4. requires |y_c - y_numpy| <= bound for every element, where the bound is the FP32
     accumulation error of the L2 GEMM (gamma * sum|terms|), one BF16 ulp per rounding, and,
     where an intermediate value lies within 2 FP32 ulp of an E4M3/BF16 rounding boundary
     (libm's expf and NumPy's exp may differ by an ulp), the effect of that one flip.

Exit status: 0 pass, 1 fail, 77 skip (no NumPy / ml_dtypes / MMOE_BIN).
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import ml_dtypes
except ImportError as exc:  # automake SKIP
    print(f"SKIP: {exc}")
    sys.exit(77)

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
F32 = np.float32
U = 2.0 ** -24
FP4 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)


def read_safetensors(path):
    """Minimal reader: 8-byte little-endian header length, JSON header, raw little-endian data."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    dtypes = {"BF16": BF16, "F32": np.float32, "I8": np.uint8, "U8": np.uint8, "I32": np.int32,
              "I64": np.int64, "F8_E4M3": np.uint8, "F8_E8M0": np.uint8}
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        arr = np.frombuffer(data[8 + n + b:8 + n + e], dtype=dtypes[info["dtype"]])
        out[name] = (arr.reshape(info["shape"]), info["dtype"])
    return out, meta


def bf16(v):
    return np.asarray(v, dtype=F32).astype(BF16).astype(F32)


def e4m3(v):
    """RNE to E4M3FN; every caller keeps |v| <= 448 (+ rounding), where ml_dtypes saturates like SATFINITE."""
    return np.asarray(v, dtype=F32).astype(E4M3).astype(F32)


def ceil_pow2(r):
    r = np.asarray(r, dtype=np.float64)
    m, e = np.frexp(r)
    return np.where(m == 0.5, np.ldexp(1.0, e - 1), np.ldexp(1.0, e))


def quantize(v, rule):
    """Row-wise FP8 quantization; returns the real values q * sf (float64)."""
    v = np.asarray(v, dtype=F32)
    g = 32 if rule in ("ue8m0_32", "sm100_req") else 128
    blocks = v.reshape(v.shape[:-1] + (-1, g))
    amax = np.abs(blocks).max(axis=-1, keepdims=True).astype(F32)
    if rule == "f32_128":  # SM90: sf = fl(max(amax, 1e-4) / 448), q = e4m3(x * fl(1/sf))
        sf = (np.maximum(amax, F32(1e-4)) / F32(448)).astype(F32)
        inv = (F32(1) / sf).astype(F32)
        q = e4m3((blocks * inv).astype(F32))
        return (q.astype(np.float64) * sf.astype(np.float64)).reshape(v.shape)
    if rule == "sm100_req":  # kernel: s = fl(amax * fl(1/448)), ceil to 2^k, no clamps
        s = (amax * F32(1.0 / 448.0)).astype(F32)
        sf = np.where(s == 0, 2.0 ** -127, ceil_pow2(np.where(s == 0, 1, s)))
    else:  # DeepGEMM / DeepSeek act_quant: 1e-4 amax floor, ceil to 2^k
        sf = ceil_pow2(np.maximum(amax, F32(1e-4)).astype(np.float64) / 448.0)
    q = e4m3((blocks.astype(np.float64) / sf).astype(F32))
    return (q.astype(np.float64) * sf).reshape(v.shape)


def dequant_fp4(w, sf):
    lo, hi = FP4[w & 15], FP4[w >> 4]
    vals = np.stack([lo, hi], axis=-1).reshape(w.shape[0], -1)
    return vals * np.ldexp(1.0, sf.astype(np.int64) - 127).repeat(32, axis=1)


def dequant_fp8(w, sf, block):
    vals = e4m3_decode(w)
    s = np.ldexp(1.0, sf.astype(np.int64) - 127) if sf.dtype == np.uint8 else sf.astype(np.float64)
    s = s.repeat(block, axis=0).repeat(block, axis=1)[:w.shape[0], :w.shape[1]]
    return vals * s


def e4m3_decode(b):
    return b.view(E4M3).astype(np.float64)


def ulp_bf16(v):
    v = np.abs(np.asarray(v, dtype=np.float64))
    _, e = np.frexp(np.maximum(v, 2.0 ** -126))
    return np.ldexp(1.0, e - 1 - 7)


RECIPES = {
    # x rule, intermediate rule, kernel epilogue (bf16 clamp bound, g * (1/(1+e)), no bf16 of h)
    "sm100": ("ue8m0_32", "sm100_req", True),
    "sm90": ("f32_128", "f32_128", True),
    "dsv4-ref": ("ue8m0_128", "ue8m0_128", False),
}
SERIAL = ("ue8m0_128", "ue8m0_128", False)


def expert(xq, w1, w3, w2, rules, limit, wt):
    """One expert on rows xq [m, D] (real values); returns (y_bf16 [m, D], delta [m, D])."""
    _, hrule, kernel = rules
    g = bf16((xq @ w1.T).astype(F32))  # exact in FP32 for the dyadic layers
    u = bf16((xq @ w3.T).astype(F32))
    c = F32(bf16(limit)) if kernel else F32(limit)
    g = np.minimum(g, c)
    u = np.clip(u, -c, c)

    def act(gv):
        with np.errstate(over="ignore"):  # exp(-g) = inf for g << 0: sig = 0, as in C
            e = np.exp(-gv.astype(np.float64)).astype(F32)
        if kernel:
            h = ((gv * (F32(1) / (F32(1) + e)).astype(F32)).astype(F32) * u).astype(F32)
            return (h * wt[:, None]).astype(F32)
        h = ((gv / (F32(1) + e)).astype(F32) * u).astype(F32)
        return bf16((h * wt[:, None]).astype(F32))

    h = act(g)
    hq = quantize(h, hrule)
    # where a 2-ulp change of h moves its quantized value, allow that flip
    hq_lo = quantize(np.nextafter(np.nextafter(h, F32(-np.inf)), F32(-np.inf)), hrule)
    hq_hi = quantize(np.nextafter(np.nextafter(h, F32(np.inf)), F32(np.inf)), hrule)
    flip = np.maximum(np.abs(hq_hi - hq), np.abs(hq_lo - hq))
    s = hq @ w2.T
    a = np.abs(hq) @ np.abs(w2).T
    k = w2.shape[1]
    n = k + k / 128 + 2
    gamma = n * U / (1 - n * U)
    extra = flip @ np.abs(w2).T
    y = bf16(s.astype(F32))
    delta = gamma * a + U * np.abs(s) + extra + ulp_bf16(np.abs(s) + gamma * a + extra)
    return y, delta


def reference(layer, meta, x, idx, wts, recipe, path):
    D = x.shape[1]
    topk = idx.shape[1]
    limit = float(meta.get("moe.swiglu_limit", "10"))
    block = int(meta.get("moe.shared_block", "128"))
    rules = RECIPES[recipe]
    xf = x.astype(F32)
    xq = quantize(xf, rules[0])
    T = x.shape[0]
    outs = np.zeros((T, topk + 1, D), dtype=np.float64)
    deltas = np.zeros((T, topk + 1, D))
    cache = {}
    for e in sorted(set(int(v) for v in idx.ravel() if v >= 0)):
        p = f"ffn.experts.{e}."
        cache[e] = tuple(dequant_fp4(layer[p + m + ".weight"][0], layer[p + m + ".scale"][0]) for m in ("w1", "w3", "w2"))
        rows, slots = np.nonzero(idx == e)
        y, d = expert(xq[rows], *cache[e], rules, limit, wts[rows, slots].astype(F32))
        outs[rows, slots] = y
        deltas[rows, slots] = d
    has_shared = path != "none"
    if has_shared:
        sp = "ffn.shared_experts."
        ws = tuple(dequant_fp8(layer[sp + m + ".weight"][0], layer[sp + m + ".scale"][0], block) for m in ("w1", "w3", "w2"))
        srules = rules if path == "fused" else SERIAL
        sx = xq if path == "fused" else quantize(xf, SERIAL[0])
        outs[:, topk], deltas[:, topk] = expert(sx, *ws, srules, limit, np.ones(T, dtype=F32))
    y = np.zeros((T, D), dtype=F32)
    bound = np.zeros((T, D))
    for t in range(T):
        order = [k for k in range(topk) if idx[t, k] >= 0]
        if recipe == "dsv4-ref":
            order.sort(key=lambda k: (idx[t, k], k))
        if has_shared:
            order.append(topk)
        acc = np.zeros(D, dtype=F32)
        for k in order:
            acc = (acc + outs[t, k].astype(F32)).astype(F32)
        y[t] = bf16(acc)
        dsum = deltas[t, order].sum(axis=0) if order else 0
        sabs = np.abs(outs[t, order]).sum(axis=0) if order else 0
        rnd = 2 * len(order) * U * (sabs + dsum)
        bound[t] = dsum + rnd + ulp_bf16(np.abs(acc) + dsum + rnd)
    return y, bound


def check_routing(layer, meta, x, token_ids, idx, wts):
    """Routing from the spec: sqrtsoftplus of FP32 logits, bias for selection, renormalize, scale."""
    gate = layer[[k for k in layer if k.endswith("ffn.gate.weight")][0]][0].astype(np.float64)
    z = (x.astype(np.float64) @ gate.T).astype(F32)  # exact for dyadic values
    s = np.sqrt(np.where(z > 20, z, np.log1p(np.exp(z.astype(np.float64))).astype(F32))).astype(F32)
    scale = F32(float(meta["moe.routed_scaling_factor"]))
    t2e = [k for k in layer if k.endswith("ffn.gate.tid2eid")]
    if t2e:
        want_idx = layer[t2e[0]][0][token_ids].astype(np.int64)
    else:
        bias = layer[[k for k in layer if k.endswith("ffn.gate.bias")][0]][0]
        sel = (s + bias).astype(F32)
        want_idx = np.argsort(-sel, axis=1, kind="stable")[:, :idx.shape[1]]  # stable: ties to the lower id
    if not np.array_equal(want_idx, idx):
        return f"routing ids differ:\n{want_idx}\nvs\n{idx}"
    sw = np.take_along_axis(s, want_idx, axis=1)
    want_w = (sw / sw.sum(axis=1, keepdims=True, dtype=F32)).astype(F32) * scale
    ulps = np.abs(want_w.view(np.int32).astype(np.int64) - wts.view(np.int32).astype(np.int64))
    if ulps.max() > 4:
        return f"routing weights differ by {ulps.max()} ulp"
    return None


def main():
    binary = os.environ.get("MMOE_BIN")
    if not binary or not os.path.exists(binary):
        print("SKIP: MMOE_BIN not set")
        return 77
    seed = int(os.environ.get("MMOE_SEED", str(np.random.SeedSequence().entropy % (2 ** 32))))
    print(f"moe_numpy: seed {seed} (replay: MMOE_SEED={seed})")
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        cases = [("biased", []), ("hash", ["--hash"])]
        for kind, extra in cases:
            lpath = os.path.join(tmp, f"{kind}.safetensors")
            ipath = os.path.join(tmp, f"{kind}.input.safetensors")
            subprocess.run([binary, "synth-layer", "--shape", "tiny", "--experts", "8", "--input-tokens", "6",
                            "--values", "dyadic", "--seed", str(seed), "--out", lpath] + extra,
                           check=True, stdout=subprocess.DEVNULL)
            layer, meta = read_safetensors(lpath)
            inp, _ = read_safetensors(ipath)
            x = inp["x"][0]
            token_ids = inp["token_ids"][0].astype(np.int64)
            for recipe in ("sm100", "sm90", "dsv4-ref"):
                for shared in ("auto", "serial"):
                    for pad in ("0", "512"):
                        opath = os.path.join(tmp, "y.safetensors")
                        run = subprocess.run([binary, "moe", "--weights", lpath, "--input", ipath, "--out", opath,
                                              "--recipe", recipe, "--shared", shared, "--pad-to", pad],
                                             capture_output=True, text=True)
                        label = f"{kind} {recipe} shared={shared} pad={pad}"
                        if run.returncode != 0:
                            print(f"FAIL {label}: megamoe moe exited {run.returncode}: {run.stderr}")
                            failures += 1
                            continue
                        out, _ = read_safetensors(opath)
                        y = out["y"][0].astype(F32)
                        idx, wts = out["topk_idx"][0], out["topk_weights"][0]
                        msg = check_routing(layer, meta, x, token_ids, idx, wts)
                        if msg:
                            print(f"FAIL {label}: {msg}")
                            failures += 1
                            continue
                        path = "serial" if shared == "serial" else "fused"
                        yr, bound = reference(layer, meta, x, idx, wts, recipe, path)
                        err = np.abs(y.astype(np.float64) - yr.astype(np.float64))
                        bad = err > bound
                        exact = np.mean(y == yr)
                        status = "ok" if not bad.any() else "FAIL"
                        print(f"{status} {label}: max |err| {err.max():.3g}, max err/bound "
                              f"{(err / np.maximum(bound, 1e-300)).max():.3g}, bit-exact {100 * exact:.1f}%")
                        if bad.any():
                            failures += 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
