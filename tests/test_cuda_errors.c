// Errors from the CUDA backend come back as errors, with their cause, never
// an abort: an impossible allocation, one past the memory cap (which the
// peak report respects), mixed dtypes inside an op (sticky, and
// returned by the model's forward and backward and by the sampler), attention
// the device cannot hold or outside the op's contract (also inside a graph
// capture), convolutions that were never reserved, then a fresh backend
// computing correctly. Each case runs in both GPU modes on a backend made for
// it. First, on the CPU backend alone (with or without a GPU), that its status
// stays 0 after ops.
//
// Skips the GPU cases (exit 0, with a message) where no GPU is present.
//
//   build/tests/test_cuda_errors [seed]
#include "cuda_check.h"

// A backend of the mode under test, made for one case (a failed one stays failed).
static dc_backend *fresh(void) {
    dc_backend *be = dc_backend_cuda_create(g_ct == DC_F32);
    if (!be) printf("FAIL creating a backend: %s\n", dc_error()), g_fail++;
    return be;
}

static bool has(const char *msg, const char *part) { return strstr(msg, part) != NULL; }

// Issues an attention op the op does not define (causal with more queries
// than keys) and, like a careless caller, reports success.
typedef struct { dc_backend *be; dc_buf out, lse, qkv; } bad_attn;
static int run_bad_attention(void *arg) {
    bad_attn *a = arg;
    dc_attn_shape sh = dc_attn_packed(1, 16, 320, 2);
    sh.causal = true, sh.Tk = 8;  // 16 queries, 8 keys
    a->be->attention_fwd(a->be, a->out, a->lse, a->qkv, dc_buf_at(a->qkv, 320), dc_buf_at(a->qkv, 640), &sh);
    return 0;
}

// Attention shapes outside the op's contract (a causal mask with more
// queries than keys, an empty sequence) come back as the backend's error
// naming the case, never a crash or silent output. (Every shape within it
// runs: tests/test_cuda_attention.c.)
static void test_attention_unsupported(void) {
    struct { int Tq, Tk, Dh; bool causal; const char *part; } cases[] = {
        {16, 8, 64, true, "at least as many keys as queries"}, {16, 0, 64, false, "at least 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dc_backend *be = fresh();
        if (!be) return;
        const int H = 2, D = H * cases[i].Dh, Tq = cases[i].Tq, Tk = cases[i].Tk;
        dc_attn_shape sh = {.B = 1, .H = H, .Tq = Tq, .Tk = Tk, .Dh = cases[i].Dh, .Dv = cases[i].Dh,
                            .causal = cases[i].causal, .q = dc_attn_rows(Tq, D, cases[i].Dh),
                            .k = dc_attn_rows(Tk, D, cases[i].Dh), .v = dc_attn_rows(Tk, D, cases[i].Dh),
                            .out = dc_attn_rows(Tq, D, cases[i].Dh)};
        size_t es = dc_dtype_size(g_ct);
        dc_buf q = {be->alloc(be, (size_t)Tq * D * es), g_ct}, k = {be->alloc(be, (size_t)Tk * D * es), g_ct};
        dc_buf v = {be->alloc(be, (size_t)Tk * D * es), g_ct}, o = {be->alloc(be, (size_t)Tq * D * es), g_ct};
        dc_buf lse = {be->alloc(be, (size_t)H * Tq * 4), DC_F32};
        dc_error_clear();
        be->attention_fwd(be, o, lse, q, k, v, &sh);
        char what[160];
        snprintf(what, sizeof what, "attention_fwd %s: status -1 naming it", cases[i].part);
        int rc = dc_backend_status(be);
        printf("     %s\n", rc ? dc_error() : "(no error)");
        expect(rc == -1 && has(dc_error(), cases[i].part), what);
        be->free(be, q.p), be->free(be, k.p), be->free(be, v.p), be->free(be, o.p), be->free(be, lse.p);
        dc_backend_destroy(be);
        // backward refuses the same shape
        if (!(be = fresh())) return;
        dc_buf b[9];  // dq, dk, dv, dout, q, k, v, out (Tq rows each: Tq >= Tk here), lse
        for (int j = 0; j < 9; j++) b[j] = (dc_buf){be->alloc(be, (size_t)Tq * D * 4), j == 8 ? DC_F32 : g_ct};
        dc_error_clear();
        be->attention_bwd(be, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], &sh);
        rc = dc_backend_status(be);
        snprintf(what, sizeof what, "attention_bwd %s: status -1 naming it", cases[i].part);
        expect(rc == -1 && has(dc_error(), cases[i].part), what);
        for (int j = 0; j < 9; j++) be->free(be, b[j].p);
        dc_backend_destroy(be);
    }
}

static void test_errors(void) {
    char what[160];
    // 1. Memory far beyond any GPU: NULL, with the size asked for and what is free; nothing is broken.
    dc_backend *be = fresh();
    if (!be) return;
    dc_error_clear();
    void *huge = be->alloc(be, (size_t)1 << 40);
    printf("     1 TiB: %s\n", dc_error());
    expect(!huge && has(dc_error(), "1048576.0 MiB") && has(dc_error(), "MiB free of"),
           "1 TiB allocation: NULL, message with the size asked for and the free memory");
    if (huge) be->free(be, huge);
    void *small = be->alloc(be, 1 << 20);
    expect(small && dc_backend_status(be) == 0, "after it: status 0 and a 1 MiB allocation works");
    be->free(be, small);

    // 1b. The memory cap: an allocation past it fails naming the cap, one
    //     within it works, and the peak reported (workspaces included) stays under it.
    size_t held = 0, peak = 0;
    be->memory(be, &held, NULL);
    be->set_memory_cap(be, held + (3 << 20));
    dc_error_clear();
    void *within = be->alloc(be, 2 << 20), *past = be->alloc(be, 2 << 20);
    printf("     past the cap: %s\n", dc_error());
    expect(within && !past && has(dc_error(), "memory cap") && has(dc_error(), "--max-gpu-memory") &&
               dc_backend_status(be) == 0,
           "capped at 3 MiB over what is held: 2 MiB allocated, 2 MiB more refused naming the cap");
    be->memory(be, NULL, &peak);
    snprintf(what, sizeof what, "the peak %zu bytes within the cap (%zu held before)", peak, held);
    expect(peak <= held + (3 << 20) && peak >= held + (2 << 20), what);
    if (past) be->free(be, past);
    be->free(be, within);
    be->set_memory_cap(be, 0);
    small = be->alloc(be, 4 << 20);
    expect(small != NULL, "no cap: 4 MiB allocated");
    be->free(be, small);

    // 2. A programmer's dtype error inside an op: recorded, returned by the
    //    status, by the model's forward and by the sampler; sticky.
    dc_dit_config cfg = {.input_size = 8, .patch = 2, .in_channels = 4, .hidden = 64, .depth = 1, .heads = 4,
                         .mlp_hidden = 256, .num_classes = 10, .learn_sigma = true};
    dc_dit m;
    dc_sampler smp;
    dc_gaussian_sampler_opts so = dc_gaussian_sampler_opts_default();
    so.steps = 2, so.null_class = cfg.num_classes;
    if (dc_dit_create(&m, &cfg, be, true) || dc_dit_init_weights(&m, 1) || dc_dit_reserve(&m, 1) ||
        dc_gaussian_sampler_init(&smp, be, &so, cfg.in_channels, cfg.input_size, cfg.input_size, 1)) {
        printf("FAIL error-case setup: %s\n", dc_error());
        g_fail++;
        dc_backend_destroy(be);
        return;
    }
    const int M = 4, K = 8, N = 8;
    dc_buf x = {be->alloc(be, M * K * 4), DC_F32}, w = {be->alloc(be, N * K * 2), DC_BF16};
    dc_buf o = {be->alloc(be, M * N * 4), DC_F32}, img = {be->alloc(be, 4 * 8 * 8 * 4), DC_F32};
    dc_buf tb = {be->alloc(be, 4), DC_F32}, yb = {be->alloc(be, 4), DC_I32};
    dc_buf mo = {be->alloc(be, 8 * 8 * 8 * 4), DC_F32};  // [1, 2C, 8, 8]
    be->zero(be, x.p, M * K * 4), be->zero(be, w.p, N * K * 2);
    be->zero(be, tb.p, 4), be->zero(be, yb.p, 4), be->zero(be, img.p, 4 * 8 * 8 * 4);
    expect(dc_backend_status(be) == 0, "status 0 before the error");
    be->linear_fwd(be, o, x, w, dc_buf_none(), M, K, N);
    int st = dc_backend_status(be);
    printf("     dtypes: %s\n", dc_error());
    expect(st == -1 && has(dc_error(), "dtypes differ") && has(dc_error(), "linear_fwd"),
           "linear_fwd with F32 input and BF16 weight: status -1 naming the op and the dtypes");
    dc_error_clear();
    expect(dc_backend_status(be) == -1 && has(dc_error(), "dtypes differ"), "the error stays (status again)");
    float h[4] = {1, 2, 3, 4};
    be->download(be, h, o.p, sizeof h);
    expect(isnan(h[0]) && isnan(h[3]), "a download after the error returns NaN, not stale numbers");
    dc_error_clear();
    void *late = be->alloc(be, 1024);
    expect(!late && has(dc_error(), "dtypes differ"), "an allocation after the error fails with its message");
    dc_error_clear();
    int frc = dc_dit_forward(&m, mo, img, tb, yb, 1);
    expect(frc == -1 && has(dc_error(), "dtypes differ"), "dc_dit_forward on the failed backend returns its error");
    dc_error_clear();
    int brc = dc_dit_backward(&m, mo, 1);
    expect(brc == -1 && has(dc_error(), "dtypes differ"), "dc_dit_backward returns it too");
    const dc_cond label = {.y = yb};  // label 0
    uint32_t idx = 0;
    dc_error_clear();
    int src = dc_sampler_run(&smp, img, &label, &idx, 1, eval_dit, NULL, &m, NULL, NULL);
    expect(src == -1 && has(dc_error(), "dtypes differ"), "dc_sampler_run on the failed backend returns its error");
    dc_sampler_free(&smp);
    dc_buf bufs[] = {x, w, o, img, tb, yb, mo};
    for (int i = 0; i < 7; i++) be->free(be, bufs[i].p);
    dc_dit_free(&m);
    dc_backend_destroy(be);

    // 3. Attention the device cannot hold: reserve refuses it up front; an
    //    op outside the contract after a legal reserve records an error naming it.
    if (!(be = fresh())) return;
    dc_error_clear();
    int rrc = be->reserve(be, 1 << 23, 512);
    expect(rrc == -1 && has(dc_error(), "head size 512") && has(dc_error(), "too long"),
           "reserve for 8M tokens of head size 512: -1 naming it");
    expect(be->reserve(be, 4096, 512) == 0 && dc_backend_status(be) == 0, "reserve for 4096 tokens of 512 works");
    int64_t n3 = 16 * 3 * 320;
    bad_attn a = {be, {be->alloc(be, 16 * 320 * 4), g_ct}, {be->alloc(be, 2 * 16 * 4), DC_F32},
                  {be->alloc(be, n3 * 4), g_ct}};
    be->zero(be, a.qkv.p, n3 * dc_dtype_size(g_ct));
    run_bad_attention(&a);
    printf("     causal: %s\n", dc_backend_status(be) ? dc_error() : "(no error)");
    expect(dc_backend_status(be) == -1 && has(dc_error(), "at least as many keys"),
           "causal attn_fwd with 16 queries and 8 keys after a legal reserve: status -1 naming it");
    be->free(be, a.out.p), be->free(be, a.lse.p), be->free(be, a.qkv.p);
    dc_backend_destroy(be);

    // 4. The same op inside a graph capture whose function does not check: no graph, the op's error.
    if (!(be = fresh())) return;
    a = (bad_attn){be, {be->alloc(be, 16 * 320 * 4), g_ct}, {be->alloc(be, 2 * 16 * 4), DC_F32},
                   {be->alloc(be, n3 * 4), g_ct}};
    dc_error_clear();
    void *graph = be->graph_capture(be, run_bad_attention, &a);
    expect(!graph && has(dc_error(), "at least as many keys"), "graph_capture of a failing op: NULL with the op's error");
    if (graph) be->graph_free(be, graph);
    be->free(be, a.out.p), be->free(be, a.lse.p), be->free(be, a.qkv.p);
    dc_backend_destroy(be);

    // 5. A new backend after all this computes again: a small fp32 product against doubles.
    if (!(be = fresh())) return;
    float hx[4 * 8], hw[8 * 8], ho[4 * 8];
    for (int i = 0; i < M * K; i++) hx[i] = (float)rnd(-1, 1);
    for (int i = 0; i < N * K; i++) hw[i] = (float)rnd(-1, 1);
    dc_buf gx = {be->alloc(be, sizeof hx), DC_F32}, gw = {be->alloc(be, sizeof hw), DC_F32};
    dc_buf go = {be->alloc(be, sizeof ho), DC_F32};
    be->upload(be, gx.p, hx, sizeof hx), be->upload(be, gw.p, hw, sizeof hw);
    be->linear_fwd(be, go, gx, gw, dc_buf_none(), M, K, N);
    be->download(be, ho, go.p, sizeof ho);
    double err = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double r = 0;
            for (int k = 0; k < K; k++) r += (double)hx[i * K + k] * hw[j * K + k];
            err = fmax(err, isnan(ho[i * N + j]) ? INFINITY : fabs(ho[i * N + j] - r));
        }
    int fst = dc_backend_status(be);
    snprintf(what, sizeof what, "a fresh backend works again: status %d, product max error %.1e", fst, err);
    expect(fst == 0 && err < 1e-4, what);
    be->free(be, gx.p), be->free(be, gw.p), be->free(be, go.p);
    dc_backend_destroy(be);

    // 6. A conv whose shape was never reserved: an error naming reserve_conv, no allocation inside the op.
    if (!(be = fresh())) return;
    dc_conv2d_shape cs = {1, 4, 8, 8, 4, 3, 1, 1, 1, 1, 1, 0};
    dc_buf cx = {be->alloc(be, 4 * 64 * 4), g_ct}, cw = {be->alloc(be, 4 * 4 * 9 * 4), g_ct};
    dc_buf co = {be->alloc(be, 4 * 64 * 4), g_ct};
    be->zero(be, cx.p, 4 * 64 * 4), be->zero(be, cw.p, 4 * 4 * 9 * 4);
    be->conv2d_fwd(be, co, cx, cw, dc_buf_none(), &cs);
    int cst = dc_backend_status(be);
    printf("     conv: %s\n", cst ? dc_error() : "(no error)");
    expect(cst == -1 && has(dc_error(), "reserve_conv") && has(dc_error(), "conv2d_fwd"),
           "conv2d_fwd before reserve_conv: status -1 naming the op and reserve_conv");
    be->free(be, cx.p), be->free(be, cw.p), be->free(be, co.p);
    dc_backend_destroy(be);
    // 7. ... and after it, a conv of another shape than the ones reserved.
    if (!(be = fresh())) return;
    dc_conv2d_shape big = {1, 4, 8, 8, 4, 3, 2, 0, 1, 0, 1, 0}, other = big;
    other.B = 64;  // its padded copy would not fit the scratch
    cx = (dc_buf){be->alloc(be, 64 * 4 * 64 * 4), g_ct}, cw = (dc_buf){be->alloc(be, 4 * 4 * 9 * 4), g_ct};
    co = (dc_buf){be->alloc(be, 64 * 4 * 16 * 4), g_ct};
    be->zero(be, cx.p, 64 * 4 * 64 * 4), be->zero(be, cw.p, 4 * 4 * 9 * 4);
    expect(be->reserve_conv(be, &big, true) == 0, "reserve_conv of a stride-2 conv with padding (0,1,0,1)");
    be->conv2d_fwd(be, co, cx, cw, dc_buf_none(), &big);
    expect(dc_backend_status(be) == 0, "its forward runs");
    be->conv2d_fwd(be, co, cx, cw, dc_buf_none(), &other);
    cst = dc_backend_status(be);
    printf("     conv: %s\n", cst ? dc_error() : "(no error)");
    expect(cst == -1 && has(dc_error(), "not reserved"), "the same conv on 64 images, not reserved: an error saying so");
    be->free(be, cx.p), be->free(be, cw.p), be->free(be, co.p);
    dc_backend_destroy(be);
    // 8. A conv reserved for inference runs forward; its backward is refused, naming backward.
    if (!(be = fresh())) return;
    dc_conv2d_shape inf = {2, 8, 8, 8, 8, 3, 1, 1, 1, 1, 1, 1};  // channels-last
    const size_t nx = 2 * 8 * 64, nw = 8 * 8 * 9, es = dc_dtype_size(g_ct);
    cx = (dc_buf){be->alloc(be, nx * es), g_ct}, cw = (dc_buf){be->alloc(be, nw * es), g_ct};
    co = (dc_buf){be->alloc(be, nx * es), g_ct};
    dc_buf cdx = {be->alloc(be, nx * es), g_ct}, cdw = {be->alloc(be, nw * 4), DC_F32};
    be->zero(be, cx.p, nx * es), be->zero(be, cw.p, nw * es), be->zero(be, co.p, nx * es), be->zero(be, cdw.p, nw * 4);
    expect(be->reserve_conv(be, &inf, false) == 0, "reserve_conv of a channels-last conv for forward only");
    be->conv2d_fwd(be, co, cx, cw, dc_buf_none(), &inf);
    expect(dc_backend_status(be) == 0, "its forward runs");
    be->conv2d_bwd(be, cdx, cdw, dc_buf_none(), co, cx, cw, &inf, false);
    cst = dc_backend_status(be);
    printf("     conv: %s\n", cst ? dc_error() : "(no error)");
    expect(cst == -1 && has(dc_error(), "not reserved for backward") && has(dc_error(), "conv2d_bwd"),
           "its backward, reserved for forward only: an error saying so");
    be->free(be, cx.p), be->free(be, cw.p), be->free(be, co.p), be->free(be, cdx.p), be->free(be, cdw.p);
    dc_backend_destroy(be);
}

// The CPU backend finishes every op before returning: nothing is left to report.
static void test_cpu_status(void) {
    dc_backend *cpu = dc_backend_cpu_create();
    float v[3] = {1, 2, 3};
    dc_buf b = {cpu->alloc(cpu, sizeof v), DC_F32};
    cpu->upload(cpu, b.p, v, sizeof v);
    cpu->gelu_fwd(cpu, b, b, 3);
    cpu->download(cpu, v, b.p, sizeof v);
    cpu->free(cpu, b.p);
    expect(dc_backend_status(cpu) == 0 && v[0] > 0.8f && v[0] < 0.85f, "cpu: status 0 after ops");
    dc_backend_destroy(cpu);
}

static void run_groups(void) { test_attention_unsupported(), test_errors(); }

int main(int argc, char **argv) {
    test_cpu_status();
    return cuda_main("test_cuda_errors", argc, argv, run_groups);
}
