#!/usr/bin/env python3
"""diffusers and transformers beside the engine, on one GPU, for Stable Diffusion.

check  Loads a pipeline folder in diffusers' layout (tools/sd_random writes a
       random-weight SD 1.5 or 2.1 one) into diffusers' UNet2DConditionModel
       and AutoencoderKL and transformers' CLIPTextModel (every tensor loaded
       strictly: nothing left at its random init) and writes, for
       `diffusion forward --component`, the inputs unet_in.safetensors,
       dec_in.safetensors, txt_in.safetensors and the outputs in fp32 with
       TF32 off (ref.safetensors: unet.out, vae.image, text.hidden,
       text.penultimate).
bench  The same models in fp16 on the GPU, eager and torch.compile: one UNet
       step at batch 1 and at batch N with guidance (2 and 2N rows), the VAE
       decode of one picture, the text encoder on two prompts, and the
       whole-picture time they add up to (text + steps x UNet + VAE), a batch
       of N pictures run whole (text, the steps back to back, one decode of
       the batch), and the peak memory of the eager batch-1 picture.
       --modes eager (or compile) runs only that one.
profile  The eager fp16 UNet step at 2N rows under torch.profiler: GPU time by
       kind of kernel (convolution, matrix product, attention, normalisation,
       elementwise) and the 15 costliest kernels, to set beside the engine's
       DC_CUDA_PROFILE=1 table.

    python3 tools/sd_pytorch.py check --model DIR --out DIR --diffusers PATH/diffusers/src
    python3 tools/sd_pytorch.py bench --model DIR --diffusers PATH/diffusers/src [--batch 8] [--steps 50]
                                      [--modes eager,compile]
    python3 tools/sd_pytorch.py profile --model DIR --diffusers PATH/diffusers/src [--batch 8]
"""
import argparse
import json
import os
import sys
import time

import torch


def load(folder, diffusers_src, dtype, device):
    sys.path.insert(0, diffusers_src)
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from safetensors.torch import load_file
    from transformers import CLIPTextConfig, CLIPTextModel

    def weights(sub, name):
        sd = load_file(os.path.join(folder, sub, name))
        return {k[len('text_model.'):] if k.startswith('text_model.') else k: v for k, v in sd.items()}

    def cfg(sub):
        with open(os.path.join(folder, sub, 'config.json')) as f:
            return json.load(f)

    unet = UNet2DConditionModel.from_config(cfg('unet'))
    unet.load_state_dict(weights('unet', 'diffusion_pytorch_model.safetensors'), strict=True)
    vae = AutoencoderKL.from_config(cfg('vae'))
    vae.load_state_dict(weights('vae', 'diffusion_pytorch_model.safetensors'), strict=True)
    tc = {k: v for k, v in cfg('text_encoder').items() if k not in ('architectures', 'model_type')}
    text = CLIPTextModel(CLIPTextConfig(**tc))
    missing = text.load_state_dict(weights('text_encoder', 'model.safetensors'), strict=False)
    assert not missing.missing_keys or all('position_ids' in k for k in missing.missing_keys), missing
    assert not missing.unexpected_keys, missing.unexpected_keys
    return [m.to(device=device, dtype=dtype).eval() for m in (unet, vae, text)]


def save(path, tensors):
    from safetensors.torch import save_file
    save_file({k: v.detach().float().cpu().contiguous() if v.is_floating_point() else v.cpu().contiguous()
               for k, v in tensors.items()}, path)


def check(a):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    unet, vae, text = load(a.model, a.diffusers, torch.float32, 'cuda')
    g = torch.Generator(device='cpu').manual_seed(0)
    lat = unet.config.sample_size
    ctx_dim = unet.config.cross_attention_dim
    x = torch.randn(1, 4, lat, lat, generator=g)
    t = torch.tensor([500.0])
    ctx = torch.randn(1, 77, ctx_dim, generator=g)
    z = torch.randn(1, 4, lat, lat, generator=g)
    ids = torch.randint(1, 49406, (1, 77), generator=g)
    ids[0, 0], ids[0, 20:] = 49406, 49407
    # a batch with guidance's rows (2 x --batch), where the engine takes its batched paths
    rb = 2 * a.batch
    xb, tb, cb = torch.randn(rb, 4, lat, lat, generator=g), torch.full((rb,), 500.0), torch.randn(rb, 77, ctx_dim,
                                                                                                  generator=g)
    os.makedirs(a.out, exist_ok=True)
    save(os.path.join(a.out, 'unet_in.safetensors'), {'x': x, 't': t, 'context': ctx})
    save(os.path.join(a.out, 'unet_in_batch.safetensors'), {'x': xb, 't': tb, 'context': cb})
    save(os.path.join(a.out, 'dec_in.safetensors'), {'z': z})
    save(os.path.join(a.out, 'txt_in.safetensors'), {'ids': ids})
    with torch.no_grad():
        out = unet(x.cuda(), t.cuda(), ctx.cuda()).sample
        out_batch = unet(xb.cuda(), tb.cuda(), cb.cuda()).sample
        image = vae.decode(z.cuda()).sample
        o = text(ids.cuda(), output_hidden_states=True)
    save(os.path.join(a.out, 'ref.safetensors'), {'unet.out': out, 'unet.out_batch': out_batch, 'vae.image': image,
                                                  'text.hidden': o.last_hidden_state,
                                                  'text.penultimate': o.hidden_states[-2]})
    print('check: wrote inputs and fp32 references to', a.out)


def timed(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def bench(a):
    unet, vae, text = load(a.model, a.diffusers, torch.float16, 'cuda')
    lat = unet.config.sample_size
    D = unet.config.cross_attention_dim
    ids = torch.full((2, 77), 49407, device='cuda')
    ids[:, 0] = 49406
    rows = {r: (torch.randn(r, 4, lat, lat, device='cuda', dtype=torch.float16),
                torch.full((r,), 500.0, device='cuda'),
                torch.randn(r, 77, D, device='cuda', dtype=torch.float16)) for r in (2, 2 * a.batch)}
    z = torch.randn(1, 4, lat, lat, device='cuda', dtype=torch.float16)
    print(f'diffusers {sys.modules["diffusers"].__version__}, torch {torch.__version__}, '
          f'{torch.cuda.get_device_name()}, fp16, {lat * 8}x{lat * 8}')
    results = {}
    for mode in a.modes.split(','):
        u = unet if mode == 'eager' else torch.compile(unet)
        d = vae.decode if mode == 'eager' else torch.compile(vae.decode)
        with torch.no_grad():
            tt = timed(lambda: text(ids), 20)
            u1 = timed(lambda: u(*rows[2]), 20)
            ub = timed(lambda: u(*rows[2 * a.batch]), 10)
            dec = timed(lambda: d(z), 10)
        pic = tt + a.steps * u1 + dec
        results[mode] = (tt, u1, ub, dec, pic)
        print(f'  {mode:8s} text {tt * 1e3:7.2f} ms | UNet step batch 1 + guidance {u1 * 1e3:7.2f} ms | '
              f'batch {a.batch} + guidance {ub * 1e3:7.2f} ms | VAE decode {dec * 1e3:7.2f} ms | '
              f'{a.steps}-step picture {pic:.3f} s | batch {a.batch}: {a.batch / (a.steps * ub + a.batch * dec + tt):.2f} pictures/s')
        # A batch as a pipeline runs it, sustained as the engine's is: the
        # text, the steps back to back, one decode of the whole batch (the
        # scheduler's own small ops left out). The figure above extrapolates
        # from 10 steps; a GPU held at its power limit runs longer work slower.
        zb = torch.randn(a.batch, 4, lat, lat, device='cuda', dtype=torch.float16)

        def batch_run():
            text(ids)
            for _ in range(a.steps):
                u(*rows[2 * a.batch])
            d(zb)
        with torch.no_grad():
            decb = timed(lambda: d(zb), 3)
            batch_run()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            batch_run()
            torch.cuda.synchronize()
            bt = time.perf_counter() - t0
        print(f'  {mode:8s} batch {a.batch} run whole: {bt:.3f} s, {a.batch / bt:.2f} pictures/s; within it '
              f'{(bt - tt - decb) / a.steps * 1e3:.2f} ms a step (the batch decoded in {decb * 1e3:.1f} ms)')
        if mode == 'eager':
            torch.cuda.reset_peak_memory_stats()
            with torch.no_grad():
                u(*rows[2]), d(z)
            torch.cuda.synchronize()
            print(f'  eager peak memory, batch 1 with guidance: {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB')


def kind(name):
    n = name.lower()
    if 'conv' in n or 'implicit' in n or 'dgrad' in n or 'nchw' in n or 'nhwc' in n:
        return 'convolution'
    if 'flash' in n or 'fmha' in n or 'attention' in n or 'softmax' in n:
        return 'attention'
    if 'gemm' in n or 'cutlass' in n or 'xmma' in n or 'sm90' in n:
        return 'matrix product'
    if 'norm' in n or 'welford' in n:
        return 'normalisation'
    return 'elementwise and copies'


def profile(a):
    from torch.profiler import ProfilerActivity, profile as tprofile
    unet, _, _ = load(a.model, a.diffusers, torch.float16, 'cuda')
    lat, D, r = unet.config.sample_size, unet.config.cross_attention_dim, 2 * a.batch
    args = (torch.randn(r, 4, lat, lat, device='cuda', dtype=torch.float16), torch.full((r,), 500.0, device='cuda'),
            torch.randn(r, 77, D, device='cuda', dtype=torch.float16))
    iters = 5
    with torch.no_grad():
        for _ in range(3):
            unet(*args)
        torch.cuda.synchronize()
        with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                unet(*args)
            torch.cuda.synchronize()
    per = {}
    kinds = {}
    for e in prof.key_averages():
        t = e.device_time_total / 1e3 / iters if hasattr(e, 'device_time_total') else e.cuda_time_total / 1e3 / iters
        if t <= 0:
            continue
        per[e.key] = per.get(e.key, 0) + t
        kinds[kind(e.key)] = kinds.get(kind(e.key), 0) + t
    total = sum(kinds.values())
    print(f'diffusers eager fp16 UNet step at {r} rows: {total:.2f} ms of GPU kernels per step')
    for k, t in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f'  {k:24s} {t:8.2f} ms  {100 * t / total:5.1f}%')
    for k, t in sorted(per.items(), key=lambda kv: -kv[1])[:15]:
        print(f'    {t:8.2f} ms  {k[:110]}')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('mode', choices=['check', 'bench', 'profile'])
    ap.add_argument('--model', required=True)
    ap.add_argument('--diffusers', required=True, help="diffusers' src folder")
    ap.add_argument('--out', default='.')
    ap.add_argument('--batch', type=int, default=8)
    ap.add_argument('--steps', type=int, default=50)
    ap.add_argument('--modes', default='eager,compile', help='bench: eager, compile or both, comma-separated')
    a = ap.parse_args()
    if not a.modes or any(m not in ('eager', 'compile') for m in a.modes.split(',')):
        ap.error(f'--modes {a.modes!r}: eager, compile, or both comma-separated')
    sys.path.insert(0, a.diffusers)
    import diffusers  # noqa: F401
    {'check': check, 'bench': bench, 'profile': profile}[a.mode](a)


if __name__ == '__main__':
    main()
