#!/usr/bin/env python3
"""Golden trajectories of the SD samplers from k-diffusion itself.

Runs k-diffusion's own sample_euler, sample_euler_ancestral and
sample_dpmpp_2m (k_diffusion/sampling.py) over its DiscreteEpsDDPMDenoiser /
DiscreteVDDPMDenoiser wrappers (k_diffusion/external.py) on the scaled-linear
SD schedule, with a synthetic model whose prediction is exact in closed form:
data x0 ~ N(mu, 0.5^2) per element, so with x = x0 + sigma eps,
E[eps | x] = sigma (x - mu) / (0.25 + sigma^2). Guidance is applied to the
model output as u + scale (c - u) (the same as AUTOMATIC1111's CFGDenoiser on
the denoised values, since denoised is affine in the output). The model is fed
the timestep rounded to float32, as a float32 model would see it.

Only sampling.py and external.py are loaded from the k-diffusion checkout; the
modules they import for other samplers (scipy, torchdiffeq, torchsde, tqdm,
k_diffusion.utils) are replaced by the few names the samplers used here need.

    python3 tools/sd_sampling_reference.py --kdiffusion PATH/k-diffusion \
        --out tests/golden/sd_ksampling.txt

Needs torch (1.13 CPU is enough). Deterministic: the noise comes from
torch.manual_seed and is written to the file with the results.
"""
import argparse
import importlib.util
import os
import sys
import types

import torch

S0 = 0.5


def load_kdiffusion(root):
    """Imports k_diffusion.sampling and k_diffusion.external from root."""
    stub = lambda name, **attrs: sys.modules.setdefault(name, types.SimpleNamespace(**attrs))
    scipy = stub('scipy', integrate=None)
    sys.modules['scipy.integrate'] = scipy.integrate
    stub('torchdiffeq', odeint=None)
    stub('torchsde', BrownianTree=None)
    trange = lambda *a, disable=None, **k: range(*a)
    sys.modules['tqdm'] = types.SimpleNamespace(auto=None)
    sys.modules['tqdm.auto'] = types.SimpleNamespace(trange=trange, tqdm=lambda x, **k: x)
    pkg = types.ModuleType('k_diffusion')
    pkg.__path__ = [os.path.join(root, 'k_diffusion')]
    sys.modules['k_diffusion'] = pkg

    def append_dims(x, target_dims):
        return x[(...,) + (None,) * (target_dims - x.ndim)]

    utils = types.ModuleType('k_diffusion.utils')
    utils.append_dims = append_dims
    sys.modules['k_diffusion.utils'] = pkg.utils = utils
    mods = {}
    for name in ('sampling', 'external'):
        spec = importlib.util.spec_from_file_location(
            'k_diffusion.' + name, os.path.join(root, 'k_diffusion', name + '.py'))
        mod = importlib.util.module_from_spec(spec)
        sys.modules['k_diffusion.' + name] = mod
        setattr(pkg, name, mod)
        spec.loader.exec_module(mod)
        mods[name] = mod
    return mods['sampling'], mods['external']


def alphas_cumprod():
    betas = torch.linspace(0.00085 ** 0.5, 0.012 ** 0.5, 1000, dtype=torch.float64) ** 2
    return torch.cumprod(1 - betas, dim=0)


class Synth(torch.nn.Module):
    """The exact eps (or v) of N(mu, S0^2) data at float32-rounded timestep t."""

    def __init__(self, log_sigmas, pred, scale, mu, mu_u):
        super().__init__()
        self.log_sigmas, self.pred, self.scale, self.mu, self.mu_u = log_sigmas, pred, scale, mu, mu_u

    def out(self, xt, t, mu):
        t = t.float().double()
        lo, hi = t.floor().long(), t.ceil().long()
        w = t - lo
        sg = ((1 - w) * self.log_sigmas[lo] + w * self.log_sigmas[hi]).exp()
        sg = sg.view(-1, *([1] * (xt.ndim - 1)))
        acp = 1 / (1 + sg * sg)
        x = xt / acp.sqrt()
        eps = sg * (x - mu) / (S0 * S0 + sg * sg)
        if self.pred == 'v':  # eps = sqrt(acp) v + sqrt(1 - acp) x_t
            return (eps - (1 - acp).sqrt() * xt) / acp.sqrt()
        return eps

    def forward(self, xt, t):
        c = self.out(xt, t, self.mu)
        if self.scale == 1:
            return c
        u = self.out(xt, t, self.mu_u)
        return u + self.scale * (c - u)


CASES = [  # name, sampler, karras, prediction, scale, steps
    ('euler_eps_cfg3', 'euler', 0, 'eps', 3.0, 20),
    ('euler_karras_v_cfg3', 'euler', 1, 'v', 3.0, 15),
    ('euler_a_eps_cfg3', 'euler_a', 0, 'eps', 3.0, 20),
    ('euler_a_karras_v', 'euler_a', 1, 'v', 1.0, 12),
    ('dpmpp_2m_karras_eps_cfg7.5', 'dpmpp_2m', 1, 'eps', 7.5, 20),
    ('dpmpp_2m_v_cfg3', 'dpmpp_2m', 0, 'v', 3.0, 10),
]
N_ELEM, MU, MU_U = 16, 0.3, -0.4


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--kdiffusion', required=True, help='a k-diffusion checkout')
    ap.add_argument('--out', required=True)
    args = ap.parse_args()
    torch.set_default_dtype(torch.float64)
    sampling, external = load_kdiffusion(args.kdiffusion)
    acp = alphas_cumprod()
    gen = torch.Generator().manual_seed(1234)
    lines = ['# k-diffusion sampler trajectories; written by tools/sd_sampling_reference.py',
             '# case <name> <sampler> <karras> <prediction> <scale> <mu> <mu_u> <steps> <n>',
             '# start: unscaled randn (x = start * sigmas[0]); noise <i>: the z of step i; out: the sample']
    fmt = lambda v: ' '.join('%.17g' % float(a) for a in v)
    for name, kind, karras, pred, scale, steps in CASES:
        wrap_cls = external.DiscreteVDDPMDenoiser if pred == 'v' else external.DiscreteEpsDDPMDenoiser
        model = wrap_cls(None, acp, quantize=False)
        model.inner_model = Synth(model.log_sigmas, pred, scale, MU, MU_U)
        if karras:
            sigmas = sampling.get_sigmas_karras(steps, model.sigma_min.item(), model.sigma_max.item())
        else:
            sigmas = model.get_sigmas(steps)
        start = torch.randn(1, N_ELEM, generator=gen)
        noise = [torch.randn(1, N_ELEM, generator=gen) for _ in range(steps)]
        x = start * sigmas[0]
        if kind == 'euler':
            out = sampling.sample_euler(model, x, sigmas)
        elif kind == 'euler_a':
            it = iter(noise)
            out = sampling.sample_euler_ancestral(model, x, sigmas, noise_sampler=lambda s, sn: next(it))
        else:
            out = sampling.sample_dpmpp_2m(model, x, sigmas)
        lines.append('case %s %s %d %s %g %g %g %d %d' % (name, kind, karras, pred, scale, MU, MU_U,
                                                          steps, N_ELEM))
        lines.append('start ' + fmt(start[0]))
        if kind == 'euler_a':
            lines += ['noise %d %s' % (i, fmt(z[0])) for i, z in enumerate(noise)]
        lines.append('out ' + fmt(out[0]))
    with open(args.out, 'w') as f:
        f.write('\n'.join(lines) + '\n')


if __name__ == '__main__':
    main()
