#!/usr/bin/env python3
"""Quantize the trained tiny DeepSeek-V4 model to the published checkpoint format, then produce goldens.

1. export: every tensor of the tensor list (tiny_dsv4_model.tensor_list, the checkpoint table of docs/spec/architecture.md)
   in its checkpoint dtype: dense linears FP8 E4M3 with one UE8M0 scale per 128x128 block (scale =
   power-of-two ceiling of amax/448), routed experts FP4 E2M1 packed two per byte (element 2k in the
   low nibble) with one UE8M0 scale per 1x32 block (ceiling of amax/6), norms/embedding/head/gate/
   compressors bf16 (round to nearest even), mHC/ape/sink/bias f32, hash tables i64.  Written as
   config.json, model.safetensors, model.safetensors.index.json and tokenizer.json.
2. golden: the EXPORTED files are read back (own safetensors reader), the model runs in evaluation
   mode (every rounding point of the spec) and the greedy continuations of a few prompts and the
   logits of a few positions are saved to golden.json.

usage: export_tiny_dsv4.py WEIGHTS.pt TOKENIZER.json OUT_DIR
"""
import json
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_dsv4_model import (TinyDSV4, bf16, e2m1, hf_config_json, quant_fp4_weight,  # noqa: E402
                             quant_fp8_weight, tensor_list)

FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]

# prompts of the goldens: (name, text, tokens to generate)
PROMPTS = [
    ("count", "1 2 3 4 5 6 7 8", 16),
    ("alphabet", "a b c d e f g h i j k l m n o p q r", 12),
    ("upper", "K L M N O P", 10),
    ("add", "3+4=7\n2+5=", 6),
    ("add2", "1+1=2\n6+3=", 6),
    ("count_long", " ".join(str(i) for i in range(1, 140)), 16),
]
LOGIT_PROMPT = "count_long"
LOGIT_POSITIONS = [0, 1, 7, 15, 16, 17, 63, 127, 128, 131, -1]
MTP_POSITIONS = [0, 16, 127, -1]  # rows of the MTP logits (row i: streams of position i, token i+1)


def e8m0_bytes(s):
    """Power-of-two fp32 scales -> UE8M0 bytes (exponent + 127)."""
    m, e = torch.frexp(s.to(torch.float64))
    assert torch.all(m == 0.5), "scale not a power of two"
    b = e - 1 + 127
    assert torch.all((b >= 0) & (b <= 254))
    return b.to(torch.uint8)


def fp4_codes(q):
    """E2M1 values -> 4-bit codes (bit 3 = sign)."""
    mag = q.abs()
    code = torch.zeros(q.shape, dtype=torch.uint8)
    for i, v in enumerate(FP4_VALUES):
        code = torch.where(mag == v, torch.tensor(i, dtype=torch.uint8), code)
    code = code | (torch.signbit(q) & (mag > 0)).to(torch.uint8) * 8
    return code


def quantize(c, state):
    """name -> (safetensors dtype, shape, bytes) for every checkpoint tensor."""
    out = {}
    for name, kind, shp, _ in tensor_list(c):
        key = name.replace(".", "__")
        w = state["p." + key] if kind != "i64" else state[key]
        w = w.float() if kind != "i64" else w
        assert tuple(w.shape) == tuple(shp), (name, w.shape, shp)
        if kind == "fp8":
            q, s = quant_fp8_weight(w)
            out[name + ".weight"] = ("F8_E4M3", list(shp), q.to(torch.float8_e4m3fn).view(torch.uint8))
            out[name + ".scale"] = ("F8_E8M0", list(s.shape), e8m0_bytes(s))
        elif kind == "fp4":
            q, s = quant_fp4_weight(w)
            codes = fp4_codes(q)
            packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
            out[name + ".weight"] = ("I8", [shp[0], shp[1] // 2], packed.view(torch.int8))
            out[name + ".scale"] = ("F8_E8M0", list(s.shape), e8m0_bytes(s))
        elif kind == "bf16":
            out[name] = ("BF16", list(shp), w.to(torch.bfloat16).view(torch.int16))
        elif kind == "f32":
            out[name] = ("F32", list(shp), w.to(torch.float32))
        elif kind == "i64":
            out[name] = ("I64", list(shp), w.to(torch.int64))
        else:
            raise ValueError(kind)
    return out


def write_safetensors(path, tensors):
    """Tensors in order of decreasing element size (8, 4, 2, 1 bytes), each class in list order, and
    the header padded to 8 bytes: every tensor's data is then aligned to its element size in the file
    (and in a page-aligned mmap), as the safetensors library's own writer arranges it."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    order = sorted(tensors.items(), key=lambda kv: -kv[1][2].element_size())  # stable
    for name, (dt, shp, t) in order:
        b = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": dt, "shape": shp, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def read_safetensors(path):
    """name -> torch tensor of the stored dtype (E4M3/E8M0/packed FP4 stay raw bytes)."""
    dts = {"F8_E4M3": torch.uint8, "F8_E8M0": torch.uint8, "I8": torch.uint8, "BF16": torch.int16,
           "F32": torch.float32, "I64": torch.int64}
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, en = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[8 + n + b:8 + n + en]), dtype=dts[e["dtype"]]).reshape(e["shape"])
        out[name] = (e["dtype"], t)
    return out


def load_quantized(model, ckdir):
    """Fill model.q from the exported files: (kind, values fp32, scales fp32)."""
    c = model.c
    raw = read_safetensors(os.path.join(ckdir, "model.safetensors"))
    table = torch.tensor(FP4_VALUES + [-v for v in FP4_VALUES], dtype=torch.float32)
    table[8] = -0.0

    def e8m0(t):
        return torch.ldexp(torch.ones(t.shape, dtype=torch.float64), t.to(torch.int64) - 127).float()
    for name, kind, shp, _ in tensor_list(c):
        if kind == "fp8":
            q = raw[name + ".weight"][1].view(torch.float8_e4m3fn).float()
            model.q[name] = ("fp8", q, e8m0(raw[name + ".scale"][1]))
        elif kind == "fp4":
            p = raw[name + ".weight"][1]
            codes = torch.stack([p & 0xF, p >> 4], -1).reshape(shp[0], shp[1]).long()
            model.q[name] = ("fp4", table[codes], e8m0(raw[name + ".scale"][1]))
        elif kind == "bf16":
            model.q[name] = ("bf16", raw[name][1].view(torch.bfloat16).float(), None)
        elif kind == "f32":
            model.q[name] = ("f32", raw[name][1].clone(), None)
        else:
            model.q[name] = ("i64", raw[name][1].clone(), None)
    model.quant = True


@torch.no_grad()
def greedy(model, ids, n):
    ids = list(ids)
    out = []
    for _ in range(n):
        logits, _ = model(torch.tensor([ids]), with_mtp=False)
        nxt = int(torch.argmax(logits[0, -1]))  # ties: the lowest id
        out.append(nxt)
        ids.append(nxt)
    return out


def main(argv):
    wpath, tokpath, out = argv[1], argv[2], argv[3]
    ck = torch.load(wpath, map_location="cpu")
    c = ck["config"]
    os.makedirs(out, exist_ok=True)
    tensors = quantize(c, ck["state"])
    write_safetensors(os.path.join(out, "model.safetensors"), tensors)
    total = sum(t.numel() * t.element_size() for _, _, t in tensors.values())
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total},
                   "weight_map": {k: "model.safetensors" for k in sorted(tensors)}}, f, indent=1)
        f.write("\n")
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(hf_config_json(c), f, indent=2)
        f.write("\n")
    with open(tokpath) as f:
        tokj = f.read()
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        f.write(tokj)
    print("exported %d tensors, %d bytes" % (len(tensors), total))

    # goldens from the exported files
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    model = TinyDSV4(c)
    load_quantized(model, out)
    golden = {"note": "generated by tools/export_tiny_dsv4.py from the exported checkpoint (PyTorch, "
                      "evaluation mode); ids include the BOS (id %d) first" % c["bos"],
              "prompts": [], "logits": []}
    for name, text, n in PROMPTS:
        ids = [c["bos"]] + tok.encode(text).ids
        cont = greedy(model, ids, n)
        print("%-10s %3d tokens: %r -> %r" % (name, len(ids), text[-30:], tok.decode(cont)))
        golden["prompts"].append({"name": name, "text": text, "ids": ids, "continuation": cont,
                                  "continuation_text": tok.decode(cont)})
    ids = next(p["ids"] for p in golden["prompts"] if p["name"] == LOGIT_PROMPT)
    with torch.no_grad():
        logits, mtp = model(torch.tensor([ids]), with_mtp=True)
    T = len(ids)
    for p in LOGIT_POSITIONS:
        pp = p % T
        golden["logits"].append({"prompt": LOGIT_PROMPT, "position": pp,
                                 "values": [float("%.9g" % v) for v in logits[0, pp].tolist()]})
    golden["mtp_logits"] = []
    for p in MTP_POSITIONS:
        pp = p % (T - 1)
        golden["mtp_logits"].append({"prompt": LOGIT_PROMPT, "row": pp,
                                     "values": [float("%.9g" % v) for v in mtp[0, pp].tolist()]})
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    torch.save(logits[0], os.path.join(os.path.dirname(wpath), "torch_logits_%s.pt" % LOGIT_PROMPT))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
