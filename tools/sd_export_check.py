#!/usr/bin/env python3
"""diffusers on what `diffusion export` wrote for a Stable Diffusion run.

Loads the exported pipeline folder with StableDiffusionPipeline.from_pretrained
and the exported single file with StableDiffusionPipeline.from_single_file
(its configs taken from the folder: a tiny or fine-tuned model is not one of
the configs diffusers knows), checks that each holds every tensor of the
other (UNet, VAE and text encoder, the same values), and runs one UNet
forward of each on the same inputs (fp32, TF32 off). With --engine, also
`diffusion forward --component unet` on the folder and on the file, and
compares all four outputs.

    python3 tools/sd_export_check.py --folder RUN_EXPORT --file RUN_EXPORT.safetensors \
        [--diffusers PATH/diffusers/src] [--engine ./diffusion] [--tol 1e-4]

Prints the largest difference of each pair relative to the reference's
largest magnitude, and exits non-zero when one is above --tol (fp32 on a GPU:
a different summation order lands near 1e-6; a wrong name or layout near 1).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch


def rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--folder', required=True, help='the exported diffusers folder')
    ap.add_argument('--file', required=True, help='the exported single file (.safetensors)')
    ap.add_argument('--diffusers', help='a diffusers source tree (PATH/src) to import instead of the installed one')
    ap.add_argument('--engine', help='the diffusion binary: compare its UNet forward as well')
    ap.add_argument('--tol', type=float, default=1e-4)
    a = ap.parse_args()
    if a.diffusers:
        sys.path.insert(0, a.diffusers)
    from diffusers import StableDiffusionPipeline
    from safetensors.torch import load_file, save_file

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    folder = StableDiffusionPipeline.from_pretrained(a.folder, torch_dtype=torch.float32, safety_checker=None)
    single = StableDiffusionPipeline.from_single_file(a.file, config=a.folder, torch_dtype=torch.float32,
                                                      safety_checker=None)
    worst = 0.0
    for part in ('unet', 'vae', 'text_encoder'):
        x = getattr(folder, part).state_dict()
        y = getattr(single, part).state_dict()
        keys = [k for k in x if not k.endswith('position_ids')]
        missing = [k for k in keys if k not in y]
        assert not missing, f'{part}: the single file lacks {missing[:5]}'
        d = max(rel(y[k].float(), x[k].float()) if x[k].abs().max() > 0 else y[k].abs().max().item() for k in keys)
        print(f'{part}: {len(keys)} tensors, largest difference folder vs file {d:.3g}')
        worst = max(worst, d)

    unet = folder.unet.to(dev)
    cfg = unet.config
    g = torch.Generator().manual_seed(0)
    size = cfg.sample_size or 8
    x = torch.randn(1, cfg.in_channels, size, size, generator=g)
    t = torch.tensor([500])
    ctx = torch.randn(1, 77, cfg.cross_attention_dim, generator=g)
    with torch.no_grad():
        ref = unet(x.to(dev), t.to(dev), ctx.to(dev)).sample.float().cpu()
        out = single.unet.to(dev)(x.to(dev), t.to(dev), ctx.to(dev)).sample.float().cpu()
    d = rel(out, ref)
    print(f'UNet forward: from_single_file vs from_pretrained {d:.3g}')
    worst = max(worst, d)
    if a.engine:
        with tempfile.TemporaryDirectory() as tmp:
            inp = os.path.join(tmp, 'in.safetensors')
            save_file({'x': x.contiguous(), 't': t.float(), 'context': ctx.contiguous()}, inp)
            for name, weights in (('folder', a.folder), ('file', a.file)):
                o = os.path.join(tmp, f'{name}.safetensors')
                subprocess.run([a.engine, 'forward', '--component', 'unet', '--weights', weights, '--input', inp,
                                '--output', o, '--precision', 'fp32'], check=True)
                d = rel(load_file(o)['out'].float(), ref)
                print(f'UNet forward: the engine on the {name} vs diffusers {d:.3g}')
                worst = max(worst, d)
    print(f'largest: {worst:.3g} (tolerance {a.tol:g})')
    sys.exit(0 if worst <= a.tol else 1)


if __name__ == '__main__':
    main()
