"""Minimal safetensors reader and writer (numpy only), for the comparison tools."""
import json
import struct

import numpy as np

_DT = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64, "I32": np.int32,
       "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16}


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    head = json.loads(blob[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        if v["dtype"] == "BF16":
            raw = np.frombuffer(blob[8 + n + a:8 + n + b], dtype=np.uint16).astype(np.uint32) << 16
            arr = raw.view(np.float32)
        else:
            arr = np.frombuffer(blob[8 + n + a:8 + n + b], dtype=_DT[v["dtype"]])
        out[k] = arr.reshape(v["shape"])
    return out


def write(path, tensors):
    """tensors: name -> numpy array (float32, float64, int64, int32 or uint8)."""
    names = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64", np.dtype(np.int64): "I64",
             np.dtype(np.int32): "I32", np.dtype(np.uint8): "U8"}
    head, off, blobs = {}, 0, []
    for k, a in tensors.items():
        a = np.ascontiguousarray(a)
        b = a.tobytes()
        head[k] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(head).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


if __name__ == "__main__":
    # python3 tools/st_read.py extract SRC DST PREFIX: copies SRC's tensors named PREFIX<name>
    # to DST as <name> (e.g. a golden file's input.x, input.t, input.y -> x, t, y)
    import sys
    if len(sys.argv) == 5 and sys.argv[1] == "extract":
        src = read(sys.argv[2])
        p = sys.argv[4]
        out = {k[len(p):]: v for k, v in src.items() if k.startswith(p)}
        if "y" in out:
            out["y"] = out["y"].astype(np.int64)
        write(sys.argv[3], out)
    else:
        sys.exit("usage: st_read.py extract SRC DST PREFIX")
