"""Reads a nanotrain checkpoint the way a PyTorch or numpy user would: the safetensors layout
checked against the format's rules (8-byte little-endian header length, JSON header, tensors
packed without holes or overlaps), every tensor decoded with numpy, and, where the packages are
installed, loaded again with safetensors.numpy / safetensors.torch and compared.
Usage: check_safetensors.py CKPT.safetensors CKPT.json   (exit 77: numpy missing, skipped)"""
import json
import struct
import sys

try:
    import numpy as np
except ImportError:
    print("numpy not installed: skipped")
    sys.exit(77)

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I32": np.int32,
          "I64": np.int64, "U8": np.uint8, "F64": np.float64}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def decode(raw, info):
    arr = np.frombuffer(raw, dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
    if info["dtype"] == "BF16":   # the top half of an fp32
        arr = (arr.astype(np.uint32) << 16).view(np.float32)
    return arr


def main():
    path, sidecar = sys.argv[1], sys.argv[2]
    blob = open(path, "rb").read()
    if len(blob) < 8:
        fail("shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        fail(f"header length {n} runs past the file ({len(blob)} bytes)")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    if not header:
        fail("no tensors")
    spans = []
    tensors = {}
    for name, info in header.items():
        if info["dtype"] not in DTYPES:
            fail(f"{name}: dtype {info['dtype']} is not a safetensors dtype this check knows")
        b, e = info["data_offsets"]
        count = int(np.prod(info["shape"])) if info["shape"] else 1
        if e - b != count * np.dtype(DTYPES[info["dtype"]]).itemsize:
            fail(f"{name}: {e - b} bytes for shape {info['shape']} {info['dtype']}")
        spans.append((b, e, name))
        tensors[name] = decode(data[b:e], info)
        if tensors[name].dtype.kind == "f" and not np.isfinite(tensors[name]).all():
            fail(f"{name}: non-finite values")
    spans.sort()
    pos = 0
    for b, e, name in spans:
        if b != pos:
            fail(f"{name} starts at {b}, expected {pos} (hole or overlap)")
        pos = e
    if pos != len(data):
        fail(f"tensors end at {pos}, the data section has {len(data)} bytes")
    side = json.load(open(sidecar))
    if not isinstance(side, dict) or not side:
        fail("the JSON sidecar is not an object")
    if not any(k.endswith("wte.weight") or k.endswith("weight") for k in tensors):
        fail("no weight tensors")
    total = sum(t.size for t in tensors.values())
    print(f"numpy: {len(tensors)} tensors, {total} values, metadata keys {sorted(meta)}")
    try:
        from safetensors.numpy import load_file
        ref = load_file(path)
        for k, v in ref.items():
            mine = tensors[k]
            if v.dtype != mine.dtype and header[k]["dtype"] == "BF16":
                continue   # numpy has no bfloat16; compared through torch below
            if not np.array_equal(v, mine):
                fail(f"safetensors.numpy disagrees on {k}")
        print(f"safetensors.numpy: {len(ref)} tensors, identical")
    except ImportError:
        print("safetensors package not installed: its numpy loader not tried")
    try:
        import torch
        for name, info in header.items():
            b, e = info["data_offsets"]
            tdt = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                   "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8,
                   "F64": torch.float64}[info["dtype"]]
            t = torch.frombuffer(bytearray(data[b:e]), dtype=tdt).reshape(info["shape"])
            if not np.array_equal(t.float().numpy() if t.is_floating_point() else t.numpy(),
                                  tensors[name].astype(np.float32) if t.is_floating_point()
                                  else tensors[name]):
                fail(f"torch decodes {name} differently")
        print(f"torch {torch.__version__}: {len(header)} tensors decoded, identical to numpy")
        try:
            from safetensors.torch import load_file as tload
            print(f"safetensors.torch: {len(tload(path))} tensors loaded")
        except ImportError:
            print("safetensors package not installed: its torch loader not tried")
    except ImportError:
        print("torch not installed: torch decoding not tried")
    print("ok")


if __name__ == "__main__":
    main()
