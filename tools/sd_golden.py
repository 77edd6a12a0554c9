#!/usr/bin/env python3
"""Golden files for the Stable Diffusion components, made by the real libraries.

For two tiny configurations with the real SD topology (sd1: OpenAI CLIP text
model with quick_gelu, 1x1-conv projections in the UNet's transformers;
sd2: OpenCLIP-style gelu text model, linear projections, per-block head
counts), builds diffusers' UNet2DConditionModel and AutoencoderKL and
transformers' CLIPTextModel with random weights, and writes:

  <out>/<set>/diffusers/          a pipeline folder as diffusers writes it
                                  (model_index.json, unet/, vae/, text_encoder/,
                                  scheduler/), weights in BF16 (sd1; sd2 keeps
                                  only the configs, to keep the repository small)
  <out>/<set>/single.safetensors  the original single-file layout (all three
                                  components: model.diffusion_model.*,
                                  first_stage_model.*, cond_stage_model.*), F16
  <out>/<set>/io.safetensors      inputs and outputs (F32; ids I64)

Every weight is rounded to a value that BF16 and F16 both hold exactly, so one
set of outputs serves the files of every dtype. Outputs are computed in
float64 on the CPU.

The single-file layout is written by the reverse of diffusers' own mapping
(loaders/single_file_utils.py), and the script checks it: diffusers'
convert_ldm_unet_checkpoint / convert_ldm_vae_checkpoint /
convert_ldm_clip_checkpoint / convert_open_clip_checkpoint must turn it back
into exactly the models' state dicts.

As SD 2's text encoder is stored by diffusers with one layer fewer than the
single file holds, the sd2 single file has one layer more than the sd2
diffusers text_encoder/ (the same weights for the shared layers).

    python3 tools/sd_golden.py --diffusers PATH/diffusers/src --out tests/golden/sd

Needs torch, transformers and safetensors; diffusers' source (pure Python) on
--diffusers. Deterministic (torch.manual_seed).
"""
import argparse
import json
import os
import sys

import torch

CONFIGS = {
    'sd1': dict(
        unet=dict(sample_size=16, in_channels=4, out_channels=4, layers_per_block=2,
                  block_out_channels=(32, 32, 32, 32),
                  down_block_types=('CrossAttnDownBlock2D',) * 3 + ('DownBlock2D',),
                  up_block_types=('UpBlock2D',) + ('CrossAttnUpBlock2D',) * 3,
                  cross_attention_dim=128, attention_head_dim=2, norm_num_groups=32,
                  use_linear_projection=False),
        vae=dict(in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1,
                 block_out_channels=(32, 32, 32, 32), down_block_types=('DownEncoderBlock2D',) * 4,
                 up_block_types=('UpDecoderBlock2D',) * 4, norm_num_groups=32, sample_size=64),
        text=dict(vocab_size=500, hidden_size=128, intermediate_size=128, num_hidden_layers=3,
                  num_attention_heads=2, max_position_embeddings=77, hidden_act='quick_gelu',
                  layer_norm_eps=1e-5, projection_dim=128, bos_token_id=498, eos_token_id=499,
                  pad_token_id=499),
        image=64, prediction='epsilon', diffusers_weights=True),
    'sd2': dict(
        unet=dict(sample_size=16, in_channels=4, out_channels=4, layers_per_block=1,
                  block_out_channels=(32, 32, 32, 64),
                  down_block_types=('CrossAttnDownBlock2D',) * 3 + ('DownBlock2D',),
                  up_block_types=('UpBlock2D',) + ('CrossAttnUpBlock2D',) * 3,
                  cross_attention_dim=128, attention_head_dim=(1, 1, 2, 2), norm_num_groups=32,
                  use_linear_projection=True),
        vae=dict(in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1,
                 block_out_channels=(32, 64), down_block_types=('DownEncoderBlock2D',) * 2,
                 up_block_types=('UpDecoderBlock2D',) * 2, norm_num_groups=32, sample_size=32),
        # the single file's encoder; the diffusers folder keeps all but the last layer
        text=dict(vocab_size=500, hidden_size=128, intermediate_size=128, num_hidden_layers=3,
                  num_attention_heads=2, max_position_embeddings=77, hidden_act='gelu',
                  layer_norm_eps=1e-5, projection_dim=128, bos_token_id=498, eos_token_id=499,
                  pad_token_id=0),
        image=32, prediction='v_prediction', diffusers_weights=False),
}


def exact16(t):
    """Rounds to BF16, then nudges the few values F16 cannot hold exactly
    (too small for its exponent) to +-2^-14, which both formats hold."""
    b = t.to(torch.bfloat16).to(torch.float64)
    h = b.to(torch.float16).to(torch.float64)
    bad = h != b
    b[bad] = torch.sign(b[bad]) * 2.0 ** -14
    assert torch.equal(b.to(torch.float16).to(torch.float64), b)
    assert torch.equal(b.to(torch.bfloat16).to(torch.float64), b)
    return b


def randomize(model, gen):
    """Non-zero random weights: N(0, 1/fan_in) matrices, norm scales near 1,
    small biases; every value exact in BF16 and F16."""
    sd = model.state_dict()
    for k, v in sd.items():
        if v.dtype not in (torch.float32, torch.float64):
            continue
        if v.ndim >= 2:
            fan_in = v[0].numel()
            r = torch.randn(v.shape, generator=gen, dtype=torch.float64) / fan_in ** 0.5
        elif k.endswith('weight'):
            r = 1.0 + 0.2 * torch.randn(v.shape, generator=gen, dtype=torch.float64)
        else:
            r = 0.2 * torch.randn(v.shape, generator=gen, dtype=torch.float64)
        sd[k] = exact16(r)
    model.load_state_dict(sd)
    return model


# ---- diffusers -> original single-file names (the reverse of single_file_utils) ----------
RES = {'norm1': 'in_layers.0', 'conv1': 'in_layers.2', 'time_emb_proj': 'emb_layers.1',
       'norm2': 'out_layers.0', 'conv2': 'out_layers.3', 'conv_shortcut': 'skip_connection'}


def unet_ldm_name(k, cfg):
    L = cfg['layers_per_block']
    has_attn = [t.startswith('CrossAttn') for t in cfg['up_block_types']]
    p = k.split('.')
    simple = {'time_embedding.linear_1': 'time_embed.0', 'time_embedding.linear_2': 'time_embed.2',
              'conv_in': 'input_blocks.0.0', 'conv_norm_out': 'out.0', 'conv_out': 'out.2'}
    head = '.'.join(p[:2])
    if head in simple:
        return simple[head] + '.' + '.'.join(p[2:])
    if p[0] == 'conv_in' or p[0] == 'conv_out' or p[0] == 'conv_norm_out':
        return simple[p[0]] + '.' + '.'.join(p[1:])
    if p[0] == 'down_blocks':
        i, kind, j, rest = int(p[1]), p[2], int(p[3]), p[4:]
        if kind == 'resnets':
            return 'input_blocks.%d.0.%s.%s' % ((L + 1) * i + j + 1, RES[rest[0]], '.'.join(rest[1:]))
        if kind == 'attentions':
            return 'input_blocks.%d.1.%s' % ((L + 1) * i + j + 1, '.'.join(rest))
        if kind == 'downsamplers':
            return 'input_blocks.%d.0.op.%s' % ((L + 1) * (i + 1), '.'.join(rest[1:]))
    if p[0] == 'mid_block':
        kind, j, rest = p[1], int(p[2]), p[3:]
        if kind == 'resnets':
            return 'middle_block.%d.%s.%s' % (2 * j, RES[rest[0]], '.'.join(rest[1:]))
        return 'middle_block.1.' + '.'.join(rest)
    if p[0] == 'up_blocks':
        i, kind, j, rest = int(p[1]), p[2], int(p[3]), p[4:]
        if kind == 'resnets':
            return 'output_blocks.%d.0.%s.%s' % ((L + 1) * i + j, RES[rest[0]], '.'.join(rest[1:]))
        if kind == 'attentions':
            return 'output_blocks.%d.1.%s' % ((L + 1) * i + j, '.'.join(rest))
        if kind == 'upsamplers':
            return 'output_blocks.%d.%d.%s' % ((L + 1) * i + L, 2 if has_attn[i] else 1, '.'.join(rest))
    raise KeyError(k)


def vae_ldm_name(k, cfg):
    n = len(cfg['block_out_channels'])
    p = k.split('.')
    attn = {'group_norm': 'norm', 'to_q': 'q', 'to_k': 'k', 'to_v': 'v', 'to_out': 'proj_out'}
    res = lambda r: ['nin_shortcut' if r[0] == 'conv_shortcut' else r[0]] + r[1:]
    if p[0] in ('quant_conv', 'post_quant_conv'):
        return k
    side, rest = p[0], p[1:]
    if rest[0] in ('conv_in', 'conv_out'):
        return k
    if rest[0] == 'conv_norm_out':
        return '%s.norm_out.%s' % (side, rest[1])
    if rest[0] == 'mid_block':
        kind, j, r = rest[1], int(rest[2]), rest[3:]
        if kind == 'resnets':
            return '%s.mid.block_%d.%s' % (side, j + 1, '.'.join(res(r)))
        if r[0] == 'to_out':
            r = r[:1] + r[2:]  # to_out.0.weight -> proj_out.weight
        return '%s.mid.attn_1.%s.%s' % (side, attn[r[0]], '.'.join(r[1:]))
    blocks, i, kind, j, r = rest[0], int(rest[1]), rest[2], rest[3], rest[4:]
    if blocks == 'down_blocks':
        if kind == 'resnets':
            return 'encoder.down.%d.block.%s.%s' % (i, j, '.'.join(res(r)))
        return 'encoder.down.%d.downsample.%s' % (i, '.'.join(r))
    if kind == 'resnets':
        return 'decoder.up.%d.block.%s.%s' % (n - 1 - i, j, '.'.join(res(r)))
    return 'decoder.up.%d.upsample.%s' % (n - 1 - i, '.'.join(r))


OPENCLIP = [('embeddings.token_embedding.weight', 'token_embedding.weight'),
            ('embeddings.position_embedding.weight', 'positional_embedding'),
            ('final_layer_norm.', 'ln_final.'), ('encoder.layers.', 'transformer.resblocks.'),
            ('layer_norm1', 'ln_1'), ('layer_norm2', 'ln_2'), ('mlp.fc1', 'mlp.c_fc'),
            ('mlp.fc2', 'mlp.c_proj'), ('self_attn.out_proj', 'attn.out_proj')]


def strip_text_model(sd):
    return {k[len('text_model.'):] if k.startswith('text_model.') else k: v for k, v in sd.items()}


def openclip_state(sd, width):
    """transformers CLIP names -> OpenCLIP's, q/k/v packed into in_proj."""
    out = {}
    for k, v in strip_text_model(sd).items():
        if k.startswith('text_projection') or 'position_ids' in k:
            continue
        if '.self_attn.' in k and any(x in k for x in ('q_proj', 'k_proj', 'v_proj')):
            layer = k.split('.')[2]
            kind = k.split('.')[-1]  # weight or bias
            name = 'transformer.resblocks.%s.attn.in_proj_%s' % (layer, kind)
            if name not in out:
                pre = 'encoder.layers.%s.self_attn.' % layer
                out[name] = torch.cat([strip_text_model(sd)[pre + x + '_proj.' + kind] for x in 'qkv'])
            continue
        for a, b in OPENCLIP:
            k = k.replace(a, b)
        out[k] = v
    return out


def same_state(a, b, what):
    """Checks two state dicts hold the same tensors (size-1 dims aside)."""
    a = {k: v for k, v in a.items() if 'position_ids' not in k}
    b = {k: v for k, v in b.items() if 'position_ids' not in k}
    if set(a) != set(b):
        raise SystemExit('%s: keys differ: %s / %s' % (what, sorted(set(a) - set(b))[:5], sorted(set(b) - set(a))[:5]))
    for k in a:
        if not torch.equal(a[k].squeeze().double(), b[k].squeeze().double()):
            raise SystemExit('%s: %s differs' % (what, k))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--diffusers', required=True, help="diffusers' src folder (holding the diffusers package)")
    ap.add_argument('--out', required=True)
    args = ap.parse_args()
    sys.path.insert(0, args.diffusers)
    import diffusers
    import transformers
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from diffusers.loaders import single_file_utils as sfu
    from safetensors.torch import save_file
    from transformers import CLIPTextConfig, CLIPTextModel

    for name, c in CONFIGS.items():
        gen = torch.Generator().manual_seed(1234 if name == 'sd1' else 5678)
        root = os.path.join(args.out, name)
        folder = os.path.join(root, 'diffusers')
        os.makedirs(folder, exist_ok=True)

        unet = randomize(UNet2DConditionModel(**c['unet']).double().eval(), gen)
        vae = randomize(AutoencoderKL(**c['vae']).double().eval(), gen)
        full = randomize(CLIPTextModel(CLIPTextConfig(**c['text'], attn_implementation='eager')).double().eval(), gen)
        if name == 'sd2':  # diffusers keeps one layer fewer
            tc = dict(c['text'], num_hidden_layers=c['text']['num_hidden_layers'] - 1)
            text = CLIPTextModel(CLIPTextConfig(**tc, attn_implementation='eager')).double().eval()
            missing = text.load_state_dict(full.state_dict(), strict=False)
            assert not missing.missing_keys, missing.missing_keys
        else:
            text = full

        # ---- the single file, checked by diffusers' own converters ----
        single = {}
        for k, v in unet.state_dict().items():
            single['model.diffusion_model.' + unet_ldm_name(k, c['unet'])] = v
        for k, v in vae.state_dict().items():
            ldm = vae_ldm_name(k, c['vae'])
            if '.mid.attn_1.' in ldm and v.ndim == 2:
                v = v[:, :, None, None]  # the original's 1x1 convolutions
            single['first_stage_model.' + ldm] = v
        if name == 'sd1':
            for k, v in full.state_dict().items():
                if 'position_ids' not in k:
                    kk = k if k.startswith('text_model.') else 'text_model.' + k
                    single['cond_stage_model.transformer.' + kk] = v
        else:
            for k, v in openclip_state(full.state_dict(), c['text']['hidden_size']).items():
                single['cond_stage_model.model.' + k] = v
        same_state(sfu.convert_ldm_unet_checkpoint(dict(single), unet.config), unet.state_dict(), name + ' unet')
        same_state(sfu.convert_ldm_vae_checkpoint(dict(single), vae.config), vae.state_dict(), name + ' vae')
        if name == 'sd1':
            conv = sfu.convert_ldm_clip_checkpoint(dict(single))
        else:
            conv = sfu.convert_open_clip_checkpoint(full, dict(single))
        same_state(strip_text_model(conv), strip_text_model(full.state_dict()), name + ' text encoder')
        save_file({k: v.to(torch.float16).contiguous() for k, v in single.items()},
                  os.path.join(root, 'single.safetensors'))

        # ---- the diffusers folder, BF16 (sd2: the configs only, to keep the files small) ----
        for m, sub in ((unet, 'unet'), (vae, 'vae'), (text, 'text_encoder')):
            if c['diffusers_weights']:
                m.to(torch.bfloat16).save_pretrained(os.path.join(folder, sub), safe_serialization=True)
                m.double()
            else:
                m.config.save_pretrained(os.path.join(folder, sub)) if sub == 'text_encoder' else \
                    m.save_config(os.path.join(folder, sub))
        os.makedirs(os.path.join(folder, 'scheduler'), exist_ok=True)
        with open(os.path.join(folder, 'scheduler', 'scheduler_config.json'), 'w') as f:
            json.dump({'_class_name': 'PNDMScheduler', 'beta_start': 0.00085, 'beta_end': 0.012,
                       'beta_schedule': 'scaled_linear', 'num_train_timesteps': 1000, 'set_alpha_to_one': False,
                       'skip_prk_steps': True, 'steps_offset': 1, 'prediction_type': c['prediction']}, f, indent=2)
        with open(os.path.join(folder, 'model_index.json'), 'w') as f:
            json.dump({'_class_name': 'StableDiffusionPipeline', '_diffusers_version': diffusers.__version__,
                       'scheduler': ['diffusers', 'PNDMScheduler'], 'text_encoder': ['transformers', 'CLIPTextModel'],
                       'tokenizer': ['transformers', 'CLIPTokenizer'], 'unet': ['diffusers', 'UNet2DConditionModel'],
                       'vae': ['diffusers', 'AutoencoderKL']}, f, indent=2)

        # ---- inputs and outputs, in float64 ----
        io = {}
        with torch.no_grad():
            lat = c['unet']['sample_size']
            x = torch.randn(2, 4, lat, lat, generator=gen, dtype=torch.float64)
            t = torch.tensor([37.0, 801.0], dtype=torch.float64)
            ctx = torch.randn(2, 77, c['unet']['cross_attention_dim'], generator=gen, dtype=torch.float64)
            io.update({'unet.x': x, 'unet.t': t, 'unet.context': ctx, 'unet.out': unet(x, t, ctx).sample})

            img = c['image']
            image = torch.rand(2, 3, img, img, generator=gen, dtype=torch.float64) * 2 - 1
            dist = vae.encode(image).latent_dist
            f = 2 ** (len(c['vae']['block_out_channels']) - 1)
            z = torch.randn(2, 4, img // f, img // f, generator=gen, dtype=torch.float64)
            io.update({'vae.image': image, 'vae.mean': dist.mean, 'vae.logvar': dist.logvar, 'vae.z': z,
                       'vae.decoded': vae.decode(z).sample})

            ids = torch.full((2, 77), c['text']['eos_token_id'], dtype=torch.int64)
            ids[:, 0] = c['text']['bos_token_id']
            ids[0, 1:12] = torch.randint(1, 498, (11,), generator=gen)
            ids[1, 1:76] = torch.randint(1, 498, (75,), generator=gen)
            out = text(ids, output_hidden_states=True)
            io.update({'text.ids': ids, 'text.hidden': out.last_hidden_state, 'text.penultimate': out.hidden_states[-2]})
            if name == 'sd2':
                o = full(ids, output_hidden_states=True)
                io.update({'text.single_hidden': o.last_hidden_state, 'text.single_penultimate': o.hidden_states[-2]})
        save_file({k: (v if v.dtype == torch.int64 else v.to(torch.float32)).contiguous() for k, v in io.items()},
                  os.path.join(root, 'io.safetensors'))
        n = lambda m: sum(p.numel() for p in m.parameters())
        print('%s: unet %d, vae %d, text %d (single file %d) parameters; diffusers %s, transformers %s, torch %s'
              % (name, n(unet), n(vae), n(text), n(full), diffusers.__version__, transformers.__version__,
                 torch.__version__))


if __name__ == '__main__':
    main()
