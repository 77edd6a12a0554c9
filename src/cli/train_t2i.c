#include "cli/train_t2i.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli_util.h"
#include "core/error.h"
#include "diffusion/sd_schedule.h"
#include "models/registry.h"
#include "io/mds.h"
#include "io/png.h"
#include "pipelines/sd.h"
#include "train/shards.h"
#include "train/stream.h"

bool t2i_is_model_path(const char *model) {
    struct stat st;
    return model && stat(model, &st) == 0;
}

int t2i_open(t2i_run *r, const char *model, const char *data, const char *vocab, unsigned st_flags) {
    memset(r, 0, sizeof *r);
    if (!realpath(model, r->model)) return dc_fail("%s: cannot resolve the path", model);
    const char *fallback = NULL;
    if (!vocab && cli_find_vocab(&fallback)) dc_error_clear();
    r->opts = (dc_t2i_opts){r->model, data, vocab, fallback, st_flags};
    return dc_t2i_base_open(&r->base, &r->opts);
}

void t2i_close(t2i_run *r) {
    dc_t2i_base_free(&r->base);
    memset(r, 0, sizeof *r);
}

int t2i_model_config(t2i_run *r, const char *unet_config, const dc_source *data, dc_kv *cfg) {
    dc_kv base = {0}, none = {0};
    int rc;
    if (unet_config) {
        rc = dc_model_config_of_json(unet_config, &base);
    } else if (r->base.has_unet) {
        rc = dc_unet_config_to_kv(&r->base.unet, &base);
    } else {
        rc = dc_fail("%s holds no UNet (%s): give the one to train from scratch with --unet-config config.json",
                     r->model, r->base.no_unet);
    }
    // the data's side and channels replace the config's sample_size and in_channels
    const dc_data_shape given = {data->channels, 1, data->height, data->width, 0};
    if (!rc) rc = dc_model_configure(&base, &none, &given, cfg);
    if (rc) dc_fail_ctx("%s", unet_config ? unet_config : r->model);
    dc_kv_free(&base);
    return rc;
}

int t2i_source(t2i_run *r, uint64_t seed, dc_source *src) {
    const dc_t2i_base *b = &r->base;
    const dc_shards_opts o = {r->opts.data, seed, DC_STREAM_BLOCK, b->latent_scale, b->text_null, b->text_null_len};
    return dc_source_shards(src, &o);
}

int t2i_schedule(t2i_run *r, dc_schedule *s) {
    // Training reads alphas_cumprod as they are: no floor under a zero terminal SNR.
    return dc_schedule_init_cfg(s, &r->base.sched, false);
}

dc_prediction t2i_prediction(const t2i_run *r) {
    return r->base.sched.prediction >= 0 ? (dc_prediction)r->base.sched.prediction : DC_PRED_EPS;
}

dc_train_config t2i_train_config_default(void) {
    dc_train_config c = dc_train_config_default();
    c.batch = c.micro_batch = 16;
    c.lr = 1e-5f, c.weight_decay = 0.01f, c.grad_clip = 1.0f;
    return c;
}

int t2i_parse_prediction(const char *word, int *pred) {
    static const char *const names[] = {[DC_PRED_EPS] = "eps", [DC_PRED_V] = "v", [DC_PRED_SAMPLE] = "sample"};
    for (int p = 0; p <= DC_PRED_SAMPLE; p++)
        if (!strcmp(word, names[p])) return *pred = p, 0;
    return dc_fail("--prediction %s: choose eps, v or sample", word);
}

int t2i_flags_check(const arg_parser *ap, bool sd, const char *unet_config, const char *init) {
    static const char *const sd_only[] = {"unet-config", "init", "caption-dropout", "vocab", "sample-every",
                                          "sample-prompts", "sample-steps", "sample-cfg"};
    static const char *const dit_only[] = {"input-size", "in-channels", "patch", "hidden", "depth",
                                           "heads", "mlp-hidden", "num-classes", "class-dropout"};
    for (size_t i = 0; i < sizeof sd_only / sizeof *sd_only && !sd; i++)
        if (args_given(ap, sd_only[i]))
            return dc_fail("--%s is for Stable Diffusion models (--model SD_PATH)", sd_only[i]);
    for (size_t i = 0; i < sizeof dit_only / sizeof *dit_only && sd; i++)
        if (args_given(ap, dit_only[i]))
            return dc_fail("--%s is not for Stable Diffusion models: %s", dit_only[i],
                           strcmp(dit_only[i], "class-dropout") ? "the UNet's shape comes from its config "
                                                                  "(--unet-config)" : "use --caption-dropout");
    if (unet_config && init && !strcmp(init, "base"))
        return dc_fail("--unet-config trains a new UNet from scratch: its weights start random (--init random)");
    return 0;
}

// ---- sampling grids

typedef struct {
    float *imgs;  // [n, 3, H, W]
    int64_t numel, base;
} grid_sink;

static int take_picture(void *ctx, int index, const float *image) {
    grid_sink *g = ctx;
    memcpy(g->imgs + (size_t)(g->base + index) * (size_t)g->numel, image, sizeof(float) * (size_t)g->numel);
    return 0;
}

int t2i_grid(t2i_run *r, const char *ckpt, const char *out, const t2i_grid_opts *g, dc_backend *be) {
    dc_sd_pipe p;
    const dc_sd_open_opts o = {.model = ckpt, .vocab = r->opts.vocab, .vocab_fallback = r->opts.vocab_fallback,
                               .st_flags = r->opts.st_flags, .prediction = -1};
    DC_TRY(dc_sd_pipe_open(&p, be, &o));
    const int side = p.default_size;
    grid_sink sink = {malloc(sizeof(float) * 3 * (size_t)side * side * (size_t)(g->n * g->per_prompt)),
                      3 * (int64_t)side * side, 0};
    int rc = sink.imgs ? 0 : dc_fail("out of memory");
    for (int i = 0; i < g->n && !rc; i++) {
        dc_sd_gen gen = {g->prompts[i], NULL, g->per_prompt, g->per_prompt, side, side, dc_ksampler_opts_default(),
                         NULL, 1};
        gen.ks.kind = DC_KS_DDIM, gen.ks.steps = g->steps, gen.ks.cfg_scale = g->cfg, gen.ks.seed = 0;
        sink.base = (int64_t)i * g->per_prompt;
        rc = dc_sd_generate(&p, &gen, take_picture, &sink, NULL, NULL);
    }
    if (!rc) rc = dc_png_write_grid(out, sink.imgs, g->n * g->per_prompt, 3, side, side, g->n, g->per_prompt);
    free(sink.imgs);
    dc_sd_pipe_close(&p);
    return rc;
}

void t2i_prompts_free(char **prompts, int n) {
    for (int i = 0; i < n; i++) free(prompts[i]);
    free(prompts);
}

static int add_prompt(char ***list, int *n, const char *s, size_t len) {
    for (int i = 0; i < *n; i++)
        if (strlen((*list)[i]) == len && !memcmp((*list)[i], s, len)) return 0;  // each once
    char *copy = strndup(s, len);
    if (!copy) return dc_fail("out of memory");
    (*list)[(*n)++] = copy;
    return 0;
}

int t2i_prompts(t2i_run *r, const char *path, int max, char ***prompts, int *n) {
    *n = 0;
    *prompts = calloc((size_t)max, sizeof **prompts);
    if (!*prompts) return dc_fail("out of memory");
    int rc = 0;
    if (path) {
        FILE *f = fopen(path, "r");
        if (!f) return t2i_prompts_free(*prompts, 0), dc_fail("%s: cannot open", path);
        char line[1024];
        while (!rc && *n < max && fgets(line, sizeof line, f)) {
            size_t len = strcspn(line, "\r\n");
            if (len) rc = add_prompt(prompts, n, line, len);
        }
        fclose(f);
        if (!rc && !*n) rc = dc_fail("%s: no prompts (one a line)", path);
    } else {
        dc_mds_reader *mr = NULL;
        dc_mds_sample smp = {0};
        rc = dc_mds_open(&mr, r->opts.data);
        const int col = rc ? -1 : dc_mds_find(mr, "caption");
        if (!rc && col < 0) rc = dc_fail("%s: no caption column to take sampling prompts from: give --sample-prompts",
                                         r->opts.data);
        for (int64_t i = 0; !rc && *n < max && i < dc_mds_samples(mr) && i < 1000; i++)
            if (!(rc = dc_mds_read(mr, i, &smp)) && smp.len[col])
                rc = add_prompt(prompts, n, (const char *)smp.data[col], smp.len[col]);
        dc_mds_sample_free(&smp);
        if (mr) dc_mds_close(mr);
    }
    if (rc) t2i_prompts_free(*prompts, *n), *prompts = NULL, *n = 0;
    return rc;
}
