#!/usr/bin/env python3
"""Cross-check megamoe's number formats against ml_dtypes (an independent implementation).

Runs the C conversions through the test helper tests/fmt_dump (built by `make check`) and
compares them with ml_dtypes' float8_e4m3fn, float8_e5m2, float4_e2m1fn, bfloat16 (and
float8_e8m0fnu for decoding), over random floats (fresh seed, printed; MMOE_SEED replays),
exact round-to-nearest ties between adjacent codes and one float ulp either side, and the
special values of docs/spec/formats.md.

Documented differences, handled explicitly (docs/spec/formats.md, E2M1 and FP8):
  * ml_dtypes' E4M3FN and E5M2 casts do not saturate: they are compared with the C
    "_nosat" variants; the saturating C variants are compared with ml_dtypes applied to
    the input clipped to +-max (which is what SATFINITE means).
  * NaN inputs: compared as a class (both results NaN codes), not bit for bit; for
    float4_e2m1fn, which has no NaN, ml_dtypes returns garbage (and warns), so NaN inputs
    are excluded from the E2M1 comparison; megamoe's documented answer is +6 (code 7).
  * float4_e2m1fn "0.25 + 1 ulp -> 0": the spec measured this ml_dtypes quirk.  The only
    mismatches tolerated are exactly that case (0.25 < |x| < 0.5, ml_dtypes code 0, C code 1,
    same sign); they are counted and printed.  With ml_dtypes 0.6.0 and float32 inputs the
    count is 0 (the quirk shows for float64 inputs such as 0.25 + 2^-30).

Exit status: 0 pass, 1 mismatch, 77 skip (no numpy/ml_dtypes or no fmt_dump).
"""
import os
import subprocess
import sys

try:
    import numpy as np
    import ml_dtypes
except ImportError as exc:  # automake SKIP
    print(f"SKIP: {exc}")
    sys.exit(77)

N_RANDOM = 400_000


def find_dump():
    build = os.environ.get("MMOE_BUILDDIR", ".")
    path = os.path.join(build, "tests", "fmt_dump")
    if not os.access(path, os.X_OK):
        print(f"SKIP: helper {path} not built (run make check)")
        sys.exit(77)
    return path


DUMP = find_dump()


def run_dump(mode, data):
    out = subprocess.run([DUMP, mode], input=data.tobytes(), stdout=subprocess.PIPE, check=True).stdout
    return out


def c_encode(mode, x):
    return np.frombuffer(run_dump(mode, x.astype(np.float32)), dtype=np.uint8)


def c_encode_bf16(x):
    return np.frombuffer(run_dump("bf16", x.astype(np.float32)), dtype=np.uint16)


def c_decode(mode, codes):
    return np.frombuffer(run_dump(mode, codes), dtype=np.float32)


def ml_encode(x, dtype, view):
    with np.errstate(all="ignore"):
        return x.astype(dtype).view(view)


failures = []


def report(name, x, got, want, mask=None):
    bad = got != want
    if mask is not None:
        bad &= mask
    n = int(bad.sum())
    checked = int(mask.sum()) if mask is not None else len(x)
    print(f"  {name}: {checked} values, {n} mismatches")
    if n:
        idx = np.nonzero(bad)[0][:10]
        for i in idx:
            bits = x[i : i + 1].view(np.uint32)[0]
            print(f"    x={x[i]!r} ({bits:08x}): megamoe {int(got[i]):#x}, ml_dtypes {int(want[i]):#x}")
        failures.append(name)


def code_values(dtype, nbits):
    """All finite positive values of a format, sorted (decoded by ml_dtypes)."""
    codes = np.arange(1 << (nbits - 1), dtype=np.uint8 if nbits <= 8 else np.uint16)
    if nbits == 4:
        vals = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)
        return vals
    vals = codes.view(dtype).astype(np.float64)
    return np.unique(vals[np.isfinite(vals)])


def ties_and_neighbours(vals):
    """Midpoints between adjacent values (and past the top), and one float32 ulp either side."""
    v = np.concatenate([vals, [vals[-1] * 2 - vals[-2]]])
    mids = ((v[:-1] + v[1:]) / 2).astype(np.float32)
    up = np.nextafter(mids, np.float32(np.inf))
    down = np.nextafter(mids, np.float32(0))
    pts = np.concatenate([mids, up, down])
    return np.concatenate([pts, -pts])


def specials():
    bits = [
        0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001,
        0x7FFFFFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x00800000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00400000,
        0x43E00000, 0x43E80000, 0x43E80001, 0x43F00000, 0x47600000, 0x47700000, 0x476FFFFF, 0x47700001,
        0x3E800000, 0x3E800001, 0xBE800001, 0x3F400000, 0x40A00000, 0x40C00000, 0x40E00000, 0x3F808000,
        0x3F818000, 0x3F808001, 0x00008000, 0x00018000, 0x3A800000, 0x3A800001, 0x37000000, 0x37800000,
    ]
    return np.array(bits, dtype=np.uint32).view(np.float32)


def random_floats(rng, lo_exp, hi_exp, n):
    sign = rng.choice([-1.0, 1.0], n)
    mant = 1.0 + rng.integers(0, 1 << 23, n) / float(1 << 23)
    exp = rng.integers(lo_exp, hi_exp + 1, n)
    return (sign * np.ldexp(mant, exp)).astype(np.float32)


def main():
    seed = int(os.environ["MMOE_SEED"]) if "MMOE_SEED" in os.environ else int.from_bytes(os.urandom(8), "little")
    print(f"formats_mldtypes: seed {seed} (replay: MMOE_SEED={seed}); ml_dtypes {ml_dtypes.__version__}")
    rng = np.random.default_rng(seed)
    anybits = rng.integers(0, 1 << 32, N_RANDOM, dtype=np.uint64).astype(np.uint32).view(np.float32)

    e4, e5, f4, bf = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float4_e2m1fn, ml_dtypes.bfloat16

    # ---------------- FP8 E4M3FN / E5M2 ----------------
    for name, dt, fmax, lo, hi, sat_mode, nosat_mode in (
        ("E4M3", e4, 448.0, -12, 10, "e4m3", "e4m3_nosat"),
        ("E5M2", e5, 57344.0, -19, 17, "e5m2", "e5m2_nosat"),
    ):
        x = np.concatenate([anybits, random_floats(rng, lo, hi, N_RANDOM),
                            ties_and_neighbours(code_values(dt, 8)), specials()])
        isnan = np.isnan(x)
        want = ml_encode(x, dt, np.uint8)
        got = c_encode(nosat_mode, x)
        report(f"{name} non-saturating vs ml_dtypes", x, got, want, ~isnan)
        # NaN inputs: NaN codes on both sides, sign kept on both sides
        nan_code = (lambda c: (c & 0x7F) == 0x7F) if name == "E4M3" else (lambda c: (c & 0x7F) > 0x7C)
        ok = nan_code(got[isnan]) & nan_code(want[isnan]) & ((got[isnan] & 0x80) == (want[isnan] & 0x80))
        print(f"  {name} NaN inputs: {int(isnan.sum())} values, {int((~ok).sum())} not NaN/sign on both sides")
        if not ok.all():
            failures.append(f"{name} NaN")
        # SATFINITE == ml_dtypes of the input clipped to +-max (non-NaN inputs)
        with np.errstate(all="ignore"):
            clipped = np.clip(x, np.float32(-fmax), np.float32(fmax))
        report(f"{name} SATFINITE vs ml_dtypes(clip(x))", x, c_encode(sat_mode, x), ml_encode(clipped, dt, np.uint8),
               ~isnan)
        # decoding of all 256 codes
        codes = np.arange(256, dtype=np.uint8)
        dec_c = c_decode(f"{name.lower()}_dec", codes)
        dec_m = codes.view(dt).astype(np.float32)
        same = (dec_c.view(np.uint32) == dec_m.view(np.uint32)) | (np.isnan(dec_c) & np.isnan(dec_m))
        print(f"  {name} decode: 256 codes, {int((~same).sum())} mismatches")
        if not same.all():
            failures.append(f"{name} decode")

    # ---------------- FP4 E2M1 ----------------
    x = np.concatenate([anybits, random_floats(rng, -5, 4, N_RANDOM), ties_and_neighbours(code_values(f4, 4)),
                        specials()])
    isnan = np.isnan(x)
    got = c_encode("e2m1", x)
    want = ml_encode(x, f4, np.uint8)
    with np.errstate(all="ignore"):
        ax = np.abs(x.astype(np.float64))
    quirk = (~isnan) & (ax > 0.25) & (ax < 0.5) & ((want & 7) == 0) & ((got & 7) == 1) & ((got & 8) == (want & 8))
    print(f"  E2M1 NaN inputs excluded: {int(isnan.sum())} (megamoe: code 7; ml_dtypes: garbage)")
    print(f"  E2M1 known ml_dtypes quirk '0.25+ulp -> 0' tolerated: {int(quirk.sum())} values")
    report("E2M1 RNE-sat vs ml_dtypes", x, got, want, (~isnan) & (~quirk))
    codes = np.arange(16, dtype=np.uint8)
    dec_c = c_decode("e2m1_dec", codes)
    dec_m = codes.view(f4).astype(np.float32)
    n_bad = int((dec_c.view(np.uint32) != dec_m.view(np.uint32)).sum())
    print(f"  E2M1 decode: 16 codes, {n_bad} mismatches")
    if n_bad:
        failures.append("E2M1 decode")

    # ---------------- BF16 ----------------
    ties = (rng.integers(0, 1 << 16, N_RANDOM, dtype=np.uint32) << 16) + 0x8000
    ties = ties + rng.integers(-1, 2, N_RANDOM).astype(np.uint32)
    x = np.concatenate([anybits, ties.view(np.float32), specials()])
    isnan = np.isnan(x)
    got = c_encode_bf16(x)
    want = ml_encode(x, bf, np.uint16)
    report("BF16 vs ml_dtypes", x, got, want, ~isnan)
    nan_ok = ((got[isnan] & 0x7F80) == 0x7F80) & ((got[isnan] & 0x7F) != 0) & ((want[isnan] & 0x7F) != 0)
    print(f"  BF16 NaN inputs: {int(isnan.sum())} values, {int((~nan_ok).sum())} not NaN on both sides")
    if not nan_ok.all():
        failures.append("BF16 NaN")
    codes = np.arange(65536, dtype=np.uint16)
    dec_c = np.frombuffer(run_dump("bf16_dec", codes), dtype=np.float32)
    dec_m = codes.view(bf).astype(np.float32)
    same = (dec_c.view(np.uint32) == dec_m.view(np.uint32)) | (np.isnan(dec_c) & np.isnan(dec_m))
    print(f"  BF16 decode: 65536 codes, {int((~same).sum())} mismatches")
    if not same.all():
        failures.append("BF16 decode")

    # ---------------- UE8M0 decode ----------------
    if hasattr(ml_dtypes, "float8_e8m0fnu"):
        codes = np.arange(256, dtype=np.uint8)
        dec_c = c_decode("ue8m0_dec", codes)
        dec_m = codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
        same = (dec_c.view(np.uint32) == dec_m.view(np.uint32)) | (np.isnan(dec_c) & np.isnan(dec_m))
        print(f"  UE8M0 decode: 256 codes, {int((~same).sum())} mismatches")
        if not same.all():
            failures.append("UE8M0 decode")

    if failures:
        print("FAIL: " + "; ".join(failures))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
