#!/usr/bin/env python3
"""Independent NumPy implementation of the DeepSeek-V4 forward pass (docs/spec/architecture.md).

Written from the specification alone, not from the C code: it reads a checkpoint directory
(config.json, model.safetensors.index.json, shards) with a tiny pure-NumPy safetensors reader,
runs the whole forward for one sequence from position 0 (every token attends to what the causal
rules of 3.3-3.5 allow), and writes or compares the F32 logits [T, vocab].

Rounding points follow the spec: bf16 casts (ml_dtypes, round to nearest even), the FP8 activation
quantization of every FP8/FP4 linear (1x128 blocks, power-of-two scales), the FP8 round trip of the kv
nope dims and the FP4 round trip of the indexer q/k (own E2M1 rounding: ml_dtypes rounds 0.25+ to 0).
Where the spec fixes a value as fp32 but not the order of the operations, this file picks the plain one:
dot products of exact products (FP8 x FP8, bf16 x bf16) are summed in float64 and rounded once to fp32;
every other fp32 expression (mHC mixing, Sinkhorn, RMSNorm's 1/sqrt, softmax, the online softmax of the
sparse attention in chunks of 64, compressor pooling, SwiGLU, routing weights) is evaluated operation by
operation in fp32, sums in ascending index order; fp32 transcendentals come from the C math library
(ctypes), the spec leaving their last ulp to the library.  With these choices an independent C
implementation that makes the same plain choices agrees bit for bit, and the test demands exactly that.

usage:
  forward_numpy.py MODEL_DIR TOKENS --out FILE.npy              compute and save logits
  forward_numpy.py MODEL_DIR TOKENS --compare LOGITS.safetensors compare with the C oracle's file
TOKENS is a comma-separated list of ids.  Exit 77 when NumPy or ml_dtypes is missing.
"""
import json
import math
import os
import struct
import sys

try:
    import numpy as np
    import ml_dtypes
except ImportError as e:  # automake SKIP
    print("SKIP: %s" % e)
    sys.exit(77)

F32 = np.float32


# --------------------------------------------------------------------------------------------
# fp32 transcendentals.  The spec leaves the last ulp of exp, cos and sin to the library
# (docs/spec/architecture.md, numerics), so this reference calls the platform's C math library (expf,
# cosf, sinf) when it can, which makes a comparison with a C implementation on the same machine free of
# that noise; else NumPy's float64 functions rounded to fp32 (correctly rounded almost always).  The
# router's log1p is the spec's own (mmoe_log1p.h: a float64 evaluation rounded once, the correctly
# rounded value but for arguments within a few float64 ulps of a midpoint): here NumPy's float64 log1p
# rounded once, the same value but for those.
# --------------------------------------------------------------------------------------------
def _libm_f32(name):
    try:
        import ctypes
        import ctypes.util
        lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        fn = getattr(lib, name)
        fn.restype = ctypes.c_float
        fn.argtypes = [ctypes.c_float]
        return np.frompyfunc(lambda v: fn(v), 1, 1)
    except (OSError, AttributeError, TypeError):
        return None


_LIBM = {n: _libm_f32(n) for n in ("expf", "cosf", "sinf")}
_LIBM["log1pf"] = None


def fpow(base, expo):
    """fp32 pow (libm powf when available) of a scalar base and an array of exponents."""
    try:
        import ctypes
        import ctypes.util
        fn = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6").powf
        fn.restype = ctypes.c_float
        fn.argtypes = [ctypes.c_float, ctypes.c_float]
        return np.array([fn(float(base), float(e)) for e in np.asarray(expo, dtype=F32)], dtype=F32)
    except (OSError, AttributeError):
        return f32(F32(base) ** np.asarray(expo, dtype=F32))
_NP = {"expf": np.exp, "log1pf": np.log1p, "cosf": np.cos, "sinf": np.sin}


def _f32fn(name, x):
    x = np.asarray(x, dtype=F32)
    if _LIBM[name] is not None and x.size:
        return np.asarray(_LIBM[name](x), dtype=F32).reshape(x.shape)
    return _NP[name](x.astype(np.float64)).astype(F32)


def fexp(x):
    return _f32fn("expf", x)


def flog1p(x):
    return _f32fn("log1pf", x)


def fcos(x):
    return _f32fn("cosf", x)


def fsin(x):
    return _f32fn("sinf", x)
BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn


# --------------------------------------------------------------------------------------------
# Number formats
# --------------------------------------------------------------------------------------------
def bf16(x):
    """Round to the nearest bf16 (ties to even), returned as float32."""
    return np.asarray(x, dtype=F32).astype(BF16).astype(F32)


def f32(x):
    return np.asarray(x).astype(F32)


def e8m0_to_f32(b):
    b = np.asarray(b, dtype=np.int32)
    return np.ldexp(np.ones_like(b, dtype=np.float64), b - 127).astype(F32)


def pow2_ceil_scale(amax, fmt_max):
    """UE8M0 scale of the V4 reference: 2^ceil(log2(fl(amax * fl(1/fmt_max))))."""
    v = f32(amax) * F32(1.0 / fmt_max)
    m, e = np.frexp(v.astype(np.float64))  # v = m * 2^e, m in [0.5, 1)
    e = np.where(m == 0.5, e - 1, e)  # exact power of two: ceil(log2 v) = e - 1
    return np.ldexp(1.0, e).astype(F32)


def fp8_quant(x, block):
    """Per row, blocks of `block` along the last axis: (codes as float32 values, scales)."""
    shp = x.shape
    xb = x.reshape(shp[:-1] + (shp[-1] // block, block)).astype(F32)
    amax = np.maximum(np.abs(xb).max(axis=-1), F32(1e-4))
    s = pow2_ceil_scale(amax, 448.0)
    q = np.clip(xb / s[..., None], -448.0, 448.0).astype(E4M3).astype(F32)
    return q.reshape(shp), s


def fp8_roundtrip(x, block):
    q, s = fp8_quant(x, block)
    shp = x.shape
    qb = q.reshape(shp[:-1] + (shp[-1] // block, block))
    return bf16(qb * s[..., None]).reshape(shp)


def e2m1_rne(v):
    """FP4 E2M1 value nearest to v (ties to the even code), saturating at +-6, sign kept."""
    a = np.minimum(np.abs(v), 6.0)
    r = np.where(a < 2.0, np.round(a * 2.0) / 2.0, np.where(a < 4.0, np.round(a), np.round(a / 2.0) * 2.0))
    return (np.sign(v) * np.minimum(r, 6.0)).astype(F32)


def fp4_roundtrip(x, block=32):
    shp = x.shape
    xb = x.reshape(shp[:-1] + (shp[-1] // block, block)).astype(F32)
    amax = np.maximum(np.abs(xb).max(axis=-1), F32(6.0 * 2.0 ** -126))
    s = pow2_ceil_scale(amax, 6.0)
    q = e2m1_rne(np.clip(xb / s[..., None], -6.0, 6.0))
    return bf16(q * s[..., None]).reshape(shp)


FP4_TABLE = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6], dtype=F32)


# --------------------------------------------------------------------------------------------
# Checkpoint reading (pure NumPy safetensors reader)
# --------------------------------------------------------------------------------------------
ST_DTYPES = {"F32": np.float32, "F64": np.float64, "I8": np.int8, "U8": np.uint8, "I32": np.int32,
             "I64": np.int64, "BF16": np.uint16, "F8_E4M3": np.uint8, "F8_E8M0": np.uint8, "I16": np.int16}


class Checkpoint:
    def __init__(self, path):
        self.tensors = {}
        idx = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(idx):
            with open(idx) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        for fn in files:
            self._read(os.path.join(path, fn))

    def _read(self, fn):
        with open(fn, "rb") as f:
            data = f.read()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        base = 8 + n
        for name, e in header.items():
            if name == "__metadata__":
                continue
            b, en = e["data_offsets"]
            raw = np.frombuffer(data, dtype=ST_DTYPES[e["dtype"]], count=(en - b) // np.dtype(
                ST_DTYPES[e["dtype"]]).itemsize, offset=base + b).reshape(e["shape"])
            self.tensors[name] = (e["dtype"], raw)

    def has(self, name):
        return name in self.tensors

    def f32(self, name):
        """Any float tensor as float32 values (bf16 and e4m3 decoded exactly)."""
        dt, raw = self.tensors[name]
        if dt == "BF16":
            return (raw.astype(np.uint32) << 16).view(F32)
        if dt == "F8_E4M3":
            return raw.view(E4M3).astype(F32)
        if dt == "F8_E8M0":
            return e8m0_to_f32(raw)
        return raw.astype(F32)

    def raw(self, name):
        return self.tensors[name][1]

    def dtype(self, name):
        return self.tensors[name][0]


# --------------------------------------------------------------------------------------------
# Config (HF or reference keys, docs/spec/architecture.md)
# --------------------------------------------------------------------------------------------
def load_config(path):
    with open(os.path.join(path, "config.json")) as f:
        c = json.load(f)
    c = c.get("text_config", c)

    def get(hf, ref, default=None):
        cur = c
        for part in hf.split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        if cur is not None:
            return cur
        if ref in c:
            return c[ref]
        if default is None:
            raise KeyError(hf)
        return default

    cfg = dict(
        vocab=get("vocab_size", "vocab_size"), dim=get("hidden_size", "dim"),
        inter=get("moe_intermediate_size", "moe_inter_dim"), n_layers=get("num_hidden_layers", "n_layers"),
        n_hash=get("num_hash_layers", "n_hash_layers", 0), n_mtp=get("num_nextn_predict_layers", "n_mtp_layers", 1),
        n_heads=get("num_attention_heads", "n_heads"), n_experts=get("n_routed_experts", "n_routed_experts"),
        topk=get("num_experts_per_tok", "n_activated_experts"),
        score_func=get("scoring_func", "score_func", "softmax"), route_scale=get("routed_scaling_factor", "route_scale", 1.0),
        swiglu_limit=get("swiglu_limit", "swiglu_limit", 0.0), q_lora=get("q_lora_rank", "q_lora_rank"),
        head_dim=get("head_dim", "head_dim"), rope_dim=get("qk_rope_head_dim", "rope_head_dim"),
        o_groups=get("o_groups", "o_groups"), o_lora=get("o_lora_rank", "o_lora_rank"),
        window=get("sliding_window", "window_size"),
        orig_len=get("rope_scaling.original_max_position_embeddings", "original_seq_len", 0),
        rope_theta=get("rope_theta", "rope_theta", 10000.0),
        compress_theta=get("compress_rope_theta", "compress_rope_theta", 40000.0),
        rope_factor=get("rope_scaling.factor", "rope_factor", 40.0), beta_fast=get("rope_scaling.beta_fast", "beta_fast", 32),
        beta_slow=get("rope_scaling.beta_slow", "beta_slow", 1), idx_heads=get("index_n_heads", "index_n_heads"),
        idx_dim=get("index_head_dim", "index_head_dim"), idx_topk=get("index_topk", "index_topk"),
        hc=get("hc_mult", "hc_mult", 4), sinkhorn=get("hc_sinkhorn_iters", "hc_sinkhorn_iters", 20),
        hc_eps=get("hc_eps", "hc_eps", 1e-6), eps=get("rms_norm_eps", "norm_eps", 1e-6))
    ratios = list(c.get("compress_ratios", [0] * cfg["n_layers"]))
    ratios += [0] * (cfg["n_layers"] + cfg["n_mtp"] - len(ratios))
    cfg["ratios"] = ratios
    q = c.get("quantization_config", {})
    cfg["wblock"] = q.get("weight_block_size", [128, 128])
    return cfg


# --------------------------------------------------------------------------------------------
# Linear layers (docs/spec/architecture.md, linear layers) and RMSNorm
# --------------------------------------------------------------------------------------------
class Model:
    def __init__(self, path, rope_form="reference"):
        self.cfg = load_config(path)
        self.ck = Checkpoint(path)
        self.cache = {}
        assert rope_form in ROPE_FORMS, rope_form
        self.rope_form = rope_form

    def _w(self, name):
        if name not in self.cache:
            self.cache[name] = self.ck.f32(name)
        return self.cache[name]

    def linear(self, x, prefix):
        """`prefix.weight` of any kind: FP8 (+ .scale), FP4 (I8/U8 packed + .scale), BF16/F32."""
        dt = self.ck.dtype(prefix + ".weight")
        if dt == "F8_E4M3":
            return self.linear_fp8(x, prefix)
        if dt in ("I8", "U8"):
            return self.linear_fp4(x, prefix)
        w = self._w(prefix + ".weight").astype(np.float64)
        return bf16((x.astype(np.float64) @ w.T).astype(F32))

    def linear_fp8(self, x, prefix):
        w = self._w(prefix + ".weight")
        sw = self._w(prefix + ".scale")
        bn, bk = self.cfg["wblock"]
        N, K = w.shape
        xq, sx = fp8_quant(bf16(x), 128)  # [T, K], [T, K/128]
        acc = np.zeros((x.shape[0], N), dtype=F32)
        sw_rows = np.repeat(sw, bn, axis=0)[:N]  # [N, K/bk]
        for kb in range(K // bk):
            sl = slice(kb * bk, (kb + 1) * bk)
            part = (xq[:, sl].astype(np.float64) @ w[:, sl].astype(np.float64).T).astype(F32)
            scale = sx[:, (kb * bk) // 128][:, None] * sw_rows[:, kb][None, :]
            acc = (acc + part * scale).astype(F32)
        return bf16(acc)

    def linear_fp4(self, x, prefix):
        key = prefix + ".weight#fp4"
        if key not in self.cache:
            packed = self.ck.raw(prefix + ".weight").view(np.uint8)
            codes = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.uint8)
            codes[:, 0::2] = packed & 0xF  # element 2k: low nibble
            codes[:, 1::2] = packed >> 4
            self.cache[key] = FP4_TABLE[codes]
        w = self.cache[key]
        sw = self._w(prefix + ".scale")  # [N, K/32]
        N, K = w.shape
        xq, sx = fp8_quant(bf16(x), 128)
        acc = np.zeros((x.shape[0], N), dtype=F32)
        for kb in range(K // 32):
            sl = slice(kb * 32, (kb + 1) * 32)
            part = (xq[:, sl].astype(np.float64) @ w[:, sl].astype(np.float64).T).astype(F32)
            scale = sx[:, (kb * 32) // 128][:, None] * sw[:, kb][None, :]
            acc = (acc + part * scale).astype(F32)
        return bf16(acc)

    def rmsnorm(self, x, wname):
        w = self._w(wname)
        x = f32(x)
        ms = f32((x.astype(np.float64) ** 2).mean(axis=-1, keepdims=True))
        r = F32(1.0) / f32(np.sqrt(f32(ms + F32(self.cfg["eps"]))))  # fp32 sqrt, fp32 reciprocal
        return bf16(w * (x * r))


# --------------------------------------------------------------------------------------------
# mHC and head mix (docs/spec/architecture.md)
# --------------------------------------------------------------------------------------------
def sigmoid(z):
    """fp32 sigmoid: 1 / (1 + exp(-z)), each operation rounded to fp32."""
    z = f32(z)
    return f32(F32(1.0) / (F32(1.0) + fexp(-z)))


def stream_logits(X, fn, eps):
    T = X.shape[0]
    x = X.reshape(T, -1).astype(np.float64)
    rs = F32(1.0) / f32(np.sqrt(f32(f32((x * x).mean(axis=1)) + F32(eps))))
    return f32(f32(x @ fn.astype(np.float64).T) * rs[:, None])


def fsum(a, axis):
    """fp32 sum in ascending index order (the spec's "all fp32"; hc is tiny, so the order is the natural one)."""
    a = np.moveaxis(f32(a), axis, 0)
    acc = a[0].copy()
    for i in range(1, a.shape[0]):
        acc = f32(acc + a[i])
    return np.expand_dims(acc, axis)


def sinkhorn(C, iters, eps):
    """Spec 3.2 step 5 in fp32 operations."""
    eps = F32(eps)
    C = f32(C)
    C = fexp(f32(C - C.max(axis=-1, keepdims=True)))
    C = f32(f32(C / fsum(C, -1)) + eps)
    C = f32(C / f32(fsum(C, -2) + eps))
    for _ in range(iters - 1):
        C = f32(C / f32(fsum(C, -1) + eps))
        C = f32(C / f32(fsum(C, -2) + eps))
    return C


def hc_pre(m, X, prefix, cfg):
    hc = cfg["hc"]
    fn, base, scale = m._w(prefix + "_fn"), m._w(prefix + "_base"), m._w(prefix + "_scale")
    z = stream_logits(X, fn, cfg["eps"])
    pre = sigmoid(z[:, :hc] * scale[0] + base[:hc]) + F32(cfg["hc_eps"])
    post = F32(2.0) * sigmoid(z[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])
    C = (z[:, 2 * hc:] * scale[2] + base[2 * hc:]).reshape(-1, hc, hc)
    C = sinkhorn(C, cfg["sinkhorn"], cfg["hc_eps"])
    y = bf16(fsum(f32(pre[:, :, None] * X), 1)[:, 0])
    return y, post, C


def hc_post(out, R, post, C):
    # X_new[k] = post[k]*out + sum_j C[j][k] * R[j]
    # fp32: the sum over the input streams j (ascending), then the post term added
    mix = fsum(f32(C[:, :, :, None] * R[:, :, None, :]), 1)[:, 0]  # [T, k, D]
    return bf16(f32(f32(post[:, :, None] * out[:, None, :]) + mix))


def head_logits(m, X, prefix, norm_name):
    cfg = m.cfg
    fn, base, scale = m._w(prefix + "hc_head_fn"), m._w(prefix + "hc_head_base"), m._w(prefix + "hc_head_scale")
    z = stream_logits(X, fn, cfg["eps"])
    pre = sigmoid(z * scale[0] + base) + F32(cfg["hc_eps"])
    y = bf16(fsum(f32(pre[:, :, None] * X), 1)[:, 0])
    y = m.rmsnorm(y, norm_name)
    head = m._w("head.weight").astype(np.float64)
    return f32(y.astype(np.float64) @ head.T)


# --------------------------------------------------------------------------------------------
# RoPE with YaRN (docs/spec/architecture.md, attention)
# --------------------------------------------------------------------------------------------
def rope_freqs(cfg, ratio):
    rd = cfg["rope_dim"]
    base = cfg["compress_theta"] if ratio else cfg["rope_theta"]
    f = f32(F32(1.0) / fpow(F32(base), np.arange(0, rd, 2, dtype=F32) / F32(rd)))
    if ratio:
        def corr(b):
            return rd * math.log(cfg["orig_len"] / (b * 2 * math.pi)) / (2 * math.log(base))
        low = max(math.floor(corr(cfg["beta_fast"])), 0)
        high = min(math.ceil(corr(cfg["beta_slow"])), rd - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(rd // 2, dtype=F32) - F32(low)) / F32(high - low), 0, 1).astype(F32)
        smooth = F32(1) - ramp
        f = f32(f / F32(cfg["rope_factor"]) * (F32(1) - smooth) + f * smooth)
    return f


# How the real part of the rotation is rounded: "reference" is the spec's (the reference's GPU code contracts
# it into one fused multiply-add, re = fp32(a*cos - fp32(b*sin))); "plain" rounds a*cos first, as the
# PyTorch model of the tiny fixture (tools/tiny_dsv4_model.py) does on the CPU: fp32(fp32(a*cos) - fp32(b*sin)).
ROPE_FORMS = ("reference", "plain")


def fma_f32(a, b, c):
    """fp32(a*b + c) rounded once, for fp32 arrays where a*b is exact in float64 (a bf16 value times an fp32
    value: 8 + 24 significant bits).  TwoSum gives s + e = a*b + c exactly with s = fl64(a*b + c); rounding
    s to fp32 is the correct rounding of the exact sum unless s lies exactly halfway between two fp32
    numbers (fp32 midpoints are float64 numbers, so no other midpoint can lie between s and s + e), and
    there the sign of e decides."""
    x = a.astype(np.float64) * b.astype(np.float64)
    y = np.asarray(c, dtype=np.float64)
    s = x + y
    bb = s - x
    e = (x - (s - bb)) + (y - bb)
    f = s.astype(F32)
    fd = f.astype(np.float64)
    other = np.where(s > fd, np.nextafter(f, F32(np.inf)), np.nextafter(f, F32(-np.inf))).astype(F32)
    od = other.astype(np.float64)
    mid = (s != fd) & (np.abs(s - fd) == np.abs(od - s))
    fix = mid & (e != 0) & ((od > fd) == (e > 0))
    return np.where(fix, other, f).astype(F32)


def rope(x, pos, freqs, inverse=False, form="reference"):
    """Rotate the adjacent pairs of the last 2*len(freqs) dims of x [..., n] (x bf16, pos per row)."""
    rd = 2 * len(freqs)
    ang = f32(f32(np.asarray(pos, dtype=F32))[..., None] * freqs)  # [..., rd/2]
    c = fcos(ang)
    s = fsin(ang)
    if inverse:
        s = -s
    y = x.copy()
    a = x[..., -rd::2]
    b = x[..., -rd + 1::2]
    while c.ndim < a.ndim:
        c = c[..., None, :]
        s = s[..., None, :]
    bs = f32(b * s)
    if form == "reference":
        re = fma_f32(a, np.broadcast_to(c, a.shape), -bs)
    else:
        re = f32(f32(a * c) - bs)
    y[..., -rd::2] = bf16(re)
    y[..., -rd + 1::2] = bf16(f32(f32(a * s) + f32(b * c)))
    return y


def hadamard(x):
    n = x.shape[-1]
    H = np.array([[1.0]])
    while H.shape[0] < n:
        H = np.block([[H, H], [H, -H]])
    return bf16(f32(x.astype(np.float64) @ H.T) * F32(1.0 / math.sqrt(n)))


# --------------------------------------------------------------------------------------------
# Compressor (3.4), indexer (3.5), attention (3.3)
# --------------------------------------------------------------------------------------------
def compress(m, x, prefix, ratio, dh, freqs, kind):
    """All complete blocks of the sequence x [T, D] -> [T//ratio, dh] bf16."""
    T = x.shape[0]
    overlap = ratio == 4
    xd = x.astype(np.float64)
    kv = f32(xd @ m._w(prefix + ".wkv.weight").astype(np.float64).T)
    g = f32(xd @ m._w(prefix + ".wgate.weight").astype(np.float64).T)
    ape = m._w(prefix + ".ape")
    g = f32(g + ape[np.arange(T) % ratio])
    nb = T // ratio
    out = np.zeros((nb, dh), dtype=F32)
    for j in range(nb):
        cur = slice(j * ratio, (j + 1) * ratio)
        if overlap:
            if j == 0:
                kv_prev = np.zeros((ratio, dh))
                g_prev = np.full((ratio, dh), -np.inf)
            else:
                prv = slice((j - 1) * ratio, j * ratio)
                kv_prev, g_prev = kv[prv, :dh], g[prv, :dh]
            kvs = np.concatenate([kv_prev, kv[cur, dh:]]).astype(np.float64)
            gs = np.concatenate([g_prev, g[cur, dh:]]).astype(np.float64)
        else:
            kvs, gs = kv[cur].astype(np.float64), g[cur].astype(np.float64)
        # per-channel softmax over the candidates and weighted sum, fp32 operations in candidate order
        gs, kvs = f32(gs), f32(kvs)
        mx = gs.max(axis=0)
        e = fexp(f32(gs - mx))
        den = fsum(e, 0)[0]
        acc = np.zeros(dh, dtype=F32)
        for i in range(gs.shape[0]):
            acc = f32(acc + f32(f32(e[i] / den) * kvs[i]))
        out[j] = acc
    out = m.rmsnorm(bf16(out), prefix + ".norm.weight")
    out = rope(out, np.arange(nb) * ratio, freqs, form=m.rope_form)
    if kind == "attn":
        nope = dh - 2 * len(freqs)
        out[:, :nope] = fp8_roundtrip(out[:, :nope], 64)
    else:
        out = fp4_roundtrip(hadamard(out), 32)
    return out


def indexer_topk(m, x, qr, prefix, freqs, cfg, L_ratio):
    T = x.shape[0]
    nh, dh = cfg["idx_heads"], cfg["idx_dim"]
    qi = m.linear(qr, prefix + ".wq_b").reshape(T, nh, dh)
    qi = rope(qi, np.arange(T), freqs, form=m.rope_form)
    qi = fp4_roundtrip(hadamard(qi), 32)
    K = compress(m, x, prefix + ".compressor", L_ratio, dh, freqs, "index")
    w = m.linear(x, prefix + ".weights_proj")  # bf16 [T, nh]
    w = bf16(w * F32((dh * nh) ** -0.5))
    picks = []
    for p in range(T):
        nc = (p + 1) // L_ratio
        if nc == 0:
            picks.append([])
            continue
        dots = bf16(f32(qi[p].astype(np.float64) @ K[:nc].astype(np.float64).T))  # [nh, nc]
        terms = bf16(np.maximum(dots, 0) * w[p][:, None])
        score = bf16(f32(terms.astype(np.float64).sum(axis=0)))
        order = sorted(range(nc), key=lambda j: (-score[j], j))  # stable: ties keep the lowest index
        picks.append(order[:min(cfg["idx_topk"], nc)])
    return picks


def sparse_attention(qp, KV, sink, scale, chunk=64):
    """Spec 3.3 sparse attention core for one query: qp [H, d], KV [n, d] (bf16 values), fp32 online softmax
    over chunks of 64 in list order, P rounded to bf16 for P.V, the sink in the denominator only."""
    H, d = qp.shape
    m = np.full(H, -np.inf, dtype=F32)
    den = np.zeros(H, dtype=F32)
    acc = np.zeros((H, d), dtype=F32)
    for c0 in range(0, KV.shape[0], chunk):
        blk = KV[c0:c0 + chunk]
        s = f32(f32(qp.astype(np.float64) @ blk.astype(np.float64).T) * scale)  # [H, cn]
        m_new = np.maximum(m, s.max(axis=1))
        alpha = fexp(f32(m - m_new))
        den = f32(den * alpha)
        acc = f32(acc * alpha[:, None])
        for i in range(blk.shape[0]):
            pr = fexp(f32(s[:, i] - m_new))
            den = f32(den + pr)
            acc = f32(acc + f32(bf16(pr)[:, None] * blk[i][None, :]))
        m = m_new
    den = f32(den + fexp(f32(sink - m)))
    return bf16(acc / den[:, None])


def attention(m, x, layer, ratio, prefix, cfg):
    T = x.shape[0]
    H, d, rd = cfg["n_heads"], cfg["head_dim"], cfg["rope_dim"]
    freqs = rope_freqs(cfg, ratio)
    pos = np.arange(T)
    qr = m.rmsnorm(m.linear(x, prefix + ".wq_a"), prefix + ".q_norm.weight")
    q = m.linear(qr, prefix + ".wq_b").reshape(T, H, d)
    # per-head RMS scaling in bf16 arithmetic
    q2 = bf16(q * q)
    mean = bf16(f32(q2.astype(np.float64).sum(axis=-1, keepdims=True)) / F32(d))
    r = bf16(F32(1.0) / f32(np.sqrt(bf16(mean + F32(cfg["eps"])))))  # fp32 sqrt and reciprocal, then bf16
    q = bf16(q * r)
    q = rope(q, pos, freqs, form=m.rope_form)
    kv = m.rmsnorm(m.linear(x, prefix + ".wkv"), prefix + ".kv_norm.weight")
    kv = rope(kv, pos, freqs, form=m.rope_form)
    kv[:, :d - rd] = fp8_roundtrip(kv[:, :d - rd], 64)
    comp = None
    picks = None
    if ratio:
        comp = compress(m, x, prefix + ".compressor", ratio, d, freqs, "attn")
    if ratio == 4:
        picks = indexer_topk(m, x, qr, prefix + ".indexer", freqs, cfg, ratio)
    sink = m._w(prefix + ".attn_sink")
    scale = F32(d ** -0.5)
    o = np.zeros((T, H, d), dtype=F32)
    for p in range(T):
        rows = [kv[t] for t in range(max(0, p - cfg["window"] + 1), p + 1)]
        if ratio == 128:
            rows += [comp[j] for j in range((p + 1) // 128)]
        elif ratio == 4:
            rows += [comp[j] for j in picks[p]]
        o[p] = sparse_attention(q[p], np.stack(rows), sink, scale)
    o = rope(o, pos, freqs, inverse=True, form=m.rope_form)
    G = cfg["o_groups"]
    og = o.reshape(T, G, H * d // G).astype(np.float64)
    if m.ck.dtype(prefix + ".wo_a.weight") == "F8_E4M3":
        wa = m._w(prefix + ".wo_a.weight")
        sa = m._w(prefix + ".wo_a.scale")
        bn, bk = cfg["wblock"]
        wa = bf16(wa * np.repeat(np.repeat(sa, bn, axis=0), bk, axis=1)[:wa.shape[0], :wa.shape[1]])
    else:
        wa = m._w(prefix + ".wo_a.weight")
    wa = wa.reshape(G, cfg["o_lora"], H * d // G).astype(np.float64)
    z = bf16(f32(np.einsum("tgc,grc->tgr", og, wa)))
    return m.linear(z.reshape(T, G * cfg["o_lora"]), prefix + ".wo_b")


# --------------------------------------------------------------------------------------------
# MoE (3.6)
# --------------------------------------------------------------------------------------------
def swiglu_expert(m, x, prefix, weight, limit):
    g = m.linear(x, prefix + ".w1")
    u = m.linear(x, prefix + ".w3")
    if limit > 0:
        u = np.clip(u, -limit, limit)
        g = np.minimum(g, F32(limit))
    silu = f32(g / f32(F32(1.0) + fexp(-g)))  # torch F.silu in fp32 operations
    h = f32(f32(silu * u) * weight)
    return m.linear(bf16(h), prefix + ".w2")


def moe(m, x, ids, prefix, layer, cfg):
    T = x.shape[0]
    s = f32(x.astype(np.float64) @ m._w(prefix + ".gate.weight").astype(np.float64).T)
    sf = cfg["score_func"]
    if sf == "softmax":
        sc = f32(np.exp(s - s.max(axis=1, keepdims=True)).astype(np.float64))
        sc = f32(sc / sc.sum(axis=1, keepdims=True))
    elif sf == "sigmoid":
        sc = sigmoid(s)
    else:
        sp = np.where(s > 20, s, flog1p(fexp(np.minimum(s, F32(20)))))
        sc = f32(np.sqrt(f32(sp)))
    k = cfg["topk"]
    if layer < cfg["n_hash"]:
        idx = m.ck.raw(prefix + ".gate.tid2eid")[np.asarray(ids)].astype(np.int64)
    else:
        sel = f32(sc + m._w(prefix + ".gate.bias"))
        idx = np.array([sorted(range(sel.shape[1]), key=lambda e: (-sel[t, e], e))[:k] for t in range(T)])
    wts = np.take_along_axis(sc, idx, axis=1)
    if sf != "softmax":
        wts = f32(wts / f32(wts.sum(axis=1, keepdims=True)))
    wts = f32(wts * F32(cfg["route_scale"]))
    acc = np.zeros((T, cfg["dim"]), dtype=F32)
    lim = cfg["swiglu_limit"]
    for e in range(cfg["n_experts"]):
        rows, slot = np.nonzero(idx == e)
        if rows.size == 0:
            continue
        y = swiglu_expert(m, x[rows], "%s.experts.%d" % (prefix, e), wts[rows, slot][:, None], lim)
        acc[rows] = f32(acc[rows] + y)
    sh = swiglu_expert(m, x, prefix + ".shared_experts", F32(1.0), lim)
    return bf16(acc + sh)


# --------------------------------------------------------------------------------------------
# Blocks, model, MTP
# --------------------------------------------------------------------------------------------
def block(m, X, ids, layer, pfx):
    cfg = m.cfg
    ratio = cfg["ratios"][layer]
    R = X
    y, post, C = hc_pre(m, X, pfx + "hc_attn", cfg)
    o = attention(m, m.rmsnorm(y, pfx + "attn_norm.weight"), layer, ratio, pfx + "attn", cfg)
    X = hc_post(o, R, post, C)
    R = X
    y, post, C = hc_pre(m, X, pfx + "hc_ffn", cfg)
    o = moe(m, m.rmsnorm(y, pfx + "ffn_norm.weight"), ids, pfx + "ffn", layer, cfg)
    return hc_post(o, R, post, C)


def forward(m, ids, with_mtp=False):
    cfg = m.cfg
    emb = m._w("embed.weight")
    h = bf16(emb[np.asarray(ids)])
    X = np.repeat(h[:, None, :], cfg["hc"], axis=1)
    for L in range(cfg["n_layers"]):
        X = block(m, X, ids, L, "layers.%d." % L)
    logits = head_logits(m, X, "", "norm.weight")
    mtp = None
    if with_mtp and cfg["n_mtp"] > 0 and len(ids) > 1:
        # assumed wiring (docs/spec/architecture.md, MTP): state at t with the token at t+1
        Xs, nid = X[:-1], np.asarray(ids[1:])
        e = m.rmsnorm(bf16(emb[nid]), "mtp.0.enorm.weight")
        hn = m.rmsnorm(Xs, "mtp.0.hnorm.weight")
        Xm = bf16(m.linear(e, "mtp.0.e_proj")[:, None, :] + m.linear(
            hn.reshape(-1, cfg["dim"]), "mtp.0.h_proj").reshape(Xs.shape))
        Xm = block(m, Xm, nid, cfg["n_layers"], "mtp.0.")
        mtp = head_logits(m, Xm, "mtp.0.", "mtp.0.norm.weight")
    return logits, mtp


def read_c_logits(fn):
    ck = Checkpoint.__new__(Checkpoint)
    ck.tensors = {}
    ck._read(fn)
    return {k: ck.f32(k) for k in ck.tensors}


def main(argv):
    if len(argv) == 2 and argv[1] == "--probe":  # the imports worked: not a skip
        return 0
    if len(argv) < 3:
        print(__doc__)
        return 2
    model_dir, tokens = argv[1], [int(t) for t in argv[2].split(",")]
    m = Model(model_dir)
    if "--out" in argv:
        logits, mtp = forward(m, tokens, with_mtp=True)
        np.save(argv[argv.index("--out") + 1], logits)
        return 0
    fn = argv[argv.index("--compare") + 1]
    c = read_c_logits(fn)
    want_mtp = "mtp_logits" in c
    ref, mtp = forward(m, tokens, with_mtp=want_mtp)
    got = c["logits"]
    if got.shape[0] == 1 and ref.shape[0] > 1:
        ref = ref[-1:]
    # Expected: bit-exact, almost always.  Both sides round at the spec's points, sum exact products (FP8 x FP8,
    # bf16 x bf16) in double and round once, do the remaining fp32 arithmetic (mHC, Sinkhorn, softmax, SwiGLU)
    # operation by operation in index order, and take fp32 transcendentals from the same C library.  What the
    # spec leaves free and the C MoE oracle does differently (its expert GEMMs and router sum in fp32, in eight
    # fused multiply-add lanes, src/cpu_ref/moe_dot.c) occasionally moves an fp32 result by an ulp, which flips one bf16
    # rounding; the flip then spreads (through FP8 steps of 6-12% of an element, the window, the compressed
    # blocks and the indexer's top-k) to later rows at the level of a few percent.  So the test accepts:
    #   - bit-exact logits, or
    #   - a divergence that starts like a rounding flip: every row before the first differing one is
    #     bit-exact, that first row is within FLIP_SEED relative (a flip seen there: 1e-3 .. 1.9e-1),
    #     80% of all rows are within 0.25 and the argmax agrees on 80% of the rows (a screen for gross errors
    #     only: the C test then requires a bit-exact model, see below).
    # A wrong formula (stream index, norm, rope, a missing round trip, wrong block order) changes the first
    # affected row by more and/or every row; mutations tried fail this test: ffn_norm <-> attn_norm (0.31
    # everywhere), no FP8 round trip of the window kv (first row 0: 7.9e-2), no FP8 round trip of the
    # compressed kv (first row 3: 3.3e-2 -- the closest call; such a bug is certain to show as non-bit-exact
    # in the usual, flip-free run).
    # The MTP block reads the main model's final streams, so a flip in main row r reaches MTP row r through one
    # more block of FP8 steps, which can grow it past FLIP_SEED (seen: 3.9e-2 and 5.0e-2).  So an MTP divergence
    # that starts exactly at the main logits' first flipped row is judged as downstream of that flip (the bulk
    # criteria only); one that starts earlier, or while the main logits are bit-exact, must meet FLIP_SEED itself.
    #
    # Exit status: 0 bit-exact; 3 a divergence that looks like a rounding flip (FLIP_SEED below on its first row,
    # the bulk criteria on the rest); 1 anything else.  A flip-like run is not a pass by itself: the C test
    # (tests/test_forward_xval.c) then draws another random model and requires a bit-exact one among a few,
    # because a wrong formula makes every model differ while a flip touches about one run in five.  The first-row
    # bound is therefore only a screen for gross errors: flips were seen up to 1.9e-1 there (row 12 of seed
    # 2219616774377253, in the sanitizer build, where NumPy's transcendentals stand in for the C library's).
    FLIP_SEED = 0.3
    ok = True
    exact = True
    main_first = None
    for name, a, b in [("logits", got, ref)] + ([("mtp_logits", c["mtp_logits"], mtp)] if want_mtp else []):
        if a.shape != b.shape:
            print("%s: shape %s, expected %s" % (name, a.shape, b.shape))
            return 1
        rel = np.linalg.norm((a - b).astype(np.float64)) / max(np.linalg.norm(b.astype(np.float64)), 1e-30)
        rows = np.linalg.norm((a - b).astype(np.float64), axis=1) / np.maximum(
            np.linalg.norm(b.astype(np.float64), axis=1), 1e-30)
        argmax_eq = np.mean(a.argmax(axis=1) == b.argmax(axis=1))
        differing = np.nonzero(np.any(a.view(np.uint32) != b.view(np.uint32), axis=1))[0]
        verdict = "bit-exact"
        if differing.size:
            first = int(differing[0])
            downstream = name == "mtp_logits" and main_first is not None and first == main_first
            seed_ok = rows[first] <= FLIP_SEED or downstream
            flip_like = seed_ok and np.mean(rows <= 0.25) >= 0.8 and argmax_eq >= 0.8
            if name == "logits":
                main_first = first
            verdict = "rounding-flip cascade from row %d (first row %.1e%s)" % (
                first, rows[first], ", downstream of the main logits' flip" if downstream else "") if flip_like \
                else "MISMATCH (first differing row %d, %.1e)" % (first, rows[first])
            ok = ok and flip_like
            exact = False
        print("%s: T=%d vocab=%d, %d of %d rows bit-exact, rel_err=%.3e max_abs=%.3e argmax_agree=%.3f: %s" % (
            name, a.shape[0], a.shape[1], a.shape[0] - differing.size, a.shape[0], rel, np.abs(a - b).max(),
            argmax_eq, verdict))
        if differing.size:
            print("  per-position rel err: " + " ".join("%.1e" % v for v in rows))
    if not all(fn is not None for fn in _LIBM.values()):
        print("note: no C math library through ctypes; NumPy transcendentals make rounding flips more frequent")
    return (0 if exact else 3) if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
