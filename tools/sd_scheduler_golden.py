#!/usr/bin/env python3
"""Golden ladders of diffusers' own schedulers, for the engine's SD samplers.

For scheduler configs that cover every key the engine follows (the SD 1.5 and
SD 2.1 scheduler_config.json as published, every beta_schedule, trained_betas,
num_train_timesteps, each timestep_spacing with and without steps_offset,
rescale_betas_zero_snr with trailing spacing, Euler's interpolation_type,
timestep_type, sigma_min / sigma_max, final_sigmas_type, DDIM's
set_alpha_to_one, DPM-Solver's lower_order_final, euler_at_final and
lambda_min_clipped), builds each sampler's diffusers class from the config,
as the engine's sampler names map to them:

  euler            EulerDiscreteScheduler.from_config(cfg, use_karras_sigmas=False, ...)
  euler_karras     EulerDiscreteScheduler.from_config(cfg, use_karras_sigmas=True)
                   (no command-line sampler; the library's Euler with karras)
  euler_a          EulerAncestralDiscreteScheduler.from_config(cfg)
  ddim             DDIMScheduler.from_config(cfg)
  dpmpp_2m         DPMSolverMultistepScheduler.from_config(cfg, solver_order=2,
                   algorithm_type="dpmsolver++", solver_type="midpoint", use_karras_sigmas=False, ...)
  dpmpp_2m_karras  the same with use_karras_sigmas=True

and writes, for 1, 2 and several step counts, what set_timesteps(n) makes:
timesteps, sigmas (the Euler classes and DPM-Solver), init_noise_sigma, and
for DDIM the alphas_cumprod of each step and of the step it goes to; for
DPM-Solver with Karras sigmas the timesteps before rounding. Each config also
keeps alphas_cumprod at the indices acp_index (DDIMScheduler's, which keeps a
zero terminal value; the other classes set it to 2^-24).

For some runs it also records the whole sampling loop, as diffusers'
pipelines run it (init_noise_sigma, scale_model_input, step), of a synthetic
model out = 0.5 x cos(t / 300) + 0.1 sin(t / 100), elementwise in float32,
from the start noise "start": the result is "out". (Euler ancestral draws its
own noise, so it has none.)

Numbers are float32 values (diffusers computes betas, alphas_cumprod and the
sigmas it keeps in float32) written with 9 significant digits.

    python3 tools/sd_scheduler_golden.py --diffusers PATH/diffusers/src --out tests/golden/sd_schedulers.json

Needs torch and numpy; diffusers' source (pure Python) on --diffusers.
Deterministic.
"""
import argparse
import json
import sys

SD15 = {"_class_name": "PNDMScheduler", "_diffusers_version": "0.6.0", "beta_end": 0.012,
        "beta_schedule": "scaled_linear", "beta_start": 0.00085, "num_train_timesteps": 1000,
        "set_alpha_to_one": False, "skip_prk_steps": True, "steps_offset": 1, "trained_betas": None,
        "clip_sample": False}
SD21 = {"_class_name": "DDIMScheduler", "_diffusers_version": "0.8.0", "beta_end": 0.012,
        "beta_schedule": "scaled_linear", "beta_start": 0.00085, "clip_sample": False,
        "num_train_timesteps": 1000, "prediction_type": "v_prediction", "set_alpha_to_one": False,
        "skip_prk_steps": True, "steps_offset": 1, "trained_betas": None}

ALL = ['euler', 'euler_karras', 'euler_a', 'ddim', 'dpmpp_2m', 'dpmpp_2m_karras']
DETERMINISTIC = ['euler', 'euler_karras', 'ddim', 'dpmpp_2m', 'dpmpp_2m_karras']


def with_(base, **kw):
    c = dict(base)
    c.update(kw)
    return c


def scaled_betas(T):
    import numpy as np
    b = np.linspace(0.00085 ** 0.5, 0.012 ** 0.5, T) ** 2
    return [float('%.6g' % x) for x in b]


# (name, config, samplers, step counts, samplers whose loop is recorded)
CASES = [
    ('sd15', SD15, ALL, [1, 2, 3, 10, 25], DETERMINISTIC),
    ('sd21', SD21, ALL, [1, 2, 25], DETERMINISTIC),
    ('defaults', {"_class_name": "DDIMScheduler"}, ALL, [2, 10], []),
    ('linear', with_(SD15, beta_schedule='linear', beta_start=0.0001, beta_end=0.02),
     ['euler', 'ddim', 'dpmpp_2m_karras'], [7], []),
    ('cosine', with_(SD15, beta_schedule='squaredcos_cap_v2'), ALL, [1, 2, 12], ['dpmpp_2m_karras']),
    ('t500', with_(SD15, num_train_timesteps=500), ALL, [1, 3, 20], []),
    ('trained', with_(SD15, num_train_timesteps=100, trained_betas=scaled_betas(100)), ALL, [1, 4, 9], []),
    ('leading0', with_(SD15, timestep_spacing='leading', steps_offset=0), ALL, [1, 2, 30], []),
    ('leading1', with_(SD15, timestep_spacing='leading', steps_offset=1), ALL, [1, 2, 30], ['euler']),
    ('trailing', with_(SD15, timestep_spacing='trailing'), ALL, [1, 2, 7, 61], ['euler', 'ddim']),
    ('linspace', with_(SD15, timestep_spacing='linspace'), ALL, [1, 2, 3, 30], ['ddim']),
    ('zsnr_trailing', with_(SD21, rescale_betas_zero_snr=True, timestep_spacing='trailing'), ALL, [1, 2, 25],
     ['euler', 'ddim', 'dpmpp_2m']),
    ('log_linear', with_(SD15, interpolation_type='log_linear'), ['euler', 'euler_karras'], [1, 2, 10], ['euler']),
    ('continuous', with_(SD21, timestep_type='continuous'), ['euler', 'euler_karras'], [3, 10], ['euler']),
    ('sigma_range', with_(SD15, sigma_min=0.1, sigma_max=10.0), ['euler_karras', 'dpmpp_2m_karras'], [2, 10], []),
    ('final_sigma_min', with_(SD15, final_sigmas_type='sigma_min'),
     ['euler', 'euler_karras', 'dpmpp_2m', 'dpmpp_2m_karras'], [1, 2, 10, 20], ['euler', 'dpmpp_2m']),
    ('no_lower_order_final', with_(SD15, final_sigmas_type='sigma_min', lower_order_final=False), ['dpmpp_2m'], [5],
     ['dpmpp_2m']),
    ('euler_at_final', with_(SD15, final_sigmas_type='sigma_min', euler_at_final=True), ['dpmpp_2m'], [20],
     ['dpmpp_2m']),
    ('lambda_clipped', with_(SD15, beta_schedule='squaredcos_cap_v2', lambda_min_clipped=-5.1),
     ['dpmpp_2m', 'dpmpp_2m_karras'], [10, 25], []),
    ('alpha_to_one', with_(SD15, set_alpha_to_one=True), ['ddim'], [1, 10], ['ddim']),
]

CLASSES = {
    'euler': ('EulerDiscreteScheduler', dict(use_karras_sigmas=False, use_exponential_sigmas=False,
                                             use_beta_sigmas=False)),
    'euler_karras': ('EulerDiscreteScheduler', dict(use_karras_sigmas=True, use_exponential_sigmas=False,
                                                    use_beta_sigmas=False)),
    'euler_a': ('EulerAncestralDiscreteScheduler', {}),
    'ddim': ('DDIMScheduler', {}),
    'dpmpp_2m': ('DPMSolverMultistepScheduler', dict(use_karras_sigmas=False, use_exponential_sigmas=False,
                                                     use_beta_sigmas=False, use_lu_lambdas=False,
                                                     use_flow_sigmas=False, solver_order=2,
                                                     algorithm_type='dpmsolver++', solver_type='midpoint')),
}
CLASSES['dpmpp_2m_karras'] = (CLASSES['dpmpp_2m'][0], dict(CLASSES['dpmpp_2m'][1], use_karras_sigmas=True))

ACP_INDEX = [0, 1, 2, 3, 10, 50, 100, 250, 400, 499, 500, 600, 750, 900, 990, 997, 998, 999]
START = [1.2, -0.7, 0.3, 2.1, -1.6, 0.05, -0.4, 0.9]


def num(x):
    x = float(x)
    return int(x) if x == int(x) and abs(x) < 1e9 else float('%.9g' % x)


def model(x, t):
    import torch
    t = torch.as_tensor(t, dtype=torch.float32)
    return 0.5 * x * torch.cos(t / 300) + 0.1 * torch.sin(t / 100)


def run_loop(sched, n):
    import torch
    sched.set_timesteps(n)
    x = torch.tensor(START, dtype=torch.float32) * sched.init_noise_sigma
    for t in sched.timesteps:
        xin = sched.scale_model_input(x, t)
        x = sched.step(model(xin, t), t, x).prev_sample
    return [num(v) for v in x.tolist()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--diffusers', required=True, help="diffusers' src folder")
    ap.add_argument('--out', required=True)
    a = ap.parse_args()
    sys.path.insert(0, a.diffusers)
    import diffusers
    import numpy as np
    import torch

    cases = []
    for name, cfg, samplers, steps, loops in CASES:
        T = cfg.get('num_train_timesteps', 1000)
        ddim = diffusers.DDIMScheduler.from_config(cfg)
        case = {'name': name, 'config': cfg,
                'alphas_cumprod': [num(ddim.alphas_cumprod[i]) for i in ACP_INDEX if i < T], 'runs': []}
        for sampler in samplers:
            cls, kw = CLASSES[sampler]
            for n in steps:
                s = getattr(diffusers, cls).from_config(cfg, **kw)
                s.set_timesteps(n)
                r = {'sampler': sampler, 'steps': n, 'timesteps': [num(t) for t in s.timesteps.tolist()],
                     'init_noise_sigma': num(s.init_noise_sigma)}
                if sampler == 'ddim':
                    acp, prev = s.alphas_cumprod, [t - T // n for t in s.timesteps.tolist()]
                    r['acp_t'] = [num(acp[t]) for t in s.timesteps.tolist()]
                    r['acp_prev'] = [num(acp[p] if p >= 0 else s.final_alpha_cumprod) for p in prev]
                else:
                    r['sigmas'] = [num(v) for v in s.sigmas.tolist()]
                if sampler == 'dpmpp_2m_karras':
                    # the timesteps before DPM-Solver rounds them (a float32 schedule
                    # against the engine's float64 may round a value near .5 the other way)
                    sig = np.array(((1 - s.alphas_cumprod) / s.alphas_cumprod) ** 0.5)
                    k = s._convert_to_karras(in_sigmas=np.flip(sig).copy(), num_inference_steps=n)
                    r['t_unrounded'] = [num(s._sigma_to_t(v, np.log(sig))) for v in k]
                if sampler in loops and (n <= 25):
                    try:
                        r['out'] = run_loop(getattr(diffusers, cls).from_config(cfg, **kw), n)
                    except IndexError as e:  # diffusers' own loop fails here: no loop to compare
                        print('%s %s %d steps: diffusers\' loop fails (%s): left out' % (name, sampler, n, e))
                case['runs'].append(r)
        cases.append(case)

    head = {'about': 'ladders of diffusers schedulers made by tools/sd_scheduler_golden.py',
            'diffusers': diffusers.__version__, 'torch': torch.__version__, 'numpy': np.__version__,
            'acp_index': ACP_INDEX, 'model': 'out = 0.5 x cos(t / 300) + 0.1 sin(t / 100) (float32)',
            'start': START}
    with open(a.out, 'w') as f:
        f.write('{\n')
        for k, v in head.items():
            f.write('%s: %s,\n' % (json.dumps(k), json.dumps(v)))
        f.write('"cases": [\n')
        for i, c in enumerate(cases):
            f.write('{"name": %s, "config": %s,\n "alphas_cumprod": %s,\n "runs": [\n' %
                    (json.dumps(c['name']), json.dumps(c['config'], separators=(',', ':')),
                     json.dumps(c['alphas_cumprod'])))
            f.write(',\n'.join('  ' + json.dumps(r, separators=(',', ':')) for r in c['runs']))
            f.write('\n ]}%s\n' % (',' if i + 1 < len(cases) else ''))
        f.write(']}\n')
    print('wrote %s: %d configs, %d runs' % (a.out, len(cases), sum(len(c['runs']) for c in cases)))


if __name__ == '__main__':
    main()
