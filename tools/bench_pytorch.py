#!/usr/bin/env python3
"""PyTorch baseline for `diffusion bench`: the same workloads on the reference model
(tools/dit_reference.py, the official DiT structure) so the two can be compared on the
same machine in the same run.

  train:  forward + official loss (mse + vb) + backward + AdamW + EMA, synthetic data
  sample: one guided sampling step = model forward on 2 x batch rows

    python3 tools/bench_pytorch.py --model demo --batch 64 --threads 2
    python3 tools/bench_pytorch.py --model DiT-S/2 --batch 16 --sample-batch 8
"""
import argparse
import copy
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import dit_reference as R  # noqa: E402

DEMO = R.DiTConfig(input_size=28, patch=4, in_channels=1, hidden=64, depth=6, heads=4,
                   mlp_hidden=256, num_classes=10, learn_sigma=True)


def macs_per_image(c):
    """Multiply-adds of one forward pass (as dc_dit_macs_per_image)."""
    T, D, F, P = (c.input_size // c.patch) ** 2, c.hidden, c.mlp_hidden, c.patch ** 2
    block = T * (4 * D * D + 2 * D * F) + 2 * T * T * D + 6 * D * D
    return c.depth * block + T * P * c.in_channels * D + 256 * D + D * D + 2 * D * D \
        + T * D * P * c.out_channels


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--sample-batch", type=int, default=32)
    ap.add_argument("--sample-steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (torch 2)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = DEMO if a.model == "demo" else R.config_from_name(a.model)
    dev = torch.device(a.device)
    model = R.build_model(cfg, seed=0, device=dev)
    ema = copy.deepcopy(model).requires_grad_(False)
    run = torch.compile(model) if a.compile else model
    diffusion, _ = R.create_diffusion("")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0)
    shape = (a.batch, cfg.in_channels, cfg.input_size, cfg.input_size)
    x0 = torch.rand(shape, device=dev) * 2 - 1
    y = torch.randint(0, cfg.num_classes, (a.batch,), device=dev)
    gflop = 2 * macs_per_image(cfg) / 1e9
    print(f"model   {a.model}: {gflop:.3f} GFLOP/image forward; torch {torch.__version__}, "
          f"{a.threads} threads, {a.device}")

    def step():
        t = torch.randint(0, 1000, (a.batch,), device=dev)
        loss = diffusion.training_losses(run, x0, t, y)["loss"].mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            for pe, p in zip(ema.parameters(), model.parameters()):
                pe.mul_(0.9999).add_(p, alpha=1 - 0.9999)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    step()
    sync()
    t0 = time.perf_counter()
    for _ in range(a.iters):
        step()
    sync()
    dt = (time.perf_counter() - t0) / a.iters
    print(f"train   batch {a.batch:4d}   {a.batch / dt:9.1f} img/s   {dt * 1e3:8.1f} ms/step   "
          f"{3 * gflop * a.batch / dt:7.1f} GFLOP/s")

    model.eval()  # sampling: no label dropout
    n = 2 * a.sample_batch
    xs = torch.randn((n, cfg.in_channels, cfg.input_size, cfg.input_size), device=dev)
    ys = torch.randint(0, cfg.num_classes + 1, (n,), device=dev)
    ts = torch.full((n,), 500.0, device=dev)
    with torch.no_grad():
        run(xs, ts, ys)
        sync()
        t0 = time.perf_counter()
        for _ in range(a.sample_steps):
            run(xs, ts, ys)
        sync()
    dt = (time.perf_counter() - t0) / a.sample_steps
    print(f"sample  batch {a.sample_batch:4d} x2 (guidance)  {a.sample_batch / dt:9.1f} image-steps/s   "
          f"{dt * 1e3:8.2f} ms/step   {gflop * n / dt:7.1f} GFLOP/s")


if __name__ == "__main__":
    main()
