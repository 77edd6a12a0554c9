// diffusion forward --component: one Stable Diffusion component on tensors
// from a file, the way to check it against diffusers / transformers.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "models/unet.h"
#include "pipelines/sd.h"

#define MAX_OUT 2

typedef struct {
    dc_backend *be;
    const dc_st_file *in;
    void *bufs[16];
    int nbufs;
    float *host[16];
    int nhost;
} fwd_ctx;

static dc_buf dev(fwd_ctx *c, dc_dtype dt, int64_t n) {
    dc_buf b = {0};
    if (dc_buf_alloc(c->be, &b, dt, (size_t)n, "forward tensor") == 0) c->bufs[c->nbufs++] = b.p;
    return b;
}

static float *host(fwd_ctx *c, int64_t n) {
    float *h = malloc(sizeof(float) * (size_t)n + 1);
    if (h) c->host[c->nhost++] = h;
    else dc_fail("out of memory");
    return h;
}

// Input tensor `name` with rank `ndim` and the dimensions of want (-1: any),
// as finite f32 values in a new host array.
static float *input(fwd_ctx *c, const char *name, int ndim, const int64_t *want, const dc_st_tensor **out) {
    const dc_st_tensor *t = dc_st_find(c->in, name);
    if (!t) return dc_fail("%s: needs a tensor '%s'", c->in->path, name), NULL;
    bool ok = t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = want[d] < 0 || t->shape[d] == want[d];
    if (!ok) {
        char w[128] = "";
        for (int d = 0; d < ndim; d++) {
            size_t k = strlen(w);
            if (want[d] < 0) snprintf(w + k, sizeof w - k, "%s*", d ? ", " : "");
            else snprintf(w + k, sizeof w - k, "%s%lld", d ? ", " : "", (long long)want[d]);
        }
        return dc_fail("%s: '%s' must have shape [%s] (*: any size)", c->in->path, name, w), NULL;
    }
    float *h = host(c, t->numel);
    if (!h) return NULL;
    if (t->dtype == DC_I64 || t->dtype == DC_I32 || t->dtype == DC_I16 || t->dtype == DC_U8 || t->dtype == DC_I8) {
        int64_t *i = malloc(sizeof(int64_t) * (size_t)t->numel + 1);
        if (!i || dc_st_read_i64(c->in, t, i)) return free(i), (float *)NULL;
        for (int64_t k = 0; k < t->numel; k++) h[k] = (float)i[k];
        free(i);
    } else if (dc_st_read_f32(c->in, t, h)) {
        return NULL;
    }
    for (int64_t k = 0; k < t->numel; k++)
        if (!isfinite(h[k]))
            return dc_fail("%s: '%s' element %lld is not finite", c->in->path, name, (long long)k), NULL;
    *out = t;
    return h;
}

// Host f32 to a backend buffer of dtype dt.
static dc_buf upload(fwd_ctx *c, const float *h, int64_t n, dc_dtype dt) {
    dc_buf f = dev(c, DC_F32, n);
    if (!f.p) return f;
    c->be->upload(c->be, f.p, h, sizeof(float) * (size_t)n);
    if (dt == DC_F32) return f;
    dc_buf b = dev(c, dt, n);
    if (b.p) c->be->cast(c->be, b, f, n);
    return b;
}

static int download(fwd_ctx *c, float *h, dc_buf b, int64_t n) {
    dc_buf f = b;
    if (b.dt != DC_F32) {
        f = dev(c, DC_F32, n);
        if (!f.p) return -1;
        c->be->cast(c->be, f, b, n);
    }
    c->be->download(c->be, h, f.p, sizeof(float) * (size_t)n);
    return dc_backend_status(c->be);
}

typedef struct {
    const char *name;
    int ndim;
    int64_t shape[4];
    float *data;
} out_tensor;

static int run_text(fwd_ctx *c, dc_sd_source *s, out_tensor *o, int *nout) {
    dc_clip_text *m;
    int skip;
    DC_TRY(dc_sd_load_text(s, c->be, &skip, &m));
    const dc_st_tensor *t;
    const int T = m->cfg.positions, W = m->cfg.width;
    float *ids = input(c, "ids", 2, (int64_t[]){-1, T}, &t);
    int rc = ids ? 0 : -1;
    int N = ids ? (int)t->shape[0] : 0;
    int32_t *i32 = NULL;
    if (!rc && !(i32 = malloc(sizeof(int32_t) * (size_t)N * T + 1))) rc = dc_fail("out of memory");
    for (int64_t k = 0; !rc && k < (int64_t)N * T; k++) i32[k] = (int32_t)ids[k];
    if (!rc) rc = dc_clip_text_check_ids(i32, (int64_t)N * T, m->cfg.vocab);
    dc_buf di = rc ? dc_buf_none() : dev(c, DC_I32, (int64_t)N * T);
    dc_buf hid = rc || !di.p ? dc_buf_none() : dev(c, c->be->compute, (int64_t)N * T * W);
    dc_buf pen = rc || !hid.p ? dc_buf_none() : dev(c, c->be->compute, (int64_t)N * T * W);
    if (!rc && !pen.p) rc = -1;
    if (!rc) rc = dc_clip_text_reserve(m, N);
    if (!rc) {
        c->be->upload(c->be, di.p, i32, sizeof(int32_t) * (size_t)N * T);
        rc = dc_clip_text_forward(m, hid, pen, di, N, 0);  // the model as stored: all its layers
    }
    o[0] = (out_tensor){"hidden", 3, {N, T, W}, rc ? NULL : host(c, (int64_t)N * T * W)};
    o[1] = (out_tensor){"penultimate", 3, {N, T, W}, rc ? NULL : host(c, (int64_t)N * T * W)};
    if (!rc && (!o[0].data || !o[1].data)) rc = -1;
    if (!rc) rc = download(c, o[0].data, hid, (int64_t)N * T * W);
    if (!rc) rc = download(c, o[1].data, pen, (int64_t)N * T * W);
    *nout = 2;
    free(i32);
    dc_clip_text_free(m);
    return rc;
}

static int run_vae(fwd_ctx *c, dc_sd_source *s, bool encode, out_tensor *o, int *nout) {
    dc_vae *m;
    DC_TRY(dc_sd_load_vae(s, c->be, encode, !encode, &m));
    const int f = dc_vae_factor(&m->cfg), L = m->cfg.latent_channels;
    const dc_st_tensor *t;
    float *x = encode ? input(c, "image", 4, (int64_t[]){-1, m->cfg.in_channels, -1, -1}, &t)
                      : input(c, "z", 4, (int64_t[]){-1, L, -1, -1}, &t);
    int rc = x ? 0 : -1;
    int N = 0, H = 0, W = 0;
    if (!rc) {
        N = (int)t->shape[0], H = (int)t->shape[2], W = (int)t->shape[3];
        if (encode && (H % f || W % f)) rc = dc_fail("%s: 'image' %dx%d is not a multiple of the VAE's factor %d",
                                                     c->in->path, H, W, f);
    }
    const int iH = encode ? H : H * f, iW = encode ? W : W * f, lh = iH / f, lw = iW / f;
    const int64_t npix = (int64_t)N * m->cfg.out_channels * iH * iW, nlat = (int64_t)N * L * lh * lw;
    if (!rc) rc = dc_vae_reserve(m, N, iH, iW);
    dc_buf in = rc ? dc_buf_none() : upload(c, x, t->numel, c->be->compute);
    if (!rc && !in.p) rc = -1;
    if (encode) {
        dc_buf mean = rc ? dc_buf_none() : dev(c, c->be->compute, nlat);
        dc_buf logv = rc || !mean.p ? dc_buf_none() : dev(c, c->be->compute, nlat);
        if (!rc && !logv.p) rc = -1;
        if (!rc) rc = dc_vae_encode(m, mean, logv, in, N, iH, iW);
        o[0] = (out_tensor){"mean", 4, {N, L, lh, lw}, rc ? NULL : host(c, nlat)};
        o[1] = (out_tensor){"logvar", 4, {N, L, lh, lw}, rc ? NULL : host(c, nlat)};
        if (!rc && (!o[0].data || !o[1].data)) rc = -1;
        if (!rc) rc = download(c, o[0].data, mean, nlat);
        if (!rc) rc = download(c, o[1].data, logv, nlat);
        *nout = 2;
    } else {
        dc_buf img = rc ? dc_buf_none() : dev(c, c->be->compute, npix);
        if (!rc && !img.p) rc = -1;
        if (!rc) rc = dc_vae_decode(m, img, in, N, H, W);
        o[0] = (out_tensor){"image", 4, {N, m->cfg.out_channels, iH, iW}, rc ? NULL : host(c, npix)};
        if (!rc && !o[0].data) rc = -1;
        if (!rc) rc = download(c, o[0].data, img, npix);
        *nout = 1;
    }
    dc_vae_free(m);
    return rc;
}

static int run_unet(fwd_ctx *c, dc_sd_source *s, const dc_heads *heads, out_tensor *o, int *nout) {
    const dc_st_tensor *tx, *tt, *tc;
    float *x = input(c, "x", 4, (int64_t[]){-1, -1, -1, -1}, &tx);
    if (!x) return -1;
    const int N = (int)tx->shape[0], C = (int)tx->shape[1], H = (int)tx->shape[2], W = (int)tx->shape[3];
    float *t = input(c, "t", 1, (int64_t[]){N}, &tt);
    float *ctx = t ? input(c, "context", 3, (int64_t[]){N, -1, -1}, &tc) : NULL;
    if (!ctx) return -1;
    for (int i = 0; i < N; i++)
        if (!(t[i] >= 0 && t[i] < 1000))
            return dc_fail("%s: t[%d] = %g is outside [0, 1000), the timesteps", c->in->path, i, t[i]);
    dc_model *m;
    DC_TRY(dc_sd_load_unet(s, c->be, H, W, heads, &m));
    const dc_model_info *info = &m->info;
    int rc = 0;
    if (C != info->channels)
        rc = dc_fail("%s: 'x' has %d channels, the UNet reads %d", c->in->path, C, info->channels);
    else if (tc->shape[2] != info->ctx_dim)
        rc = dc_fail("%s: 'context' is %lld wide, the UNet reads %d", c->in->path, (long long)tc->shape[2],
                     info->ctx_dim);
    const int L = (int)tc->shape[1];
    const int64_t nx = (int64_t)N * C * H * W, no = (int64_t)N * info->out_channels * H * W;
    if (!rc) rc = dc_model_reserve(m, N);
    dc_buf dx = rc ? dc_buf_none() : upload(c, x, nx, DC_F32);
    dc_buf dt = rc ? dc_buf_none() : upload(c, t, N, DC_F32);
    dc_buf dctx = rc ? dc_buf_none() : upload(c, ctx, tc->numel, c->be->compute);
    dc_buf dout = rc ? dc_buf_none() : dev(c, DC_F32, no);
    if (!rc && (!dx.p || !dt.p || !dctx.p || !dout.p)) rc = -1;
    if (!rc) {
        dc_cond cond = {.ctx = dctx, .len = L, .dim = (int)tc->shape[2]};
        rc = dc_model_forward(m, dout, dx, dt, &cond, N);
    }
    o[0] = (out_tensor){"out", 4, {N, info->out_channels, H, W}, rc ? NULL : host(c, no)};
    if (!rc && !o[0].data) rc = -1;
    if (!rc) rc = download(c, o[0].data, dout, no);
    *nout = 1;
    dc_model_free(m);
    return rc;
}

int cmd_forward_sd(int argc, char **argv) {
    const char *weights = NULL, *component = NULL, *input_path = NULL, *output = NULL;
    const char *device = "auto", *precision = "auto", *heads_text = NULL;
    int threads = 0;
    bool no_verify = false;
    arg_spec specs[] = {
        {"weights", ARG_STR, &weights, "PATH", "pipeline folder, component folder or file, or single file"},
        {"component", ARG_STR, &component, "NAME", "unet, vae-encode, vae-decode or text-encoder"},
        {"input", ARG_STR, &input_path, "PATH", "safetensors with the component's inputs (see above)"},
        {"output", ARG_STR, &output, "PATH", "safetensors file to write"},
        {"unet-heads", ARG_STR, &heads_text, "LIST", "UNet attention heads, 8 or 5,10,20,20 (default: config.json, "
                                                     "else SD's rules)"},
        {"no-verify", ARG_FLAG, &no_verify, NULL, CLI_NO_VERIFY_HELP},
        {"threads", ARG_INT, &threads, "N", "CPU threads (default: all cores)"},
        {"device", ARG_STR, &device, "NAME", CLI_DEVICE_HELP},
        {"precision", ARG_STR, &precision, "P", CLI_PRECISION_HELP},
    };
    arg_parser ap = {"diffusion forward --component NAME --weights PATH --input IN --output OUT",
                     "Runs one Stable Diffusion component on tensors read from IN (float32, or\n"
                     "integers where noted) and writes its outputs to OUT:\n"
                     "  unet          x [N,4,H,W], t [N] (float or int), context [N,77,D] -> out [N,4,H,W]\n"
                     "  vae-decode    z [N,4,h,w] (already divided by the scaling factor)\n"
                     "                -> image [N,3,f*h,f*w], unclamped\n"
                     "  vae-encode    image [N,3,H,W] in [-1,1] -> mean, logvar [N,4,H/f,W/f]\n"
                     "  text-encoder  ids [N,77] (int64) -> hidden (final LayerNorm output) and\n"
                     "                penultimate (the second-to-last layer's output)",
                     specs, (int)(sizeof specs / sizeof specs[0]), 0, {0}, 0, {0}};
    int rc = args_parse(&ap, argc, argv);
    if (rc) return rc > 0 ? 0 : cli_usage_fail();
    if (!weights || !component || !input_path || !output)
        return dc_fail("--weights, --component, --input and --output are required (see --help)"), cli_usage_fail();
    int kind = !strcmp(component, "unet") ? 0 : !strcmp(component, "vae-encode") ? 1
             : !strcmp(component, "vae-decode") ? 2 : !strcmp(component, "text-encoder") ? 3 : -1;
    if (kind < 0)
        return dc_fail("--component %s: choose unet, vae-encode, vae-decode or text-encoder", component),
               cli_usage_fail();
    dc_heads heads = {0};
    if (heads_text && dc_heads_parse(heads_text, &heads)) return cli_usage_fail();
    if (cli_check_device_flags(threads, device, precision)) return cli_usage_fail();
    cli_inputs ins = {0};
    int bad = cli_inputs_add(&ins, "--weights", weights) || cli_inputs_add(&ins, "--input", input_path) ||
              cli_check_stdio(&ins) || cli_check_output(output, &ins);
    cli_inputs_free(&ins);
    if (bad) return cli_fail();

    fwd_ctx c = {0};
    dc_sd_model model = {0};
    dc_sd_source src = {0};
    dc_st_file in = {0};
    bool in_open = false, model_open = false, src_open = false;
    out_tensor o[MAX_OUT] = {{0}};
    int nout = 0, status = 1;
    const dc_sd_part parts[] = {DC_SD_UNET, DC_SD_VAE, DC_SD_VAE, DC_SD_TEXT};
    if (cli_set_threads(threads) || cli_backend(device, precision, &c.be)) goto done;
    if (dc_st_open_opts(&in, input_path, no_verify ? DC_ST_NO_VERIFY : 0)) goto done;
    in_open = true, c.in = &in;
    if (dc_sd_model_open(&model, weights, no_verify ? DC_ST_NO_VERIFY : 0)) goto done;
    model_open = true;
    if (dc_sd_source_open(&src, &model, parts[kind])) goto done;
    src_open = true;
    int r = kind == 0 ? run_unet(&c, &src, &heads, o, &nout) : kind == 3 ? run_text(&c, &src, o, &nout)
                                                          : run_vae(&c, &src, kind == 1, o, &nout);
    if (r) goto done;
    dc_st_entry e[MAX_OUT];
    for (int i = 0; i < nout; i++) {
        e[i] = (dc_st_entry){.name = o[i].name, .dtype = DC_F32, .ndim = o[i].ndim, .data = o[i].data};
        memcpy(e[i].shape, o[i].shape, sizeof o[i].shape);
    }
    if (dc_st_write(output, e, nout, NULL, NULL, 0)) goto done;
    dc_log("wrote %s: %s%s%s on %s", output, o[0].name, nout > 1 ? ", " : "", nout > 1 ? o[1].name : "", c.be->name);
    status = 0;
done:
    if (status) cli_fail();
    if (c.be) {
        for (int i = 0; i < c.nbufs; i++) c.be->free(c.be, c.bufs[i]);
        dc_backend_destroy(c.be);
    }
    for (int i = 0; i < c.nhost; i++) free(c.host[i]);
    if (src_open) dc_sd_source_close(&src);
    if (model_open) dc_sd_model_close(&model);
    if (in_open) dc_st_close(&in);
    return status;
}
