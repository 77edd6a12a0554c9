#!/usr/bin/env python3
"""diffusers' VAE encoder in pictures a second, the figure `diffusion prepare` is set beside.

Loads the VAE of a pipeline folder in diffusers' layout (tools/sd_random writes
a random-weight SD 1.5 one: the speed does not depend on the values) into
diffusers' AutoencoderKL in fp16 on the GPU and times `encode` (the latent
distribution, what prepare stores) on batches of random pictures, after
warm-up; eager, and torch.compile where asked.

    python3 tools/sd_vae_encode_bench.py --model DIR --diffusers PATH/diffusers/src
           [--size 512] [--batch 16] [--iters 8] [--modes eager,compile]
"""
import argparse
import json
import os
import sys
import time

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--diffusers", required=True, help="a diffusers source tree (its src/ folder)")
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--modes", default="eager,compile")
    a = ap.parse_args()
    sys.path.insert(0, a.diffusers)
    from diffusers import AutoencoderKL
    from safetensors.torch import load_file

    with open(os.path.join(a.model, "vae", "config.json")) as f:
        vae = AutoencoderKL.from_config(json.load(f))
    vae.load_state_dict(load_file(os.path.join(a.model, "vae", "diffusion_pytorch_model.safetensors")), strict=True)
    vae = vae.to("cuda", torch.float16).eval()
    x = torch.rand(a.batch, 3, a.size, a.size, device="cuda", dtype=torch.float16) * 2 - 1
    for mode in a.modes.split(","):
        enc = torch.compile(vae.encode) if mode == "compile" else vae.encode
        with torch.no_grad():
            for _ in range(3):
                enc(x).latent_dist.mean.float().sum().item()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(a.iters):
                d = enc(x).latent_dist
                d.mean.float().sum().item()  # the mean and logvar reach the host side, as prepare's do
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        print(f"diffusers VAE encode {mode}: {a.iters * a.batch / dt:.1f} pictures/s "
              f"({a.size}x{a.size}, batch {a.batch}, fp16)", flush=True)


if __name__ == "__main__":
    main()
