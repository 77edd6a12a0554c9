#!/usr/bin/env python3
"""The engine's `diffusion bench` output beside tools/bench_pytorch.py's JSON,
as a table with the ratios (engine / PyTorch; for latency PyTorch / engine,
so above 1 means the engine is faster everywhere).

    python3 tools/compare_bench.py ENGINE.txt TORCH.json"""
import json
import re
import sys


def engine(path):
    r = {}
    for line in open(path):
        m = re.match(r"train\s+batch\s+(\d+)\s+([0-9.]+) img/s.*?([0-9.]+) TFLOP/s(?:\s+MFU ([0-9.]+)%)?"
                     r"(?:.*?peak GPU ([0-9.]+) GiB)?", line)
        if m:
            r["train"] = (float(m.group(2)), m.group(5))
        m = re.match(r"sample\s+batch\s+(\d+).*?([0-9.]+) image-steps/s\s+([0-9.]+) ms/step", line)
        if m:
            r["latency" if int(m.group(1)) == 1 else "sample"] = (
                float(m.group(3)) if int(m.group(1)) == 1 else float(m.group(2)), None)
    return r


def main():
    eng = engine(sys.argv[1])
    tj = json.load(open(sys.argv[2]))
    rows = [("train", "img/s"), ("sample", "image-steps/s"), ("latency", "ms/step")]
    modes = sorted({r["mode"] for r in tj["results"]}, key=lambda m: m != "eager")
    head = f"{'workload':<9} {'unit':<14} {'engine':>9}" + "".join(f" {m:>9} {'ratio':>6}" for m in modes)
    print(f"{tj['model']} batch {tj['results'][0]['batch']} on {tj['device']}, torch {tj['torch']}")
    print(head)
    for w, unit in rows:
        e = eng.get(w, (None, None))[0]
        line = f"{w:<9} {unit:<14} {e if e is not None else float('nan'):>9.1f}"
        for m in modes:
            t = next((r for r in tj["results"] if r["mode"] == m and r["workload"] == w), None)
            v = t["value"] if t and t["status"] == "ok" else None
            if v is None or e is None:
                line += f" {'-':>9} {'-':>6}"
                continue
            ratio = v / e if w == "latency" else e / v
            line += f" {v:>9.1f} {ratio:>5.2f}x"
        print(line)
    if "train" in eng and eng["train"][1]:
        peaks = ", ".join(f"{r['mode']} {r['peak_gib']:.1f}" for r in tj["results"]
                          if r["workload"] == "train" and r.get("peak_gib"))
        print(f"training peak GPU memory: engine {float(eng['train'][1]):.1f} GiB; PyTorch {peaks} GiB")


if __name__ == "__main__":
    main()
