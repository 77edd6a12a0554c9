"""Minimal safetensors reader (numpy only), for the comparison tools."""
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
