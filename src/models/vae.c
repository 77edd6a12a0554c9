// The VAE's configuration (config.json or tensor shapes), its parameters
// registered under diffusers' names, and loading. The forward passes are in
// vae_blocks.c, the original layout's names in vae_names.c.
#include "models/vae.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "models/vae_modules.h"

// SD's values where neither a config nor the shapes say otherwise.
#define VAE_GROUPS 32
#define VAE_EPS 1e-6f
#define VAE_SCALING 0.18215f

int dc_vae_config_validate(const dc_vae_config *c) {
    if (c->nblocks < 1 || c->nblocks > DC_VAE_MAX_BLOCKS)
        return dc_fail("VAE: %d blocks (block_out_channels); 1 to %d are supported", c->nblocks, DC_VAE_MAX_BLOCKS);
    if (c->layers_per_block < 1 || c->layers_per_block > DC_VAE_MAX_LAYERS)
        return dc_fail("VAE: layers_per_block %d; 1 to %d are supported", c->layers_per_block, DC_VAE_MAX_LAYERS);
    if (c->in_channels < 1 || c->out_channels < 1 || c->latent_channels < 1)
        return dc_fail("VAE: in_channels %d, out_channels %d, latent_channels %d must be positive", c->in_channels,
                       c->out_channels, c->latent_channels);
    if (c->groups < 1) return dc_fail("VAE: norm_num_groups %d must be positive", c->groups);
    for (int i = 0; i < c->nblocks; i++)
        if (c->ch[i] < 1 || c->ch[i] % c->groups)
            return dc_fail("VAE: block_out_channels[%d] = %d does not split into %d groups (norm_num_groups)", i,
                           c->ch[i], c->groups);
    if (!(c->eps > 0)) return dc_fail("VAE: GroupNorm eps %g must be positive", c->eps);
    if (!(c->scaling_factor > 0)) return dc_fail("VAE: scaling_factor %g must be positive", c->scaling_factor);
    return 0;
}

// ---- config.json

// Integer member `key` (def when absent); a member of another kind is refused.
static int json_int(const dc_json *root, const char *path, const char *key, int def, int *out) {
    const dc_json *v = dc_json_get(root, key);
    int64_t x;
    if (!v) return *out = def, 0;
    if (dc_json_get_i64(v, &x) || x < 0 || x > 1 << 20)
        return dc_fail("%s: '%s' must be a non-negative integer", path, key);
    *out = (int)x;
    return 0;
}

// A boolean member that the engine supports only in one state (diffusers' default).
static int json_require_bool(const dc_json *root, const char *path, const char *key, bool want, const char *why) {
    const dc_json *v = dc_json_get(root, key);
    if (!v || v->type == DC_JSON_NULL) return 0;
    if (v->type != DC_JSON_TRUE && v->type != DC_JSON_FALSE)
        return dc_fail("%s: '%s' must be true or false", path, key);
    if ((v->type == DC_JSON_TRUE) != want)
        return dc_fail("%s: '%s' is %s: %s", path, key, want ? "false" : "true", why);
    return 0;
}

// down_block_types / up_block_types: n entries, each `want`.
static int json_block_types(const dc_json *root, const char *path, const char *key, const char *want, int n) {
    const dc_json *v = dc_json_get(root, key);
    if (!v) return 0;  // diffusers' default is the plain block
    if (v->type != DC_JSON_ARRAY) return dc_fail("%s: '%s' must be a list of block names", path, key);
    if (v->nkids != n)
        return dc_fail("%s: '%s' has %d entries but block_out_channels has %d", path, key, v->nkids, n);
    for (int i = 0; i < n; i++) {
        const dc_json *t = &v->kids[i];
        if (!dc_json_is_cstr(t)) return dc_fail("%s: '%s'[%d] must be a string", path, key, i);
        if (strcmp(t->str, want))
            return dc_fail("%s: '%s'[%d] is '%s': only %s is supported", path, key, i, t->str, want);
    }
    return 0;
}

int dc_vae_config_from_json(dc_vae_config *c, const dc_json *root, const char *path) {
    memset(c, 0, sizeof *c);
    if (!root || root->type != DC_JSON_OBJECT) return dc_fail("%s: the VAE config must be a JSON object", path);
    // Absent keys take diffusers' AutoencoderKL defaults, as diffusers itself does.
    DC_TRY(json_int(root, path, "in_channels", 3, &c->in_channels));
    DC_TRY(json_int(root, path, "out_channels", 3, &c->out_channels));
    DC_TRY(json_int(root, path, "latent_channels", 4, &c->latent_channels));
    DC_TRY(json_int(root, path, "layers_per_block", 1, &c->layers_per_block));
    DC_TRY(json_int(root, path, "norm_num_groups", VAE_GROUPS, &c->groups));
    const dc_json *bo = dc_json_get(root, "block_out_channels");
    if (!bo) {
        c->nblocks = 1, c->ch[0] = 64;
    } else {
        if (bo->type != DC_JSON_ARRAY || bo->nkids < 1)
            return dc_fail("%s: 'block_out_channels' must be a non-empty list of integers", path);
        if (bo->nkids > DC_VAE_MAX_BLOCKS)
            return dc_fail("%s: 'block_out_channels' has %d entries; at most %d are supported", path, bo->nkids,
                           DC_VAE_MAX_BLOCKS);
        c->nblocks = bo->nkids;
        for (int i = 0; i < bo->nkids; i++) {
            int64_t x;
            if (dc_json_get_i64(&bo->kids[i], &x) || x < 1 || x > 1 << 20)
                return dc_fail("%s: 'block_out_channels'[%d] must be a positive integer", path, i);
            c->ch[i] = (int)x;
        }
    }
    DC_TRY(json_block_types(root, path, "down_block_types", "DownEncoderBlock2D", c->nblocks));
    DC_TRY(json_block_types(root, path, "up_block_types", "UpDecoderBlock2D", c->nblocks));
    const dc_json *act = dc_json_get(root, "act_fn");
    if (act && (!dc_json_is_cstr(act) || strcmp(act->str, "silu")))
        return dc_fail("%s: 'act_fn' is %s%s%s: only \"silu\" is supported", path, dc_json_is_cstr(act) ? "\"" : "",
                       dc_json_is_cstr(act) ? act->str : "not a string", dc_json_is_cstr(act) ? "\"" : "");
    DC_TRY(json_require_bool(root, path, "use_quant_conv", true, "VAEs without quant_conv are not supported"));
    DC_TRY(json_require_bool(root, path, "use_post_quant_conv", true,
                             "VAEs without post_quant_conv are not supported"));
    DC_TRY(json_require_bool(root, path, "mid_block_add_attention", true,
                             "VAEs without mid-block attention are not supported"));
    const dc_json *sf = dc_json_get(root, "scaling_factor");
    if (sf && sf->type != DC_JSON_NUMBER) return dc_fail("%s: 'scaling_factor' must be a number", path);
    c->scaling_factor = sf ? (float)sf->num : VAE_SCALING;
    c->eps = VAE_EPS;
    if (dc_vae_config_validate(c)) return dc_fail_ctx("%s", path);
    return 0;
}

// ---- inference from shapes

// Dimension d of the tensor named by fmt (one or two integer arguments), or -1.
static int64_t dim_of(const dc_weights *w, int d, const char *fmt, int a, int b) {
    char name[160];
    snprintf(name, sizeof name, fmt, a, b);
    return dc_weights_dim(w, name, d);
}

int dc_vae_config_infer(dc_vae_config *c, const dc_weights *w, dc_names names) {
    memset(c, 0, sizeof *c);
    bool orig = names == DC_NAMES_ORIGINAL;
    bool enc = dc_weights_has(w, "encoder.conv_in.weight"), dec = dc_weights_has(w, "decoder.conv_in.weight");
    if (!enc && !dec)
        return dc_fail("%s: no VAE tensors (neither '%sencoder.conv_in.weight' nor '%sdecoder.conv_in.weight')",
                       w->nfiles ? w->files[0].path : "weights", w->prefix, w->prefix);
    // Levels (block_out_channels) from the first resnet's conv1 [ch, in, 3, 3]
    // of each down block, or of each up block (listed from the deepest level
    // in diffusers, from level 0 in the original layout).
    const char *resnet_fmt = enc ? (orig ? "encoder.down.%d.block.%d.conv1.weight"
                                         : "encoder.down_blocks.%d.resnets.%d.conv1.weight")
                                 : (orig ? "decoder.up.%d.block.%d.conv1.weight"
                                         : "decoder.up_blocks.%d.resnets.%d.conv1.weight");
    int n = 0;
    while (n <= DC_VAE_MAX_BLOCKS && dim_of(w, 0, resnet_fmt, n, 0) > 0) n++;
    if (n == 0 || n > DC_VAE_MAX_BLOCKS)
        return dc_fail("%s: %s blocks in the %s (between 1 and %d are supported)",
                       w->nfiles ? w->files[0].path : "weights", n ? "too many" : "no", enc ? "encoder" : "decoder",
                       DC_VAE_MAX_BLOCKS);
    c->nblocks = n;
    int layers = 0;
    while (layers <= DC_VAE_MAX_LAYERS + 1 && dim_of(w, 0, resnet_fmt, 0, layers) > 0) layers++;
    for (int i = 0; i < n; i++) c->ch[enc || orig ? i : n - 1 - i] = (int)dim_of(w, 0, resnet_fmt, i, 0);
    c->layers_per_block = enc ? layers : layers - 1;  // the up blocks have one resnet more
    c->latent_channels = (int)(enc ? dim_of(w, 0, "encoder.conv_out.weight", 0, 0) / 2
                                   : dim_of(w, 1, "decoder.conv_in.weight", 0, 0));
    // A file with one half only: the image channels are the same both ways.
    c->in_channels = (int)(enc ? dim_of(w, 1, "encoder.conv_in.weight", 0, 0)
                               : dim_of(w, 0, "decoder.conv_out.weight", 0, 0));
    c->out_channels = dec ? (int)dim_of(w, 0, "decoder.conv_out.weight", 0, 0) : c->in_channels;
    c->groups = VAE_GROUPS, c->eps = VAE_EPS, c->scaling_factor = VAE_SCALING;
    if (dc_vae_config_validate(c))
        return dc_fail_ctx("%s: the VAE's tensor shapes", w->nfiles ? w->files[0].path : "weights");
    return 0;
}

// ---- registration, in diffusers' state-dict order

static int resnet_add(dc_params *ps, vae_resnet *r, const char *name, int ci, int co, const dc_vae_config *c) {
    char k[DC_PARAM_NAME_MAX];
#define KEY(leaf) (snprintf(k, sizeof k, "%s.%s", name, leaf), k)
    r->has_shortcut = ci != co;
    DC_TRY(dc_group_norm_add(ps, &r->norm1, KEY("norm1"), ci, c->groups, c->eps));
    DC_TRY(dc_conv2d_add_nhwc(ps, &r->conv1, KEY("conv1"), ci, co, 3, 1, 1));
    DC_TRY(dc_group_norm_add(ps, &r->norm2, KEY("norm2"), co, c->groups, c->eps));
    DC_TRY(dc_conv2d_add_nhwc(ps, &r->conv2, KEY("conv2"), co, co, 3, 1, 1));
    if (r->has_shortcut) DC_TRY(dc_conv2d_add_nhwc(ps, &r->shortcut, KEY("conv_shortcut"), ci, co, 1, 1, 0));
    return 0;
}

static int mid_add(dc_params *ps, vae_mid *m, const char *side, int C, const dc_vae_config *c) {
    char k[DC_PARAM_NAME_MAX];
    vae_attention *a = &m->attn;
    snprintf(k, sizeof k, "%s.mid_block.attentions.0.group_norm", side);
    DC_TRY(dc_group_norm_add(ps, &a->norm, k, C, c->groups, c->eps));
    const char *proj[4] = {"to_q", "to_k", "to_v", "to_out.0"};
    dc_linear *lin[4] = {&a->q, &a->k, &a->v, &a->out};
    for (int i = 0; i < 4; i++) {
        snprintf(k, sizeof k, "%s.mid_block.attentions.0.%s", side, proj[i]);
        DC_TRY(dc_linear_add(ps, lin[i], k, C, C));
    }
    for (int j = 0; j < 2; j++) {
        snprintf(k, sizeof k, "%s.mid_block.resnets.%d", side, j);
        DC_TRY(resnet_add(ps, &m->res[j], k, C, C, c));
    }
    return 0;
}

static int encoder_add(dc_params *ps, vae_encoder *e, const dc_vae_config *c) {
    char k[DC_PARAM_NAME_MAX];
    int n = c->nblocks;
    DC_TRY(dc_conv2d_add_nhwc(ps, &e->conv_in, "encoder.conv_in", c->in_channels, c->ch[0], 3, 1, 1));
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < c->layers_per_block; j++) {
            int ci = j ? c->ch[i] : c->ch[i ? i - 1 : 0];
            snprintf(k, sizeof k, "encoder.down_blocks.%d.resnets.%d", i, j);
            DC_TRY(resnet_add(ps, &e->res[i][j], k, ci, c->ch[i], c));
        }
        if (i + 1 < n) {  // padded (0, 1, 0, 1) at run time, hence no padding here
            snprintf(k, sizeof k, "encoder.down_blocks.%d.downsamplers.0.conv", i);
            DC_TRY(dc_conv2d_add_nhwc(ps, &e->down[i], k, c->ch[i], c->ch[i], 3, 2, 0));
        }
    }
    DC_TRY(mid_add(ps, &e->mid, "encoder", c->ch[n - 1], c));
    DC_TRY(dc_group_norm_add(ps, &e->norm_out, "encoder.conv_norm_out", c->ch[n - 1], c->groups, c->eps));
    return dc_conv2d_add_nhwc(ps, &e->conv_out, "encoder.conv_out", c->ch[n - 1], 2 * c->latent_channels, 3, 1, 1);
}

static int decoder_add(dc_params *ps, vae_decoder *d, const dc_vae_config *c) {
    char k[DC_PARAM_NAME_MAX];
    int n = c->nblocks;
    DC_TRY(dc_conv2d_add_nhwc(ps, &d->conv_in, "decoder.conv_in", c->latent_channels, c->ch[n - 1], 3, 1, 1));
    // up_blocks.i works at level n-1-i: channels in reverse order
    for (int i = 0; i < n; i++) {
        int co = c->ch[n - 1 - i], prev = c->ch[i ? n - i : n - 1];
        for (int j = 0; j <= c->layers_per_block; j++) {
            snprintf(k, sizeof k, "decoder.up_blocks.%d.resnets.%d", i, j);
            DC_TRY(resnet_add(ps, &d->res[i][j], k, j ? co : prev, co, c));
        }
        if (i + 1 < n) {
            snprintf(k, sizeof k, "decoder.up_blocks.%d.upsamplers.0.conv", i);
            DC_TRY(dc_conv2d_add_nhwc(ps, &d->up[i], k, co, co, 3, 1, 1));
        }
    }
    DC_TRY(mid_add(ps, &d->mid, "decoder", c->ch[n - 1], c));
    DC_TRY(dc_group_norm_add(ps, &d->norm_out, "decoder.conv_norm_out", c->ch[0], c->groups, c->eps));
    return dc_conv2d_add_nhwc(ps, &d->conv_out, "decoder.conv_out", c->ch[0], c->out_channels, 3, 1, 1);
}

int dc_vae_create(dc_vae **out, const dc_vae_config *c, dc_backend *be, dc_dtype loaded, bool encoder,
                  bool decoder) {
    *out = NULL;
    DC_TRY(dc_vae_config_validate(c));
    if (!encoder && !decoder) return dc_fail("VAE: neither the encoder nor the decoder was asked for");
    dc_vae *m = calloc(1, sizeof *m);
    if (!m || !(m->mods = calloc(1, sizeof *m->mods))) return free(m), dc_fail("out of memory");
    m->cfg = *c, m->be = be, m->has_encoder = encoder, m->has_decoder = decoder;
    dc_params *ps = &m->params;
    dc_vae_modules *md = m->mods;
    int L2 = 2 * c->latent_channels;
    if ((encoder && encoder_add(ps, &md->enc, c)) || (decoder && decoder_add(ps, &md->dec, c)) ||
        (encoder && dc_conv2d_add_nhwc(ps, &md->quant_conv, "quant_conv", L2, L2, 1, 1, 0)) ||
        (decoder && dc_conv2d_add_nhwc(ps, &md->post_quant_conv, "post_quant_conv", c->latent_channels,
                                  c->latent_channels, 1, 1, 0)) ||
        dc_params_alloc_frozen(ps, be, loaded)) {
        dc_vae_free(m);
        return dc_fail_ctx("VAE");
    }
    *out = m;
    return 0;
}

// ---- loading

typedef struct {
    const dc_vae_config *cfg;
    const dc_weights *w;
} name_ctx;

static int map_original(void *ctx, const char *param, dc_weight_src *src) {
    return dc_vae_original_name(((name_ctx *)ctx)->cfg, param, src);
}

// diffusers' own names, or those of files from before diffusers 0.14, whose
// attention was query / key / value / proj_attn.
static int map_diffusers(void *ctx, const char *param, dc_weight_src *src) {
    const name_ctx *x = ctx;
    memset(src, 0, sizeof *src);
    snprintf(src->name, sizeof src->name, "%s", param);
    if (dc_weights_has(x->w, param)) return 0;
    static const char *const now[] = {".to_q.", ".to_k.", ".to_v.", ".to_out.0."};
    static const char *const old[] = {".query.", ".key.", ".value.", ".proj_attn."};
    for (int i = 0; i < 4; i++) {
        const char *at = strstr(param, now[i]);
        if (!at) continue;
        char alt[160];
        snprintf(alt, sizeof alt, "%.*s%s%s", (int)(at - param), param, old[i], at + strlen(now[i]));
        if (dc_weights_has(x->w, alt)) snprintf(src->name, sizeof src->name, "%s", alt);
    }
    return 0;  // absent under both names: the loader names the current one
}

int dc_vae_load(dc_vae *m, const dc_weights *w, dc_names names) {
    name_ctx x = {&m->cfg, w};
    if (dc_params_load_weights(&m->params, w, names == DC_NAMES_ORIGINAL ? map_original : map_diffusers, &x))
        return dc_fail_ctx("loading the VAE");
    return 0;
}

void dc_vae_free(dc_vae *m) {
    if (!m) return;
    dc_vae_release(m);
    dc_params_free(&m->params);
    free(m->mods);
    free(m);
}
