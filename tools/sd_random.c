// Random-weight Stable Diffusion models in the layouts people have them, so
// the loaders run on real names and shapes without shipping or downloading
// weights: a diffusers pipeline folder (model_index.json, unet/, vae/,
// text_encoder/ with transformers 4 names, scheduler/), or a single-file
// checkpoint in the original layout (OpenAI CLIP names for SD 1.x, OpenCLIP
// with packed q/k/v for SD 2.x). Both layouts of one config and seed hold the
// same values; the SD 2 single file's text encoder has one layer more than
// the folder's (as real files do), which SD 2 skips. A folder gets tokenizer/
// as CLIP's tokenizer files are (vocab.json, merges.txt, the special tokens;
// SD 2 pads with "!"), made from OpenAI's vocabulary (--vocab, default the
// repository's data/bpe_simple_vocab_16e6.txt.gz), so it runs as a real one.
//
// --config t2i-demo writes the base a text-to-image model is trained from
// scratch on: a diffusers folder with tokenizer/, a small CLIP text encoder
// (width 128, 4 layers of 4 heads, MLP 512, 77 positions, CLIP's 49408
// tokens) initialised as transformers initialises CLIPTextModel, DDPM's
// linear schedule in scheduler/, and neither a UNet (it is trained from a
// config) nor a VAE (it draws pixels): model_index.json names both null.
//
// --config tiny-pixel is tiny1 without a VAE: its UNet draws 16x16 pictures.
//
//   sd_random --config sd1.5|sd2.1|tiny1|tiny2|tiny-pixel|t2i-demo --layout diffusers|single
//             [--dtype f16|bf16|f32] [--seed N] [--vocab BPE] --out PATH
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/rng.h"
#include "models/clip_text.h"
#include "models/unet.h"
#include "models/vae.h"
#include "nn/weights.h"

typedef struct {
    dc_unet_config unet;
    dc_vae_config vae;
    dc_clip_text_config text;  // as the single file holds it
    int version;
    bool has_unet, has_vae;    // (a folder without one names it null in model_index.json)
    bool ddpm;                 // DDPM's linear schedule, transformers' text encoder init (t2i-demo)
} sd_config;

static int config_of(const char *name, sd_config *c) {
    memset(c, 0, sizeof *c);
    dc_unet_config_sd15(&c->unet);
    dc_vae_config v = {3, 3, 4, 4, {128, 256, 512, 512}, 2, 32, 1e-6f, 0.18215f};
    c->vae = v;
    dc_clip_text_config t = {49408, 77, 768, 12, 12, 3072, DC_ACT_QUICK_GELU, 1e-5f};
    c->text = t;
    c->version = 1;
    c->has_unet = c->has_vae = true;
    bool two = !strcmp(name, "sd2.1") || !strcmp(name, "tiny2");
    if (two) {
        c->version = 2;
        c->unet.ctx_dim = 1024, c->unet.linear_proj = true, c->unet.sample_size = 96;
        c->unet.prediction = DC_PRED_V;
        const int heads[4] = {5, 10, 20, 20};
        for (int i = 0; i < 4; i++) c->unet.heads[i] = heads[i];
        c->text.width = 1024, c->text.heads = 16, c->text.layers = 24, c->text.ffn = 4096;
        c->text.act = DC_ACT_GELU_ERF;
    }
    const bool pixel = !strcmp(name, "tiny-pixel");
    if (!strncmp(name, "tiny", 4)) {  // the real topology, small: 32x32 pictures in seconds on a CPU
        c->unet.nblocks = 2;
        c->unet.ch[0] = 64, c->unet.ch[1] = 128;
        c->unet.attn[0] = true, c->unet.attn[1] = false;
        c->unet.heads[0] = 1, c->unet.heads[1] = 2;  // heads of 64, as inference from shapes assumes
        c->unet.layers = two ? 1 : 2;
        c->unet.ctx_dim = 64;
        c->unet.sample_size = 8;
        dc_vae_config tv = {3, 3, 4, 3, {32, 32, 64}, 1, 32, 1e-6f, 0.18215f};
        c->vae = tv;
        c->text.width = 64, c->text.heads = 1, c->text.ffn = 128, c->text.layers = two ? 3 : 2;
        if (pixel) {  // tiny1 drawing 16x16 pictures itself (no VAE)
            c->has_vae = false;
            c->unet.in_channels = c->unet.out_channels = 3, c->unet.sample_size = 16;
        }
        return pixel || !strcmp(name, "tiny1") || two ? 0 : dc_fail("--config %s: no such config", name);
    }
    if (!strcmp(name, "t2i-demo")) {
        dc_clip_text_config demo = {49408, 77, 128, 4, 4, 512, DC_ACT_QUICK_GELU, 1e-5f};
        c->text = demo;
        c->has_unet = c->has_vae = false, c->ddpm = true;
        return 0;
    }
    if (!strcmp(name, "sd1.5") || !strcmp(name, "sd2.1")) return 0;
    return dc_fail("--config %s: choose sd1.5, sd2.1, tiny1, tiny2, tiny-pixel or t2i-demo",
                   name);
}

// Normal(0, 1/fan_in) for matrices, 1 + N(0, 0.1) for norm scales, N(0, 0.05)
// for biases: finite activations through every layer.
static void fill(dc_params *ps, uint64_t seed, uint32_t salt) {
    for (int i = 0; i < ps->count; i++) {
        const dc_param *p = &ps->items[i];
        float *h = malloc(sizeof(float) * (size_t)p->numel);
        int64_t fan = p->ndim >= 2 ? p->numel / p->shape[0] : 1;
        bool bias = strstr(p->name, "bias") != NULL;
        for (int64_t j = 0; j < p->numel; j++) {
            float n = dc_randn_at(seed, salt, (uint32_t)i, DC_STREAM_INIT, (uint64_t)j);
            h[j] = p->ndim >= 2 ? n / sqrtf((float)fan) : bias ? 0.05f * n : 1.0f + 0.1f * n;
        }
        ps->be->upload(ps->be, dc_param_data(ps, i).p, h, sizeof(float) * (size_t)p->numel);
        free(h);
    }
}

// A CLIP text encoder as transformers initialises one (CLIPPreTrainedModel.
// _init_weights in transformers/models/clip/modeling_clip.py, with
// initializer_factor 1): embeddings N(0, 0.02); q, k, v projections
// N(0, d^-0.5 (2L)^-0.5), the output projection N(0, d^-0.5); the MLP's fc1
// N(0, (2d)^-0.5) and fc2 N(0, d^-0.5 (2L)^-0.5); LayerNorms 1 and 0; every
// bias 0 (d the width, L the layers).
static void fill_clip_init(dc_params *ps, const dc_clip_text_config *c, uint64_t seed) {
    const double d = c->width, L = c->layers;
    const double proj = 1 / sqrt(d) / sqrt(2 * L), out = 1 / sqrt(d), fc1 = 1 / sqrt(2 * d);
    for (int i = 0; i < ps->count; i++) {
        const dc_param *p = &ps->items[i];
        const char *n = p->name;
        double std = 0, one = 0;  // values N(0, std^2) + one
        if (strstr(n, "embedding.weight")) std = 0.02;
        else if (strstr(n, "_proj.weight")) std = strstr(n, "out_proj") ? out : proj;
        else if (strstr(n, "fc1.weight")) std = fc1;
        else if (strstr(n, "fc2.weight")) std = proj;
        else if (strstr(n, "layer_norm") && strstr(n, ".weight")) one = 1;
        float *h = malloc(sizeof(float) * (size_t)p->numel);
        for (int64_t j = 0; j < p->numel; j++)
            h[j] = (float)(one + std * dc_randn_at(seed, 3, (uint32_t)i, DC_STREAM_INIT, (uint64_t)j));
        ps->be->upload(ps->be, dc_param_data(ps, i).p, h, sizeof(float) * (size_t)p->numel);
        free(h);
    }
}

// The tensors being written: names and data converted to the file's dtype.
typedef struct {
    dc_st_entry *e;
    char (*names)[160];
    void **bufs;
    int n, cap;
    dc_dtype dt;
} writer;

static void *convert(const float *h, int64_t n, dc_dtype dt) {
    if (dt == DC_F32) {
        float *o = malloc(sizeof(float) * (size_t)n);
        memcpy(o, h, sizeof(float) * (size_t)n);
        return o;
    }
    uint16_t *o = malloc(sizeof(uint16_t) * (size_t)n);
    for (int64_t j = 0; j < n; j++) o[j] = dt == DC_BF16 ? dc_f32_to_bf16(h[j]) : dc_f32_to_f16(h[j]);
    return o;
}

static void add(writer *w, const char *name, int ndim, const int64_t *shape, const float *h) {
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 256;
        w->e = realloc(w->e, sizeof *w->e * w->cap);
        w->names = realloc(w->names, sizeof *w->names * w->cap);
        w->bufs = realloc(w->bufs, sizeof *w->bufs * w->cap);
    }
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    snprintf(w->names[w->n], 160, "%s", name);
    w->bufs[w->n] = convert(h, n, w->dt);
    dc_st_entry *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    e->dtype = w->dt, e->ndim = ndim, e->data = w->bufs[w->n];
    memcpy(e->shape, shape, sizeof(int64_t) * (size_t)ndim);
    w->n++;
}

static int flush(writer *w, const char *path) {
    for (int i = 0; i < w->n; i++) w->e[i].name = w->names[i];
    int rc = dc_st_write(path, w->e, w->n, NULL, NULL, 0);
    for (int i = 0; i < w->n; i++) free(w->bufs[i]);
    w->n = 0;
    return rc;
}

static float *host_of(const dc_params *ps, int i) {
    const dc_param *p = &ps->items[i];
    float *h = malloc(sizeof(float) * (size_t)p->numel);
    ps->be->download(ps->be, h, dc_param_data(ps, i).p, sizeof(float) * (size_t)p->numel);
    return h;
}

typedef int (*name_fn)(const void *cfg, const char *param, dc_weight_src *src);

static int unet_name(const void *cfg, const char *param, dc_weight_src *src) {
    return dc_unet_weight_map((void *)cfg, param, src);
}
static int vae_name(const void *cfg, const char *param, dc_weight_src *src) {
    return dc_vae_original_name(cfg, param, src);
}
static int clip_name(const void *cfg, const char *param, dc_weight_src *src) {
    return dc_clip_text_openclip_name((void *)cfg, param, src);
}

// Adds every parameter (those of text layers >= max_layer left out) under
// prefix + its name (names NULL) or its mapped original name; parameters
// mapped to rows of one tensor are packed in row order; the original VAE's
// attention projections are 1x1 convolutions.
static int add_params(writer *w, const dc_params *ps, const char *prefix, name_fn names, const void *cfg,
                      int max_layer) {
    for (int i = 0; i < ps->count; i++) {
        const dc_param *p = &ps->items[i];
        int layer;
        if (sscanf(p->name, "encoder.layers.%d.", &layer) == 1 && layer >= max_layer) continue;
        dc_weight_src src = {{0}, 0, 0};
        if (names) DC_TRY(names(cfg, p->name, &src));
        else snprintf(src.name, sizeof src.name, "%s", p->name);
        char full[256];
        snprintf(full, sizeof full, "%s%s", prefix, src.name);
        int64_t shape[DC_MAX_DIMS];
        memcpy(shape, p->shape, sizeof shape);
        int ndim = p->ndim;
        if (names == vae_name && strstr(src.name, "mid.attn_1.") && ndim == 2) shape[2] = shape[3] = 1, ndim = 4;
        float *h = host_of(ps, i);
        if (src.rows) {  // packed: gather every parameter of this tensor, in row order
            bool first = src.row0 == 0;
            if (!first) {
                free(h);
                continue;
            }
            int64_t row = p->numel / p->shape[0], total = 0;
            float *all = NULL;
            for (int k = 0; k < ps->count; k++) {
                dc_weight_src s2 = {{0}, 0, 0};
                if (names(cfg, ps->items[k].name, &s2) || strcmp(s2.name, src.name)) continue;
                total = s2.row0 + s2.rows > total ? s2.row0 + s2.rows : total;
                all = realloc(all, sizeof(float) * (size_t)(total * row));
                float *hk = host_of(ps, k);
                memcpy(all + s2.row0 * row, hk, sizeof(float) * (size_t)(s2.rows * row));
                free(hk);
            }
            shape[0] = total;
            add(w, full, ndim, shape, all);
            free(all);
        } else {
            add(w, full, ndim, shape, h);
        }
        free(h);
    }
    return 0;
}

static int write_text(const char *path, const char *text) {
    dc_atomic_file *af = dc_atomic_begin(path);
    if (!af) return -1;
    fputs(text, dc_atomic_stream(af));
    return dc_atomic_end(af, 1);
}

static void ints(char *b, size_t cap, const int *v, int n) {
    size_t k = (size_t)snprintf(b, cap, "[");
    for (int i = 0; i < n; i++) k += (size_t)snprintf(b + k, cap - k, "%s%d", i ? ", " : "", v[i]);
    snprintf(b + k, cap - k, "]");
}

static int write_text_config(const char *out, const dc_clip_text_config *x, int text_layers) {
    char p[4200], t[1024];
    snprintf(t, sizeof t,
             "{\n  \"architectures\": [\"CLIPTextModel\"],\n  \"model_type\": \"clip_text_model\",\n"
             "  \"vocab_size\": %d,\n  \"max_position_embeddings\": %d,\n  \"hidden_size\": %d,\n"
             "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n  \"intermediate_size\": %d,\n"
             "  \"hidden_act\": \"%s\",\n  \"layer_norm_eps\": 1e-05\n}\n",
             x->vocab, x->positions, x->width, text_layers, x->heads, x->ffn,
             x->act == DC_ACT_QUICK_GELU ? "quick_gelu" : "gelu");
    snprintf(p, sizeof p, "%s/text_encoder/config.json", out);
    return write_text(p, t);
}

static int write_unet_config(const char *out, const dc_unet_config *u) {
    char p[4200], t[4096], ch[128], heads[128], types_d[256] = "[", types_u[256] = "[";
    ints(ch, sizeof ch, u->ch, u->nblocks);
    ints(heads, sizeof heads, u->heads, u->nblocks);
    for (int i = 0; i < u->nblocks; i++) {
        strcat(types_d, i ? ", " : ""), strcat(types_u, i ? ", " : "");
        strcat(types_d, u->attn[i] ? "\"CrossAttnDownBlock2D\"" : "\"DownBlock2D\"");
        strcat(types_u, u->attn[u->nblocks - 1 - i] ? "\"CrossAttnUpBlock2D\"" : "\"UpBlock2D\"");
    }
    strcat(types_d, "]"), strcat(types_u, "]");
    snprintf(t, sizeof t,
             "{\n  \"_class_name\": \"UNet2DConditionModel\",\n  \"in_channels\": %d,\n  \"out_channels\": %d,\n"
             "  \"block_out_channels\": %s,\n  \"layers_per_block\": %d,\n  \"down_block_types\": %s,\n"
             "  \"up_block_types\": %s,\n  \"attention_head_dim\": %s,\n  \"cross_attention_dim\": %d,\n"
             "  \"norm_num_groups\": 32,\n  \"norm_eps\": 1e-05,\n  \"use_linear_projection\": %s,\n"
             "  \"sample_size\": %d\n}\n",
             u->in_channels, u->out_channels, ch, u->layers, types_d, types_u, heads, u->ctx_dim,
             u->linear_proj ? "true" : "false", u->sample_size);
    snprintf(p, sizeof p, "%s/unet/config.json", out);
    return write_text(p, t);
}

static int write_vae_config(const char *out, const dc_vae_config *v) {
    char p[4200], t[4096], ch[128];
    ints(ch, sizeof ch, v->ch, v->nblocks);
    char down[256] = "[", up[256] = "[";
    for (int i = 0; i < v->nblocks; i++)
        strcat(down, i ? ", \"DownEncoderBlock2D\"" : "\"DownEncoderBlock2D\""),
            strcat(up, i ? ", \"UpDecoderBlock2D\"" : "\"UpDecoderBlock2D\"");
    strcat(down, "]"), strcat(up, "]");
    snprintf(t, sizeof t,
             "{\n  \"_class_name\": \"AutoencoderKL\",\n  \"in_channels\": 3,\n  \"out_channels\": 3,\n"
             "  \"latent_channels\": 4,\n  \"block_out_channels\": %s,\n  \"layers_per_block\": %d,\n"
             "  \"down_block_types\": %s,\n  \"up_block_types\": %s,\n  \"norm_num_groups\": 32,\n"
             "  \"scaling_factor\": 0.18215\n}\n",
             ch, v->layers_per_block, down, up);
    snprintf(p, sizeof p, "%s/vae/config.json", out);
    return write_text(p, t);
}

// scheduler/scheduler_config.json and model_index.json: SD's PNDM on the
// scaled-linear ladder, or (ddpm) DDPM's linear betas as diffusers'
// DDPMScheduler defaults them; unet/ and vae/ named, or null where absent.
static int write_pipeline(const char *out, const sd_config *c) {
    char p[4200], t[1024];
    if (c->ddpm)
        snprintf(t, sizeof t,
                 "{\n  \"_class_name\": \"DDPMScheduler\",\n  \"beta_start\": 0.0001,\n  \"beta_end\": 0.02,\n"
                 "  \"beta_schedule\": \"linear\",\n  \"num_train_timesteps\": 1000,\n  \"clip_sample\": false,\n"
                 "  \"prediction_type\": \"epsilon\"\n}\n");
    else
        snprintf(t, sizeof t,
                 "{\n  \"_class_name\": \"PNDMScheduler\",\n  \"beta_start\": 0.00085,\n  \"beta_end\": 0.012,\n"
                 "  \"beta_schedule\": \"scaled_linear\",\n  \"num_train_timesteps\": 1000,\n  \"steps_offset\": 1,\n"
                 "  \"set_alpha_to_one\": false,\n  \"clip_sample\": false,\n  \"skip_prk_steps\": true,\n"
                 "  \"prediction_type\": \"%s\"\n}\n", c->unet.prediction == DC_PRED_V ? "v_prediction" : "epsilon");
    snprintf(p, sizeof p, "%s/scheduler/scheduler_config.json", out);
    DC_TRY(write_text(p, t));
    snprintf(t, sizeof t,
             "{\n  \"_class_name\": \"StableDiffusionPipeline\",\n"
             "  \"scheduler\": [\"diffusers\", \"%s\"],\n"
             "  \"text_encoder\": [\"transformers\", \"CLIPTextModel\"],\n"
             "  \"tokenizer\": [\"transformers\", \"CLIPTokenizer\"],\n"
             "  \"unet\": %s,\n  \"vae\": %s\n}\n",
             c->ddpm ? "DDPMScheduler" : "PNDMScheduler",
             c->has_unet ? "[\"diffusers\", \"UNet2DConditionModel\"]" : "[null, null]",
             c->has_vae ? "[\"diffusers\", \"AutoencoderKL\"]" : "[null, null]");
    snprintf(p, sizeof p, "%s/model_index.json", out);
    return write_text(p, t);
}

// ---- tokenizer/: OpenAI's BPE file in transformers' form -----------------------------------

#define CLIP_MERGES (49152 - 256 - 2)  // the merges simple_tokenizer.py uses

// bytes_to_unicode(): each byte's printable stand-in, in OpenAI's order
// (printable bytes as themselves, then the rest from U+0100 on), as UTF-8.
static void byte_symbols(char sym[256][4]) {
    int order[256], n = 0, extra = 0;
    bool printable[256] = {false};
    for (int b = 0; b < 256; b++)
        if ((b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae) printable[b] = true, order[n++] = b;
    for (int b = 0; b < 256; b++)
        if (!printable[b]) order[n++] = b;
    for (int i = 0; i < 256; i++) {
        int b = order[i];
        unsigned cp = printable[b] ? (unsigned)b : 256u + (unsigned)extra++;
        char *s = sym[i];
        if (cp < 0x80) s[0] = (char)cp, s[1] = 0;
        else s[0] = (char)(0xc0 | cp >> 6), s[1] = (char)(0x80 | (cp & 0x3f)), s[2] = 0;
    }
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

// vocab.json (token -> id: the byte symbols, the same with </w>, each merge
// joined, <|startoftext|>, <|endoftext|>), merges.txt and the special tokens
// into dir/tokenizer/, from the BPE file at bpe.
static int write_tokenizer(const char *dir, const char *bpe, int version) {
    gzFile gz = gzopen(bpe, "rb");
    if (!gz) return dc_fail("%s: cannot open the CLIP vocabulary (give --vocab)", bpe);
    size_t cap = 1 << 22, len = 0;
    char *text = malloc(cap);
    int got;
    while (text && (got = gzread(gz, text + len, (unsigned)(cap - len - 1))) > 0)
        if ((len += (size_t)got) == cap - 1) text = realloc(text, cap *= 2);
    gzclose(gz);
    if (!text) return dc_fail("out of memory");
    text[len] = 0;
    static char *merges[CLIP_MERGES];
    char *line = strchr(text, '\n');  // the first line is a header
    int n = 0;
    while (line && n < CLIP_MERGES) {
        char *next = strchr(++line, '\n');
        if (next) *next = 0;
        if (!strchr(line, ' ')) break;
        merges[n++] = line;
        line = next;
    }
    if (n < CLIP_MERGES) return free(text), dc_fail("%s: %d merges, not OpenAI's vocabulary", bpe, n);
    char path[4200], sym[256][4];
    byte_symbols(sym);
    snprintf(path, sizeof path, "%s/tokenizer", dir);
    int rc = dc_mkdir_p(path);
    snprintf(path, sizeof path, "%s/tokenizer/vocab.json", dir);
    dc_atomic_file *af = rc ? NULL : dc_atomic_begin(path);
    if (af) {
        FILE *f = dc_atomic_stream(af);
        int id = 0;
        fputc('{', f);
        for (int i = 0; i < 256; i++) json_string(f, sym[i]), fprintf(f, ": %d, ", id++);
        for (int i = 0; i < 256; i++) {
            char end[16];
            snprintf(end, sizeof end, "%s</w>", sym[i]);
            json_string(f, end), fprintf(f, ": %d, ", id++);
        }
        for (int i = 0; i < n; i++) {
            char joined[256];
            size_t a = strcspn(merges[i], " ");
            snprintf(joined, sizeof joined, "%.*s%s", (int)a, merges[i], merges[i] + a + 1);
            json_string(f, joined), fprintf(f, ": %d, ", id++);
        }
        fprintf(f, "\"<|startoftext|>\": %d, \"<|endoftext|>\": %d}\n", id, id + 1);
        rc = dc_atomic_end(af, 1);
    } else {
        rc = -1;
    }
    snprintf(path, sizeof path, "%s/tokenizer/merges.txt", dir);
    af = rc ? NULL : dc_atomic_begin(path);
    if (af) {
        FILE *f = dc_atomic_stream(af);
        fputs("#version: 0.2\n", f);
        for (int i = 0; i < n; i++) fprintf(f, "%s\n", merges[i]);
        rc = dc_atomic_end(af, 1);
    } else {
        rc = -1;
    }
    free(text);
    // SD 2's tokenizer pads with "!" (id 0), SD 1's with <|endoftext|>.
    const char *pad = version == 2 ? "!" : "<|endoftext|>";
    char t[512];
    snprintf(t, sizeof t,
             "{\n  \"bos_token\": \"<|startoftext|>\",\n  \"eos_token\": \"<|endoftext|>\",\n"
             "  \"pad_token\": \"%s\",\n  \"unk_token\": \"<|endoftext|>\"\n}\n", pad);
    snprintf(path, sizeof path, "%s/tokenizer/special_tokens_map.json", dir);
    if (!rc) rc = write_text(path, t);
    snprintf(t, sizeof t,
             "{\n  \"tokenizer_class\": \"CLIPTokenizer\",\n  \"model_max_length\": 77,\n"
             "  \"do_lower_case\": true,\n  \"errors\": \"replace\",\n  \"pad_token\": \"%s\"\n}\n", pad);
    snprintf(path, sizeof path, "%s/tokenizer/tokenizer_config.json", dir);
    if (!rc) rc = write_text(path, t);
    return rc;
}

static int run(const char *config, const char *layout, const char *dtype, uint64_t seed, const char *vocab,
               const char *out) {
    sd_config c;
    DC_TRY(config_of(config, &c));
    bool single = !strcmp(layout, "single");
    if (!single && strcmp(layout, "diffusers")) return dc_fail("--layout %s: diffusers or single", layout);
    if (single && !c.has_unet) return dc_fail("--config %s has no UNet: only --layout diffusers", config);
    writer w = {0};
    w.dt = !strcmp(dtype, "f16") ? DC_F16 : !strcmp(dtype, "bf16") ? DC_BF16 : DC_F32;
    if (w.dt == DC_F32 && strcmp(dtype, "f32")) return dc_fail("--dtype %s: f16, bf16 or f32", dtype);
    dc_backend *be = dc_backend_cpu_create();
    dc_model *unet = NULL;
    dc_vae *vae = NULL;
    dc_clip_text *text = NULL;
    int rc = c.has_unet ? dc_unet_new(&c.unet, be, DC_F32, 8, 8, &unet) : 0;
    if (!rc && c.has_vae) rc = dc_vae_create(&vae, &c.vae, be, DC_F32, true, true);
    if (!rc) rc = dc_clip_text_create(&text, &c.text, be, DC_F32);
    if (!rc) {
        if (unet) fill(&dc_unet_of(unet)->params, seed, 1);
        if (vae) fill(&vae->params, seed, 2);
        if (c.ddpm) fill_clip_init(&text->params, &c.text, seed);
        else fill(&text->params, seed, 3);
    }
    // SD 2's encoder: all layers in the single file, one fewer in the folder.
    const int text_layers = c.version == 2 && !single ? c.text.layers - 1 : c.text.layers;
    char path[4200];
    if (!rc && single) {
        rc = add_params(&w, &dc_unet_of(unet)->params, "model.diffusion_model.", unet_name, &dc_unet_of(unet)->cfg,
                        1 << 30);
        if (!rc && vae) rc = add_params(&w, &vae->params, "first_stage_model.", vae_name, &vae->cfg, 1 << 30);
        if (!rc && c.version == 2)
            rc = add_params(&w, &text->params, "cond_stage_model.model.", clip_name, &text->cfg, 1 << 30);
        else if (!rc)
            rc = add_params(&w, &text->params, "cond_stage_model.transformer.text_model.", NULL, NULL, 1 << 30);
        if (!rc) rc = flush(&w, out);
    } else if (!rc) {
        const char *dirs[] = {"text_encoder", "scheduler", unet ? "unet" : NULL, vae ? "vae" : NULL};
        for (int i = 0; i < 4 && !rc; i++) {
            snprintf(path, sizeof path, "%s/%s", out, dirs[i] ? dirs[i] : "");
            if (dirs[i]) rc = dc_mkdir_p(path);
        }
        if (!rc && unet) rc = write_unet_config(out, &c.unet);
        if (!rc && vae) rc = write_vae_config(out, &c.vae);
        if (!rc) rc = write_text_config(out, &c.text, text_layers);
        if (!rc) rc = write_pipeline(out, &c);
        if (!rc) rc = write_tokenizer(out, vocab, c.version);
        snprintf(path, sizeof path, "%s/unet/diffusion_pytorch_model.safetensors", out);
        if (!rc && unet) rc = add_params(&w, &dc_unet_of(unet)->params, "", NULL, NULL, 1 << 30);
        if (!rc && unet) rc = flush(&w, path);
        snprintf(path, sizeof path, "%s/vae/diffusion_pytorch_model.safetensors", out);
        if (!rc && vae) rc = add_params(&w, &vae->params, "", NULL, NULL, 1 << 30);
        if (!rc && vae) rc = flush(&w, path);
        snprintf(path, sizeof path, "%s/text_encoder/model.safetensors", out);
        if (!rc) rc = add_params(&w, &text->params, "text_model.", NULL, NULL, text_layers);  // transformers 4
        if (!rc) rc = flush(&w, path);
    }
    free(w.e), free(w.names), free(w.bufs);
    dc_model_free(unet);
    if (vae) dc_vae_free(vae);
    if (text) dc_clip_text_free(text);
    dc_backend_destroy(be);
    return rc;
}

int main(int argc, char **argv) {
    const char *config = NULL, *layout = "diffusers", *dtype = "f16", *out = NULL;
    const char *vocab = "data/bpe_simple_vocab_16e6.txt.gz";
    uint64_t seed = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--config")) config = argv[i + 1];
        else if (!strcmp(argv[i], "--layout")) layout = argv[i + 1];
        else if (!strcmp(argv[i], "--dtype")) dtype = argv[i + 1];
        else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--out")) out = argv[i + 1];
        else if (!strcmp(argv[i], "--vocab")) vocab = argv[i + 1];
        else return fprintf(stderr, "sd_random: unknown flag %s\n", argv[i]), 2;
    }
    if (!config || !out || argc % 2 == 0) {
        fprintf(stderr, "usage: sd_random --config sd1.5|sd2.1|tiny1|tiny2|tiny-pixel|t2i-demo --layout diffusers|single "
                        "[--dtype f16|bf16|f32] [--seed N] [--vocab BPE] --out PATH\n");
        return 2;
    }
    if (run(config, layout, dtype, seed, vocab, out)) {
        fprintf(stderr, "sd_random: %s\n", dc_error());
        return 1;
    }
    return 0;
}
