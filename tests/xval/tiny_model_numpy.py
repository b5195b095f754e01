#!/usr/bin/env python3
"""Three-way check of the embedded default model (fixtures/tiny-dsv4) on its 146-token counting prompt.

The C oracle (`megamoe logits --mtp`) computes the logits and the MTP logits; the independent NumPy
forward (forward_numpy.py, written from the spec) recomputes them and must agree bit for bit (its
own comparison).  The rows saved by PyTorch in golden.json (tools/export_tiny_dsv4.py) come from a
model that rounds one thing differently: RoPE's real part as fp32(fp32(a cos) - fp32(b sin)) (plain
CPU arithmetic, tools/tiny_dsv4_model.py), where the reference and the oracle contract it into one
fused multiply-add.  So the NumPy forward runs a second time with that rounding ("plain") and must
equal the PyTorch rows bit for bit; the two NumPy runs show where the two roundings part on this
prompt (the first bf16 flip, after which end-to-end logits no longer agree: docs/moe-oracle.md).
Expected: bit-exact, for the reasons given in forward_numpy.py (same rounding points, same plain
fp32 order, same libm); without the C math library only forward_numpy's loose bound holds.
Exit 77 (automake SKIP) when NumPy or ml_dtypes is missing.
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import forward_numpy as fn  # exits 77 itself when ml_dtypes is missing
except ImportError as e:
    print("SKIP: %s" % e)
    sys.exit(77)


def main():
    src = os.environ.get("MMOE_SRCDIR", ".")
    binary = os.environ.get("MMOE_BIN", "megamoe")
    fx = os.path.join(src, "fixtures", "tiny-dsv4")
    with open(os.path.join(fx, "golden.json")) as f:
        g = json.load(f)
    name = g["logits"][0]["prompt"]
    ids = next(p["ids"] for p in g["prompts"] if p["name"] == name)
    toks = ",".join(str(i) for i in ids)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.st")
        rc = subprocess.call([binary, "logits", "--model", fx, "--ids", toks, "--out", out, "--mtp"])
        if rc != 0:
            print("megamoe logits failed with %d" % rc)
            return 1
        rc = fn.main(["forward_numpy.py", fx, toks, "--compare", out])
        if rc != 0:
            print("C oracle and NumPy forward disagree on the fixture")
            return 1
    m = fn.Model(fx, rope_form="plain")
    logits, mtp = fn.forward(m, ids, with_mtp=True)
    exact = all(f is not None for f in fn._LIBM.values())
    worst = 0.0
    for key, ref, pos_key in (("logits", logits, "position"), ("mtp_logits", mtp, "row")):
        for r in g[key]:
            saved = np.array(r["values"], dtype=np.float32)
            row = ref[r[pos_key]]
            d = float(np.abs(row - saved).max())
            worst = max(worst, d)
            if exact and d != 0.0:
                print("%s row %d: NumPy and PyTorch differ by %g" % (key, r[pos_key], d))
                return 1
            if int(row.argmax()) != int(saved.argmax()):
                print("%s row %d: argmax NumPy %d, PyTorch %d" % (key, r[pos_key], row.argmax(), saved.argmax()))
                return 1
    print("NumPy (PyTorch's RoPE rounding) vs PyTorch goldens: max |diff| %g (%s)" % (
        worst, "bit-exact expected" if exact else "argmax only"))
    ref, _ = fn.forward(fn.Model(fx), ids)
    parted = np.nonzero(np.any(ref.view(np.uint32) != logits.view(np.uint32), axis=1))[0]
    print("the two RoPE roundings give the same logits up to position %s of %d" % (
        int(parted[0]) - 1 if parted.size else len(ids) - 1, len(ids)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
