// DreamBooth's paired source (train/pairs.h) over two in-memory sets: every
// global batch's first half comes from the instance set and its second from
// the class set, each half in the order its set gives alone at half the
// batch; the samples weigh 2 and 2 x the prior weight; the conditioning and
// pictures are the sets' own; the fingerprint follows both sets and the
// weight; an odd batch and sets of different kinds are refused.
#include <string.h>

#include "check.h"
#include "core/error.h"
#include "tiny_data.h"
#include "train/pairs.h"

static int pair_make(dc_source *s, dc_dataset *a, dc_dataset *b, float w) {
    dc_source sa, sb;
    DC_TRY(dc_source_dataset(&sa, a, 11));
    if (dc_source_dataset(&sb, b, 12)) return dc_source_close(&sa), -1;
    return dc_source_pairs(s, &sa, &sb, w);
}

int main(void) {
    dc_dataset a, b;
    tiny_data(&a, 5), tiny_data(&b, 7);
    for (int i = 0; i < 7 * 64; i++) b.images[i] = -b.images[i];  // the class pictures differ
    b.fingerprint = dc_dataset_fingerprint(&b);
    dc_source p, ia, cb;
    CHECK(pair_make(&p, &a, &b, 0.5f) == 0, "pairs: %s", dc_error());
    dc_source_dataset(&ia, &a, 11), dc_source_dataset(&cb, &b, 12);
    CHECK(p.n == 12 && p.channels == 1 && p.height == 8 && p.ops->weight, "12 samples of 1x8x8, weighed");
    // batch 4: positions 4s, 4s+1 the instance set's at batch 2, 4s+2, 4s+3 the class set's
    int bad = 0;
    for (int64_t g = 0; g < 4 * 9; g++) {
        int64_t idx, want;
        const int64_t step = g / 4, k = g % 4;
        p.ops->index(&p, g, 4, &idx);
        if (k < 2) ia.ops->index(&ia, step * 2 + k, 2, &want);
        else cb.ops->index(&cb, step * 2 + k - 2, 2, &want), want += a.n;
        bad += idx != want;
        const float w = p.ops->weight(&p, idx);
        bad += w != (k < 2 ? 2.0f : 1.0f);
        float x[64], y[64];
        int32_t l1, l2;
        p.ops->x0(&p, idx, false, 1, 0, 0, x);
        (k < 2 ? &ia : &cb)->ops->x0(k < 2 ? &ia : &cb, k < 2 ? idx : idx - a.n, false, 1, 0, 0, y);
        p.ops->cond(&p, idx, false, &l1, NULL, NULL);
        (k < 2 ? &ia : &cb)->ops->cond(k < 2 ? &ia : &cb, k < 2 ? idx : idx - a.n, false, &l2, NULL, NULL);
        bad += memcmp(x, y, sizeof x) != 0 || l1 != l2;
    }
    CHECK(bad == 0, "each half of a batch is its set's order at half the batch, its weights 2 and 2 x 0.5: %d off",
          bad);
    int64_t idx;
    CHECK(p.ops->index(&p, 0, 3, &idx) != 0 && strstr(dc_error(), "must be even"), "an odd batch: '%s'", dc_error());
    dc_source q;
    CHECK(pair_make(&q, &a, &b, 0.25f) == 0 && q.fingerprint != p.fingerprint,
          "the fingerprint follows the prior weight");
    dc_source_close(&q);
    dc_dataset c;
    tiny_data(&c, 3);
    c.height = 4;  // another size
    CHECK(pair_make(&q, &a, &c, 1) != 0 && strstr(dc_error(), "different kinds"), "sets of another size: '%s'",
          dc_error());
    dc_source_close(&p), dc_source_close(&ia), dc_source_close(&cb);
    dc_dataset_free(&a), dc_dataset_free(&b), dc_dataset_free(&c);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
