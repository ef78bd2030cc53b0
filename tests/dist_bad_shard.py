"""Rewrites one tensor of a sharded checkpoint's shard file, then records the file's new size
and SHA-256 in the manifest, so that only the check of the tensor itself can refuse it.
Usage: dist_bad_shard.py CKPT_DIR FILE f16|longer
  f16: the first master.* tensor (by name) stored as F16; longer: one element appended to it.
Prints the tensor's name."""
import hashlib
import json
import struct
import sys

import numpy as np

ckpt, name, mode = sys.argv[1:4]
path = ckpt + "/" + name
blob = open(path, "rb").read()
(n,) = struct.unpack("<Q", blob[:8])
header = json.loads(blob[8:8 + n].decode("utf-8"))
meta = header.pop("__metadata__", None)
tensors = {}
for key, info in header.items():
    a, b = info["data_offsets"]
    tensors[key] = np.frombuffer(blob[8 + n + a:8 + n + b], dtype=np.float32)
target = sorted(k for k in tensors if k.startswith("master."))[0]
if mode == "f16":
    tensors[target] = tensors[target].astype(np.float16)
else:
    tensors[target] = np.append(tensors[target], np.float32(0))
out, data = {}, b""
for key, v in tensors.items():
    raw = v.tobytes()
    out[key] = {"dtype": "F16" if v.dtype == np.float16 else "F32", "shape": [v.size],
                "data_offsets": [len(data), len(data) + len(raw)]}
    data += raw
if meta is not None:
    out["__metadata__"] = meta
text = json.dumps(out).encode("utf-8")
text += b" " * (-len(text) % 8)
new = struct.pack("<Q", len(text)) + text + data
open(path, "wb").write(new)
manifest = json.load(open(ckpt + "/MANIFEST.json"))
for f in manifest["files"]:
    if f["name"] == name:
        f["size"] = len(new)
        f["sha256"] = hashlib.sha256(new).hexdigest()
json.dump(manifest, open(ckpt + "/MANIFEST.json", "w"))
print(target)
