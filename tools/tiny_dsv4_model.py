"""The tiny DeepSeek-V4 model in PyTorch: one forward, two modes (float training, quantized evaluation).

The forward follows docs/spec/architecture.md step by step (embedding and stream expansion,
mHC pre/post with Sinkhorn, attention with q/kv low rank, per-head q scaling, interleaved RoPE with
YaRN on compressed layers, sliding window + compressed blocks (ratio 128) or indexer-picked blocks
(ratio 4), attention sink, inverse RoPE, grouped output projection; MoE with sqrtsoftplus scores,
hash routing on the first layers, SwiGLU with the clamp; hc_head, norm, head; the MTP block).
It was written from the spec, with tests/xval/forward_numpy.py (the independent NumPy forward that
matches the C oracle bit for bit) as the map of the rounding points.

* Training mode (quant=False): float32 parameters, no rounding, all experts computed densely and
  weighted by the (sparse) routing weights, so that everything except the indexer and the routing
  choices is differentiable.  Optional straight-through fake quantization of the weights (--qat).
* Evaluation mode (quant=True): the weights are the exported checkpoint's (FP8 codes and block scales,
  FP4 codes and 1x32 scales, bf16, f32) and every rounding point of the spec is applied: bf16 casts,
  the FP8 1x128 activation quantization of every FP8/FP4 linear with its per-block fp32 accumulation,
  the FP8 round trip of the kv nope dims, Hadamard + FP4 round trip of the indexer, bf16 P in P.V.
  Where the spec leaves the fp32 order free, the plain choices of the NumPy forward: dot products of
  exact products summed in float64 and rounded once to fp32; other sums in ascending index order,
  one fp32 rounding per addition; the sparse attention in the reference's list order; fp32 exp/cos/
  sin/pow/log1p correctly rounded (float64, rounded once).  On the fixture this agrees bit for bit
  with the C oracle (tests/test_tiny_model.c states the bound it demands and prints the difference).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

F32 = torch.float32
F64 = torch.float64


# ----------------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------------
def tiny_config():
    """The fixture's architecture: every V4 layer type at the smallest widths the C oracle accepts."""
    return dict(
        vocab=512, dim=128, inter=128, n_layers=4, n_hash=2, n_mtp=1, n_heads=2, n_experts=8, topk=2,
        n_shared=1, score_func="sqrtsoftplus", route_scale=1.5, swiglu_limit=10.0, q_lora=128,
        head_dim=128, rope_dim=64, o_groups=2, o_lora=64, window=16, orig_len=65536, rope_theta=10000.0,
        compress_theta=160000.0, rope_factor=16.0, beta_fast=32, beta_slow=1, idx_heads=2, idx_dim=64,
        idx_topk=4, hc=4, sinkhorn=20, hc_eps=1e-6, eps=1e-6, ratios=[0, 4, 128, 4, 0], max_seq_len=1024,
        bos=0, eos=1)


def hf_config_json(c):
    """config.json with the published (Hugging Face) keys."""
    return {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        "bos_token_id": c["bos"], "eos_token_id": c["eos"], "hc_eps": c["hc_eps"], "hc_mult": c["hc"],
        "hc_sinkhorn_iters": c["sinkhorn"], "head_dim": c["head_dim"], "hidden_act": "silu",
        "hidden_size": c["dim"], "index_head_dim": c["idx_dim"], "index_n_heads": c["idx_heads"],
        "index_topk": c["idx_topk"], "max_position_embeddings": c["max_seq_len"],
        "moe_intermediate_size": c["inter"], "n_routed_experts": c["n_experts"],
        "n_shared_experts": c["n_shared"], "norm_topk_prob": True, "num_attention_heads": c["n_heads"],
        "num_experts_per_tok": c["topk"], "num_hidden_layers": c["n_layers"], "num_hash_layers": c["n_hash"],
        "num_key_value_heads": 1, "num_nextn_predict_layers": c["n_mtp"], "o_groups": c["o_groups"],
        "o_lora_rank": c["o_lora"], "q_lora_rank": c["q_lora"], "qk_rope_head_dim": c["rope_dim"],
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
        "rms_norm_eps": c["eps"],
        "rope_scaling": {"beta_fast": c["beta_fast"], "beta_slow": c["beta_slow"], "factor": c["rope_factor"],
                         "original_max_position_embeddings": c["orig_len"], "type": "yarn"},
        "rope_theta": c["rope_theta"], "routed_scaling_factor": c["route_scale"],
        "scoring_func": c["score_func"], "sliding_window": c["window"], "swiglu_limit": c["swiglu_limit"],
        "tie_word_embeddings": False, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
        "vocab_size": c["vocab"], "compress_rope_theta": c["compress_theta"], "compress_ratios": c["ratios"],
    }


# ----------------------------------------------------------------------------------------------
# Tensor list (names, checkpoint dtype, shape): the checkpoint table of docs/spec/architecture.md at the tiny widths.
# kinds: fp8 (E4M3 + 128x128 E8M0 scale), fp4 (packed E2M1 + 1x32 E8M0 scale), bf16, f32, i64.
# ----------------------------------------------------------------------------------------------
def tensor_list(c):
    D, H, d, G, hc, I = c["dim"], c["n_heads"], c["head_dim"], c["o_groups"], c["hc"], c["inter"]
    L = []

    def block(i, p):
        for s in ("attn", "ffn"):
            L.append((p + "hc_%s_fn" % s, "f32", ((2 + hc) * hc, hc * D), "hc_fn"))
            L.append((p + "hc_%s_base" % s, "f32", ((2 + hc) * hc,), "hc_base"))
            L.append((p + "hc_%s_scale" % s, "f32", (3,), "hc_scale"))
            L.append((p + "%s_norm.weight" % s, "bf16", (D,), "norm"))
        r = c["ratios"][i]
        L.append((p + "attn.wq_a", "fp8", (c["q_lora"], D), "lin"))
        L.append((p + "attn.q_norm.weight", "bf16", (c["q_lora"],), "norm"))
        L.append((p + "attn.wq_b", "fp8", (H * d, c["q_lora"]), "lin"))
        L.append((p + "attn.wkv", "fp8", (d, D), "lin"))
        L.append((p + "attn.kv_norm.weight", "bf16", (d,), "norm"))
        L.append((p + "attn.wo_a", "fp8", (G * c["o_lora"], H * d // G), "lin"))
        L.append((p + "attn.wo_b", "fp8", (D, G * c["o_lora"]), "lin"))
        L.append((p + "attn.attn_sink", "f32", (H,), "sink"))

        def comp(q, rr, dh):
            cc = 2 if rr == 4 else 1
            L.append((q + ".wkv.weight", "bf16", (cc * dh, D), "lin"))
            L.append((q + ".wgate.weight", "bf16", (cc * dh, D), "lin"))
            L.append((q + ".ape", "f32", (rr, cc * dh), "ape"))
            L.append((q + ".norm.weight", "bf16", (dh,), "norm"))
        if r in (4, 128):
            comp(p + "attn.compressor", r, d)
        if r == 4:
            L.append((p + "attn.indexer.wq_b", "fp8", (c["idx_heads"] * c["idx_dim"], c["q_lora"]), "lin"))
            L.append((p + "attn.indexer.weights_proj.weight", "bf16", (c["idx_heads"], D), "lin"))
            comp(p + "attn.indexer.compressor", 4, c["idx_dim"])
        L.append((p + "ffn.gate.weight", "bf16", (c["n_experts"], D), "gate"))
        if i < c["n_hash"]:
            L.append((p + "ffn.gate.tid2eid", "i64", (c["vocab"], c["topk"]), "tid2eid"))
        else:
            L.append((p + "ffn.gate.bias", "f32", (c["n_experts"],), "bias"))
        for e in range(c["n_experts"]):
            L.append((p + "ffn.experts.%d.w1" % e, "fp4", (I, D), "lin"))
            L.append((p + "ffn.experts.%d.w2" % e, "fp4", (D, I), "lin"))
            L.append((p + "ffn.experts.%d.w3" % e, "fp4", (I, D), "lin"))
        Ws = c["n_shared"] * I
        L.append((p + "ffn.shared_experts.w1", "fp8", (Ws, D), "lin"))
        L.append((p + "ffn.shared_experts.w2", "fp8", (D, Ws), "lin"))
        L.append((p + "ffn.shared_experts.w3", "fp8", (Ws, D), "lin"))

    def head(p):
        L.append((p + "hc_head_fn", "f32", (hc, hc * D), "hc_fn"))
        L.append((p + "hc_head_base", "f32", (hc,), "hc_head_base"))
        L.append((p + "hc_head_scale", "f32", (1,), "hc_scale"))
        L.append((p + "norm.weight", "bf16", (D,), "norm"))

    L.append(("embed.weight", "bf16", (c["vocab"], D), "embed"))
    L.append(("head.weight", "bf16", (c["vocab"], D), "headw"))
    head("")
    for i in range(c["n_layers"]):
        block(i, "layers.%d." % i)
    for m in range(c["n_mtp"]):
        p = "mtp.%d." % m
        L.append((p + "e_proj", "fp8", (D, D), "lin"))
        L.append((p + "h_proj", "fp8", (D, D), "lin"))
        L.append((p + "enorm.weight", "bf16", (D,), "norm"))
        L.append((p + "hnorm.weight", "bf16", (D,), "norm"))
        head(p)
        block(c["n_layers"] + m, p)
    return L


# ----------------------------------------------------------------------------------------------
# Number formats (torch); used for the weight export, the QAT fake quantization and the evaluation
# ----------------------------------------------------------------------------------------------
def bf16(x):
    return x.to(torch.bfloat16).to(F32)


def pow2_ceil(v):
    """2^ceil(log2 v) of positive fp32 values (exact: frexp)."""
    m, e = torch.frexp(v.to(F64))
    e = torch.where(m == 0.5, e - 1, e)
    return torch.ldexp(torch.ones_like(v, dtype=F64), e).to(F32)


def e4m3(x):
    """Round fp32 to the nearest E4M3 value (ties to even), saturating at +-448."""
    return x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(F32)


def e2m1(v):
    """FP4 E2M1 value nearest to v (ties to the even code), saturating at +-6."""
    a = v.abs().clamp(max=6.0)
    r = torch.where(a < 2.0, torch.round(a * 2.0) / 2.0,
                    torch.where(a < 4.0, torch.round(a), torch.round(a / 2.0) * 2.0))
    return torch.sign(v) * r.clamp(max=6.0)


def fp8_act_quant(x, block):
    """Per row, blocks of `block` on the last axis: (codes as fp32 values, fp32 power-of-two scales)."""
    shp = x.shape
    xb = x.reshape(shp[:-1] + (shp[-1] // block, block))
    amax = xb.abs().amax(-1).clamp(min=1e-4)
    s = pow2_ceil(amax * torch.tensor(1.0 / 448.0, dtype=F32))
    q = e4m3(xb / s[..., None])
    return q.reshape(shp), s


def fp8_roundtrip(x, block):
    q, s = fp8_act_quant(x, block)
    shp = x.shape
    return bf16(q.reshape(shp[:-1] + (shp[-1] // block, block)) * s[..., None]).reshape(shp)


def fp4_roundtrip(x, block=32):
    shp = x.shape
    xb = x.reshape(shp[:-1] + (shp[-1] // block, block))
    amax = xb.abs().amax(-1).clamp(min=6.0 * 2.0 ** -126)
    s = pow2_ceil(amax * torch.tensor(1.0 / 6.0, dtype=F32))
    q = e2m1((xb / s[..., None]).clamp(-6.0, 6.0))
    return bf16(q * s[..., None]).reshape(shp)


def quant_fp8_weight(w, bn=128, bk=128):
    """FP8 E4M3 weight with one power-of-two scale per bn x bk block: (codes fp32 [out,in], scales fp32)."""
    out, inn = w.shape
    nbo, nbi = -(-out // bn), -(-inn // bk)
    wp = torch.zeros(nbo * bn, nbi * bk, dtype=F32, device=w.device)
    wp[:out, :inn] = w
    blk = wp.reshape(nbo, bn, nbi, bk)
    amax = blk.abs().amax(dim=(1, 3)).clamp(min=1e-30)
    s = pow2_ceil(amax / 448.0)
    q = e4m3(blk / s[:, None, :, None]).reshape(nbo * bn, nbi * bk)[:out, :inn]
    return q, s


def quant_fp4_weight(w, block=32):
    """FP4 E2M1 weight with one power-of-two scale per 1 x 32 block: (codes fp32 values [out,in], scales)."""
    out, inn = w.shape
    blk = w.reshape(out, inn // block, block)
    amax = blk.abs().amax(-1).clamp(min=1e-30)
    s = pow2_ceil(amax / 6.0)
    q = e2m1(blk / s[..., None]).reshape(out, inn)
    return q, s


def fake_quant(w, kind):
    """Straight-through fake quantization of a weight for QAT: forward sees the dequantized value."""
    with torch.no_grad():
        if kind == "fp8":
            q, s = quant_fp8_weight(w.detach().float())
            deq = q * s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:w.shape[0], :w.shape[1]]
        elif kind == "fp4":
            q, s = quant_fp4_weight(w.detach().float())
            deq = q * s.repeat_interleave(32, 1)
        else:
            deq = bf16(w.detach())
    return w + (deq - w).detach()


# ----------------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------------
class TinyDSV4(nn.Module):
    def __init__(self, c, seed=0):
        super().__init__()
        self.c = c
        self.quant = False
        self.qat = False
        self.spec = {n: (k, shp, role) for n, k, shp, role in tensor_list(c)}
        g = torch.Generator().manual_seed(seed)
        self.p = nn.ParameterDict()
        self.buffers_i64 = {}
        for name, (kind, shp, role) in self.spec.items():
            if kind == "i64":
                # hash routing: topk distinct experts per token, fixed (not trained)
                t = torch.stack([torch.randperm(c["n_experts"], generator=g)[:c["topk"]] for _ in range(shp[0])])
                self.register_buffer(self._key(name), t)
                continue
            self.p[self._key(name)] = nn.Parameter(self._init(role, shp, g))
        self.q = {}  # evaluation weights: name -> (kind, codes, scales)

    @staticmethod
    def _key(name):
        return name.replace(".", "__")

    def _init(self, role, shp, g):
        hc = self.c["hc"]
        if role == "embed":
            return torch.randn(shp, generator=g)
        if role in ("lin", "headw", "gate"):
            return torch.randn(shp, generator=g) / math.sqrt(shp[1])
        if role == "norm":
            return torch.ones(shp)
        if role == "hc_fn":
            return torch.randn(shp, generator=g) * 0.01
        if role == "hc_base":
            b = torch.zeros(shp)
            b[:hc] = -1.0  # pre ~ sigmoid(-1) = 0.27: the streams are averaged
            b[2 * hc:] = (torch.eye(hc) * 4.0).flatten()  # C ~ identity after Sinkhorn
            return b
        if role == "hc_head_base":
            return torch.full(shp, -1.0)
        if role == "hc_scale":
            return torch.ones(shp)
        if role in ("sink", "bias"):
            return torch.zeros(shp)
        if role == "ape":
            return torch.zeros(shp)
        raise ValueError(role)

    # -- parameter access ----------------------------------------------------------------------
    def W(self, name):
        """A float weight (training) or the dequantized exported weight (evaluation)."""
        if self.quant:
            kind, q, s = self.q[name]
            if kind == "fp8":
                return q * s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:q.shape[0], :q.shape[1]]
            if kind == "fp4":
                return q * s.repeat_interleave(32, 1)
            return q
        w = self.p[self._key(name)]
        if self.qat:
            kind = self.spec[name][0]
            if kind in ("fp8", "fp4", "bf16") and w.dim() == 2:
                return fake_quant(w, kind)
        return w

    def tid2eid(self, name):
        if self.quant:
            return self.q[name][1]
        return getattr(self, self._key(name))

    def R(self, x):
        """bf16 rounding point (evaluation only)."""
        return bf16(x) if self.quant else x

    # -- fp32 elementary functions and sums.  In evaluation they are the correctly rounded fp32 value
    # (computed in float64, rounded once), which is what the C library's expf/cosf/... return in all
    # but rare cases, and sums run in ascending index order, one fp32 rounding per addition, as the
    # C oracle and the NumPy forward do where the spec leaves the order free.
    def exp(self, x):
        return torch.exp(x.to(F64)).to(F32) if self.quant else torch.exp(x)

    def sigmoid(self, z):
        return 1.0 / (1.0 + self.exp(-z)) if self.quant else torch.sigmoid(z)

    def fsum(self, x, dim, keepdim=False):
        if not self.quant:
            return x.sum(dim, keepdim=keepdim)
        x = x.movedim(dim, 0)
        acc = x[0].clone()
        for i in range(1, x.shape[0]):
            acc = acc + x[i]
        return acc.unsqueeze(dim) if keepdim else acc

    # -- linears (3.0) -------------------------------------------------------------------------
    def linear(self, x, name):
        kind = self.spec[name][0]
        if not self.quant:
            return x @ self.W(name).t()
        if kind == "bf16":
            return bf16((x.to(F64) @ self.q[name][1].to(F64).t()).to(F32))
        _, wq, sw = self.q[name]
        xq, sx = fp8_act_quant(bf16(x), 128)
        bk = 128 if kind == "fp8" else 32
        N, K = wq.shape
        acc = torch.zeros(x.shape[:-1] + (N,), dtype=F32)
        for kb in range(K // bk):
            sl = slice(kb * bk, (kb + 1) * bk)
            part = (xq[..., sl].to(F64) @ wq[:, sl].to(F64).t()).to(F32)
            if kind == "fp8":
                swr = sw[:, kb].repeat_interleave(128)[:N]
            else:
                swr = sw[:, kb]
            acc = acc + part * (sx[..., (kb * bk) // 128][..., None] * swr)
        return bf16(acc)

    def dense(self, x, name):
        """fp32 matmul of bf16 inputs (gate, compressor, head): float64 sum of exact products."""
        if not self.quant:
            return x @ self.W(name).t()
        return (x.to(F64) @ self.W(name).to(F64).t()).to(F32)

    def rmsnorm(self, x, name):
        w = self.W(name)
        if not self.quant:
            return w * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.c["eps"]))
        ms = (x.to(F64) ** 2).mean(-1, keepdim=True).to(F32)
        r = 1.0 / torch.sqrt(ms + torch.tensor(self.c["eps"], dtype=F32))
        return bf16(w * (x * r))

    # -- mHC (3.2) -----------------------------------------------------------------------------
    def stream_logits(self, X, fn):
        x = X.flatten(-2)
        if not self.quant:
            rs = torch.rsqrt((x * x).mean(-1, keepdim=True) + self.c["eps"])
            return (x @ fn.t()) * rs
        xd = x.to(F64)
        rs = 1.0 / torch.sqrt((xd * xd).mean(-1, keepdim=True).to(F32) + torch.tensor(self.c["eps"], dtype=F32))
        return (xd @ fn.to(F64).t()).to(F32) * rs

    def sinkhorn(self, C):
        eps = self.c["hc_eps"]
        C = self.exp(C - C.amax(-1, keepdim=True))
        C = C / self.fsum(C, -1, True) + eps
        C = C / (self.fsum(C, -2, True) + eps)
        for _ in range(self.c["sinkhorn"] - 1):
            C = C / (self.fsum(C, -1, True) + eps)
            C = C / (self.fsum(C, -2, True) + eps)
        return C

    def hc_pre(self, X, p):
        hc = self.c["hc"]
        fn, base, scale = self.W(p + "_fn"), self.W(p + "_base"), self.W(p + "_scale")
        z = self.stream_logits(X, fn)
        pre = self.sigmoid(z[..., :hc] * scale[0] + base[:hc]) + self.c["hc_eps"]
        post = 2.0 * self.sigmoid(z[..., hc:2 * hc] * scale[1] + base[hc:2 * hc])
        C = (z[..., 2 * hc:] * scale[2] + base[2 * hc:]).reshape(z.shape[:-1] + (hc, hc))
        C = self.sinkhorn(C)
        y = self.R(self.fsum(pre[..., None] * X, -2))
        return y, post, C

    def hc_post(self, out, R, post, C):
        # X_new[k] = post[k] * out + sum_j C[j][k] * R[j]
        mix = self.fsum(C[..., :, :, None] * R[..., :, None, :], -3)
        return self.R(post[..., None] * out[..., None, :] + mix)

    def head_logits(self, X, p, norm):
        fn, base, scale = self.W(p + "hc_head_fn"), self.W(p + "hc_head_base"), self.W(p + "hc_head_scale")
        z = self.stream_logits(X, fn)
        pre = self.sigmoid(z * scale[0] + base) + self.c["hc_eps"]
        y = self.R(self.fsum(pre[..., None] * X, -2))
        y = self.rmsnorm(y, norm)
        return self.dense(y, "head.weight")

    # -- RoPE (3.3) ----------------------------------------------------------------------------
    def rope_freqs(self, ratio, device):
        c = self.c
        rd = c["rope_dim"]
        base = c["compress_theta"] if ratio else c["rope_theta"]
        ex = torch.arange(0, rd, 2, dtype=F32) / rd
        f = 1.0 / torch.pow(torch.tensor(base, dtype=F64), ex.to(F64)).to(F32)
        if ratio:
            def corr(b):
                return rd * math.log(c["orig_len"] / (b * 2 * math.pi)) / (2 * math.log(base))
            low = max(math.floor(corr(c["beta_fast"])), 0)
            high = min(math.ceil(corr(c["beta_slow"])), rd - 1)
            if low == high:
                high += 0.001
            ramp = ((torch.arange(rd // 2, dtype=F32) - low) / (high - low)).clamp(0, 1)
            smooth = 1.0 - ramp
            f = f / c["rope_factor"] * (1.0 - smooth) + f * smooth
        return f.to(device)

    def rope(self, x, pos, freqs, inverse=False):
        """Rotate the adjacent pairs of the last 2*len(freqs) dims; pos broadcasts against x's rows."""
        rd = 2 * freqs.shape[0]
        ang = pos.to(F32)[..., None] * freqs
        if self.quant:
            cs, sn = torch.cos(ang.to(F64)).to(F32), torch.sin(ang.to(F64)).to(F32)
        else:
            cs, sn = torch.cos(ang), torch.sin(ang)
        if inverse:
            sn = -sn
        # x is [B, T, ...]: the position axis is x's axis 1
        shp = (cs.shape[0],) + (1,) * (x.dim() - 3) + (cs.shape[-1],)
        cs, sn = cs.reshape(shp), sn.reshape(shp)
        a, b = x[..., -rd::2], x[..., -rd + 1::2]
        ya = self.R(a * cs - b * sn)
        yb = self.R(a * sn + b * cs)
        rot = torch.stack([ya, yb], -1).flatten(-2)
        return torch.cat([x[..., :-rd], rot], -1)

    def hadamard(self, x):
        n = x.shape[-1]
        Hm = torch.ones(1, 1, dtype=F64)
        while Hm.shape[0] < n:
            Hm = torch.cat([torch.cat([Hm, Hm], 1), torch.cat([Hm, -Hm], 1)], 0)
        if not self.quant:
            return x @ (Hm.to(x.dtype).to(x.device) / math.sqrt(n)).t()
        return bf16((x.to(F64) @ Hm.t()).to(F32) * torch.tensor(1.0 / math.sqrt(n), dtype=F32))

    # -- compressor (3.4) ----------------------------------------------------------------------
    def compress(self, x, p, ratio, dh, freqs, kind):
        """x [B, T, D] -> [B, T//ratio, dh]."""
        B, T, _ = x.shape
        nb = T // ratio
        kv = self.dense(x, p + ".wkv.weight")
        g = self.dense(x, p + ".wgate.weight")
        ape = self.W(p + ".ape")
        g = g + ape[torch.arange(T, device=x.device) % ratio]
        kv, g = kv[:, :nb * ratio], g[:, :nb * ratio]
        if ratio == 4:
            kvb = kv.reshape(B, nb, ratio, 2 * dh)
            gb = g.reshape(B, nb, ratio, 2 * dh)
            kv_prev = torch.cat([torch.zeros_like(kvb[:, :1, :, :dh]), kvb[:, :-1, :, :dh]], 1)
            g_prev = torch.cat([torch.full_like(gb[:, :1, :, :dh], -math.inf), gb[:, :-1, :, :dh]], 1)
            kvs = torch.cat([kv_prev, kvb[..., dh:]], 2)
            gs = torch.cat([g_prev, gb[..., dh:]], 2)
        else:
            kvs = kv.reshape(B, nb, ratio, dh)
            gs = g.reshape(B, nb, ratio, dh)
        e = self.exp(gs - gs.amax(2, keepdim=True))
        out = self.fsum((e / self.fsum(e, 2, True)) * kvs, 2)
        out = self.rmsnorm(self.R(out), p + ".norm.weight")
        pos = torch.arange(nb, device=x.device) * ratio
        out = self.rope(out, pos, freqs)
        if not self.quant:
            return out
        if kind == "attn":
            nope = dh - freqs.shape[0] * 2
            return torch.cat([fp8_roundtrip(out[..., :nope], 64), out[..., nope:]], -1)
        return fp4_roundtrip(self.hadamard(out), 32)

    def indexer_pick(self, x, qr, p, freqs):
        """Spec 3.5: the picked ratio-4 blocks per query position: (mask [B, T, nb], the picks in
        descending score order [B, T, k], their validity [B, T, k]); k = min(index_topk, nb)."""
        c = self.c
        B, T, _ = x.shape
        nh, dh = c["idx_heads"], c["idx_dim"]
        with torch.no_grad():
            qi = self.linear(qr, p + ".wq_b").reshape(B, T, nh, dh)
            pos = torch.arange(T, device=x.device)
            qi = self.rope(qi, pos, freqs)
            qi = self.hadamard(qi)
            if self.quant:
                qi = fp4_roundtrip(qi, 32)
            K = self.compress(x, p + ".compressor", 4, dh, freqs, "index")  # [B, nb, dh]
            nb = K.shape[1]
            mask = torch.zeros(B, T, nb, dtype=torch.bool, device=x.device)
            if nb == 0:
                return mask, None, None
            w = self.linear(x, p + ".weights_proj.weight")
            w = self.R(w * torch.tensor((dh * nh) ** -0.5, dtype=F32))
            if self.quant:
                dots = bf16(torch.einsum("bthd,bjd->bthj", qi.to(F64), K.to(F64)).to(F32))
                terms = bf16(dots.clamp(min=0) * w[..., None])
                score = bf16(terms.to(F64).sum(2).to(F32))  # [B, T, nb]
            else:
                dots = torch.einsum("bthd,bjd->bthj", qi, K)
                score = (dots.clamp(min=0) * w[..., None]).sum(2)
            causal = torch.arange(nb, device=x.device)[None, :] < ((pos + 1) // 4)[:, None]  # [T, nb]
            score = score.masked_fill(~causal, -math.inf)
            order = torch.sort(-score, dim=-1, stable=True).indices  # descending, ties: lowest index
            k = min(c["idx_topk"], nb)
            top = order[..., :k]
            valid = torch.gather(causal[None].expand(B, T, nb), -1, top)
            mask.scatter_(-1, top, True)
            return mask & causal, top, valid

    # -- attention (3.3) -----------------------------------------------------------------------
    def attention(self, x, layer, p):
        c = self.c
        B, T, _ = x.shape
        H, d, rd = c["n_heads"], c["head_dim"], c["rope_dim"]
        ratio = c["ratios"][layer]
        freqs = self.rope_freqs(ratio, x.device)
        pos = torch.arange(T, device=x.device)
        qr = self.rmsnorm(self.linear(x, p + ".wq_a"), p + ".q_norm.weight")
        q = self.linear(qr, p + ".wq_b").reshape(B, T, H, d)
        if self.quant:
            q2 = bf16(q * q)
            mean = bf16(q2.to(F64).sum(-1, keepdim=True).to(F32) / d)
            r = bf16(1.0 / torch.sqrt(bf16(mean + torch.tensor(c["eps"], dtype=F32))))
            q = bf16(q * r)
        else:
            q = q * torch.rsqrt((q * q).mean(-1, keepdim=True) + c["eps"])
        q = self.rope(q, pos, freqs)
        kv = self.rmsnorm(self.linear(x, p + ".wkv"), p + ".kv_norm.weight")
        kv = self.rope(kv, pos, freqs)
        if self.quant:
            kv = torch.cat([fp8_roundtrip(kv[..., :d - rd], 64), kv[..., d - rd:]], -1)
        keys = kv
        # masks: window over the raw kv, then the compressed entries
        tq = pos[:, None]
        tk = pos[None, :]
        allowed = (tk <= tq) & (tk > tq - c["window"])  # [T, T]
        allowed = allowed[None].expand(B, T, T)
        top = top_valid = None
        if ratio:
            comp = self.compress(x, p + ".compressor", ratio, d, freqs, "attn")
            nb = comp.shape[1]
            if ratio == 128:
                cm = torch.arange(nb, device=x.device)[None, :] < ((pos + 1) // 128)[:, None]
                cm = cm[None].expand(B, T, nb)
            else:
                cm, top, top_valid = self.indexer_pick(x, qr, p + ".indexer", freqs)
            keys = torch.cat([kv, comp], 1)
            allowed = torch.cat([allowed, cm], 2)
        sink = self.W(p + ".attn_sink")
        scale = d ** -0.5
        if self.quant:
            s = (torch.einsum("bthd,bkd->bhtk", q.to(F64), keys.to(F64)).to(F32) * torch.tensor(scale, dtype=F32))
        else:
            s = torch.einsum("bthd,bkd->bhtk", q, keys) * scale
        s = s.masked_fill(~allowed[:, None], -math.inf)
        m = s.amax(-1, keepdim=True)
        if self.quant:
            o = self.attend_in_order(s, m, keys, sink, ratio, T, top, top_valid)
        else:
            pr = torch.exp(s - m)
            den = pr.sum(-1, keepdim=True) + torch.exp(sink[None, :, None, None] - m)
            o = torch.einsum("bhtk,bkd->bthd", pr / den, keys)
        o = self.rope(o, pos, freqs, inverse=True)
        G = c["o_groups"]
        og = o.reshape(B, T, G, H * d // G)
        wa = self.R(self.W(p + ".wo_a")).reshape(G, c["o_lora"], H * d // G)
        if self.quant:
            z = bf16(torch.einsum("btgc,grc->btgr", og.to(F64), wa.to(F64)).to(F32))
        else:
            z = torch.einsum("btgc,grc->btgr", og, wa)
        return self.linear(z.reshape(B, T, G * c["o_lora"]), p + ".wo_b")

    def attend_in_order(self, s, m, keys, sink, ratio, T, top, top_valid):
        """Evaluation: the sparse-attention sums of docs/spec/architecture.md (attention) in the list order of the reference (window rows
        by ascending position, then the compressed rows: ascending for ratio 128, indexer order for ratio 4),
        one fp32 rounding per addition; P rounded to bf16 for P.V; the sink in the denominator only.
        (Every list here is shorter than the 64-row chunk, so the online softmax is this plain one.)
        s [B, H, T, n_keys] (masked -inf), m [B, H, T, 1] the row maxima -> o [B, T, H, d] bf16."""
        c = self.c
        B, H = s.shape[0], s.shape[1]
        W = c["window"]
        pos = torch.arange(T)
        lists, valids = [], []
        for i in range(W):  # window: positions p-W+1 .. p
            t = pos - W + 1 + i
            lists.append(t.clamp(min=0)[None].expand(B, T))
            valids.append((t >= 0)[None].expand(B, T))
        nb = keys.shape[1] - T
        if ratio == 128:
            for j in range(nb):
                lists.append(torch.full((B, T), T + j, dtype=torch.long))
                valids.append((j < (pos + 1) // 128)[None].expand(B, T))
        elif ratio == 4 and top is not None:
            for i in range(top.shape[-1]):
                lists.append(T + top[..., i])
                valids.append(top_valid[..., i])
        den = torch.zeros(B, H, T, dtype=F32)
        acc = torch.zeros(B, T, H, keys.shape[-1], dtype=F32)
        bidx = torch.arange(B)[:, None]
        for idx, ok in zip(lists, valids):
            s_i = torch.gather(s, 3, idx[:, None, :, None].expand(B, H, T, 1))[..., 0]  # [B, H, T]
            pr = self.exp(s_i - m[..., 0])
            den = torch.where(ok[:, None, :], den + pr, den)
            kv_i = keys[bidx, idx]  # [B, T, d]
            term = bf16(pr).permute(0, 2, 1)[..., None] * kv_i[:, :, None, :]
            acc = torch.where(ok[:, :, None, None], acc + term, acc)
        den = den + self.exp(sink[None, :, None] - m[..., 0])
        return bf16(acc / den.permute(0, 2, 1)[..., None])

    # -- MoE (3.6) -----------------------------------------------------------------------------
    def expert(self, x, p, weight):
        lim = self.c["swiglu_limit"]
        g = self.linear(x, p + ".w1")
        u = self.linear(x, p + ".w3")
        u = u.clamp(-lim, lim)
        g = g.clamp(max=lim)
        h = (g / (1.0 + self.exp(-g)) if self.quant else F.silu(g)) * u * weight
        return self.linear(self.R(h), p + ".w2")

    def moe(self, x, ids, p, layer):
        c = self.c
        B, T, D = x.shape
        s = self.dense(x, p + ".gate.weight")
        sp = torch.where(s > 20, s, torch.log1p(self.exp(s.clamp(max=20)).to(F64)).to(F32) if self.quant
                         else torch.log1p(torch.exp(s.clamp(max=20))))
        sc = torch.sqrt(sp)
        k = c["topk"]
        if layer < c["n_hash"]:
            idx = self.tid2eid(p + ".gate.tid2eid")[ids]
        else:
            sel = (sc + self.W(p + ".gate.bias")).detach()
            # descending, ties to the lowest expert id
            idx = torch.sort(-sel, dim=-1, stable=True).indices[..., :k]
        wts = torch.gather(sc, -1, idx)
        wts = wts / wts.sum(-1, keepdim=True) * c["route_scale"]
        if not self.quant:
            dense_w = torch.zeros(B, T, c["n_experts"], device=x.device).scatter(-1, idx, wts)
            acc = 0
            for e in range(c["n_experts"]):
                acc = acc + self.expert(x, "%s.experts.%d" % (p, e), dense_w[..., e:e + 1])
            self._aux_load[p] = F.one_hot(idx, c["n_experts"]).float().sum(-2).mean((0, 1)).detach()
            return acc + self.expert(x, p + ".shared_experts", 1.0)
        xf = x.reshape(B * T, D)
        idf = idx.reshape(B * T, k)
        wf = wts.reshape(B * T, k)
        acc = torch.zeros(B * T, D, dtype=F32)
        for e in range(c["n_experts"]):
            rows, slot = torch.nonzero(idf == e, as_tuple=True)
            if rows.numel() == 0:
                continue
            y = self.expert(xf[rows], "%s.experts.%d" % (p, e), wf[rows, slot][:, None])
            acc[rows] = acc[rows] + y
        sh = self.expert(xf, p + ".shared_experts", 1.0)
        return bf16(acc + sh).reshape(B, T, D)

    # -- blocks, model, MTP (3.1, 3.7, 3.8) ------------------------------------------------------
    def block(self, X, ids, layer, pfx):
        R = X
        y, post, C = self.hc_pre(X, pfx + "hc_attn")
        o = self.attention(self.rmsnorm(y, pfx + "attn_norm.weight"), layer, pfx + "attn")
        X = self.hc_post(o, R, post, C)
        R = X
        y, post, C = self.hc_pre(X, pfx + "hc_ffn")
        o = self.moe(self.rmsnorm(y, pfx + "ffn_norm.weight"), ids, pfx + "ffn", layer)
        return self.hc_post(o, R, post, C)

    def forward(self, ids, with_mtp=True):
        """ids [B, T] -> (logits [B, T, V], mtp logits [B, T-1, V] predicting t+2, or None)."""
        c = self.c
        self._aux_load = {}
        emb = self.W("embed.weight")
        h = self.R(emb[ids])
        X = h[:, :, None, :].expand(-1, -1, c["hc"], -1)
        for L in range(c["n_layers"]):
            X = self.block(X, ids, L, "layers.%d." % L)
        logits = self.head_logits(X, "", "norm.weight")
        mtp = None
        if with_mtp and c["n_mtp"] > 0 and ids.shape[1] > 1:
            Xs, nid = X[:, :-1], ids[:, 1:]
            e = self.rmsnorm(self.R(emb[nid]), "mtp.0.enorm.weight")
            hn = self.rmsnorm(Xs, "mtp.0.hnorm.weight")
            Xm = self.R(self.linear(e, "mtp.0.e_proj")[:, :, None, :] + self.linear(hn, "mtp.0.h_proj"))
            Xm = self.block(Xm, nid, c["n_layers"], "mtp.0.")
            mtp = self.head_logits(Xm, "mtp.0.", "mtp.0.norm.weight")
        return logits, mtp
