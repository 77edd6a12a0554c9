#!/usr/bin/env python3
"""diffusers' side of `diffusion bench --sd-train`: training steps of a Stable
Diffusion UNet made from the same config.json (tools/configs/), random init,
on the same workload and recipe, eager and torch.compile, on one GPU.

A step, as diffusers' examples/text_to_image/train_text_to_image.py runs it
(UNet only, latents and text embeddings precomputed):
  - latents [B, 4, PX/8, PX/8] and text embeddings [B, 77, cross_attention_dim],
    random, made once on the GPU (the engine stages its own from host memory
    each step, which costs it, not this side);
  - timesteps uniform in 0..999, noise N(0, 1), x_t = DDPMScheduler(scaled_linear
    0.00085..0.012, 1000 steps).add_noise(latents, noise, t);
  - the UNet's forward under bf16 autocast (fp32 weights), MSE against the
    noise (epsilon prediction) in fp32, backward;
  - gradients clipped to norm 1 (clip_grad_norm_, foreach), fused AdamW
    (torch.optim.AdamW(fused=True): lr 1e-5, betas 0.9/0.999, eps 1e-8, weight
    decay 1e-2), zero_grad(set_to_none=True);
  - EMA of an fp32 copy of the weights with torch._foreach_lerp_ (what
    diffusers' EMAModel(foreach=True).step does), decay min(0.9999,
    (1 + n) / (10 + n)) at its n-th update: EMAModel's, and the engine's.
The engine's recipe is the same (src/cli/cmd_bench_sd_train.c), so the two
do the same work a step.

With --lora RANK, a LoRA step instead, as diffusers' train_text_to_image_lora.py
and kohya's train_network.py run one: the UNet's weights cast to bf16 and frozen,
LoRA layers (plain PyTorch, as kohya's networks/lora.py: down kaiming-uniform,
up zero, y = base(x) + up(down(x)) * alpha / rank, alpha = rank) on kohya's
default targets (every Linear and 1x1 Conv2d inside the Transformer2DModels),
their fp32 factors alone trained (lr 1e-4, the same AdamW, clipping and EMA);
the engine's `bench --sd-train --lora RANK` does the same work.

Reported per mode: img/s and ms a step over --steps steps after --warmup
untimed ones (torch.compile compiles during them), and the peak of
torch.cuda.max_memory_allocated over the whole run of the mode (model,
optimizer state, EMA, activations). One line a mode, `result MODE IMG_S
MS_STEP PEAK_GIB`, for scripts. A mode in its own process gives the cleanest
memory figure (tools/sd_train_gpu.sh runs them so).

    python3 tools/sd_train_bench.py --config tools/configs/sd21_unet.json --size 256 --batch 64 \\
        --diffusers PATH/diffusers/src [--modes eager,compile] [--steps 10] [--warmup 3]
"""
import argparse
import gc
import json
import sys
import time

import torch


def decay_at(n):
    """diffusers' EMAModel.get_decay (use_ema_warmup False) at its n-th step (1-based)."""
    step = n - 1
    return 0.0 if step <= 0 else min(0.9999, (1 + step) / (10 + step))


class LoRA(torch.nn.Module):
    """kohya's LoRAModule: base(x) + up(down(x)) * alpha / rank, for a Linear or a Conv2d."""

    def __init__(self, base, rank):
        super().__init__()
        import math
        self.base = base
        if isinstance(base, torch.nn.Conv2d):
            self.down = torch.nn.Conv2d(base.in_channels, rank, base.kernel_size, base.stride, base.padding, bias=False)
            self.up = torch.nn.Conv2d(rank, base.out_channels, 1, bias=False)
        else:
            self.down = torch.nn.Linear(base.in_features, rank, bias=False)
            self.up = torch.nn.Linear(rank, base.out_features, bias=False)
        torch.nn.init.kaiming_uniform_(self.down.weight, a=math.sqrt(5))
        torch.nn.init.zeros_(self.up.weight)
        self.scale = 1.0  # alpha = rank

    def forward(self, x):
        return self.base(x) + self.up(self.down(x)) * self.scale


def add_lora(unet, rank):
    """LoRA layers on every Linear and 1x1 Conv2d inside the Transformer2DModels; their parameters."""
    from diffusers.models.transformers.transformer_2d import Transformer2DModel
    todo = []
    for block in unet.modules():
        if not isinstance(block, Transformer2DModel):
            continue
        for parent in block.modules():
            for name, child in parent.named_children():
                conv1 = isinstance(child, torch.nn.Conv2d) and child.kernel_size == (1, 1)
                if isinstance(child, torch.nn.Linear) or conv1:
                    todo.append((parent, name, child))
    layers = []
    for parent, name, child in todo:
        lora = LoRA(child, rank).to('cuda')
        setattr(parent, name, lora)
        layers.append(lora)
    return [p for l in layers for p in (l.down.weight, l.up.weight)]


def run_mode(a, cfg, mode):
    from diffusers import DDPMScheduler, UNet2DConditionModel
    torch.manual_seed(0)
    unet = UNet2DConditionModel.from_config(cfg).to('cuda').train()
    if a.lora:
        unet.requires_grad_(False)
        unet.to(torch.bfloat16)
        params = add_lora(unet, a.lora)
    else:
        params = [p for p in unet.parameters() if p.requires_grad]
    lr = 1e-4 if a.lora else 1e-5
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, fused=True)
    ema = None if a.no_ema else [p.detach().clone() for p in params]
    sched = DDPMScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
                          beta_schedule='scaled_linear')
    sched.alphas_cumprod = sched.alphas_cumprod.to('cuda')  # add_noise indexes it by t on the GPU
    lat = a.size // 8
    B, D = a.batch, unet.config.cross_attention_dim
    latents = torch.randn(B, unet.config.in_channels, lat, lat, device='cuda')
    text = torch.randn(B, 77, D, device='cuda')
    model = torch.compile(unet) if mode == 'compile' else unet
    updates = 0

    def step():
        nonlocal updates
        noise = torch.randn_like(latents)
        t = torch.randint(0, 1000, (B,), device='cuda')
        x_t = sched.add_noise(latents, noise, t)
        with torch.autocast('cuda', dtype=torch.bfloat16):
            pred = model(x_t, t, text).sample
        loss = torch.nn.functional.mse_loss(pred.float(), noise.float())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        updates += 1
        if ema is not None:
            with torch.no_grad():
                torch._foreach_lerp_(ema, [p.detach() for p in params], 1 - decay_at(updates))
        return loss

    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.warmup):
        loss = step()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    sec = (time.perf_counter() - t0) / a.steps
    if not torch.isfinite(loss).item():
        raise SystemExit(f'{mode}: the loss is {loss.item()}')
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f'  {mode:8s} batch {B} at {a.size}x{a.size}: {B / sec:8.2f} img/s, {sec * 1e3:8.2f} ms/step, '
          f'peak {peak:.2f} GiB (warm-up of {a.warmup} steps took {warm_s:.1f} s; loss {loss.item():.4f})')
    print(f'result {mode} {B / sec:.2f} {sec * 1e3:.2f} {peak:.2f}', flush=True)
    del model, unet, params, opt, ema, latents, text
    gc.collect()
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--config', required=True, help="the UNet's diffusers config.json")
    ap.add_argument('--diffusers', help="diffusers' src folder, put first on sys.path (else the installed one)")
    ap.add_argument('--size', type=int, default=256, help='picture size: latents of size/8')
    ap.add_argument('--batch', type=int, default=64)
    ap.add_argument('--steps', type=int, default=10, help='timed steps')
    ap.add_argument('--warmup', type=int, default=3, help='untimed steps first (compile happens here)')
    ap.add_argument('--modes', default='eager,compile', help='eager, compile, or both comma-separated')
    ap.add_argument('--lora', type=int, default=0, help='train a LoRA of this rank over the frozen bf16 UNet')
    ap.add_argument('--no-ema', action='store_true', help='keep no EMA (DreamBooth: train_dreambooth.py has none)')
    a = ap.parse_args()
    modes = a.modes.split(',')
    if not modes or any(m not in ('eager', 'compile') for m in modes):
        ap.error(f'--modes {a.modes!r}: eager, compile, or both comma-separated')
    if a.size < 8 or a.size % 8 or a.batch < 1 or a.steps < 1 or a.warmup < 0:
        ap.error('--size must be a multiple of 8, --batch and --steps positive, --warmup non-negative')
    if a.diffusers:
        sys.path.insert(0, a.diffusers)
    import diffusers
    with open(a.config) as f:
        cfg = {k: v for k, v in json.load(f).items() if not k.startswith('_')}
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    print(f'diffusers {diffusers.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}; '
          f'{a.config}: ' + (f'a rank-{a.lora} LoRA over the frozen bf16 UNet' if a.lora else 'UNet training') +
          ', bf16 autocast, fused AdamW, ' + ('no EMA' if a.no_ema else 'foreach EMA'))
    for mode in modes:
        run_mode(a, cfg, mode)


if __name__ == '__main__':
    main()
