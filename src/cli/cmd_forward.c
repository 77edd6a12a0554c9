// diffusion forward: evaluate the model on tensors x, t, y from a file, the
// way to check a converted or trained checkpoint against PyTorch.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "diffusion/schedule.h"

#define CHUNK 32  // images per forward pass

static int check_inputs(const dc_st_file *in, const dc_model_info *c, const dc_st_tensor **x,
                        const dc_st_tensor **t, const dc_st_tensor **y) {
    *x = dc_st_find(in, "x"), *t = dc_st_find(in, "t"), *y = dc_st_find(in, "y");
    if (!*x || !*t || !*y) return dc_fail("%s: needs tensors 'x', 't' and 'y'", in->path);
    const dc_st_tensor *X = *x;
    if (X->ndim != 4 || X->shape[1] != c->channels || X->shape[2] != c->height || X->shape[3] != c->width)
        return dc_fail("%s: 'x' must have shape [N, %d, %d, %d]", in->path, c->channels, c->height, c->width);
    if ((*t)->ndim != 1 || (*t)->shape[0] != X->shape[0] || (*y)->ndim != 1 || (*y)->shape[0] != X->shape[0])
        return dc_fail("%s: 't' and 'y' must have shape [%lld]", in->path, (long long)X->shape[0]);
    return 0;
}

// The model is defined for finite x, timesteps in [0, 1000) and labels up to
// the null class; anything else would give garbage without a word.
static int check_values(const dc_st_file *in, const dc_model_info *c, int64_t N, const float *x,
                        const float *t, const int64_t *y) {
    int64_t H = c->height, W = c->width, img = (int64_t)c->channels * H * W;
    for (int64_t i = 0; i < N * img; i++) {
        if (isfinite(x[i])) continue;
        int64_t n = i / img, r = i % img;
        return dc_fail("%s: x[%lld, %lld, %lld, %lld] is %s; the input must be finite", in->path,
                       (long long)n, (long long)(r / (H * W)), (long long)(r / W % H), (long long)(r % W),
                       isnan(x[i]) ? "NaN" : "infinite");
    }
    for (int64_t i = 0; i < N; i++) {
        if (!(t[i] >= 0 && t[i] < DC_DIFFUSION_STEPS))
            return dc_fail("%s: t[%lld] = %g is outside [0, %d), the diffusion timesteps", in->path,
                           (long long)i, t[i], DC_DIFFUSION_STEPS);
        if (y[i] < 0 || y[i] > c->num_classes)
            return dc_fail("%s: y[%lld] = %lld is outside [0, %d] (%d is the null class)", in->path,
                           (long long)i, (long long)y[i], c->num_classes, c->num_classes);
    }
    return 0;
}

int cmd_forward(int argc, char **argv) {
    for (int i = 1; i < argc; i++)  // a Stable Diffusion component: its own flags
        if (!strcmp(argv[i], "--component") || !strncmp(argv[i], "--component=", 12)) return cmd_forward_sd(argc, argv);
    const char *weights = NULL, *input = NULL, *output = NULL, *device = "auto", *precision = "auto";
    int heads = 0, threads = 0;
    bool raw = false, no_verify = false;
    arg_spec specs[] = {
        {"weights", ARG_STR, &weights, "PATH", "checkpoint, run folder or official-key weights"},
        {"input", ARG_STR, &input, "PATH", "safetensors with x [N,C,H,W] f32, t [N], y [N] int64"},
        {"output", ARG_STR, &output, "PATH", "safetensors file to write with tensor 'out'"},
        {"raw", ARG_FLAG, &raw, NULL, "use the raw weights of a checkpoint instead of EMA"},
        {"heads", ARG_INT, &heads, "N", CLI_HEADS_HELP},
        {"no-verify", ARG_FLAG, &no_verify, NULL, CLI_NO_VERIFY_HELP},
        {"threads", ARG_INT, &threads, "N", "CPU threads (default: all cores)"},
        {"device", ARG_STR, &device, "NAME", CLI_DEVICE_HELP},
        {"precision", ARG_STR, &precision, "P", CLI_PRECISION_HELP},
    };
    arg_parser ap = {"diffusion forward --weights W --input IN --output OUT",
                     "Runs the model on x (N,C,H,W float32), t (N timesteps, float or int) and\n"
                     "y (N, int64 labels; num_classes is the null class) read from IN and writes\n"
                     "the output (N, out_channels, H, W) as tensor 'out' to OUT.\n"
                     "For a Stable Diffusion component: diffusion forward --component NAME --help.",
                     specs, (int)(sizeof specs / sizeof specs[0]), 0, {0}, 0, {0}};
    int rc = args_parse(&ap, argc, argv);
    if (rc) return rc > 0 ? 0 : cli_usage_fail();
    if (!weights || !input || !output)
        return dc_fail("--weights, --input and --output are required (see --help)"), cli_usage_fail();
    if (cli_check_heads(heads) || cli_check_device_flags(threads, device, precision)) return cli_usage_fail();
    unsigned st_flags = no_verify ? DC_ST_NO_VERIFY : 0;
    cli_inputs ins = {0};
    int bad = cli_inputs_add_checkpoint(&ins, "--weights", weights) || cli_inputs_add(&ins, "--input", input) ||
              cli_check_stdio(&ins) || cli_check_output(output, &ins);
    cli_inputs_free(&ins);
    if (bad) return cli_fail();

    dc_backend *be = NULL;
    dc_model *m = NULL;
    dc_st_file in = {0};
    bool in_open = false;
    float *hx = NULL, *ht = NULL, *hout = NULL;
    int64_t *hy = NULL;
    dc_buf x = {0}, t = {0}, y = {0}, out = {0};
    int status = 1;
    const char *which;
    if (cli_set_threads(threads) || cli_backend(device, precision, &be)) goto done;
    if (cli_load_model(weights, raw, heads, st_flags, be, &m, &which)) goto done;
    if (m->info.cond != DC_COND_LABELS) {
        dc_fail("%s is a text-conditioned %s; forward reads class labels y only", weights, m->ops->name);
        goto done;
    }
    if (dc_st_open_opts(&in, input, st_flags)) goto done;
    in_open = true;
    const dc_model_info *c = &m->info;
    const dc_st_tensor *tx, *tt, *ty;
    if (check_inputs(&in, c, &tx, &tt, &ty)) goto done;
    int64_t N = tx->shape[0], img = (int64_t)c->channels * c->height * c->width;
    int64_t oimg = (int64_t)c->out_channels * c->height * c->width;
    hx = malloc(N * img * sizeof *hx + 1), ht = malloc(N * sizeof *ht + 1);
    hy = malloc(N * sizeof *hy + 1), hout = malloc(N * oimg * sizeof *hout + 1);
    if (!hx || !ht || !hy || !hout) { dc_fail("out of memory"); goto done; }
    if (dc_st_read_f32(&in, tx, hx)) goto done;
    if (tt->dtype == DC_F32 || tt->dtype == DC_F64 || tt->dtype == DC_F16 || tt->dtype == DC_BF16) {
        if (dc_st_read_f32(&in, tt, ht)) goto done;
    } else {
        int64_t *ti = (int64_t *)hy;  // borrow hy as scratch, refilled below
        if (dc_st_read_i64(&in, tt, ti)) goto done;
        for (int64_t i = 0; i < N; i++) ht[i] = (float)ti[i];
    }
    if (dc_st_read_i64(&in, ty, hy)) goto done;
    if (check_values(&in, c, N, hx, ht, hy)) goto done;
    int chunk = N < CHUNK ? (int)(N > 0 ? N : 1) : CHUNK;
    if (dc_model_reserve(m, chunk)) goto done;
    x = (dc_buf){be->alloc(be, chunk * img * 4), DC_F32};
    out = (dc_buf){be->alloc(be, chunk * oimg * 4), DC_F32};
    t = (dc_buf){be->alloc(be, chunk * 4), DC_F32};
    y = (dc_buf){be->alloc(be, chunk * 4), DC_I32};
    if (!x.p || !out.p || !t.p || !y.p) goto done;
    for (int64_t i0 = 0; i0 < N; i0 += chunk) {
        int n = (int)(N - i0 < chunk ? N - i0 : chunk);
        int32_t yy[CHUNK];
        for (int i = 0; i < n; i++) yy[i] = (int32_t)hy[i0 + i];
        be->upload(be, x.p, hx + i0 * img, n * img * 4);
        be->upload(be, t.p, ht + i0, n * 4);
        be->upload(be, y.p, yy, n * 4);
        dc_cond cond = {.y = y};
        if (dc_model_forward(m, out, x, t, &cond, n)) goto done;
        be->download(be, hout + i0 * oimg, out.p, n * oimg * 4);
        if (dc_backend_status(be)) goto done;
    }
    dc_st_entry e = {.name = "out", .dtype = DC_F32, .ndim = 4,
                     .shape = {N, c->out_channels, c->height, c->width}, .data = hout};
    if (dc_st_write(output, &e, 1, NULL, NULL, 0)) goto done;
    dc_log("wrote %s: out [%lld, %d, %d, %d] (%s weights)", output, (long long)N,
           c->out_channels, c->height, c->width, which);
    status = 0;
done:
    if (status) cli_fail();
    if (be) {
        void *bufs[] = {x.p, out.p, t.p, y.p};
        for (int i = 0; i < 4; i++) if (bufs[i]) be->free(be, bufs[i]);
    }
    if (in_open) dc_st_close(&in);
    free(hx), free(ht), free(hy), free(hout);
    dc_model_free(m);
    if (be) dc_backend_destroy(be);
    return status;
}
