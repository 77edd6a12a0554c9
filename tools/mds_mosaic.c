// Rewrites a data set `diffusion prepare` wrote in the layout of MosaicML's
// LAION shards (mosaicml/diffusion's precomputed latents: raw fp16 values in
// "bytes" columns whose shapes the index does not give), so the tests can
// train on such shards without Python:
//
//   mds_mosaic IN_DIR OUT_DIR [zstd] [cut K]
//
// OUT_DIR's columns: latents_256 (IN's latents_mean), caption_latents (IN's
// text_embeddings), caption. zstd compresses the shards; cut K drops the
// last 2 bytes of sample K's latents (a broken sample). Exit status 0, or 1
// with a message.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/mds.h"

// Column k of the sample read: its values' bytes.
static int values(const dc_mds_reader *r, const dc_mds_sample *s, int k, dc_mds_value *v) {
    dc_mds_array a;
    DC_TRY(dc_mds_decode(dc_mds_column_at(r, k), s->data[k], s->len[k], &a));
    *v = (dc_mds_value){a.values, (size_t)a.count * dc_mds_dtype_size(a.dtype), 0, 0, NULL};
    return 0;
}

static int rewrite(const char *in, const char *out, int zstd, long long cut) {
    dc_mds_reader *r;
    DC_TRY(dc_mds_open(&r, in));
    const int lat = dc_mds_find(r, "latents_mean"), text = lat < 0 ? -1 : dc_mds_find(r, "text_embeddings"),
              cap = text < 0 ? -1 : dc_mds_find(r, "caption");
    const dc_mds_spec cols[] = {{"latents_256", "bytes"}, {"caption_latents", "bytes"}, {"caption", "str"}};
    const dc_mds_write_opts o = {zstd ? 3 : 0, 24000};  // a few samples a shard
    dc_mds_writer *w = NULL;
    dc_mds_sample s = {0};
    int rc = cap < 0 ? -1 : dc_mds_writer_open(&w, out, cols, 3, &o);
    for (int64_t i = 0; !rc && i < dc_mds_samples(r); i++) {
        dc_mds_value v[3];
        rc = dc_mds_read(r, i, &s) || values(r, &s, lat, &v[0]) || values(r, &s, text, &v[1]);
        if (rc) break;
        v[2] = (dc_mds_value){s.data[cap], s.len[cap], 0, 0, NULL};
        if (i == cut) v[0].len -= 2;
        rc = dc_mds_write(w, v);
    }
    dc_mds_sample_free(&s);
    dc_mds_close(r);
    if (w) rc = rc ? (dc_mds_writer_free(w), rc) : dc_mds_writer_finish(w);
    return rc;
}

int main(int argc, char **argv) {
    const int zstd = argc > 3 && !strcmp(argv[3], "zstd"), at = 3 + zstd;
    const long long cut = argc > at + 1 && !strcmp(argv[at], "cut") ? atoll(argv[at + 1]) : -1;
    if (argc < 3 || argc != at + (cut >= 0 ? 2 : 0)) {
        fprintf(stderr, "usage: mds_mosaic IN_DIR OUT_DIR [zstd] [cut K]\n");
        return 1;
    }
    if (rewrite(argv[1], argv[2], zstd, cut)) {
        fprintf(stderr, "mds_mosaic: %s\n", dc_error());
        return 1;
    }
    return 0;
}
