#!/usr/bin/env python3
"""Golden files for LoRA files, made by diffusers' own LoRA loader.

Over the tiny SD 1.x model of tests/golden/sd/sd1 (its diffusers UNet and
transformers CLIPTextModel), writes one random LoRA in three formats:

  kohya.safetensors      lora_unet_* / lora_te_text_model_* with lora_down,
                         lora_up and alpha (one layer without an alpha)
  peft.safetensors       diffusers' save_lora_weights form: unet.<path> /
                         text_encoder.text_model.<path> .lora_A / .lora_B,
                         alpha / rank folded into lora_B
  diffusers.safetensors  the older diffusers forms: unet.<path>.lora.down /
                         .lora.up and text_encoder.text_model.<path>
                         .lora_linear_layer.down / .up, alpha / rank folded
                         likewise

on attention projections, the feed-forward, the transformers' 1x1-conv
proj_in/out, a resnet's 3x3 conv1 (LoCon) and time_emb_proj, and the text
encoder's q/v/out projections and MLP. Each file is read by
StableDiffusionLoraLoaderMixin.lora_state_dict (diffusers' key conversion)
and loaded into fresh copies of the models: the UNet's part by
load_lora_into_unet and fused by fuse_lora; the text encoder's part as
diffusers' _load_lora_into_text_encoder does it (convert_state_dict_to_peft,
_create_lora_config, peft's injection), by hand only because that function
looks its layers up under "text_model.", which transformers 5's
CLIPTextModel no longer has; merged by peft's merge(). The script checks
that every layer of the file got its LoRA (none dropped). Then
golden.safetensors (F32) gets, per format F:

  F.unet.out    the UNet with the LoRA at run time (PEFT's layers), on
                io.safetensors' unet.x, unet.t, unet.context, in float64
  F.text.hidden the text encoder's last hidden state on io's text.ids, float64
  F.fused.<unet|text>.<module path>.weight
                the layer's weight after fuse_lora (float64, then F32)

tests/test_lora_golden.c holds the engine to them, at run time and merged.

    python3 tools/lora_golden.py --diffusers PATH/diffusers/src [--site DIR] --out tests/golden/lora

--site: a folder put on sys.path for peft (and accelerate) where they are not
installed (diffusers loads LoRAs only through peft). Needs torch,
transformers, safetensors. Deterministic (torch.manual_seed).
"""
import argparse
import copy
import os
import sys

import torch

# (part, module path, rank, alpha or None)
LAYERS = [
    ('unet', 'down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q', 4, 2.0),
    ('unet', 'down_blocks.1.attentions.1.transformer_blocks.0.attn2.to_k', 2, 4.0),
    ('unet', 'mid_block.attentions.0.transformer_blocks.0.attn1.to_out.0', 3, None),
    ('unet', 'up_blocks.1.attentions.2.transformer_blocks.0.ff.net.0.proj', 4, 4.0),
    ('unet', 'up_blocks.3.attentions.0.transformer_blocks.0.ff.net.2', 2, 1.0),
    ('unet', 'down_blocks.2.attentions.0.proj_in', 2, 2.0),
    ('unet', 'up_blocks.2.attentions.1.proj_out', 2, 1.0),
    ('unet', 'down_blocks.0.resnets.1.conv1', 4, 2.0),
    ('unet', 'up_blocks.0.resnets.2.time_emb_proj', 2, 2.0),
    ('text', 'text_model.encoder.layers.0.self_attn.q_proj', 4, 8.0),
    ('text', 'text_model.encoder.layers.1.self_attn.v_proj', 2, 2.0),
    ('text', 'text_model.encoder.layers.2.self_attn.out_proj', 2, 1.0),
    ('text', 'text_model.encoder.layers.0.mlp.fc1', 3, 3.0),
    ('text', 'text_model.encoder.layers.2.mlp.fc2', 2, 1.0),
]


def local(model, path):
    """The module path in model: transformers 5's CLIPTextModel has no text_model level."""
    if path.startswith('text_model.') and not hasattr(model, 'text_model'):
        return path[len('text_model.'):]
    return path


def module(model, path):
    m = model
    for p in local(model, path).split('.'):
        m = m[int(p)] if p.isdigit() else getattr(m, p)
    return m


def factors(unet, te):
    """Random down [r, in(, k, k)] and up [out, r(, 1, 1)] for every layer."""
    g = torch.Generator().manual_seed(7)
    out = []
    for part, path, r, alpha in LAYERS:
        w = module(unet if part == 'unet' else te, path).weight
        dshape = (r,) + tuple(w.shape[1:])
        ushape = (w.shape[0], r) + (1,) * (w.dim() - 2)
        down = (0.3 * torch.randn(dshape, generator=g)).float()
        up = (0.3 * torch.randn(ushape, generator=g)).float()
        out.append((part, path, r, alpha, down, up))
    return out


def files(fs):
    """The three files' state dicts."""
    kohya, peft, diff = {}, {}, {}
    for part, path, r, alpha, down, up in fs:
        stem = ('lora_unet_' if part == 'unet' else 'lora_te_') + path.replace('.', '_')
        kohya[stem + '.lora_down.weight'] = down
        kohya[stem + '.lora_up.weight'] = up
        if alpha is not None:
            kohya[stem + '.alpha'] = torch.tensor(alpha)
        s = (alpha if alpha is not None else r) / r
        dot = ('unet.' if part == 'unet' else 'text_encoder.') + path
        peft[dot + '.lora_A.weight'] = down
        peft[dot + '.lora_B.weight'] = (up * s).contiguous()
        mid = '.lora' if part == 'unet' else '.lora_linear_layer'
        diff[dot + mid + '.down.weight'] = down
        diff[dot + mid + '.up.weight'] = (up * s).contiguous()
    return {'kohya': kohya, 'peft': peft, 'diffusers': diff}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--diffusers', help="diffusers' src folder (else the installed one)")
    ap.add_argument('--site', help='a folder with peft (and accelerate) to put on sys.path')
    ap.add_argument('--gold', default='tests/golden/sd/sd1', help='the tiny SD 1.x model and its io.safetensors')
    ap.add_argument('--out', default='tests/golden/lora')
    a = ap.parse_args()
    for p in (a.site, a.diffusers):
        if p:
            sys.path.insert(0, p)
    import diffusers
    import peft
    import transformers
    from diffusers import UNet2DConditionModel
    from diffusers.loaders import StableDiffusionLoraLoaderMixin
    from diffusers.utils import convert_state_dict_to_diffusers, convert_state_dict_to_peft
    from diffusers.utils.peft_utils import _create_lora_config
    from peft import inject_adapter_in_model, set_peft_model_state_dict
    from peft.tuners.tuners_utils import BaseTunerLayer
    from safetensors.torch import load_file, save_file
    from transformers import CLIPTextModel
    torch.manual_seed(0)
    print(f'diffusers {diffusers.__version__}, peft {peft.__version__}, transformers {transformers.__version__}, '
          f'torch {torch.__version__}')

    class Holder(StableDiffusionLoraLoaderMixin):
        """What load_lora_weights and fuse_lora need of a pipeline: its UNet and text encoder."""
        def __init__(self, unet, text_encoder):
            self.unet, self.text_encoder = unet, text_encoder
            self.components = {'unet': unet, 'text_encoder': text_encoder}
            self.hf_device_map = None  # not spread over devices
            self._merged_adapters = set()

    unet0 = UNet2DConditionModel.from_pretrained(os.path.join(a.gold, 'diffusers', 'unet'), torch_dtype=torch.float32)
    te0 = CLIPTextModel.from_pretrained(os.path.join(a.gold, 'diffusers', 'text_encoder'), torch_dtype=torch.float32)
    io = load_file(os.path.join(a.gold, 'io.safetensors'))
    fs = factors(unet0, te0)
    os.makedirs(a.out, exist_ok=True)
    golden = {}
    for fmt, sd in files(fs).items():
        path = os.path.join(a.out, fmt + '.safetensors')
        save_file(sd, path)
        h = Holder(copy.deepcopy(unet0), copy.deepcopy(te0))
        sd_, alphas, meta = h.lora_state_dict(path, return_lora_metadata=True)
        h.load_lora_into_unet(sd_, network_alphas=alphas, unet=h.unet, adapter_name='golden', metadata=meta,
                              _pipeline=h)
        te = h.text_encoder
        tsd = {k.removeprefix('text_encoder.'): v for k, v in sd_.items() if k.startswith('text_encoder.')}
        tsd = {local(te, k): v for k, v in convert_state_dict_to_peft(convert_state_dict_to_diffusers(tsd)).items()}
        tal = {local(te, k.removeprefix('text_encoder.')): v for k, v in (alphas or {}).items()
               if k.split('.')[0] == 'text_encoder'}
        rank = {k: v.shape[1] for k, v in tsd.items() if k.endswith('lora_B.weight')}
        inject_adapter_in_model(_create_lora_config(tsd, tal or None, None, rank, is_unet=False), te,
                                adapter_name='golden')
        set_peft_model_state_dict(te, tsd, adapter_name='golden')
        for part, model in (('unet', h.unet), ('text', h.text_encoder)):
            got = sorted(n for n, m in model.named_modules() if isinstance(m, BaseTunerLayer))
            want = sorted(local(model, p) for q, p, *_ in fs if q == part)
            if got != want:
                raise SystemExit(f'{fmt}: diffusers adapted {got} of the {part}, the file holds {want}')
        h.unet.double(), h.text_encoder.double()
        with torch.no_grad():
            golden[fmt + '.unet.out'] = h.unet(io['unet.x'].double(), io['unet.t'].double(),
                                               io['unet.context'].double()).sample.float()
            golden[fmt + '.text.hidden'] = h.text_encoder(io['text.ids'].long()).last_hidden_state.float()
            h.fuse_lora(components=['unet'], lora_scale=1.0)
            for m in te.modules():
                if isinstance(m, BaseTunerLayer):
                    m.merge(adapter_names=['golden'])
            for part, p, *_ in fs:
                m = module(h.unet if part == 'unet' else h.text_encoder, p)
                w = m.get_base_layer().weight if isinstance(m, BaseTunerLayer) else m.weight
                golden[f'{fmt}.fused.{part}.{p}.weight'] = w.float().contiguous()
        print(f'{fmt}: {len(sd)} tensors, {len(fs)} layers adapted by diffusers')
    # the three files hold the same LoRA: diffusers must draw the same from each
    for fmt in ('peft', 'diffusers'):
        d = (golden[fmt + '.unet.out'] - golden['kohya.unet.out']).abs().max().item()
        print(f'{fmt} against kohya: UNet outputs within {d:.2e}')
    save_file(golden, os.path.join(a.out, 'golden.safetensors'))
    print(f'wrote {a.out}/golden.safetensors: {len(golden)} tensors')


if __name__ == '__main__':
    main()
