// `diffusion prepare`'s work: pictures resized, encoded in batches, written
// to MDS shards, with what the finished shards hold recorded so that a
// stopped run continues (see prepare.h).
#include "pipelines/prepare.h"

#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fsutil.h"
#include "core/hash.h"
#include "core/log.h"
#include "io/json.h"
#include "io/mds.h"
#include "io/png.h"

#define PROGRESS_FILE "prepare.progress.json"
#define SUMMARY_FILE "prepare.json"
#define NCOLS 8

// ---- buckets

static int by_size(const void *a, const void *b) {
    const dc_bucket *x = a, *y = b;
    return x->width != y->width ? x->width - y->width : x->height - y->height;
}

static void bucket_add(dc_bucket *b, int *n, int w, int h) {
    for (int i = 0; i < *n; i++)
        if (b[i].width == w && b[i].height == h) return;
    b[(*n)++] = (dc_bucket){w, h};
}

int dc_buckets_make(int size, int min_side, int max_side, int step, dc_bucket **out, int *n) {
    *out = NULL, *n = 0;
    if (step < 1 || size < step || min_side < step || min_side > max_side || max_side > DC_IMAGE_MAX_SIDE)
        return dc_fail("buckets: size %d, sides %d..%d in steps of %d: give step <= size and step <= min <= max "
                       "<= %d", size, min_side, max_side, step, DC_IMAGE_MAX_SIDE);
    const int64_t area = (int64_t)size * size;
    dc_bucket *b = malloc(sizeof *b * (size_t)(2 * ((max_side - min_side) / step + 1) + 1));
    if (!b) return dc_fail("out of memory");
    int k = 0;
    bucket_add(b, &k, size / step * step, size / step * step);
    for (int w = min_side; w <= max_side; w += step) {
        int64_t h = area / w / step * step;
        if (h > max_side) h = max_side;
        if (h >= min_side) bucket_add(b, &k, w, (int)h), bucket_add(b, &k, (int)h, w);
    }
    qsort(b, (size_t)k, sizeof *b, by_size);
    *out = b, *n = k;
    return 0;
}

int dc_bucket_select(const dc_bucket *b, int n, int width, int height) {
    const double ar = (double)width / height;
    int best = 0;
    double err = 0;
    for (int i = 0; i < n; i++) {
        double e = (double)b[i].width / b[i].height - ar;
        e = e < 0 ? -e : e;
        if (i == 0 || e < err) best = i, err = e;
    }
    return best;
}

// ---- models

int dc_prepare_models_load(dc_prepare_models *m, const dc_prepare_opts *o, dc_backend *be) {
    memset(m, 0, sizeof *m);
    dc_sd_pipe *p = &m->sd;
    dc_sd_sched_cfg_default(&p->sched);
    m->be = p->be = be;
    int rc = dc_sd_model_open(&p->files, o->model, o->st_flags);
    // A pixel-space model (no VAE) trains on pixels whatever o->no_vae says.
    const bool no_vae = o->no_vae || (!rc && dc_sd_model_pixel_space(&p->files));
    if (!rc) rc = dc_sd_source_open(&p->src[p->nsrc++], &p->files, DC_SD_TEXT);
    if (!rc && !no_vae) rc = dc_sd_source_open(&p->src[p->nsrc++], &p->files, DC_SD_VAE);
    char tokdir[4200];
    const char *vocab = o->vocab ? o->vocab : rc ? NULL : dc_sd_tokenizer_dir(&p->files, tokdir, sizeof tokdir);
    if (!vocab) vocab = o->vocab_fallback;
    if (!rc && !vocab)
        rc = dc_fail("%s has no tokenizer/ folder: give the CLIP vocabulary (--vocab bpe_simple_vocab_16e6.txt.gz, or "
                     "a tokenizer folder)", o->model);
    if (!rc) rc = dc_clip_tokenizer_load(&p->tok, vocab);
    if (!rc) rc = dc_sd_load_text(&p->src[0], be, &p->text_skip, &p->text);
    if (!rc && !no_vae) rc = dc_sd_load_vae(&p->src[1], be, true, false, &p->vae);
    for (int i = 0; i < p->nsrc; i++) dc_sd_source_close(&p->src[i]);
    p->nsrc = 0;
    if (rc) return dc_prepare_models_close(m), -1;
    if (be->freeze_weights) be->freeze_weights(be, true);
    m->scaling_factor = p->vae ? p->vae->cfg.scaling_factor : 0;
    return 0;
}

void dc_prepare_models_close(dc_prepare_models *m) {
    dc_sd_pipe_close(&m->sd);
    memset(m, 0, sizeof *m);
}

// ---- the output folder

// The files a run writes into a data set folder: index.json, shards, and
// the temporary files of shards being written.
static bool written_name(const char *s) {
    int k, n = 0;
    if (!strcmp(s, "index.json") || !strncmp(s, "index.json.tmp.", 15)) return true;
    if (sscanf(s, "shard.%5d.mds%n", &k, &n) != 1 || n != 15) return false;
    return !s[n] || !strcmp(s + n, ".zstd") || !strncmp(s + n, ".tmp.", 5) || !strncmp(s + n, ".zstd.tmp.", 10);
}

// The temporary files of the run's own records (written whole, then renamed).
static bool record_temp_name(const char *s) {
    return !strncmp(s, PROGRESS_FILE ".tmp.", strlen(PROGRESS_FILE) + 5) ||
           !strncmp(s, SUMMARY_FILE ".tmp.", strlen(SUMMARY_FILE) + 5);
}

static bool bucket_name(const char *s) {
    int w, h, n = 0;
    return sscanf(s, "%dx%d%n", &w, &h, &n) == 2 && !s[n];
}

// What a run wrote into dir (temporary files only, with tmp_only): removed.
// *found counts what there was.
static int clean_dir(const char *dir, bool tmp_only, bool remove, int *found) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    char path[4400];
    int rc = 0;
    for (struct dirent *e; (e = readdir(d)) && !rc;) {
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (e->d_name[0] == '.' || lstat(path, &st)) continue;
        if (S_ISDIR(st.st_mode) && bucket_name(e->d_name) && !tmp_only) {
            rc = clean_dir(path, false, remove, found);
            if (!rc && remove) rmdir(path);  // left when it holds files of the user's
        } else if (S_ISREG(st.st_mode) && (written_name(e->d_name) || record_temp_name(e->d_name) ||
                                           (!tmp_only && (!strcmp(e->d_name, PROGRESS_FILE) ||
                                                                                    !strcmp(e->d_name, SUMMARY_FILE))))) {
            if (tmp_only && !strstr(e->d_name, ".tmp.")) continue;
            (*found)++;
            if (remove && unlink(path)) rc = dc_fail("%s: cannot remove it", path);
        }
    }
    closedir(d);
    return rc;
}

// ---- the settings a run is continued with

static uint64_t list_hash(const dc_picture_set *set) {
    dc_xxh64_state h;
    dc_xxh64_init(&h, 0);
    for (int64_t i = 0; i < set->n; i++) {
        const dc_picture_entry *e = &set->e[i];
        dc_xxh64_update(&h, e->path, strlen(e->path) + 1);
        if (e->member) dc_xxh64_update(&h, e->member, strlen(e->member) + 1);
        dc_xxh64_update(&h, e->caption, strlen(e->caption) + 1);
        dc_xxh64_update_u64(&h, (uint64_t)e->repeats);
        dc_xxh64_update_u64(&h, (uint64_t)e->size);
    }
    return dc_xxh64_digest(&h);
}

static void settings_text(char *buf, size_t cap, const dc_picture_set *set, const dc_prepare_opts *o) {
    snprintf(buf, cap,
             "model %s, vae %s, size %d, buckets %s %d..%d, batch %d, shard bytes %lld, zstd %d, budget %lld, "
             "%lld pictures, list %016llx",
             o->model, o->no_vae ? "none" : "yes", o->size, o->buckets ? "yes" : "no", o->min_side, o->max_side,
             o->batch, (long long)o->shard_bytes, o->zstd_level, (long long)o->max_pixels, (long long)set->n,
             (unsigned long long)list_hash(set));
}

typedef struct {
    int job;          // data sets finished before this one
    int shards;       // its finished shards
    int64_t samples;  // the samples they hold
    int64_t next;     // the position (in the job's list) of the first sample not in them,
    int copy;         // and which of its repeats
    int64_t corrupt;  // pictures skipped before that point
} progress_state;

static int progress_save(const char *out, const char *settings, const progress_state *s) {
    char path[4200];
    snprintf(path, sizeof path, "%s/" PROGRESS_FILE, out);
    dc_atomic_file *af = dc_atomic_begin(path);
    if (!af) return -1;
    FILE *f = dc_atomic_stream(af);
    fputs("{\"settings\": ", f);
    int ok = dc_json_write_string(f, settings) == 0;
    fprintf(f, ", \"job\": %d, \"shards\": %d, \"samples\": %lld, \"next\": %lld, \"copy\": %d, \"corrupt\": %lld}\n",
            s->job, s->shards, (long long)s->samples, (long long)s->next, s->copy, (long long)s->corrupt);
    return dc_atomic_end(af, ok);
}

static int progress_load(const char *path, const char *settings, progress_state *s) {
    dc_json_doc doc;
    DC_TRY(dc_json_read_file(&doc, path));
    const dc_json *r = doc.root, *set = dc_json_get(r, "settings");
    int64_t v[6];
    const char *keys[6] = {"job", "shards", "samples", "next", "copy", "corrupt"};
    int rc = set && dc_json_is_cstr(set) ? 0 : dc_fail("%s: no settings", path);
    for (int i = 0; i < 6 && !rc; i++)
        if (dc_json_get_i64(dc_json_get(r, keys[i]), &v[i]) || v[i] < 0 || v[i] > (1ll << 40))
            rc = dc_fail("%s: \"%s\" is missing or out of range", path, keys[i]);
    if (!rc && strcmp(set->str, settings))
        rc = dc_fail("%s was written by a run with other settings or pictures (%s; now: %s): give --overwrite to "
                     "start over", path, set->str, settings);
    if (!rc) *s = (progress_state){(int)v[0], (int)v[1], v[2], v[3], (int)v[4], v[5]};
    dc_json_free(&doc);
    return rc;
}

// ---- jobs: one data set each (all pictures, or one bucket's)

typedef struct {
    int width, height;
    int64_t *idx;  // [n] entries of the picture set, in order
    int64_t n;
    char dir[4200];
} job;

static void jobs_free(job *j, int n) {
    for (int i = 0; i < n; i++) free(j[i].idx);
    free(j);
}

// The jobs, and the pictures whose header could not be read (skipped, with
// a warning, when buckets need their sizes).
static int plan_jobs(const dc_picture_set *set, const char *out, const dc_prepare_opts *o, job **jobs, int *njobs,
                     int64_t *corrupt) {
    *jobs = NULL, *njobs = 0, *corrupt = 0;
    dc_bucket *b = NULL;
    int nb = 1;
    if (o->buckets) DC_TRY(dc_buckets_make(o->size, o->min_side, o->max_side, 64, &b, &nb));
    int *which = malloc(sizeof *which * (size_t)set->n);
    job *j = calloc((size_t)nb, sizeof *j);
    int rc = which && j ? 0 : dc_fail("out of memory");
    for (int64_t i = 0; i < set->n && !rc; i++) {
        which[i] = 0;
        if (!o->buckets) continue;
        dc_image img;
        if (dc_picture_set_read(set, i, &img, o->max_pixels, true)) {
            dc_warn("skipped: %s", dc_error());
            dc_error_clear();
            which[i] = -1, (*corrupt)++;
            continue;
        }
        which[i] = dc_bucket_select(b, nb, img.width, img.height);
    }
    for (int64_t i = 0; i < set->n && !rc; i++)
        if (which[i] >= 0) j[which[i]].n++;
    for (int k = 0; k < nb && !rc; k++) {
        j[k].width = b ? b[k].width : o->size, j[k].height = b ? b[k].height : o->size;
        if (o->buckets) snprintf(j[k].dir, sizeof j[k].dir, "%s/%dx%d", out, j[k].width, j[k].height);
        else snprintf(j[k].dir, sizeof j[k].dir, "%s", out);
        if (!(j[k].idx = malloc(sizeof *j[k].idx * (size_t)(j[k].n ? j[k].n : 1)))) rc = dc_fail("out of memory");
        j[k].n = 0;
    }
    for (int64_t i = 0; i < set->n && !rc; i++)
        if (which[i] >= 0) j[which[i]].idx[j[which[i]].n++] = i;
    int k = 0;  // empty buckets are no data sets
    for (int i = 0; i < nb && !rc; i++) {
        if (j[i].n) j[k++] = j[i];
        else free(j[i].idx);
    }
    free(which), free(b);
    if (rc) return jobs_free(j, j ? nb : 0), rc;
    *jobs = j, *njobs = k;
    return 0;
}

// ---- encoding a batch
//
// A batch goes to the device in two halves: submit queues its work (the
// pictures' upload from pinned memory, the text encoder, the VAE encoder,
// the downloads of the results into pinned memory) without waiting for the
// device, and collect waits for those downloads and rounds the results to
// fp16. Where batches are read on a thread of their own (opts.overlap), the
// loop submits batch i before it collects and writes batch i - 1, so the
// device encodes one batch while the host writes the last and the reader
// decodes the next: three sets of buffers, one for each.

typedef struct {
    int B, H, W, C, h, w, T, D;
    int64_t pix, lat;          // per picture: 3 H W, C h w
    dc_buf img;                // [B, 3, H, W] compute dtype
    dc_buf mean, logvar;       // [B, C, h, w] compute dtype
    dc_buf lat32;              // [2, B, C, h, w] f32: the means, then the log-variances
    dc_buf ctx, ctx32;         // [B, T, D] compute dtype, f32
    void *h_in;                // pinned [B, 3, H, W] in the compute dtype: the pictures as uploaded
    float *h_lat, *h_ctx;      // pinned: lat32's and ctx32's values as downloaded
    int64_t ticket;            // the batch's last download (0: none to wait for)
    uint8_t *h_px;             // [B, 3, H, W] the resized pictures' bytes
    uint16_t *m16, *v16, *c16; // [B, C, h, w] twice, [B, T, D]: what is written, fp16
    // the batch in flight: pictures encoded, and its window [a, end) of the job's list
    int n;
    int64_t a, end;
    // per picture of the batch
    int64_t *pos;
    int *orig_w, *orig_h, *tokens;
    const char **caption;
    bool *failed;              // the picture of the slot could not be read
    char (*why)[512];          // and why
} batch_bufs;

static void bufs_free(dc_backend *be, batch_bufs *b) {
    dc_buf *d[] = {&b->img, &b->mean, &b->logvar, &b->lat32, &b->ctx, &b->ctx32};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++)
        if (d[i]->p) be->free(be, d[i]->p);
    void *pinned[] = {b->h_in, b->h_lat, b->h_ctx};
    for (size_t i = 0; i < sizeof pinned / sizeof *pinned; i++)
        if (pinned[i]) be->free_pinned(be, pinned[i]);
    free(b->h_px), free(b->m16), free(b->v16), free(b->c16);
    free(b->pos), free(b->orig_w), free(b->orig_h), free(b->tokens), free(b->caption);
    free(b->failed), free(b->why);
    memset(b, 0, sizeof *b);
}

static void *pinned(dc_backend *be, size_t bytes, int *rc) {
    void *p = *rc ? NULL : be->alloc_pinned(be, bytes);
    if (!p && !*rc) *rc = dc_fail_ctx("pinned host memory for a batch (%.1f MiB)", bytes / 1048576.0);
    return p;
}

static int bufs_alloc(dc_prepare_models *m, batch_bufs *b, int B, int H, int W, bool vae_batch) {
    dc_backend *be = m->be;
    const dc_vae *vae = m->sd.vae;
    memset(b, 0, sizeof *b);
    if (!be->alloc_pinned || !be->copy_async || !be->host_wait || !be->wait_ticket)
        return dc_fail("prepare: the %s backend cannot copy beside its ops", be->name);
    b->B = B, b->H = H, b->W = W, b->T = m->sd.text->cfg.positions, b->D = m->sd.text->cfg.width;
    b->C = vae ? vae->cfg.latent_channels : 0;
    b->h = vae ? H / dc_vae_factor(&vae->cfg) : 0, b->w = vae ? W / dc_vae_factor(&vae->cfg) : 0;
    b->pix = 3ll * H * W, b->lat = (int64_t)b->C * b->h * b->w;
    const int64_t ctx = (int64_t)b->T * b->D;
    const dc_dtype ct = be->compute;
    int rc = dc_buf_alloc(be, &b->ctx, ct, (size_t)(B * ctx), "text embeddings");
    if (!rc) rc = dc_buf_alloc(be, &b->ctx32, DC_F32, (size_t)(B * ctx), "text embeddings (f32)");
    b->h_ctx = pinned(be, sizeof(float) * (size_t)(B * ctx), &rc);
    if (!rc && vae) {
        rc = dc_buf_alloc(be, &b->img, ct, (size_t)(B * b->pix), "pictures");
        if (!rc) rc = dc_buf_alloc(be, &b->mean, ct, (size_t)(B * b->lat), "latent means");
        if (!rc) rc = dc_buf_alloc(be, &b->logvar, ct, (size_t)(B * b->lat), "latent log-variances");
        if (!rc) rc = dc_buf_alloc(be, &b->lat32, DC_F32, (size_t)(2 * B * b->lat), "latents (f32)");
        b->h_in = pinned(be, dc_dtype_size(ct) * (size_t)(B * b->pix), &rc);
        b->h_lat = pinned(be, sizeof(float) * (size_t)(2 * B * b->lat), &rc);
        if (!rc) rc = dc_vae_reserve_batch(m->sd.vae, B, vae_batch ? B : 1, H, W);
    }
    b->h_px = malloc((size_t)(B * b->pix));
    b->m16 = malloc(sizeof(uint16_t) * (size_t)(B * b->lat + 1));
    b->v16 = malloc(sizeof(uint16_t) * (size_t)(B * b->lat + 1));
    b->c16 = malloc(sizeof(uint16_t) * (size_t)(B * ctx));
    b->pos = malloc(sizeof *b->pos * (size_t)B);
    b->orig_w = malloc(sizeof(int) * (size_t)B), b->orig_h = malloc(sizeof(int) * (size_t)B);
    b->tokens = malloc(sizeof(int) * (size_t)B);
    b->caption = malloc(sizeof *b->caption * (size_t)B);
    b->failed = malloc(sizeof *b->failed * (size_t)B), b->why = malloc(sizeof *b->why * (size_t)B);
    if (!rc && (!b->h_px || !b->m16 || !b->v16 || !b->c16 || !b->pos || !b->orig_w || !b->orig_h || !b->tokens ||
                !b->caption || !b->failed || !b->why))
        rc = dc_fail("out of memory for a batch of %d pictures of %dx%d", B, W, H);
    if (rc) bufs_free(be, b);
    return rc;
}

// The compute dtype's size, and picture k's slot of b->h_in.
static size_t in_size(const dc_prepare_models *m) { return dc_dtype_size(m->be->compute); }
static void *in_slot(const dc_prepare_models *m, const batch_bufs *b, int k) {
    return (char *)b->h_in + (size_t)k * b->pix * in_size(m);
}

// Moves a loaded picture from slot `from` of the batch to slot `to`.
static void move_slot(const dc_prepare_models *m, batch_bufs *b, int from, int to) {
    if (b->h_in) memcpy(in_slot(m, b, to), in_slot(m, b, from), in_size(m) * (size_t)b->pix);
    memcpy(b->h_px + to * b->pix, b->h_px + from * b->pix, (size_t)b->pix);
    b->orig_w[to] = b->orig_w[from], b->orig_h[to] = b->orig_h[from];
}

// Reads and resizes picture `e` of the set into slot k of the batch: its
// bytes, and (with a VAE) its values in [-1, 1] in the compute dtype, as the
// device's cast from fp32 would round them.
static int load_picture(const dc_prepare_models *m, const dc_picture_set *set, int64_t e, const dc_prepare_opts *o,
                        batch_bufs *b, int k) {
    dc_image pic, fit;
    DC_TRY(dc_picture_set_read(set, e, &pic, o->max_pixels, false));
    int rc = dc_image_fit(&pic, b->W, b->H, DC_RESIZE_CROP, &fit);
    if (rc == 0) {
        b->orig_w[k] = pic.width, b->orig_h[k] = pic.height;
        const int64_t plane = (int64_t)b->W * b->H;
        uint8_t *px = b->h_px + k * b->pix;
        for (int64_t i = 0; i < plane; i++)
            for (int c = 0; c < 3; c++) px[c * plane + i] = fit.rgb[i * 3 + c];
        const dc_dtype dt = m->be->compute;
        void *in = b->h_in ? in_slot(m, b, k) : NULL;
        for (int64_t i = 0; in && i < b->pix; i++) {
            const float v = dc_pixel_float(px[i]);
            if (dt == DC_F32) ((float *)in)[i] = v;
            else ((uint16_t *)in)[i] = dt == DC_BF16 ? dc_f32_to_bf16(v) : dc_f32_to_f16(v);
        }
    }
    dc_image_free(&pic), dc_image_free(&fit);
    return rc;
}

// Queues the text encoder and the VAE on the n pictures loaded, and the
// downloads of their results (see above).
static int submit(dc_prepare_models *m, batch_bufs *b, int n) {
    dc_backend *be = m->be;
    const int64_t ctx = (int64_t)b->T * b->D;
    for (int k = 0; k < n; k++) {
        int32_t ids[DC_CLIP_CONTEXT];
        int count;
        DC_TRY(dc_clip_tokenize(&m->sd.tok, b->caption[k], ids, &count));
        b->tokens[k] = dc_clip_counted(count);  // with BOS and EOS
    }
    // the pictures go up beside the text encoder (once the ops queued before are done)
    const int64_t up = m->sd.vae ? be->copy_async(be, b->img.p, b->h_in, in_size(m) * (size_t)(n * b->pix), false) : 0;
    DC_TRY(dc_sd_encode_prompts(&m->sd, b->caption, n, b->ctx));
    be->cast(be, b->ctx32, b->ctx, n * ctx);
    b->ticket = be->copy_async(be, b->h_ctx, b->ctx32.p, sizeof(float) * (size_t)(n * ctx), true);
    if (m->sd.vae) {
        be->wait_ticket(be, up);
        DC_TRY(dc_vae_encode(m->sd.vae, b->mean, b->logvar, b->img, n, b->H, b->W));
        be->cast(be, b->lat32, b->mean, n * b->lat);
        be->cast(be, dc_buf_at(b->lat32, n * b->lat), b->logvar, n * b->lat);
        b->ticket = be->copy_async(be, b->h_lat, b->lat32.p, sizeof(float) * (size_t)(2 * n * b->lat), true);
    }
    return dc_backend_status(be);
}

// Waits for a submitted batch's results and rounds them to what is written.
static int collect(dc_prepare_models *m, batch_bufs *b, int n) {
    dc_backend *be = m->be;
    const int64_t ctx = (int64_t)b->T * b->D;
    DC_TRY(be->host_wait(be, b->ticket));
    DC_TRY(dc_backend_status(be));  // the downloads' contents are undefined after an error
    for (int64_t i = 0; i < n * ctx; i++) b->c16[i] = dc_f32_to_f16(b->h_ctx[i]);
    const float *mean = b->h_lat, *logvar = b->h_lat + n * b->lat;
    for (int64_t i = 0; m->sd.vae && i < n * b->lat; i++)
        b->m16[i] = dc_f32_to_f16(mean[i]), b->v16[i] = dc_f32_to_f16(logvar[i]);
    return 0;
}

// ---- writing

typedef struct {
    int64_t pos;
    int copy;
} written_rec;

typedef struct {
    dc_mds_writer *w;
    const char *out, *settings;
    progress_state st;            // what the finished shards hold
    int64_t base_corrupt;         // pictures skipped before this run's start in this job, and in earlier jobs
    written_rec *rec;             // the samples written since st's point, in order
    int64_t nrec, rec_cap;
    int64_t *corrupt;             // positions skipped in this run, this job
    int64_t ncorrupt, corrupt_cap;
} writer_state;

static int grow(void **p, int64_t *cap, int64_t n, size_t elem) {
    if (n < *cap) return 0;
    int64_t c = *cap ? *cap * 2 : 256;
    void *q = realloc(*p, elem * (size_t)c);
    if (!q) return dc_fail("out of memory");
    *p = q, *cap = c;
    return 0;
}

// After a write: when a shard was finished, the progress file moves on to
// the first sample it does not hold.
static int commit(writer_state *ws) {
    int shards;
    int64_t samples;
    dc_mds_writer_progress(ws->w, &shards, &samples);
    if (shards == ws->st.shards) return 0;
    const int64_t done = samples - ws->st.samples;  // records now in finished shards
    const written_rec r = ws->rec[done];            // the sample just written is never among them
    memmove(ws->rec, ws->rec + done, sizeof *ws->rec * (size_t)(ws->nrec - done));
    ws->nrec -= done;
    int64_t before = 0;
    for (int64_t i = 0; i < ws->ncorrupt; i++) before += ws->corrupt[i] < r.pos;
    ws->st.shards = shards, ws->st.samples = samples, ws->st.next = r.pos, ws->st.copy = r.copy;
    ws->st.corrupt = ws->base_corrupt + before;
    return progress_save(ws->out, ws->settings, &ws->st);
}

// The columns, in the order values are passed (the writer sorts them by name).
typedef struct {
    dc_mds_spec spec[NCOLS];
    char enc[3][64];
    int n;
} columns;

static void columns_make(columns *c, const batch_bufs *b, bool latents) {
    int k = 0;
    c->spec[k++] = (dc_mds_spec){"caption", "str"};
    if (latents) {
        snprintf(c->enc[0], sizeof c->enc[0], "ndarray:float16:%d,%d,%d", b->C, b->h, b->w);
        c->spec[k++] = (dc_mds_spec){"latents_mean", c->enc[0]};
        c->spec[k++] = (dc_mds_spec){"latents_logvar", c->enc[0]};
    } else {
        snprintf(c->enc[1], sizeof c->enc[1], "ndarray:uint8:3,%d,%d", b->H, b->W);
        c->spec[k++] = (dc_mds_spec){"pixels", c->enc[1]};
    }
    c->spec[k++] = (dc_mds_spec){"original_height", "int32"};
    c->spec[k++] = (dc_mds_spec){"original_width", "int32"};
    snprintf(c->enc[2], sizeof c->enc[2], "ndarray:float16:%d,%d", b->T, b->D);
    c->spec[k++] = (dc_mds_spec){"text_embeddings", c->enc[2]};
    c->spec[k++] = (dc_mds_spec){"text_tokens", "int32"};
    c->n = k;
}

static int write_sample(writer_state *ws, const batch_bufs *b, int k, bool latents) {
    const int64_t ctx = (int64_t)b->T * b->D;
    const int32_t oh = b->orig_h[k], ow = b->orig_w[k], tokens = b->tokens[k];
    dc_mds_value v[NCOLS] = {{0}};
    int i = 0;
    v[i++] = (dc_mds_value){b->caption[k], strlen(b->caption[k]), 0, 0, NULL};
    if (latents) {
        v[i++] = (dc_mds_value){b->m16 + k * b->lat, sizeof(uint16_t) * (size_t)b->lat, DC_MDS_F16, 0, NULL};
        v[i++] = (dc_mds_value){b->v16 + k * b->lat, sizeof(uint16_t) * (size_t)b->lat, DC_MDS_F16, 0, NULL};
    } else {
        v[i++] = (dc_mds_value){b->h_px + k * b->pix, (size_t)b->pix, DC_MDS_U8, 0, NULL};
    }
    v[i++] = (dc_mds_value){&oh, 4, 0, 0, NULL};
    v[i++] = (dc_mds_value){&ow, 4, 0, 0, NULL};
    v[i++] = (dc_mds_value){b->c16 + k * ctx, sizeof(uint16_t) * (size_t)ctx, DC_MDS_F16, 0, NULL};
    v[i++] = (dc_mds_value){&tokens, 4, 0, 0, NULL};
    return dc_mds_write(ws->w, v);
}

typedef struct {
    dc_prepare_progress_fn fn;
    void *ctx;
    int64_t done, total, written;
} progress_cb;

// ---- reading a batch

// The pictures [a, end) of job j read and resized into b's slots, on all
// cores (each into its own slot, its error kept in failed/why).
typedef struct {
    const dc_prepare_models *m;
    const dc_picture_set *set;
    const job *j;
    const dc_prepare_opts *o;
    batch_bufs *b;
    int64_t a, end;
} batch_read;

static void read_batch(const batch_read *r) {
    const int nb = (int)(r->end - r->a);
#pragma omp parallel for schedule(dynamic, 1)
    for (int k = 0; k < nb; k++) {
        r->b->failed[k] = load_picture(r->m, r->set, r->j->idx[r->a + k], r->o, r->b, k) != 0;
        if (r->b->failed[k]) snprintf(r->b->why[k], sizeof r->b->why[k], "%s", dc_error());
    }
}

static void *read_batch_thread(void *p) {
    read_batch(p);
    return NULL;
}

// The next batch's reading, on a thread of its own while the current batch
// is encoded and written (o->overlap), or at wait() when it is not.
typedef struct {
    batch_read r;
    pthread_t th;
    bool running, pending;
} reader;

static void reader_start(reader *rd, const batch_read *r, bool overlap) {
    rd->r = *r;
    rd->pending = true;
    rd->running = overlap && pthread_create(&rd->th, NULL, read_batch_thread, &rd->r) == 0;
}

static void reader_wait(reader *rd) {
    if (rd->running) pthread_join(rd->th, NULL);
    else if (rd->pending) read_batch(&rd->r);  // no thread: read it now
    rd->running = rd->pending = false;
}

// Collects batch b and writes its samples (those from the run's start on).
static int write_batch(dc_prepare_models *m, const dc_picture_set *set, const job *j, writer_state *ws,
                       progress_cb *pc, batch_bufs *b, int64_t start, int copy0) {
    const bool latents = m->sd.vae != NULL;
    if (b->n) DC_TRY(collect(m, b, b->n));
    for (int k = 0; k < b->n; k++) {
        if (b->pos[k] < start) continue;
        const int reps = set->e[j->idx[b->pos[k]]].repeats;
        for (int c = b->pos[k] == start ? copy0 : 0; c < reps; c++) {
            DC_TRY(write_sample(ws, b, k, latents));
            DC_TRY(grow((void **)&ws->rec, &ws->rec_cap, ws->nrec, sizeof *ws->rec));
            ws->rec[ws->nrec++] = (written_rec){b->pos[k], c}, pc->written++;
            DC_TRY(commit(ws));
        }
    }
    pc->done += b->end - (b->a > start ? b->a : start);
    return pc->fn && pc->fn(pc->ctx, pc->done, pc->total, pc->written) ? -1 : 0;
}

// One data set: job j's pictures from the point ws->st gives.
static int run_job(dc_prepare_models *m, const dc_picture_set *set, const job *j, const dc_prepare_opts *o,
                   writer_state *ws, progress_cb *pc) {
    const bool latents = m->sd.vae != NULL;
    const int B = (int)(o->batch < j->n ? o->batch : j->n);
    // with overlap three sets of buffers: one read, one encoded, one written (see "encoding a batch")
    enum { SETS = 3 };
    const int sets = o->overlap ? SETS : 1;
    batch_bufs bufs[SETS] = {0};
    for (int i = 0; i < sets; i++)
        if (bufs_alloc(m, &bufs[i], B, j->height, j->width, o->vae_batch)) {
            for (int k = 0; k < i; k++) bufs_free(m->be, &bufs[k]);
            return -1;
        }
    columns cols;
    columns_make(&cols, &bufs[0], latents);
    const bool resuming = ws->st.shards > 0 || ws->st.next > 0 || ws->st.copy > 0;
    // A killed run's temporary files, and an index it wrote just before it
    // stopped (the progress file still names this data set as unfinished).
    char index[4300];
    snprintf(index, sizeof index, "%s/index.json", j->dir);
    int found = 0, rc = clean_dir(j->dir, true, true, &found);
    if (!rc && dc_file_exists(index) && unlink(index)) rc = dc_fail("%s: cannot remove it", index);
    dc_mds_write_opts wo = {o->zstd_level, o->shard_bytes};
    if (!rc) rc = dc_mds_writer_open(&ws->w, j->dir, cols.spec, cols.n, &wo);
    int64_t held = 0;
    if (!rc && resuming) rc = dc_mds_writer_resume(ws->w, ws->st.shards, &held);
    if (!rc && held != ws->st.samples)
        rc = dc_fail("%s: its %d shards hold %lld samples, and " PROGRESS_FILE " says %lld: give --overwrite to start "
                     "over", j->dir, ws->st.shards, (long long)held, (long long)ws->st.samples);
    const int64_t start = ws->st.next;
    const int copy0 = ws->st.copy;
    ws->nrec = ws->ncorrupt = 0;
    // Batches are the same windows of the list in every run, so a picture is
    // always encoded beside the same others: a continued run writes the bytes
    // an uninterrupted one would. Batch i + 1 is read while batch i is
    // encoded and batch i - 1 written.
    reader rd = {0};
    int cur = 0;
    batch_bufs *pending = NULL;  // submitted, not yet written
    const int64_t first = start / B * B;
    if (!rc && first < j->n)
        reader_start(&rd, &(batch_read){m, set, j, o, &bufs[0], first, first + B < j->n ? first + B : j->n}, false);
    for (int64_t a = first; a < j->n && !rc; a += B, cur = (cur + 1) % sets) {
        const int64_t end = a + B < j->n ? a + B : j->n;
        batch_bufs *b = &bufs[cur];
        reader_wait(&rd);  // this batch's pictures
        if (end < j->n)
            reader_start(&rd, &(batch_read){m, set, j, o, &bufs[(cur + 1) % sets], end,
                                             end + B < j->n ? end + B : j->n}, o->overlap);
        // the readable pictures packed in order, the others reported, as one at a time would
        const int nb = (int)(end - a);
        int n = 0;
        for (int k = 0; k < nb && !rc; k++) {
            const int64_t pos = a + k;
            if (!b->failed[k]) {
                if (n != k) move_slot(m, b, k, n);
                b->caption[n] = set->e[j->idx[pos]].caption, b->pos[n] = pos;
                n++;
            } else if (pos >= start) {
                dc_warn("skipped: %s", b->why[k]);
                if ((rc = grow((void **)&ws->corrupt, &ws->corrupt_cap, ws->ncorrupt, sizeof *ws->corrupt))) break;
                ws->corrupt[ws->ncorrupt++] = pos;
            }
        }
        b->n = n, b->a = a, b->end = end, b->ticket = 0;
        if (!rc && n) rc = submit(m, b, n);
        // the batch before is written while this one is encoded (without overlap: this one, now)
        if (!rc && sets == 1) rc = write_batch(m, set, j, ws, pc, b, start, copy0);
        else if (!rc && pending) rc = write_batch(m, set, j, ws, pc, pending, start, copy0);
        pending = sets > 1 ? b : NULL;
    }
    if (!rc && pending) rc = write_batch(m, set, j, ws, pc, pending, start, copy0);
    if (rd.running) pthread_join(rd.th, NULL);  // stopped early: the reading in flight ends before its buffers go
    m->be->sync(m->be);                         // and the device's copies into them
    for (int i = 0; i < sets; i++) bufs_free(m->be, &bufs[i]);
    if (rc) {
        dc_mds_writer_free(ws->w);
        ws->w = NULL;
        return rc;
    }
    ws->base_corrupt += ws->ncorrupt;
    if (ws->st.samples + ws->nrec == 0) {  // no picture of the job could be read: no data set
        dc_mds_writer_free(ws->w);
        ws->w = NULL;
        return 0;
    }
    rc = dc_mds_writer_finish(ws->w);
    ws->w = NULL;
    return rc;
}

static int write_summary(const char *out, const dc_prepare_models *m, const dc_prepare_opts *o, const job *j,
                         const int64_t *samples, int njobs, const dc_prepare_stats *st) {
    char path[4200];
    snprintf(path, sizeof path, "%s/" SUMMARY_FILE, out);
    dc_atomic_file *af = dc_atomic_begin(path);
    if (!af) return -1;
    FILE *f = dc_atomic_stream(af);
    fprintf(f, "{\n  \"latents\": %s,\n", m->sd.vae ? "true" : "false");
    if (m->sd.vae)
        fprintf(f, "  \"latent_scaling_factor\": %.9g,\n  \"latent_scaling_applied\": false,\n", m->scaling_factor);
    fprintf(f, "  \"size\": %d,\n  \"pictures\": %lld,\n  \"samples\": %lld,\n  \"corrupt\": %lld,\n", o->size,
            (long long)st->pictures, (long long)st->samples, (long long)st->corrupt);
    fprintf(f, "  \"buckets\": %s", o->buckets ? "[" : "null\n}\n");
    for (int i = 0, k = 0; o->buckets && i < njobs; i++)
        if (samples[i])
            fprintf(f, "%s\n    {\"folder\": \"%dx%d\", \"width\": %d, \"height\": %d, \"samples\": %lld}",
                    k++ ? "," : "", j[i].width, j[i].height, j[i].width, j[i].height, (long long)samples[i]);
    if (o->buckets) fputs("\n  ]\n}\n", f);
    return dc_atomic_end(af, 1);
}

static int check_opts(const dc_prepare_opts *o, const dc_prepare_models *m) {
    // Latents: whole latent pixels, and at least SD's 8. Pixels: any side
    // (Fashion-MNIST's 28 stays as it is); the UNet checks its own alignment.
    const int f = m->sd.vae ? dc_vae_factor(&m->sd.vae->cfg) : 1, unit = m->sd.vae ? (f > 8 ? f : 8) : 1;
    if (o->batch < 1 || o->batch > 4096) return dc_fail("batch %d: 1 to 4096", o->batch);
    if (!o->buckets && (o->size < 8 || o->size > DC_IMAGE_MAX_SIDE || o->size % unit))
        return dc_fail("size %d: a multiple of %d from 8 up to %d", o->size, unit, DC_IMAGE_MAX_SIDE);
    if (o->buckets && (o->min_side % 64 || o->max_side % 64 || o->size < 64))
        return dc_fail("buckets: the sides (%d..%d) must be multiples of 64, and the size (%d) at least 64",
                       o->min_side, o->max_side, o->size);
    return 0;
}

int dc_prepare_run(dc_prepare_models *m, const dc_picture_set *set, const char *out, const dc_prepare_opts *o,
                   dc_prepare_progress_fn progress, void *ctx, dc_prepare_stats *st) {
    memset(st, 0, sizeof *st);
    st->pictures = set->n;
    DC_TRY(check_opts(o, m));
    char settings[8400], path[4200];
    settings_text(settings, sizeof settings, set, o);
    DC_TRY(dc_mkdir_p(out));
    snprintf(path, sizeof path, "%s/" PROGRESS_FILE, out);
    progress_state rs = {0};
    bool resume = false;
    int found = 0;
    // what a killed run was writing when it died (a shard, the index, its records): never whole, removed
    DC_TRY(clean_dir(out, true, true, &found));
    found = 0;
    if (o->overwrite) DC_TRY(clean_dir(out, false, true, &found));
    else if (dc_file_exists(path)) {
        DC_TRY(progress_load(path, settings, &rs));
        resume = true;
    } else {
        DC_TRY(clean_dir(out, false, false, &found));
        char sum[4200];
        snprintf(sum, sizeof sum, "%s/" SUMMARY_FILE, out);
        if (dc_file_exists(sum)) return dc_fail("%s holds a prepared data set already: give --overwrite to make it again", out);
        if (found) return dc_fail("%s holds MDS shards that no unfinished run recorded: give --overwrite to remove them", out);
    }
    job *jobs;
    int njobs;
    int64_t probe_corrupt;
    DC_TRY(plan_jobs(set, out, o, &jobs, &njobs, &probe_corrupt));
    int rc = 0;
    if (resume && rs.job > njobs) rc = dc_fail("%s: it names data set %d of %d: give --overwrite", path, rs.job, njobs);
    writer_state ws = {.out = out, .settings = settings, .base_corrupt = resume ? rs.corrupt : 0};
    progress_cb pc = {progress, ctx, 0, 0, 0};
    for (int i = 0; i < njobs; i++) pc.total += jobs[i].n;
    for (int i = 0; i < rs.job && i < njobs; i++) pc.done += jobs[i].n;
    if (resume) pc.done += rs.next;
    if (!rc && !resume) rc = progress_save(out, settings, &(progress_state){0});
    for (int i = resume ? rs.job : 0; i < njobs && !rc; i++) {
        ws.st = resume && i == rs.job ? rs : (progress_state){i, 0, 0, 0, 0, ws.base_corrupt};
        rc = run_job(m, set, &jobs[i], o, &ws, &pc);
        if (!rc) rc = progress_save(out, settings, &(progress_state){i + 1, 0, 0, 0, 0, ws.base_corrupt});
    }
    // Every data set read back: the counts reported are the files'.
    int64_t *samples = calloc((size_t)njobs + 1, sizeof *samples);
    if (!rc && !samples) rc = dc_fail("out of memory");
    for (int i = 0; i < njobs && !rc; i++) {
        dc_mds_reader *r;
        snprintf(path, sizeof path, "%s/index.json", jobs[i].dir);
        if (!dc_file_exists(path)) continue;  // every picture of it unreadable
        if ((rc = dc_mds_open(&r, jobs[i].dir))) break;
        st->nbuckets++;
        samples[i] = dc_mds_samples(r);
        st->samples += samples[i];
        if (resume && i < rs.job) st->resumed += samples[i];
        dc_mds_close(r);
    }
    st->resumed += resume ? rs.samples : 0;
    st->corrupt = probe_corrupt + ws.base_corrupt;
    if (!rc && st->samples == 0) rc = dc_fail("%s: none of its %lld pictures could be read", out, (long long)set->n);
    if (!rc) rc = write_summary(out, m, o, jobs, samples, njobs, st);
    snprintf(path, sizeof path, "%s/" PROGRESS_FILE, out);
    if (!rc && unlink(path)) rc = dc_fail("%s: cannot remove it", path);
    free(samples), free(ws.rec), free(ws.corrupt);
    jobs_free(jobs, njobs);
    return rc;
}
