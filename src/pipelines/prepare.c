// `diffusion prepare`'s work: pictures resized, encoded in batches, written
// to MDS shards, with what the finished shards hold recorded so that a
// stopped run continues (see prepare.h); a batch's buffers, reading and
// encoding are prepare_batch.c's.
#include "pipelines/prepare.h"
#include "pipelines/prepare_batch.h"

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

// Collects batch b and writes its samples (those from the run's start on).
static int write_batch(dc_prepare_models *m, const dc_picture_set *set, const job *j, writer_state *ws,
                       progress_cb *pc, batch_bufs *b, int64_t start, int copy0) {
    const bool latents = m->sd.vae != NULL;
    if (b->n) DC_TRY(prep_collect(m, b, b->n));
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
    // with overlap three sets of buffers: one read, one encoded, one written (prepare_batch.h)
    enum { SETS = 3 };
    const int sets = o->overlap ? SETS : 1;
    batch_bufs bufs[SETS] = {0};
    for (int i = 0; i < sets; i++)
        if (prep_bufs_alloc(m, &bufs[i], B, j->height, j->width, o->vae_batch)) {
            for (int k = 0; k < i; k++) prep_bufs_free(m->be, &bufs[k]);
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
    prep_reader rd = {0};
    int cur = 0;
    batch_bufs *pending = NULL;  // submitted, not yet written
    const int64_t first = start / B * B;
    if (!rc && first < j->n)
        prep_reader_start(&rd, &(batch_read){m, set, j->idx, o, &bufs[0], first, first + B < j->n ? first + B : j->n},
                          false);
    for (int64_t a = first; a < j->n && !rc; a += B, cur = (cur + 1) % sets) {
        const int64_t end = a + B < j->n ? a + B : j->n;
        batch_bufs *b = &bufs[cur];
        prep_reader_wait(&rd);  // this batch's pictures
        if (end < j->n)
            prep_reader_start(&rd, &(batch_read){m, set, j->idx, o, &bufs[(cur + 1) % sets], end,
                                                  end + B < j->n ? end + B : j->n}, o->overlap);
        // the readable pictures packed in order, the others reported, as one at a time would
        const int nb = (int)(end - a);
        int n = 0;
        for (int k = 0; k < nb && !rc; k++) {
            const int64_t pos = a + k;
            if (!b->failed[k]) {
                if (n != k) prep_move_slot(m, b, k, n);
                b->caption[n] = set->e[j->idx[pos]].caption, b->pos[n] = pos;
                n++;
            } else if (pos >= start) {
                dc_warn("skipped: %s", b->why[k]);
                if ((rc = grow((void **)&ws->corrupt, &ws->corrupt_cap, ws->ncorrupt, sizeof *ws->corrupt))) break;
                ws->corrupt[ws->ncorrupt++] = pos;
            }
        }
        b->n = n, b->a = a, b->end = end, b->ticket = 0;
        if (!rc && n) rc = prep_submit(m, b, n);
        // the batch before is written while this one is encoded (without overlap: this one, now)
        if (!rc && sets == 1) rc = write_batch(m, set, j, ws, pc, b, start, copy0);
        else if (!rc && pending) rc = write_batch(m, set, j, ws, pc, pending, start, copy0);
        pending = sets > 1 ? b : NULL;
    }
    if (!rc && pending) rc = write_batch(m, set, j, ws, pc, pending, start, copy0);
    if (rd.running) pthread_join(rd.th, NULL);  // stopped early: the reading in flight ends before its buffers go
    m->be->sync(m->be);                         // and the device's copies into them
    for (int i = 0; i < sets; i++) prep_bufs_free(m->be, &bufs[i]);
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
