#!/usr/bin/env python3
"""Round trips between the engine and the PyTorch reference model (tools/dit_reference.py).

1. A checkpoint trained by `diffusion train`, exported with `diffusion export`, loads into
   the official-structure PyTorch DiT with load_state_dict(strict=True), and both give the
   same output on the same inputs.
2. A plain official-key state dict written from PyTorch (no metadata) is read by
   `diffusion forward`, which infers the config from the shapes, and gives PyTorch's output.

usage: pytorch_interop.py DIFFUSION_BINARY TMPDIR
"""
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import dit_reference as R  # noqa: E402

BIN, TMP = sys.argv[1], sys.argv[2]
failures = 0


def run(*args):
    r = subprocess.run([BIN, *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(args)}: {r.stderr.strip()}")


def engine_forward(weights, x, t, y, *extra):
    R.save_safetensors(f"{TMP}/in.safetensors", {"x": x, "t": t, "y": y})
    run("forward", "--weights", weights, "--input", f"{TMP}/in.safetensors",
        "--output", f"{TMP}/out.safetensors", "--threads", "2", *extra)
    return R.load_safetensors(f"{TMP}/out.safetensors")[0]["out"]


def compare(name, ours, ref, tol=1e-4):
    global failures
    err = np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-6)
    ok = np.isfinite(ours).all() and err < tol
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name}: normalised error {err:.2e} (tolerance {tol:g})")


def inputs(cfg, n, rng):
    x = rng.standard_normal((n, cfg.in_channels, cfg.input_size, cfg.input_size)).astype(np.float32)
    t = rng.integers(0, 1000, n).astype(np.float32)
    y = rng.integers(0, cfg.num_classes + 1, n).astype(np.int64)  # null class included
    return x, t, y


def torch_forward(model, x, t, y):
    model.eval()  # training mode would drop labels at random (the official LabelEmbedder)
    with torch.no_grad():
        return model.double()(torch.tensor(x).double(), torch.tensor(t).double(),
                              torch.tensor(y)).float().numpy()


rng = np.random.default_rng(0)

# 1. engine checkpoint -> export -> PyTorch
run("train", "--input-size", "32", "--depth", "2", "--hidden", "48", "--heads", "3", "--patch", "4",
    "--batch", "8", "--steps", "10", "--lr", "2e-2", "--ema-decay", "0", "--threads", "2",
    "--out", f"{TMP}/run")
run("export", "--ckpt", f"{TMP}/run", "--out", f"{TMP}/export.safetensors")
sd, meta = R.load_safetensors(f"{TMP}/export.safetensors")
cfg = R.DiTConfig(input_size=int(meta["input_size"]), patch=int(meta["patch_size"]),
                  in_channels=int(meta["in_channels"]), hidden=int(meta["hidden_size"]),
                  depth=int(meta["depth"]), heads=int(meta["num_heads"]),
                  mlp_hidden=int(meta["mlp_hidden"]), num_classes=int(meta["num_classes"]),
                  learn_sigma=meta["learn_sigma"] == "true")
model = R.build_model(cfg)
model.load_state_dict({k: torch.tensor(v) for k, v in sd.items()}, strict=True)
print(f"ok   exported checkpoint loads with load_state_dict(strict=True): {len(sd)} tensors")
x, t, y = inputs(cfg, 5, rng)
compare("engine forward vs PyTorch on exported EMA weights",
        engine_forward(f"{TMP}/export.safetensors", x, t, y), torch_forward(model, x, t, y))

# 2. PyTorch official-key state dict (no metadata) -> engine
cfg = R.DiTConfig(input_size=16, patch=4, in_channels=3, hidden=40, depth=3, heads=5,
                  mlp_hidden=160, num_classes=7, learn_sigma=True)
model = R.build_model(cfg, seed=1)
with torch.no_grad():  # official init zeroes adaLN and the final layer: perturb everything
    for name, p in model.named_parameters():
        if name != "pos_embed":
            p.add_(0.05 * torch.randn_like(p))
R.save_safetensors(f"{TMP}/official.safetensors", {k: v.numpy() for k, v in model.state_dict().items()})
x, t, y = inputs(cfg, 4, rng)
compare("engine forward on a plain official state dict vs PyTorch",
        engine_forward(f"{TMP}/official.safetensors", x, t, y, "--heads", "5"), torch_forward(model, x, t, y))
sys.exit(1 if failures else 0)
