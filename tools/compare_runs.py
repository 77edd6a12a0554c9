#!/usr/bin/env python3
"""Compares two `diffusion train` run folders checkpoint by checkpoint (the same
recipe and seed, trained another way: 2 GPUs against 1, say): at every step both
wrote, the largest absolute difference of the raw weights and of the EMA, each
also relative to the largest magnitude of the reference's (max |b - a| / max |a|),
and of the step's loss (the `loss` every checkpoint records, all digits). Prints
one table row: the largest of each over the common steps.

    python3 tools/compare_runs.py REF_DIR GOT_DIR LABEL     one row
    python3 tools/compare_runs.py --header                  the table's header

A NaN or infinity anywhere prints as nan and makes the exit status 1, as does
a folder without common checkpoints."""
import glob
import json
import math
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import st_read  # noqa: E402

ROW = "{:<28} {:>6}  {:>10} {:>10}  {:>10} {:>10}  {:>10} {:>10}"


def metadata(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)).get("__metadata__", {})


def steps(folder):
    out = {}
    for p in glob.glob(os.path.join(folder, "step_*.safetensors")):
        try:
            out[int(os.path.basename(p)[5:-12])] = p
        except ValueError:
            pass
    return out


def worst(ref, got, names):
    """max |got - ref| and max |ref| over the named tensors (nan if any is not finite)."""
    d = m = 0.0
    for k in names:
        a, b = ref[k].astype(np.float64), got[k].astype(np.float64)
        if a.shape != b.shape or not (np.isfinite(a).all() and np.isfinite(b).all()):
            return math.nan, math.nan
        if a.size:
            d, m = max(d, float(np.abs(b - a).max())), max(m, float(np.abs(a).max()))
    return d, m


def fmt(x):
    return "nan" if math.isnan(x) else f"{x:.2e}"


def main():
    if sys.argv[1:] == ["--header"]:
        print(ROW.format("comparison", "steps", "weights", "rel", "EMA", "rel", "loss", "rel"))
        return 0
    ref_dir, got_dir, label = sys.argv[1], sys.argv[2], sys.argv[3]
    a, b = steps(ref_dir), steps(got_dir)
    common = sorted(set(a) & set(b))
    if not common:
        print(ROW.format(label, 0, "no common", "checkpoints", "", "", "", ""))
        return 1
    w = [0.0, 0.0]  # largest max |d| and largest max |d| / max |a|
    e = [0.0, 0.0]
    loss = [0.0, 0.0]
    for s in common:
        ref, got = st_read.read(a[s]), st_read.read(b[s])
        raw = [k for k in ref if not k.startswith(("ema.", "train."))]
        ema = [k for k in ref if k.startswith("ema.")]
        if set(ref) != set(got):
            print(ROW.format(label, len(common), "tensors", "differ", "", "", "", ""))
            return 1
        for acc, names in ((w, raw), (e, ema)):
            d, m = worst(ref, got, names)
            rel = d / m if m > 0 else d
            acc[0], acc[1] = max(acc[0], d), max(acc[1], rel)
            if math.isnan(d):
                acc[0] = acc[1] = math.nan
        la, lb = metadata(a[s]).get("loss"), metadata(b[s]).get("loss")
        if la is None or lb is None:
            loss = [math.nan, math.nan]
        else:
            la, lb = float(la), float(lb)
            d = abs(lb - la) if math.isfinite(la) and math.isfinite(lb) else math.nan
            loss = [max(loss[0], d), max(loss[1], d / abs(la) if la else d)]
            if math.isnan(d):
                loss = [math.nan, math.nan]
    vals = w + e + loss
    print(ROW.format(label, len(common), *(fmt(v) for v in vals)))
    return 1 if any(math.isnan(v) for v in vals) else 0


if __name__ == "__main__":
    sys.exit(main())
