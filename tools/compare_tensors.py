#!/usr/bin/env python3
"""Relative error ||b - a|| / ||a|| of one tensor in two safetensors files.

    python3 tools/compare_tensors.py NAME REF.safetensors GOT.safetensors TOL [LABEL]

NAME may be REFNAME=GOTNAME when the two files name the tensor differently.

Prints one line, 'PASS' or 'FAIL'; NaN fails. Exit status 1 on failure."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import st_read  # noqa: E402


def main():
    name, ref, got, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    label = sys.argv[5] if len(sys.argv) > 5 else name
    ref_name, _, got_name = name.partition('=')
    got_name = got_name or ref_name
    try:
        a = st_read.read(ref)[ref_name].astype(np.float64)
        b = st_read.read(got)[got_name].astype(np.float64)
    except (OSError, KeyError, ValueError) as e:
        print(f"{label}: FAIL (cannot read: {e})")
        return 1
    if a.shape != b.shape:
        print(f"{label}: FAIL (shapes {a.shape} vs {b.shape})")
        return 1
    err = np.linalg.norm(b - a) / max(np.linalg.norm(a), 1e-300)
    ok = bool(np.isfinite(b).all()) and err <= tol
    print(f"{label}: {'PASS' if ok else 'FAIL'} rel. error {err:.2e} (tol {tol:g}, {a.size} values)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
