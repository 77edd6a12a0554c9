#!/usr/bin/env python3
"""Golden gradients of the Stable Diffusion UNet, made by diffusers' own autograd.

For the tiny sd1 and sd2 UNets of tests/golden/sd (made by tools/sd_golden.py:
the real SD 1.x and 2.x topology, weights exact in F16), builds diffusers'
UNet2DConditionModel in float64 from the set's unet/config.json with
norm_num_groups 8 (see below), loads the
weights from the set's single file through diffusers' own converter, runs it
on the set's io.safetensors inputs (unet.x, unet.t, unet.context), and takes
the gradient of

    L = sum(dout * unet(x, t, context))

for a fixed random dout with torch autograd, with respect to every parameter.
It writes <golden>/<set>/grad.safetensors (F32):

  dout             [2, 4, 16, 16] the loss's weights
  out              [2, 4, 16, 16] the UNet's output
  <name>           [k] gradient values of parameter <name> (diffusers' key), at
                   k = min(numel, 256) flat indices i * numel // k (PyTorch's
                   order): every tensor is checked without storing all 1.2M
                   values of a set
  norm.<name>      [1] the whole gradient's L2 norm

    python3 tools/sd_grad_golden.py --diffusers PATH/diffusers/src --golden tests/golden/sd

Needs torch and safetensors (and what diffusers imports: huggingface_hub,
transformers); diffusers' source on --diffusers. Deterministic.
"""
import argparse
import json
import os
import sys

import torch

SAMPLES = 256


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--diffusers', required=True, help="diffusers' src folder (holding the diffusers package)")
    ap.add_argument('--golden', required=True, help='tests/golden/sd')
    args = ap.parse_args()
    sys.path.insert(0, args.diffusers)
    import diffusers
    from diffusers import UNet2DConditionModel
    from diffusers.loaders import single_file_utils as sfu
    from safetensors.torch import load_file, save_file

    for name, seed in (('sd1', 4321), ('sd2', 8765)):
        root = os.path.join(args.golden, name)
        with open(os.path.join(root, 'diffusers', 'unet', 'config.json')) as f:
            cfg = json.load(f)
        # 8 groups: the sets' 32 groups of 32 channels normalise each channel
        # alone, which zeroes the gradients of every per-channel constant (the
        # time embedding's projections, conv1's biases); the shapes are the same
        cfg['norm_num_groups'] = 8
        unet = UNet2DConditionModel.from_config(cfg).double().eval()
        single = {k: v.double() for k, v in load_file(os.path.join(root, 'single.safetensors')).items()}
        state = sfu.convert_ldm_unet_checkpoint(single, unet.config)
        unet.load_state_dict(state)
        io = {k: v.double() for k, v in load_file(os.path.join(root, 'io.safetensors')).items() if k.startswith('unet.')}
        gen = torch.Generator().manual_seed(seed)
        dout = torch.randn(io['unet.x'].shape, generator=gen, dtype=torch.float64).float().double()
        out = unet(io['unet.x'], io['unet.t'], io['unet.context']).sample
        (dout * out).sum().backward()
        res = {'dout': dout, 'out': out.detach()}
        for k, p in unet.named_parameters():
            g = p.grad.detach().reshape(-1)
            n = g.numel()
            kk = min(n, SAMPLES)
            idx = torch.arange(kk, dtype=torch.int64) * n // kk
            res[k] = g[idx]
            res['norm.' + k] = g.norm().reshape(1)
        save_file({k: v.to(torch.float32).contiguous() for k, v in res.items()}, os.path.join(root, 'grad.safetensors'))
        print('%s: %d parameter tensors; diffusers %s, torch %s'
              % (name, len(list(unet.parameters())), diffusers.__version__, torch.__version__))


if __name__ == '__main__':
    main()
