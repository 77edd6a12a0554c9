// Times the GPU's channels-last GroupNorm, forward and backward (with SiLU
// where the UNet has it), and the transformers' LayerNorm, at the shapes of
// SD 2.1's UNet training at 256 px (latents 32x32), batch 64 by default: each
// shape's microseconds a call and the bytes a call must move over that time,
// then the step's totals, each shape weighted by how many of its norms a step
// runs. Random bf16 maps, the backward from the forward's statistics (with
// the parameters' gradients written); one warm-up call a shape.
//
//   norm_bench [--batch N] [--calls N]
//
// Needs a GPU (exits 1 saying so without one). For comparing builds of the
// norm kernels in one run: the figures of docs/PERFORMANCE.md's GroupNorm rows.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/error.h"

typedef struct {
    int hw, c, silu, count;  // pixels, channels, SiLU after, norms of this shape a step
} shape;

// The UNet's GroupNorms (32 groups) at 32x32 latents: resnets (SiLU) and
// transformers (none), down, mid and up blocks with their concatenations.
static const shape k_shapes[] = {
    {1024, 320, 1, 11}, {1024, 320, 0, 6}, {1024, 640, 1, 2},  {1024, 960, 1, 1},  {256, 320, 1, 1},
    {256, 640, 1, 9},   {256, 640, 0, 5},  {256, 960, 1, 1},   {256, 1280, 1, 1},  {256, 1920, 1, 1},
    {64, 640, 1, 1},    {64, 1280, 1, 9},  {64, 1280, 0, 5},   {64, 1920, 1, 1},   {64, 2560, 1, 2},
    {16, 1280, 1, 11},  {16, 1280, 0, 1},  {16, 2560, 1, 3},
};
enum { NSHAPES = sizeof k_shapes / sizeof k_shapes[0], GROUPS = 32, MAX_C = 2560 };

// The transformers' LayerNorms (3 a transformer) over their tokens: 5
// transformers at each of 32x32, 16x16 and 8x8, the mid block's at 4x4.
static const shape k_ln_shapes[] = {{1024, 320, 0, 15}, {256, 640, 0, 15}, {64, 1280, 0, 15}, {16, 1280, 0, 3}};
enum { NLN = sizeof k_ln_shapes / sizeof k_ln_shapes[0] };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// The maps, parameters, their gradients and the statistics the ops share.
typedef struct {
    dc_buf x, dy, y, dx, gamma, beta, dg, db, mean, rstd;
} norm_bufs;

// us[0], us[1]: microseconds a call of shape p's forward and backward (a
// GroupNorm, or with ln a LayerNorm over its B hw tokens), after a warm-up call.
static void time_shape(dc_backend *be, const norm_bufs *b, bool ln, const shape *p, int B, int calls, double us[2]) {
    const int64_t M = (int64_t)B * p->hw;
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k <= calls; k++) {
            if (k == 1) be->sync(be), us[pass] = now();  // the first call warms up
            if (ln && pass == 0)
                be->layer_norm_fwd(be, b->y, b->mean, b->rstd, b->x, b->gamma, b->beta, M, p->c, 1e-5f);
            else if (ln)
                be->layer_norm_bwd(be, b->dx, b->dg, b->db, b->dy, b->x, b->mean, b->rstd, b->gamma, M, p->c,
                                   DC_BWD_DW_SET);
            else if (pass == 0)
                be->group_norm_nhwc_fwd(be, b->y, b->mean, b->rstd, b->x, b->gamma, b->beta, B, p->c, p->hw, GROUPS,
                                        1e-5f, p->silu);
            else
                be->group_norm_nhwc_bwd(be, b->dx, b->dg, b->db, b->dy, b->x, b->mean, b->rstd, b->gamma, b->beta, B,
                                        p->c, p->hw, GROUPS, p->silu, DC_BWD_DW_SET);
        }
        be->sync(be);
        us[pass] = (now() - us[pass]) / calls * 1e6;
    }
}

static int usage(FILE *f, int rc) {
    fputs("usage: norm_bench [--batch N] [--calls N]\n"
          "Times the GPU's channels-last GroupNorm and the LayerNorm, forward and backward,\n"
          "at SD 2.1's UNet shapes (256 px) and prints us a call, TB/s and the step's\n"
          "weighted totals.\n"
          "  --batch N   images (default 64)\n"
          "  --calls N   timed calls a shape and pass (default 40)\n",
          f);
    return rc;
}

int main(int argc, char **argv) {
    int B = 64, calls = 40;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(stdout, 0);
        int *v = !strcmp(argv[i], "--batch") ? &B : !strcmp(argv[i], "--calls") ? &calls : NULL;
        if (!v || i + 1 >= argc || (*v = atoi(argv[++i])) < 1) return usage(stderr, 2);
    }
    dc_backend *be = dc_backend_cuda_create(false);
    if (!be) {
        fprintf(stderr, "norm_bench: needs a GPU: %s\n", dc_error());
        return 1;
    }
    int64_t most = 0;
    for (int i = 0; i < NSHAPES; i++)
        if ((int64_t)k_shapes[i].hw * k_shapes[i].c > most) most = (int64_t)k_shapes[i].hw * k_shapes[i].c;
    const size_t n = (size_t)B * (size_t)most;
    int64_t stat_rows = GROUPS;  // a sample's statistics: its groups, or its tokens
    for (int i = 0; i < NLN; i++)
        if (k_ln_shapes[i].hw > stat_rows) stat_rows = k_ln_shapes[i].hw;
    dc_buf x, dy, y, dx, gamma, beta, dg, db, mean, rstd;
    if (dc_buf_alloc(be, &x, DC_BF16, n, "x") || dc_buf_alloc(be, &dy, DC_BF16, n, "dy") ||
        dc_buf_alloc(be, &y, DC_BF16, n, "y") || dc_buf_alloc(be, &dx, DC_BF16, n, "dx") ||
        dc_buf_alloc(be, &gamma, DC_BF16, MAX_C, "gamma") || dc_buf_alloc(be, &beta, DC_BF16, MAX_C, "beta") ||
        dc_buf_alloc(be, &dg, DC_F32, MAX_C, "dgamma") || dc_buf_alloc(be, &db, DC_F32, MAX_C, "dbeta") ||
        dc_buf_alloc(be, &mean, DC_F32, (size_t)B * stat_rows, "mean") ||
        dc_buf_alloc(be, &rstd, DC_F32, (size_t)B * stat_rows, "rstd")) {
        fprintf(stderr, "norm_bench: %s\n", dc_error());
        dc_backend_destroy(be);
        return 1;
    }
    uint16_t *h = malloc(n * sizeof *h);
    if (!h) {
        fprintf(stderr, "norm_bench: out of memory\n");
        dc_backend_destroy(be);
        return 1;
    }
    uint64_t s = 0x9e3779b97f4a7c15u;
    for (size_t i = 0; i < n; i++) {  // uniform in [-1, 1)
        s = s * 6364136223846793005u + 1442695040888963407u;
        h[i] = dc_f32_to_bf16((float)(s >> 40) / 8388608.0f - 1.0f);
    }
    be->upload(be, x.p, h, n * 2), be->upload(be, dy.p, h + 1, (n - 1) * 2);
    be->upload(be, gamma.p, h + 7, MAX_C * 2), be->upload(be, beta.p, h + 9000, MAX_C * 2);
    free(h);

    const norm_bufs nb = {x, dy, y, dx, gamma, beta, dg, db, mean, rstd};
    printf("| pixels | channels | SiLU | a step | forward us | TB/s | backward us | TB/s |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    double fwd = 0, bwd = 0;
    for (int i = 0; i < NSHAPES; i++) {
        const shape *p = &k_shapes[i];
        double us[2];
        time_shape(be, &nb, false, p, B, calls, us);
        const double map = 2.0 * B * p->hw * p->c;  // bytes of one bf16 map
        // forward: x read twice (sums, then the output), the output written;
        // backward: x and dy read twice, dx written
        printf("| %d | %d | %s | %d | %.1f | %.2f | %.1f | %.2f |\n", p->hw, p->c, p->silu ? "yes" : "no", p->count,
               us[0], 3 * map / us[0] / 1e6, us[1], 5 * map / us[1] / 1e6);
        fwd += us[0] * p->count, bwd += us[1] * p->count;
    }
    printf("a step (batch %d): forward %.3f ms, backward %.3f ms\n", B, fwd / 1e3, bwd / 1e3);

    printf("\n| LayerNorm rows | width | a step | forward us | TB/s | backward us | TB/s |\n");
    printf("|---|---|---|---|---|---|---|\n");
    double lfwd = 0, lbwd = 0;
    for (int i = 0; i < NLN; i++) {
        const shape *p = &k_ln_shapes[i];
        const int64_t M = (int64_t)B * p->hw;
        double us[2];
        time_shape(be, &nb, true, p, B, calls, us);
        const double map = 2.0 * M * p->c;
        // forward: x read, the output written; backward: x and dy read for dx
        // and again for the parameters' sums, dx written
        printf("| %lld | %d | %d | %.1f | %.2f | %.1f | %.2f |\n", (long long)M, p->c, p->count, us[0],
               2 * map / us[0] / 1e6, us[1], 5 * map / us[1] / 1e6);
        lfwd += us[0] * p->count, lbwd += us[1] * p->count;
    }
    printf("LayerNorm, a step (batch %d): forward %.3f ms, backward %.3f ms\n", B, lfwd / 1e3, lbwd / 1e3);
    const int rc = dc_backend_status(be) ? 1 : 0;
    if (rc) fprintf(stderr, "norm_bench: %s\n", dc_error());
    dc_backend_destroy(be);
    return rc;
}
