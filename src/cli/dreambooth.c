#include "cli/dreambooth.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "io/png.h"
#include "pipelines/prepare.h"
#include "pipelines/sd.h"

// The pictures a folder holds (not its subfolders), by extension.
static int count_pictures(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        const char *dot = strrchr(e->d_name, '.');
        n += dot && (!strcasecmp(dot, ".png") || !strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg") ||
                     !strcasecmp(dot, ".webp"));
    }
    closedir(d);
    return n;
}

typedef struct {
    const char *dir;
    int first;  // the index of the batch's first picture
    int size;
} class_sink;

static int write_class(void *ctx, int index, const float *img) {
    const class_sink *s = ctx;
    char path[4200];
    snprintf(path, sizeof path, "%s/class_%05d.png", s->dir, s->first + index);
    const int64_t plane = (int64_t)s->size * s->size;
    uint8_t *px = malloc((size_t)(3 * plane));
    if (!px) return dc_fail("out of memory");
    for (int64_t i = 0; i < plane; i++)
        for (int c = 0; c < 3; c++) px[i * 3 + c] = dc_pixel_u8(img[c * plane + i]);
    const int rc = dc_png_write(path, px, s->size, s->size, 3);
    free(px);
    return rc;
}

// Pictures have..want-1 of the class prompt, picture i from seed i (one at a
// time: a stopped run keeps each as it is written, and draws the rest).
static int draw_class(const t2i_dreambooth *d, const char *model, const char *vocab, const char *fallback,
                      unsigned st_flags, const char *dir, int have, int size, dc_backend *be) {
    dc_sd_pipe p;
    const dc_sd_open_opts o = {.model = model, .vocab = vocab, .vocab_fallback = fallback, .st_flags = st_flags,
                               .prediction = -1};
    DC_TRY(dc_sd_pipe_open(&p, be, &o));
    dc_log("drawing %d class pictures of \"%s\" with %s into %s", d->class_images - have, d->class_prompt, model, dir);
    int rc = 0;
    for (int i = have; i < d->class_images && !rc; i++) {
        dc_sd_gen g = {d->class_prompt, NULL, 1, 1, size, size, dc_ksampler_opts_default(), NULL, 1};
        g.ks.seed = (uint64_t)i;
        class_sink s = {dir, i, size};
        rc = dc_sd_generate(&p, &g, write_class, &s, NULL, NULL);
        if (!rc) dc_progress(i + 1 == d->class_images, "class pictures: %d/%d", i + 1, d->class_images);
    }
    dc_sd_pipe_close(&p);
    return rc;
}

static int prepare_set(const char *pictures, const char *caption, const char *out, const dc_prepare_opts *o,
                       dc_prepare_models *m) {
    dc_picture_set set;
    const dc_picture_set_opts so = {NULL, NULL, caption};
    DC_TRY(dc_picture_set_scan(&set, pictures, &so));
    dc_prepare_stats st = {0};
    const int rc = dc_prepare_run(m, &set, out, o, NULL, NULL, &st);
    if (!rc) dc_log("prepared %s: %lld pictures captioned \"%s\"", out, (long long)st.samples, caption);
    if (!rc && st.corrupt) dc_warn("%lld unreadable pictures of %s were skipped", (long long)st.corrupt, pictures);
    dc_picture_set_free(&set);
    return rc;
}

int t2i_dreambooth_flags(const arg_parser *ap, t2i_dreambooth *d, int class_images, int resolution) {
    static const char *const all[] = {"instance-prompt", "class-prompt", "class-data", "class-images",
                                      "prior-loss-weight", "resolution"};
    for (size_t i = 0; i < sizeof all / sizeof *all && !d; i++)
        if (args_given(ap, all[i])) return dc_fail("--%s is for DreamBooth (--instance-data DIR)", all[i]);
    if (!d) return 0;
    if (!d->instance_prompt) return dc_fail("--instance-data needs --instance-prompt (\"a photo of sks dog\")");
    if (args_given(ap, "data")) return dc_fail("--instance-data is DreamBooth's data: --data is not for it");
    for (size_t i = 2; i < 5 && !d->class_prompt; i++)
        if (args_given(ap, all[i])) return dc_fail("--%s is for prior preservation (--class-prompt TEXT)", all[i]);
    if (class_images < 1 || class_images > 100000) return dc_fail("--class-images %d: 1 to 100000", class_images);
    if (resolution && (resolution < 8 || resolution > 16384)) return dc_fail("--resolution %d: 8 to 16384", resolution);
    d->class_images = class_images, d->size = resolution;
    return 0;
}

int t2i_dreambooth_paths(const t2i_dreambooth *d, const char *run, char *inst, char *cls, size_t cap) {
    if ((size_t)snprintf(inst, cap, "%s/dreambooth/instance", run) >= cap ||
        (size_t)snprintf(cls, cap, "%s/dreambooth/class", run) >= cap)
        return dc_fail("%s: too long a path", run);
    if (!d->class_prompt) cls[0] = 0;
    return 0;
}

int t2i_dreambooth_prepare(const t2i_dreambooth *d, const char *model, const char *vocab, const char *fallback,
                           unsigned st_flags, const char *run, dc_backend *be, char *inst, char *cls, size_t cap) {
    // the base's size and space (pixels or latents), read without its weights
    dc_sd_pipe probe;
    const dc_sd_open_opts po = {.model = model, .vocab = vocab, .vocab_fallback = fallback, .st_flags = st_flags,
                                .prediction = -1};
    DC_TRY(dc_sd_pipe_find(&probe, &po));
    const int size = d->size ? d->size : probe.default_size, align = probe.align;
    const bool pixels = probe.pixels;
    dc_sd_pipe_close(&probe);
    if (size % align) return dc_fail("--resolution %d: the model draws multiples of %d pixels", size, align);
    char root[4200], class_dir[4200];
    snprintf(root, sizeof root, "%s/dreambooth", run);
    DC_TRY(t2i_dreambooth_paths(d, run, inst, cls, cap));
    DC_TRY(dc_mkdir_p(root));
    if (d->class_prompt) {
        snprintf(class_dir, sizeof class_dir, "%s", d->class_data ? d->class_data : root);
        if (!d->class_data) strncat(class_dir, "/class_images", sizeof class_dir - strlen(class_dir) - 1);
        DC_TRY(dc_mkdir_p(class_dir));
        const int have = count_pictures(class_dir);
        if (have < d->class_images) DC_TRY(draw_class(d, model, vocab, fallback, st_flags, class_dir, have, size, be));
    }
    dc_prepare_opts o = {model, vocab, fallback, st_flags, pixels, size, false, 0, 0, 4, 0, 0, 0, false, false,
                         strcmp(be->name, "cpu") != 0};
    dc_prepare_models m = {0};
    int rc = dc_prepare_models_load(&m, &o, be);
    if (!rc) rc = prepare_set(d->instance_data, d->instance_prompt, inst, &o, &m);
    if (!rc && d->class_prompt) rc = prepare_set(class_dir, d->class_prompt, cls, &o, &m);
    dc_prepare_models_close(&m);
    return rc;
}
