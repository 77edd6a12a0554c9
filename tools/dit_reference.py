#!/usr/bin/env python3
"""PyTorch reference for diffusion.c: the official DiT model and its training loss.

Self-contained (torch + numpy only, no timm, no safetensors package) and written to
reproduce facebookresearch/DiT exactly:

  * models.py: the module tree mirrors the official one (timm's PatchEmbed, Attention and
    Mlp are re-implemented with the same attribute names), so `state_dict()` keys, shapes
    and order are the official ones and official checkpoints load with strict=True.
  * diffusion/gaussian_diffusion.py: the pieces of GaussianDiffusion.training_losses that
    DiT uses (linear betas, learned-range variance, eps prediction, loss = mse + vb).

Importable (build_model, forward, loss, GaussianDiffusion, save/load_safetensors) so that
benchmarks can reuse it, and a CLI:

  python3 tools/dit_reference.py golden --out tests/golden   # write the golden files
  python3 tools/dit_reference.py check tests/golden/*.safetensors  # recompute and compare

Runs on torch 1.13 (CPU) and torch 2.x. Golden values are computed in float64 from
float32 weights and inputs, then stored as float32.
"""
import argparse
import dataclasses
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


# =====================================================================================
# Configs
# =====================================================================================

@dataclasses.dataclass
class DiTConfig:
    # Field names follow dc_dit_config in src/models/dit.h.
    input_size: int = 32
    patch: int = 2
    in_channels: int = 4
    hidden: int = 1152
    depth: int = 28
    heads: int = 16
    mlp_hidden: int = 4608  # int(hidden * mlp_ratio); mlp_ratio is 4.0 officially
    num_classes: int = 1000
    learn_sigma: bool = True
    class_dropout_prob: float = 0.1  # > 0 adds the null-class row to the label table

    @property
    def out_channels(self):
        return 2 * self.in_channels if self.learn_sigma else self.in_channels


# models.py, "DiT Configs": name -> (depth, hidden, patch, heads).
OFFICIAL_CONFIGS = {
    "DiT-XL/2": (28, 1152, 2, 16), "DiT-XL/4": (28, 1152, 4, 16), "DiT-XL/8": (28, 1152, 8, 16),
    "DiT-L/2": (24, 1024, 2, 16), "DiT-L/4": (24, 1024, 4, 16), "DiT-L/8": (24, 1024, 8, 16),
    "DiT-B/2": (12, 768, 2, 12), "DiT-B/4": (12, 768, 4, 12), "DiT-B/8": (12, 768, 8, 12),
    "DiT-S/2": (12, 384, 2, 6), "DiT-S/4": (12, 384, 4, 6), "DiT-S/8": (12, 384, 8, 6),
}


def config_from_name(name, input_size=32, in_channels=4, num_classes=1000, learn_sigma=True):
    depth, hidden, patch, heads = OFFICIAL_CONFIGS[name]
    return DiTConfig(input_size=input_size, patch=patch, in_channels=in_channels, hidden=hidden,
                     depth=depth, heads=heads, mlp_hidden=4 * hidden, num_classes=num_classes,
                     learn_sigma=learn_sigma)


# =====================================================================================
# Fixed 2-D sin-cos positional embedding (models.py, from MAE's util/pos_embed.py)
# =====================================================================================

def get_1d_sincos_pos_embed_from_grid(embed_dim, pos):
    """(M,) positions -> (M, embed_dim) = [sin(pos w) | cos(pos w)], w_k = 1/10000^(k/(E/2))."""
    assert embed_dim % 2 == 0
    omega = np.arange(embed_dim // 2, dtype=np.float64)
    omega /= embed_dim / 2.0
    omega = 1.0 / 10000 ** omega
    out = np.einsum("m,d->md", pos.reshape(-1), omega)  # outer product, float64
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def get_2d_sincos_pos_embed(embed_dim, grid_size):
    """(grid_size^2, embed_dim) float64. Token n = row * grid_size + col.

    np.meshgrid(grid_w, grid_h) puts w first, so grid[0] holds the column index and
    grid[1] the row: the first half of the dims (officially named emb_h) encodes the column.
    """
    assert embed_dim % 2 == 0
    grid_h = np.arange(grid_size, dtype=np.float32)
    grid_w = np.arange(grid_size, dtype=np.float32)
    grid = np.stack(np.meshgrid(grid_w, grid_h), axis=0).reshape([2, 1, grid_size, grid_size])
    emb_h = get_1d_sincos_pos_embed_from_grid(embed_dim // 2, grid[0])
    emb_w = get_1d_sincos_pos_embed_from_grid(embed_dim // 2, grid[1])
    return np.concatenate([emb_h, emb_w], axis=1)


# =====================================================================================
# The model (models.py; timm layers re-implemented with timm's attribute names)
# =====================================================================================

def modulate(x, shift, scale):
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class PatchEmbed(nn.Module):
    """timm PatchEmbed: Conv2d(k=p, s=p) then (B, D, h, w) -> (B, h*w, D); norm is Identity."""

    def __init__(self, img_size, patch_size, in_chans, embed_dim):
        super().__init__()
        self.patch_size = (patch_size, patch_size)
        self.grid_size = (img_size // patch_size, img_size // patch_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size,
                              bias=True)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    """timm Attention with qkv_bias=True, no q/k norm, no dropout.

    qkv output features are laid out (3, heads, head_dim): [q | k | v], each head-major.
    fused=True uses F.scaled_dot_product_attention (torch >= 2.0), as recent timm does;
    the math is the same, only the kernel differs.
    """

    def __init__(self, dim, num_heads, fused=False):
        super().__init__()
        assert dim % num_heads == 0
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.fused = fused and hasattr(F, "scaled_dot_product_attention")
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each (B, H, N, Dh)
        if self.fused:
            x = F.scaled_dot_product_attention(q, k, v)
        else:
            attn = (q * self.scale) @ k.transpose(-2, -1)
            x = attn.softmax(dim=-1) @ v
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


class Mlp(nn.Module):
    """timm Mlp: fc1 -> GELU(tanh) -> fc2 (dropouts are 0 in DiT)."""

    def __init__(self, in_features, hidden_features):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden_features, in_features)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden_size, frequency_embedding_size=256):
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(frequency_embedding_size, hidden_size, bias=True),
            nn.SiLU(),
            nn.Linear(hidden_size, hidden_size, bias=True),
        )
        self.frequency_embedding_size = frequency_embedding_size

    @staticmethod
    def timestep_embedding(t, dim, max_period=10000):
        """[cos(t f_k) | sin(t f_k)], f_k = exp(-ln(max_period) k / half) (GLIDE's nn.py).

        Computed in float32 whatever the model dtype, exactly as officially (the official
        code feeds this float32 table to the MLP; here it is then cast to the MLP's dtype).
        """
        half = dim // 2
        freqs = torch.exp(
            -math.log(max_period) * torch.arange(start=0, end=half, dtype=torch.float32) / half
        ).to(device=t.device)
        args = t[:, None].float() * freqs[None]
        embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        if dim % 2:
            embedding = torch.cat([embedding, torch.zeros_like(embedding[:, :1])], dim=-1)
        return embedding

    def forward(self, t):
        t_freq = self.timestep_embedding(t, self.frequency_embedding_size)
        return self.mlp(t_freq.to(self.mlp[0].weight.dtype))


class LabelEmbedder(nn.Module):
    """num_classes + 1 rows when dropout_prob > 0: the last row is the null (unconditional) class."""

    def __init__(self, num_classes, hidden_size, dropout_prob):
        super().__init__()
        use_cfg_embedding = dropout_prob > 0
        self.embedding_table = nn.Embedding(num_classes + use_cfg_embedding, hidden_size)
        self.num_classes = num_classes
        self.dropout_prob = dropout_prob

    def token_drop(self, labels, force_drop_ids=None):
        if force_drop_ids is None:
            drop_ids = torch.rand(labels.shape[0], device=labels.device) < self.dropout_prob
        else:
            drop_ids = force_drop_ids == 1
        return torch.where(drop_ids, self.num_classes, labels)

    def forward(self, labels, train, force_drop_ids=None):
        if (train and self.dropout_prob > 0) or (force_drop_ids is not None):
            labels = self.token_drop(labels, force_drop_ids)
        return self.embedding_table(labels)


class DiTBlock(nn.Module):
    """adaLN-Zero block; chunks: shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp."""

    def __init__(self, hidden_size, num_heads, mlp_hidden, fused_attn=False):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(hidden_size, num_heads=num_heads, fused=fused_attn)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(in_features=hidden_size, hidden_features=mlp_hidden)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))

    def forward(self, x, c):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = \
            self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))
        x = x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x


class FinalLayer(nn.Module):
    def __init__(self, hidden_size, patch_size, out_channels):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels, bias=True)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size))

    def forward(self, x, c):
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class DiT(nn.Module):
    """models.DiT. Submodules are registered in the official order, so the default-init
    random draws, initialize_weights and state_dict order all match the official code."""

    def __init__(self, cfg: DiTConfig, fused_attn=False):
        super().__init__()
        self.cfg = cfg
        self.learn_sigma = cfg.learn_sigma
        self.in_channels = cfg.in_channels
        self.out_channels = cfg.out_channels
        self.patch_size = cfg.patch
        self.num_heads = cfg.heads

        self.x_embedder = PatchEmbed(cfg.input_size, cfg.patch, cfg.in_channels, cfg.hidden)
        self.t_embedder = TimestepEmbedder(cfg.hidden)
        self.y_embedder = LabelEmbedder(cfg.num_classes, cfg.hidden, cfg.class_dropout_prob)
        num_patches = self.x_embedder.num_patches
        # Fixed sin-cos table: a parameter (so it is in the state dict) that never trains.
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches, cfg.hidden), requires_grad=False)
        self.blocks = nn.ModuleList([
            DiTBlock(cfg.hidden, cfg.heads, cfg.mlp_hidden, fused_attn) for _ in range(cfg.depth)
        ])
        self.final_layer = FinalLayer(cfg.hidden, cfg.patch, self.out_channels)
        self.initialize_weights()

    def initialize_weights(self):
        """models.DiT.initialize_weights (adaLN-Zero: the model starts as the identity map
        of its input up to a zero output)."""
        def _basic_init(module):
            if isinstance(module, nn.Linear):
                torch.nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.constant_(module.bias, 0)
        self.apply(_basic_init)

        pos_embed = get_2d_sincos_pos_embed(self.pos_embed.shape[-1],
                                            int(self.x_embedder.num_patches ** 0.5))
        self.pos_embed.data.copy_(torch.from_numpy(pos_embed).float().unsqueeze(0))

        # Patch embedding initialised like nn.Linear on its (D, C*p*p) view.
        w = self.x_embedder.proj.weight.data
        nn.init.xavier_uniform_(w.view([w.shape[0], -1]))

        nn.init.normal_(self.y_embedder.embedding_table.weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)

        for block in self.blocks:
            nn.init.constant_(block.adaLN_modulation[-1].weight, 0)
            nn.init.constant_(block.adaLN_modulation[-1].bias, 0)
        nn.init.constant_(self.final_layer.adaLN_modulation[-1].weight, 0)
        nn.init.constant_(self.final_layer.adaLN_modulation[-1].bias, 0)
        nn.init.constant_(self.final_layer.linear.weight, 0)
        nn.init.constant_(self.final_layer.linear.bias, 0)

    def unpatchify(self, x):
        """(N, T, p*p*c), features ordered (p_row, p_col, c) -> (N, c, H, W)."""
        c = self.out_channels
        p = self.x_embedder.patch_size[0]
        h = w = int(x.shape[1] ** 0.5)
        assert h * w == x.shape[1]
        x = x.reshape(shape=(x.shape[0], h, w, p, p, c))
        x = torch.einsum("nhwpqc->nchpwq", x)
        return x.reshape(shape=(x.shape[0], c, h * p, h * p))

    def forward(self, x, t, y):
        x = self.x_embedder(x) + self.pos_embed  # (N, T, D)
        t = self.t_embedder(t)                   # (N, D)
        y = self.y_embedder(y, self.training)    # (N, D)
        c = t + y
        for block in self.blocks:
            x = block(x, c)
        x = self.final_layer(x, c)               # (N, T, p*p*out_channels)
        return self.unpatchify(x)                # (N, out_channels, H, W)


def build_model(cfg: DiTConfig, seed=None, dtype=torch.float32, device="cpu", fused_attn=False):
    """The official model with the official initialisation (seeded through torch's global
    RNG, as the official train.py does with torch.manual_seed)."""
    if seed is not None:
        torch.manual_seed(seed)
    return DiT(cfg, fused_attn=fused_attn).to(device=device, dtype=dtype)


def forward(model, x, t, y):
    """out[N, out_channels, H, W] = model(x[N, C, H, W], t[N] timesteps, y[N] int64 labels)."""
    return model(x, t, y)


# =====================================================================================
# Gaussian diffusion training loss (diffusion/gaussian_diffusion.py, as DiT configures it:
# linear betas, eps prediction, LEARNED_RANGE variance, loss type MSE -> loss = mse + vb)
# =====================================================================================

def normal_kl(mean1, logvar1, mean2, logvar2):
    """KL(N(mean1, e^logvar1) || N(mean2, e^logvar2)) elementwise, in nats."""
    return 0.5 * (-1.0 + logvar2 - logvar1 + torch.exp(logvar1 - logvar2)
                  + ((mean1 - mean2) ** 2) * torch.exp(-logvar2))


def approx_standard_normal_cdf(x):
    """Phi(x) ~ 0.5 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))


def discretized_gaussian_log_likelihood(x, means, log_scales):
    """log P(bin of x) for data in [-1, 1] quantised to 256 levels (bins +-1/255); the edge
    bins extend to -inf / +inf (x < -0.999 / x > 0.999). Probabilities clamped at 1e-12."""
    centered_x = x - means
    inv_stdv = torch.exp(-log_scales)
    cdf_plus = approx_standard_normal_cdf(inv_stdv * (centered_x + 1.0 / 255.0))
    cdf_min = approx_standard_normal_cdf(inv_stdv * (centered_x - 1.0 / 255.0))
    log_cdf_plus = torch.log(cdf_plus.clamp(min=1e-12))
    log_one_minus_cdf_min = torch.log((1.0 - cdf_min).clamp(min=1e-12))
    cdf_delta = cdf_plus - cdf_min
    return torch.where(
        x < -0.999, log_cdf_plus,
        torch.where(x > 0.999, log_one_minus_cdf_min, torch.log(cdf_delta.clamp(min=1e-12))))


def mean_flat(x):
    return x.mean(dim=list(range(1, x.ndim)))


def linear_betas(num_timesteps=1000):
    """get_named_beta_schedule("linear"): scale keeps the schedule's shape for other T."""
    scale = 1000 / num_timesteps
    return np.linspace(scale * 0.0001, scale * 0.02, num_timesteps, dtype=np.float64)


def space_timesteps(num_timesteps, section_counts):
    """respace.py: the original steps kept when each of len(section_counts) equal sections
    keeps section_counts[i] steps. The index is accumulated by repeated addition and
    rounded by Python's round() (half to even), as officially ("ddimN" strings omitted)."""
    size_per, extra = divmod(num_timesteps, len(section_counts))
    start_idx, all_steps = 0, []
    for i, section_count in enumerate(section_counts):
        size = size_per + (1 if i < extra else 0)
        if size < section_count:
            raise ValueError(f"cannot divide section of {size} steps into {section_count}")
        frac_stride = 1 if section_count <= 1 else (size - 1) / (section_count - 1)
        cur_idx = 0.0
        for _ in range(section_count):
            all_steps.append(start_idx + round(cur_idx))
            cur_idx += frac_stride
        start_idx += size
    return set(all_steps)


class GaussianDiffusion:
    """Schedule tables in float64 numpy, as officially. Per-sample coefficients are taken in
    the dtype of the tensors they multiply (officially always float32; float64 here for the
    golden values)."""

    def __init__(self, betas):
        betas = np.asarray(betas, dtype=np.float64)
        self.num_timesteps = len(betas)
        self.betas = betas
        alphas = 1.0 - betas
        self.alphas_cumprod = np.cumprod(alphas, axis=0)
        self.alphas_cumprod_prev = np.append(1.0, self.alphas_cumprod[:-1])
        self.sqrt_alphas_cumprod = np.sqrt(self.alphas_cumprod)
        self.sqrt_one_minus_alphas_cumprod = np.sqrt(1.0 - self.alphas_cumprod)
        self.sqrt_recip_alphas_cumprod = np.sqrt(1.0 / self.alphas_cumprod)
        self.sqrt_recipm1_alphas_cumprod = np.sqrt(1.0 / self.alphas_cumprod - 1)
        self.posterior_variance = betas * (1.0 - self.alphas_cumprod_prev) / (1.0 - self.alphas_cumprod)
        # posterior_variance[0] is 0: the log is clipped by repeating entry 1.
        self.posterior_log_variance_clipped = np.log(
            np.append(self.posterior_variance[1], self.posterior_variance[1:]))
        self.posterior_mean_coef1 = betas * np.sqrt(self.alphas_cumprod_prev) / (1.0 - self.alphas_cumprod)
        self.posterior_mean_coef2 = ((1.0 - self.alphas_cumprod_prev) * np.sqrt(alphas)
                                     / (1.0 - self.alphas_cumprod))

    @staticmethod
    def _extract(arr, t, like):
        """arr[t] as a (N, 1, 1, ...) tensor of like's dtype and device."""
        res = torch.from_numpy(arr).to(device=t.device)[t.long()].to(like.dtype)
        return res.reshape(-1, *([1] * (like.ndim - 1)))

    def q_sample(self, x_start, t, noise):
        """x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps."""
        return (self._extract(self.sqrt_alphas_cumprod, t, x_start) * x_start
                + self._extract(self.sqrt_one_minus_alphas_cumprod, t, x_start) * noise)

    def q_posterior_mean_variance(self, x_start, x_t, t):
        mean = (self._extract(self.posterior_mean_coef1, t, x_t) * x_start
                + self._extract(self.posterior_mean_coef2, t, x_t) * x_t)
        return mean, self._extract(self.posterior_log_variance_clipped, t, x_t)

    def p_mean_variance(self, model_output, x_t, t):
        """Learned-range variance, eps prediction, no clipping of x0 (clip_denoised=False in
        training). model_output: (N, 2C, ...) = [eps_hat | v]."""
        C = x_t.shape[1]
        eps_hat, v = torch.split(model_output, C, dim=1)
        min_log = self._extract(self.posterior_log_variance_clipped, t, x_t)
        max_log = self._extract(np.log(self.betas), t, x_t)
        frac = (v + 1) / 2  # v in [-1, 1] interpolates the log-variance
        log_var = frac * max_log + (1 - frac) * min_log
        x0_hat = (self._extract(self.sqrt_recip_alphas_cumprod, t, x_t) * x_t
                  - self._extract(self.sqrt_recipm1_alphas_cumprod, t, x_t) * eps_hat)
        mean, _ = self.q_posterior_mean_variance(x0_hat, x_t, t)
        return mean, log_var

    def vb_terms_bpd(self, model_output, x_start, x_t, t):
        """Per-sample variational bound term in bits/dim: KL(q(x_{t-1}|x_t,x0) || p(x_{t-1}|x_t))
        for t > 0, the decoder NLL -log p(x0|x1) for t == 0, both mean over C,H,W / ln 2."""
        true_mean, true_log_var = self.q_posterior_mean_variance(x_start, x_t, t)
        mean, log_var = self.p_mean_variance(model_output, x_t, t)
        kl = mean_flat(normal_kl(true_mean, true_log_var, mean, log_var)) / np.log(2.0)
        nll = -discretized_gaussian_log_likelihood(x_start, means=mean, log_scales=0.5 * log_var)
        nll = mean_flat(nll) / np.log(2.0)
        return torch.where(t == 0, nll, kl)

    def loss_terms(self, model_output, x_start, x_t, t, noise):
        """training_losses after the model call: per-sample mse, vb and loss = mse + vb.

        vb sees eps_hat detached ("frozen_out"), so it trains only the variance channels;
        mse = mean over C,H,W of (eps - eps_hat)^2 trains only the eps channels.
        """
        C = x_t.shape[1]
        eps_hat, v = torch.split(model_output, C, dim=1)
        frozen_out = torch.cat([eps_hat.detach(), v], dim=1)
        vb = self.vb_terms_bpd(frozen_out, x_start, x_t, t)
        mse = mean_flat((noise - eps_hat) ** 2)
        return {"mse": mse, "vb": vb, "loss": mse + vb}

    def training_losses(self, model, x_start, t, y, noise=None):
        if noise is None:
            noise = torch.randn_like(x_start)
        x_t = self.q_sample(x_start, t, noise)
        return self.loss_terms(model(x_t, t, y), x_start, x_t, t, noise)


def create_diffusion(timestep_respacing="", diffusion_steps=1000):
    """diffusion/__init__.py create_diffusion as DiT uses it. Returns (diffusion,
    timestep_map): step k of the (respaced) process is original timestep timestep_map[k],
    the value the model must be fed.

    Even training ("" = all 1000 steps) goes through SpacedDiffusion, whose betas are
    rebuilt as 1 - abar_i / abar_prev: equal to the linspace betas only to the last bits.
    """
    counts = [diffusion_steps] if not timestep_respacing else \
        [int(x) for x in str(timestep_respacing).split(",")]
    use = space_timesteps(diffusion_steps, counts)
    base = GaussianDiffusion(linear_betas(diffusion_steps))
    last, new_betas, timestep_map = 1.0, [], []
    for i, abar in enumerate(base.alphas_cumprod):
        if i in use:
            new_betas.append(1 - abar / last)
            last = abar
            timestep_map.append(i)
    return GaussianDiffusion(np.array(new_betas)), timestep_map


def loss(model, diffusion, x_start, t, y, noise=None):
    """The scalar DiT training loss: mean over the batch of mse + vb."""
    return diffusion.training_losses(model, x_start, t, y, noise)["loss"].mean()


# =====================================================================================
# safetensors, by hand: u64 LE header length, JSON header (space-padded to a multiple of
# 8), then the raw little-endian C-order data, tensors back to back in header order.
# =====================================================================================

_ST_DTYPES = {np.dtype("float32"): "F32", np.dtype("float64"): "F64", np.dtype("int64"): "I64",
              np.dtype("int32"): "I32", np.dtype("float16"): "F16", np.dtype("uint8"): "U8"}
_ST_NUMPY = {v: k for k, v in _ST_DTYPES.items()}


def save_safetensors(path, tensors, metadata=None):
    """tensors: dict name -> numpy array (insertion order is the file order)."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": _ST_DTYPES[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    hdr = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hdr += b" " * (-len(hdr) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)))
        f.write(hdr)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def load_safetensors(path):
    """Returns (dict name -> numpy array, metadata dict)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    buf = raw[8 + n:]
    out = {}
    for name, h in header.items():
        b, e = h["data_offsets"]
        dt = _ST_NUMPY[h["dtype"]].newbyteorder("<")
        out[name] = np.frombuffer(buf[b:e], dtype=dt).reshape(h["shape"]).astype(dt.newbyteorder("="))
    return out, meta


# =====================================================================================
# Golden files for tests/test_golden.c
# =====================================================================================

# Tiny configs, kept small so each file stays a few hundred KB.
#   A: the usual shape (patch 2, 4 channels, learned sigma), two blocks, head dim 8.
#   B: patch 4, one channel, no learned sigma, mlp_hidden 2D (not 4D), head dim 16.
GOLDEN_CONFIGS = {
    "dit_a": DiTConfig(input_size=8, patch=2, in_channels=4, hidden=24, depth=2, heads=3,
                       mlp_hidden=96, num_classes=10, learn_sigma=True),
    "dit_b": DiTConfig(input_size=8, patch=4, in_channels=1, hidden=32, depth=1, heads=2,
                       mlp_hidden=64, num_classes=3, learn_sigma=False),
}
GOLDEN_SEED = 20240601
WEIGHT_STD = 0.1     # every tensor N(0, WEIGHT_STD): nothing zero, so no block is the identity
GOLDEN_N = 3         # model batch
LOSS_T = [0, 1, 500, 999]  # loss batch timesteps: the decoder NLL (t=0), both ends of KL


def golden_weights(model, rng):
    """Random non-zero weights (float32) for every trainable tensor; pos_embed stays the
    official table. Returned as an ordered dict of numpy float32 arrays in state-dict order."""
    sd = {}
    for name, p in model.state_dict().items():
        if name == "pos_embed":
            sd[name] = p.detach().cpu().numpy().astype(np.float32)
        else:
            sd[name] = (rng.standard_normal(tuple(p.shape)) * WEIGHT_STD).astype(np.float32)
    return sd


def reference_model(cfg, weights):
    """A float64 model holding exactly the given float32 weights."""
    model = build_model(cfg, seed=0, dtype=torch.float64)
    model.load_state_dict({k: torch.from_numpy(v).double() for k, v in weights.items()},
                          strict=True)
    return model.eval()  # eval: no label dropout


def model_golden(model, x, t, y, R):
    """out = model(x, t, y) and dL/dparam for L = sum(out * R), all float64."""
    model.zero_grad(set_to_none=True)
    out = model(torch.from_numpy(x).double(), torch.from_numpy(t), torch.from_numpy(y))
    (out * torch.from_numpy(R).double()).sum().backward()
    grads = {k: p.grad.detach().numpy() for k, p in model.named_parameters() if p.requires_grad}
    return out.detach().numpy(), grads


def loss_golden(diffusion, out, x0, xt, eps, t):
    """Per-sample mse, vb and d(mean_b loss_b)/d out, float64, from a given model output."""
    out_t = torch.from_numpy(out).double().requires_grad_(True)
    terms = diffusion.loss_terms(out_t, torch.from_numpy(x0).double(), torch.from_numpy(xt).double(),
                                 torch.from_numpy(t), torch.from_numpy(eps).double())
    terms["loss"].mean().backward()
    return terms["mse"].detach().numpy(), terms["vb"].detach().numpy(), out_t.grad.numpy()


def golden_metadata(cfg, seed):
    return {"input_size": cfg.input_size, "patch": cfg.patch, "in_channels": cfg.in_channels,
            "hidden": cfg.hidden, "depth": cfg.depth, "heads": cfg.heads,
            "mlp_hidden": cfg.mlp_hidden, "num_classes": cfg.num_classes,
            "learn_sigma": "true" if cfg.learn_sigma else "false",
            "generator": "tools/dit_reference.py golden", "seed": seed,
            # The same config under the names the engine's own checkpoints use
            # (src/models/dit_io.c), so the file loads as a checkpoint as it is.
            "model": "DiT", "patch_size": cfg.patch, "hidden_size": cfg.hidden,
            "num_heads": cfg.heads}


def make_golden(cfg, seed):
    f32 = lambda a: np.asarray(a, dtype=np.float32)
    rng = np.random.default_rng(seed)  # numpy's PCG64: the same stream on every platform
    model = reference_model(cfg, golden_weights(build_model(cfg, seed=0), rng))
    weights = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}

    N, C, S = GOLDEN_N, cfg.in_channels, cfg.input_size
    x = f32(rng.standard_normal((N, C, S, S)))
    t = f32([999, 0, 421])
    y = np.array([3 % cfg.num_classes, cfg.num_classes, 2 % cfg.num_classes], dtype=np.int64)
    R = f32(rng.standard_normal((N, cfg.out_channels, S, S)))
    out, grads = model_golden(model, x, t, y, R)

    tensors = dict(weights)
    tensors.update({"input.x": x, "input.t": t, "input.y": y, "output.out": f32(out), "R": R})
    tensors.update({"grad." + k: f32(g) for k, g in grads.items()})

    if cfg.learn_sigma:
        # The loss check is independent of the model: a synthetic model output whose eps
        # half is near eps (as a trained model's would be) keeps every term well conditioned.
        diffusion, _ = create_diffusion()  # training: all 1000 steps
        B = len(LOSS_T)
        x0 = rng.uniform(-1.3, 1.3, (B, C, S, S)).clip(-1.0, 1.0)  # many exact +-1 pixels
        # Keep interior values away from the +-0.999 edge-bin test, where a float32 rounding
        # of x0 or of the constant could change the branch.
        near = (np.abs(x0) > 0.99) & (np.abs(x0) < 1.0)
        x0[near] = np.sign(x0[near]) * 0.99
        x0 = f32(x0)
        eps = f32(rng.standard_normal((B, C, S, S)))
        lt = np.array(LOSS_T, dtype=np.int64)
        # x_t from float64 coefficients, then rounded: the loss below uses exactly the stored x_t.
        xt = f32(diffusion.q_sample(torch.from_numpy(x0).double(), torch.from_numpy(lt),
                                    torch.from_numpy(eps).double()).numpy())
        out_l = f32(np.concatenate([eps + 0.5 * rng.standard_normal(eps.shape),
                                    rng.uniform(-1.2, 1.2, eps.shape)], axis=1))
        mse, vb, dout = loss_golden(diffusion, out_l, x0, xt, eps, lt)
        tensors.update({"loss.x0": x0, "loss.eps": eps, "loss.t": f32(lt), "loss.xt": xt,
                        "loss.out": out_l, "loss.mse": f32(mse), "loss.vb": f32(vb),
                        "loss.dout": f32(dout)})
    return tensors, golden_metadata(cfg, seed)


def cmd_golden(args):
    os.makedirs(args.out, exist_ok=True)
    for i, (name, cfg) in enumerate(GOLDEN_CONFIGS.items()):
        tensors, meta = make_golden(cfg, GOLDEN_SEED + i)
        path = os.path.join(args.out, name + ".safetensors")
        save_safetensors(path, tensors, meta)
        print(f"{path}: {len(tensors)} tensors, {os.path.getsize(path)} bytes")


def _config_from_meta(meta):
    ints = ["input_size", "patch", "in_channels", "hidden", "depth", "heads", "mlp_hidden",
            "num_classes"]
    return DiTConfig(**{k: int(meta[k]) for k in ints}, learn_sigma=meta["learn_sigma"] == "true")


def _nerr(a, b):
    """max|a - b| / max|b|: the normalised error the C test uses too."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def cmd_check(args):
    """Recomputes each golden file from its own weights and inputs (a round trip of the
    file format and of determinism; float32 storage rounding bounds the error)."""
    worst = 0.0
    for path in args.files:
        ts, meta = load_safetensors(path)
        cfg = _config_from_meta(meta)
        weights = {k: v for k, v in ts.items()
                   if k != "R" and not k.startswith(("input.", "output.", "grad.", "loss."))}
        model = reference_model(cfg, weights)
        out, grads = model_golden(model, ts["input.x"], ts["input.t"], ts["input.y"], ts["R"])
        errs = {"output.out": _nerr(out, ts["output.out"])}
        errs.update({"grad." + k: _nerr(g, ts["grad." + k]) for k, g in grads.items()})
        if "loss.out" in ts:
            mse, vb, dout = loss_golden(create_diffusion()[0], ts["loss.out"], ts["loss.x0"],
                                        ts["loss.xt"], ts["loss.eps"], ts["loss.t"].astype(np.int64))
            errs.update({"loss.mse": _nerr(mse, ts["loss.mse"]), "loss.vb": _nerr(vb, ts["loss.vb"]),
                         "loss.dout": _nerr(dout, ts["loss.dout"])})
        w = max(errs, key=errs.get)
        worst = max(worst, errs[w])
        print(f"{path}: {len(errs)} tensors recomputed, worst {w} {errs[w]:.2e}")
    if worst > 1e-6:
        print("FAIL", file=sys.stderr)
        return 1
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("golden", help="write the golden files for tests/test_golden.c")
    g.add_argument("--out", default="tests/golden")
    c = sub.add_parser("check", help="recompute golden files and compare")
    c.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    torch.set_grad_enabled(True)
    return {"golden": cmd_golden, "check": cmd_check}[args.cmd](args) or 0


if __name__ == "__main__":
    sys.exit(main())
