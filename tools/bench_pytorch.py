#!/usr/bin/env python3
"""PyTorch baseline for `diffusion bench`: the same workloads on the reference model
(tools/dit_reference.py, the official DiT structure), so our engine can be compared with
PyTorch on the same machine. Synthetic, seeded data; every number is the median of
--repeats timed runs of --iters (or --sample-steps) iterations, after --warmup iterations
(torch.compile compiles during the warm-up).

  train:   forward + official loss (mse + vb) + backward + AdamW + EMA (decay 0.9999)
  sample:  one guided step at --sample-batch N = forward on 2N rows (cond + null class)
           + the guidance combine, as forward_with_cfg; reported as image-steps/s
  latency: the same guided step at batch 1 (2 rows); reported as ms/step

On CUDA: bf16 autocast (--amp), TF32 matmuls, flash/fused SDPA, fused AdamW.

    python3 tools/bench_pytorch.py --model demo --batch 64 --threads 2
    python3 tools/bench_pytorch.py --device cuda --model DiT-XL/2 --modes eager,compile --json out.json
"""
import argparse
import contextlib
import copy
import dataclasses
import gc
import importlib
import json
import os
import platform
import statistics
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(__file__))
import dit_reference as R  # noqa: E402

DEMO = R.DiTConfig(input_size=28, patch=4, in_channels=1, hidden=64, depth=6, heads=4,
                   mlp_hidden=256, num_classes=10, learn_sigma=True)
EMA_DECAY, CFG_SCALE = 0.9999, 4.0


def macs_per_image(c):
    """Multiply-adds of one forward pass (as dc_dit_macs_per_image)."""
    T, D, F, P = (c.input_size // c.patch) ** 2, c.hidden, c.mlp_hidden, c.patch ** 2
    block = T * (4 * D * D + 2 * D * F) + 2 * T * T * D + 6 * D * D
    return c.depth * block + T * P * c.in_channels * D + 256 * D + D * D + 2 * D * D \
        + T * D * P * c.out_channels


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo", help="demo or an official name, e.g. DiT-XL/2")
    ap.add_argument("--batch", type=int, default=64, help="training batch")
    ap.add_argument("--sample-batch", type=int, default=32, help="guided sampling batch N (2N rows)")
    ap.add_argument("--iters", type=int, help="training steps per timed repeat (CUDA 20, CPU 5)")
    ap.add_argument("--sample-steps", type=int, help="sampling steps per timed repeat (CUDA 50, CPU 10)")
    ap.add_argument("--warmup", type=int, help="untimed iterations first (CUDA 3, CPU 1)")
    ap.add_argument("--repeats", type=int, help="timed repeats; the median is reported (CUDA 5, CPU 3)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    ap.add_argument("--amp", choices=["bf16", "none"], help="autocast dtype (CUDA bf16, CPU none)")
    ap.add_argument("--compile", action="store_true", help="same as --modes compile")
    ap.add_argument("--compile-mode", default=None,
                    help="torch.compile mode, e.g. max-autotune-no-cudagraphs (default: default)")
    ap.add_argument("--modes", help="comma list of eager,compile, run one after the other")
    ap.add_argument("--workloads", default="train,sample,latency", help="comma list")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write all results to this file")
    a = ap.parse_args()
    cuda = a.device.startswith("cuda")
    pick = lambda v, gpu, cpu: v if v is not None else (gpu if cuda else cpu)  # noqa: E731
    a.iters, a.sample_steps = pick(a.iters, 20, 5), pick(a.sample_steps, 50, 10)
    a.warmup, a.repeats, a.amp = pick(a.warmup, 3, 1), pick(a.repeats, 5, 3), pick(a.amp, "bf16", "none")
    a.modes = (a.modes or ("compile" if a.compile else "eager")).split(",")
    a.workloads = a.workloads.split(",")
    for m in a.modes:
        assert m in ("eager", "compile"), f"unknown mode {m}"
    for w in a.workloads:
        assert w in ("train", "sample", "latency"), f"unknown workload {w}"
    return a


class Bench:
    def __init__(self, a, cfg, dev):
        self.a, self.cfg, self.dev = a, cfg, dev
        self.cuda = dev.type == "cuda"
        self.fwd_flop = 2 * macs_per_image(cfg)  # per image (row), forward

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.dev)

    def autocast(self):
        if self.a.amp == "bf16":
            return torch.autocast(device_type=self.dev.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def reset(self):
        """Between workloads and modes: drop compiled graphs, cached memory, peak stats."""
        gc.collect()
        if hasattr(torch, "compile"):  # torch 2: forget compiled graphs
            importlib.import_module("torch._dynamo").reset()
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.dev)

    def model(self, mode):
        """A fresh model (official init, seeded) and the callable to run: compiled or not."""
        model = R.build_model(self.cfg, seed=self.a.seed, device=self.dev, fused_attn=self.cuda)
        run = torch.compile(model, mode=self.a.compile_mode) if mode == "compile" else model
        torch.manual_seed(self.a.seed + 1)  # the synthetic data stream
        return model, run

    def measure(self, fn, iters):
        """Median seconds per iteration over the timed repeats, and peak GiB during them."""
        for _ in range(self.a.warmup):
            fn()
        self.sync()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.dev)
        times = []
        for _ in range(self.a.repeats):
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            self.sync()
            times.append((time.perf_counter() - t0) / iters)
        peak = torch.cuda.max_memory_allocated(self.dev) / 2 ** 30 if self.cuda else None
        return statistics.median(times), peak

    def train(self, mode):
        a, cfg, dev = self.a, self.cfg, self.dev
        model, run = self.model(mode)
        model.train()  # as train.py: label dropout on
        ema = copy.deepcopy(model).requires_grad_(False)
        ema_p, model_p = list(ema.parameters()), list(model.parameters())  # incl. pos_embed, as update_ema
        try:  # fused AdamW: CUDA, torch >= 2.0
            assert self.cuda
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0, fused=True)
        except (AssertionError, TypeError, RuntimeError):
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0)
        diffusion, _ = R.create_diffusion("")
        x0 = torch.rand((a.batch, cfg.in_channels, cfg.input_size, cfg.input_size), device=dev) * 2 - 1
        y = torch.randint(0, cfg.num_classes, (a.batch,), device=dev)
        net = lambda x, t, yy: run(x, t, yy).float()  # noqa: E731  (the loss in float32)

        def step():
            t = torch.randint(0, diffusion.num_timesteps, (a.batch,), device=dev)
            with self.autocast():
                loss = diffusion.training_losses(net, x0, t, y)["loss"].mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():  # update_ema: ema = decay * ema + (1 - decay) * param
                if hasattr(torch, "_foreach_lerp_"):
                    torch._foreach_lerp_(ema_p, model_p, 1 - EMA_DECAY)
                else:
                    torch._foreach_mul_(ema_p, EMA_DECAY)
                    torch._foreach_add_(ema_p, model_p, alpha=1 - EMA_DECAY)

        sec, peak = self.measure(step, a.iters)
        return dict(batch=a.batch, rows=a.batch, value=a.batch / sec, unit="img/s", ms=sec * 1e3,
                    tflops=3 * self.fwd_flop * a.batch / sec / 1e12, peak_gib=peak)

    def sample(self, mode, n, latency):
        a, cfg, dev = self.a, self.cfg, self.dev
        model, run = self.model(mode)
        model.eval()  # no label dropout
        C, S = cfg.in_channels, cfg.input_size
        x = torch.randn((n, C, S, S), device=dev)
        t = torch.full((2 * n,), 500, dtype=torch.long, device=dev)
        y = torch.cat([torch.randint(0, cfg.num_classes, (n,), device=dev),
                       torch.full((n,), cfg.num_classes, dtype=torch.long, device=dev)])  # null class

        def step():  # forward_with_cfg: guidance on the eps channels, variance passed through
            with torch.no_grad(), self.autocast():
                out = run(torch.cat([x, x]), t, y)
                eps, rest = out[:, :C], out[:, C:]
                cond, uncond = eps.chunk(2)
                half = uncond + CFG_SCALE * (cond - uncond)
                return torch.cat([torch.cat([half, half]), rest], dim=1)

        sec, peak = self.measure(step, a.sample_steps)
        flops = self.fwd_flop * 2 * n / sec / 1e12
        if latency:
            return dict(batch=n, rows=2 * n, value=sec * 1e3, unit="ms/step", ms=sec * 1e3,
                        tflops=flops, peak_gib=peak)
        return dict(batch=n, rows=2 * n, value=n / sec, unit="image-steps/s", ms=sec * 1e3,
                    tflops=flops, peak_gib=peak)

    def run(self, mode, workload):
        self.reset()
        if workload == "train":
            return self.train(mode)
        return self.sample(mode, self.a.sample_batch if workload == "sample" else 1, workload == "latency")


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    cfg = DEMO if a.model == "demo" else R.config_from_name(a.model)
    dev = torch.device(a.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # as the official train.py / sample.py
        torch.backends.cudnn.allow_tf32 = True
        dev_name = torch.cuda.get_device_name(dev)
    else:
        dev_name = f"cpu {platform.machine()} ({a.threads} threads)"
    bench = Bench(a, cfg, dev)
    print(f"model   {a.model}: {bench.fwd_flop / 1e9:.3f} GFLOP/image forward; torch {torch.__version__}, "
          f"{dev_name}, amp {a.amp}, median of {a.repeats} repeats")

    results = []
    for mode in a.modes:
        for wl in a.workloads:
            r = dict(mode=mode, workload=wl, status="ok", batch=None, rows=None, value=None,
                     unit=None, ms=None, tflops=None, peak_gib=None)
            if mode == "compile" and not hasattr(torch, "compile"):
                r.update(status=f"unavailable (torch {torch.__version__} has no torch.compile)")
            else:
                try:
                    r.update(bench.run(mode, wl))
                except Exception as e:  # keep the other measurements of this device call
                    traceback.print_exc()
                    r.update(status=f"error: {type(e).__name__}: {e}"[:300])
            results.append(r)
            if r["status"] == "ok":
                print(f"{mode:8s} {wl:8s} batch {r['batch']:4d}  {r['value']:10.2f} {r['unit']:14s}"
                      f"{r['ms']:9.2f} ms/step {r['tflops']:8.4g} TFLOP/s", flush=True)
            else:
                print(f"{mode:8s} {wl:8s} {r['status']}", flush=True)
        bench.reset()

    if a.json:
        doc = dict(torch=torch.__version__, device=dev_name, model=a.model, amp=a.amp,
                   compile_mode=a.compile_mode, fwd_gflop_per_image=bench.fwd_flop / 1e9,
                   config=dataclasses.asdict(cfg), iters=a.iters, sample_steps=a.sample_steps,
                   warmup=a.warmup, repeats=a.repeats, results=results)
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)

    # The summary table, last.
    print(f"\n{'mode':8s} {'workload':8s} {'batch':>5s} {'value':>11s} {'unit':14s} {'ms/step':>9s} "
          f"{'TFLOP/s':>8s} {'peak GiB':>8s}")
    for r in results:
        if r["status"] != "ok":
            print(f"{r['mode']:8s} {r['workload']:8s} {r['status']}")
            continue
        peak = f"{r['peak_gib']:8.2f}" if r["peak_gib"] is not None else f"{'-':>8s}"
        print(f"{r['mode']:8s} {r['workload']:8s} {r['batch']:5d} {r['value']:11.2f} {r['unit']:14s} "
              f"{r['ms']:9.2f} {r['tflops']:8.4g} {peak}")


if __name__ == "__main__":
    main()
