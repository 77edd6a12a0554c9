#!/usr/bin/env python3
"""Compares the loss curves of two `diffusion train` logs (same recipe and seed,
e.g. CPU and GPU): the mean absolute difference of the logged losses relative
to their mean, and the first and last values of each.

    python3 tools/compare_curves.py CPU.log GPU.log [TOL]"""
import re
import sys


def losses(path):
    out = {}
    for line in open(path, errors="replace"):
        m = re.search(r"step (\d+)/\d+\s+loss ([0-9.eE+-]+)", line)
        if m:
            out[int(m.group(1))] = float(m.group(2))
    return out


def main():
    a, b = losses(sys.argv[1]), losses(sys.argv[2])
    tol = float(sys.argv[3]) if len(sys.argv) > 3 else 0.05
    steps = sorted(set(a) & set(b))
    if len(steps) < 2:
        print(f"loss curves: FAIL (only {len(steps)} common logged steps)")
        return 1
    diff = sum(abs(a[s] - b[s]) for s in steps) / len(steps)
    mean = sum(a[s] for s in steps) / len(steps)
    rel = diff / mean
    ok = rel <= tol
    print(f"loss curves CPU vs GPU over {len(steps)} logged steps: {'PASS' if ok else 'FAIL'} "
          f"mean |diff| {rel:.1%} of the mean loss (tol {tol:.0%}); step {steps[0]}: {a[steps[0]]:.4f} vs "
          f"{b[steps[0]]:.4f}, step {steps[-1]}: {a[steps[-1]]:.4f} vs {b[steps[-1]]:.4f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
