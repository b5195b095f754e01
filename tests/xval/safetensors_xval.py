#!/usr/bin/env python3
"""Cross-check of megamoe's safetensors reader and writer against the `safetensors` package.

Driven by tests/test_safetensors_xval.c:

  safetensors_xval.py probe
      exit 0 if safetensors and numpy import, 77 (automake SKIP) if not.
  safetensors_xval.py write DIR SEED
      write DIR/py.safetensors with random tensors of every dtype (seeded), and
      DIR/py_manifest.json + DIR/py_<i>.bin: each tensor's name, dtype, shape and raw
      little-endian bytes, for the C reader to compare against.
  safetensors_xval.py check FILE MANIFEST
      read FILE (written by the C writer) with safetensors and compare every tensor
      (dtype, shape, bytes; values too through safetensors.numpy for numpy dtypes)
      and the metadata against MANIFEST (written by the C test); exit 1 on mismatch.

Dtypes numpy has (F16, F32, F64, I8, U8, I16, I32, I64) go through safetensors.numpy;
BF16 and the FP8 types through the raw `serialize` API, whose calling convention changed
between versions: both known forms are tried, and the dtypes are left out with a printed
note if neither works.
"""
import json
import os
import sys

try:
    import numpy as np
    import safetensors
    import safetensors.numpy as stnp
    from safetensors import safe_open
except ImportError as exc:  # pragma: no cover
    print(f"SKIP: {exc}")
    sys.exit(77)

# safetensors header name -> (name in the raw serialize API, element size, numpy dtype or None)
DTYPES = {
    "F16": ("float16", 2, np.float16), "F32": ("float32", 4, np.float32),
    "F64": ("float64", 8, np.float64), "I8": ("int8", 1, np.int8), "U8": ("uint8", 1, np.uint8),
    "I16": ("int16", 2, np.int16), "I32": ("int32", 4, np.int32), "I64": ("int64", 8, np.int64),
    "BF16": ("bfloat16", 2, None), "F8_E4M3": ("float8_e4m3fn", 1, None),
    "F8_E5M2": ("float8_e5m2", 1, None), "F8_E8M0": ("float8_e8m0fnu", 1, None),
    "BOOL": ("bool", 1, np.bool_), "U16": ("uint16", 2, np.uint16), "U32": ("uint32", 4, np.uint32),
    "U64": ("uint64", 8, np.uint64),
}


def serialize_raw(tensors, metadata):
    """tensors: {name: (header dtype, shape, bytes)}; returns the file bytes or None."""
    from safetensors import _safetensors_rust as rust
    keep = []
    try:
        spec = {}
        for name, (dt, shape, data) in tensors.items():
            buf = np.frombuffer(data, dtype=np.uint8).copy()
            keep.append(buf)  # the spec holds raw pointers: keep the buffers alive
            spec[name] = rust.TensorSpec(dtype=DTYPES[dt][0], shape=list(shape),
                                         data_ptr=buf.ctypes.data, data_len=len(data))
        return bytes(rust.serialize(spec, metadata))
    except (AttributeError, TypeError):
        pass
    try:  # older releases: a dict of {"dtype", "shape", "data"}
        spec = {name: {"dtype": DTYPES[dt][0], "shape": list(shape), "data": data}
                for name, (dt, shape, data) in tensors.items()}
        return bytes(safetensors.serialize(spec, metadata))
    except Exception as exc:  # noqa: BLE001
        print(f"note: this safetensors ({safetensors.__version__}) cannot serialize raw "
              f"bytes ({exc}); BF16/FP8 are left out of the Python-written file")
        return None


def random_shape(rng):
    ndim = int(rng.integers(0, 4))
    return tuple(int(rng.integers(1, 7)) if rng.integers(0, 10) else 0 for _ in range(ndim))


def cmd_write(out_dir, seed):
    rng = np.random.default_rng(seed)
    raw, manifest = {}, []
    for k in range(3):
        for dt, (_, size, _) in DTYPES.items():
            shape = random_shape(rng)
            numel = int(np.prod(shape, dtype=np.int64))
            data = rng.integers(0, 256, size=numel * size, dtype=np.uint8).tobytes()
            name = f"py.{k}.{dt.lower()}.weight"
            raw[name] = (dt, shape, data)
            manifest.append({"name": name, "dtype": dt, "shape": list(shape), "data": data})
    metadata = {"format": "np", "seed": str(seed)}
    blob = serialize_raw(raw, metadata)
    path = os.path.join(out_dir, "py.safetensors")
    if blob is None:
        manifest = [m for m in manifest if DTYPES[m["dtype"]][2] is not None]
        arrays = {m["name"]: np.frombuffer(m["data"], dtype=DTYPES[m["dtype"]][2])
                  .reshape(m["shape"]) for m in manifest}
        stnp.save_file(arrays, path, metadata=metadata)
    else:
        with open(path, "wb") as fp:
            fp.write(blob)
    for i, m in enumerate(manifest):
        with open(os.path.join(out_dir, f"py_{i}.bin"), "wb") as fp:
            fp.write(m.pop("data"))
        m["bin"] = f"py_{i}.bin"
    with open(os.path.join(out_dir, "py_manifest.json"), "w") as fp:
        json.dump({"tensors": manifest, "metadata": metadata}, fp)
    print(f"wrote {len(manifest)} tensors with safetensors {safetensors.__version__}")
    return 0


def cmd_check(path, manifest_path):
    with open(manifest_path) as fp:
        manifest = json.load(fp)
    base = os.path.dirname(manifest_path)
    with open(path, "rb") as fp:
        blob = fp.read()
    found = {name: info for name, info in safetensors.deserialize(blob)}
    errors = []
    want_names = {m["name"] for m in manifest["tensors"]}
    if set(found) != want_names:
        errors.append(f"names differ: extra {sorted(set(found) - want_names)}, "
                      f"missing {sorted(want_names - set(found))}")
    numpy_view = {}
    if all(DTYPES[m["dtype"]][2] is not None for m in manifest["tensors"]):
        numpy_view = stnp.load_file(path)
    for m in manifest["tensors"]:
        info = found.get(m["name"])
        if info is None:
            continue
        with open(os.path.join(base, m["bin"]), "rb") as fp:
            data = fp.read()
        if info["dtype"] != m["dtype"]:
            errors.append(f"{m['name']}: dtype {info['dtype']} != {m['dtype']}")
        if list(info["shape"]) != m["shape"]:
            errors.append(f"{m['name']}: shape {info['shape']} != {m['shape']}")
        if bytes(info["data"]) != data:
            errors.append(f"{m['name']}: bytes differ")
        if m["name"] in numpy_view:
            ref = np.frombuffer(data, dtype=DTYPES[m["dtype"]][2]).reshape(m["shape"])
            if not np.array_equal(numpy_view[m["name"]].view(np.uint8), ref.view(np.uint8)):
                errors.append(f"{m['name']}: numpy values differ")
    with safe_open(path, framework="numpy") as f:
        meta = f.metadata() or {}
    if meta != manifest.get("metadata", {}):
        errors.append(f"metadata {meta} != {manifest.get('metadata')}")
    # the header is padded to 8 bytes and every tensor is aligned to its element size
    n = int.from_bytes(blob[:8], "little")
    if n % 8:
        errors.append(f"header length {n} is not a multiple of 8")
    header = json.loads(blob[8:8 + n])
    for name, entry in header.items():
        if name != "__metadata__" and (8 + n + entry["data_offsets"][0]) % DTYPES[entry["dtype"]][1]:
            errors.append(f"{name}: not aligned to its element size")
    for e in errors:
        print("MISMATCH:", e)
    print(f"checked {len(found)} tensors written by megamoe: "
          f"{'OK' if not errors else str(len(errors)) + ' errors'}")
    return 1 if errors else 0


def main(argv):
    if len(argv) >= 2 and argv[1] == "probe":
        print(f"safetensors {safetensors.__version__}, numpy {np.__version__}")
        return 0
    if len(argv) == 4 and argv[1] == "write":
        return cmd_write(argv[2], int(argv[3]))
    if len(argv) == 4 and argv[1] == "check":
        return cmd_check(argv[2], argv[3])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
