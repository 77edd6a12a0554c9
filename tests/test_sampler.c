// Whole sampling runs of the diffusion layer with a fake model: DDPM and DDIM,
// with and without guidance and learned variance, against the official loops
// written again in long double; batch independence, caller-supplied noise and
// progress; text conditioning (embeddings and the unconditional one) against
// the label path; refusals of bad options; and the real CPU backend (its op
// table, the same samples through its memory, the loss op's bits on 1 thread
// and on all). Prints one line per check; exits 1 on any failure (NaN fails).
#include <omp.h>

#include "core/error.h"
#include "core/rng.h"
#include "diffusion/gaussian.h"
#include "diffusion/schedule.h"
#include "diffusion_ref.h"

// ---- a whole sampling run with a fake model ------------------------------------------------------
typedef struct {
    int C, HW, null_class, calls, bad_t, nt;
    bool learn_sigma;
    float t_seen[1000];
} fake_model;

// eps = 0.1 x + 0.05 * lab(y), v = 0.5 sin(x + t / 1000); lab(null) = 0, lab(y) = 1 + y % 3
static ld fake_eps(ld x, int y, int null_class) { return 0.1L * x + 0.05L * (y == null_class ? 0 : 1 + y % 3); }
static int fake_eval(void *ctx, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond, int B) {
    fake_model *m = ctx;
    float *o = out.p;
    const float *xp = x.p, *tp = t.p;
    const int32_t *yp = cond->y.p;
    int OC = m->learn_sigma ? 2 * m->C : m->C, N = m->C * m->HW;
    for (int b = 0; b < B; b++) {
        if (tp[b] != tp[0]) m->bad_t++;
        for (int i = 0; i < N; i++) {
            float xv = xp[b * N + i];
            o[b * OC * m->HW + i] = 0.1f * xv + 0.05f * (yp[b] == m->null_class ? 0 : 1 + yp[b] % 3);
            if (m->learn_sigma) o[b * OC * m->HW + N + i] = 0.5f * sinf(xv + tp[b] / 1000.0f);
        }
    }
    if (m->nt < 1000) m->t_seen[m->nt++] = tp[0];
    m->calls++;
    return 0;
}

static int g_prog_calls, g_prog_last;
static void count_progress(void *ctx, int step, int total) {
    (void)ctx, (void)total;
    g_prog_calls++, g_prog_last = step;
}

// The same run, in long double, written from the official loops.
static void ref_sample(const dc_gaussian_sampler_opts *o, int C, int HW, const int32_t *y, const uint32_t *idx,
                       int B, ld *x) {
    static int ts[1000];
    static ld_proc p;
    ref_space(o->steps, ts);
    ld_proc_init(&p, ts, o->steps);
    int N = C * HW, guided = o->guided_channels ? o->guided_channels : C;
    bool cfg = o->cfg_scale > 1.0f;
    for (int b = 0; b < B; b++)
        for (int j = 0; j < N; j++)
            x[b * N + j] = dc_randn_at(o->seed, idx[b], 0xFFFFFFFFu, DC_STREAM_SAMPLE_START, (uint32_t)j);
    for (int k = o->steps - 1; k >= 0; k--) {
        for (int b = 0; b < B; b++)
            for (int j = 0; j < N; j++) {
                ld xv = x[b * N + j], e = fake_eps(xv, y[b], o->null_class);
                if (cfg && j / HW < guided) {
                    ld u = fake_eps(xv, o->null_class, o->null_class);
                    e = u + (ld)o->cfg_scale * (e - u);
                }
                ld v = 0.5L * sinl(xv + ts[k] / 1000.0L);
                ld z = k ? dc_randn_at(o->seed, idx[b], (uint32_t)k, DC_STREAM_NOISE, (uint32_t)j) : 0;
                ld x0 = p.sra[k] * xv - p.srm1[k] * e;
                if (o->kind == DC_STEP_DDPM) {
                    ld fr = (v + 1) / 2;
                    ld lv = o->learn_sigma ? fr * logl(p.beta[k]) + (1 - fr) * p.clipped[k]
                                           : logl(k == 0 ? p.pv[1] : p.beta[k]);
                    x[b * N + j] = p.c1[k] * x0 + p.c2[k] * xv + (k ? expl(0.5L * lv) * z : 0);
                } else {
                    ld ab = p.abar[k], abp = p.abar_prev[k];
                    ld eps2 = (p.sra[k] * xv - x0) / p.srm1[k];
                    ld sig = (ld)o->eta * sqrtl((1 - abp) / (1 - ab)) * sqrtl(1 - ab / abp);
                    x[b * N + j] = x0 * sqrtl(abp) + sqrtl(1 - abp - sig * sig) * eps2 + sig * z;
                }
            }
    }
}

static void test_sampler(dc_backend *be) {
    enum { B = 3, C = 4, H = 4, W = 4, HW = H * W, N = C * HW };
    struct { const char *name; int steps; dc_step_kind kind; float eta, cfg; int guided; bool ls; } runs[] = {
        {"sampler DDPM 10 steps, cfg 4 (quirk: 3 ch)", 10, DC_STEP_DDPM, 0, 4.0f, 3, true},
        {"sampler DDPM 25 steps, no cfg, fixed var", 25, DC_STEP_DDPM, 0, 1.0f, 0, false},
        {"sampler DDIM 25 steps, eta 0, cfg 1.5", 25, DC_STEP_DDIM, 0, 1.5f, 0, true},
        {"sampler DDIM 10 steps, eta 1, no cfg", 10, DC_STEP_DDIM, 1, 1.0f, 0, true},
    };
    const int32_t y[B] = {1, 2, 7};
    const uint32_t idx[B] = {5, 6, 7};
    // labels on the backend (this one's memory is the host's), and one-image views of them
    const dc_cond cond = {.y = {(void *)y, DC_I32}}, cond1 = {.y = {(void *)(y + 1), DC_I32}},
                  cond2 = {.y = {(void *)(y + 2), DC_I32}};
    for (size_t q = 0; q < sizeof runs / sizeof runs[0]; q++) {
        dc_gaussian_sampler_opts o = dc_gaussian_sampler_opts_default();
        o.steps = runs[q].steps, o.kind = runs[q].kind, o.eta = runs[q].eta;
        o.cfg_scale = runs[q].cfg, o.guided_channels = runs[q].guided, o.learn_sigma = runs[q].ls;
        o.seed = 31337, o.null_class = 10;
        dc_sampler smp;
        if (dc_gaussian_sampler_init(&smp, be, &o, C, H, W, B)) { check(runs[q].name, false, "%s", dc_error()); continue; }
        fake_model m = {.C = C, .HW = HW, .null_class = 10, .learn_sigma = runs[q].ls};
        float x[B * N], x1[N];
        g_prog_calls = g_prog_last = 0;
        int rc = dc_sampler_run(&smp, dc_buf_f32(x), &cond, idx, B, fake_eval, NULL, &m, count_progress, NULL);
        static ld ref[B * N];
        ref_sample(&o, C, HW, y, idx, B, ref);
        double err = rc ? INFINITY : 0;
        for (int i = 0; i < B * N; i++) err = fmax(err, relerr(x[i], ref[i], 1.0L));
        // the model saw the original timesteps, last kept step first
        static int ts[1000];
        ref_space(o.steps, ts);
        bool tok = m.calls == o.steps && m.bad_t == 0;
        for (int k = 0; tok && k < o.steps; k++) tok = m.t_seen[k] == (float)ts[o.steps - 1 - k];
        // sample 6 alone (batch of one) equals its row in the batch of three
        fake_model m1 = m;
        m1.calls = m1.nt = 0;
        rc |= dc_sampler_run(&smp, dc_buf_f32(x1), &cond1, idx + 1, 1, fake_eval, NULL, &m1, NULL, NULL);
        bool indep = memcmp(x1, x + N, sizeof x1) == 0;
        // x_given: starting from the same noise, supplied by the caller, changes nothing
        smp.set.x_given = true;
        m1.calls = m1.nt = 0;
        for (int j = 0; j < N; j++)
            x1[j] = dc_randn_at(o.seed, idx[2], DC_SAMPLE_START_STEP, DC_STREAM_SAMPLE_START, (uint32_t)j);
        rc |= dc_sampler_run(&smp, dc_buf_f32(x1), &cond2, idx + 2, 1, fake_eval, NULL, &m1, NULL, NULL);
        indep = indep && memcmp(x1, x + 2 * N, sizeof x1) == 0;
        // float state over 10-25 steps vs long double: x0 = sra x - srm1 eps (sra up to
        // 157 at t = 999) magnifies float rounding; ~4e-6 observed, 3e-5 allowed
        check(runs[q].name, rc == 0 && err < 3e-5 && tok && indep && g_prog_calls == o.steps &&
                                g_prog_last == o.steps,
              "max err %.2e; t map %s; batch-independent %s; progress %d/%d", err,
              tok ? "ok" : "BAD", indep ? "yes" : "NO", g_prog_calls, o.steps);
        dc_sampler_free(&smp);
    }
    dc_gaussian_sampler_opts bad = dc_gaussian_sampler_opts_default();
    bad.guided_channels = 5;
    dc_sampler smp;
    bool rej = dc_gaussian_sampler_init(&smp, be, &bad, C, H, W, 2) != 0;
    check("sampler rejects guided channels > C", rej, "%s", dc_error());
    bad = dc_gaussian_sampler_opts_default();
    bad.kind = DC_STEP_DDIM, bad.eta = 3.0f;
    rej = dc_gaussian_sampler_init(&smp, be, &bad, C, H, W, 2) != 0;
    check("sampler rejects DDIM eta = 3", rej, "%s", dc_error());
}

// Text conditioning: the model sees the caller's embeddings, then (with
// guidance) the unconditional one for every image. The fake reads lab from an
// embedding whose every value is 5 + lab, so a text run whose embeddings hold
// the labels' lab values, and a null embedding of 5 (lab 0; zeroed memory
// would read as -5), must give the label run's samples bit for bit.
enum { TL = 2, TD = 3 };
static int fake_text_eval(void *ctx, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond, int B) {
    fake_model *m = ctx;
    float *o = out.p;
    const float *xp = x.p, *tp = t.p, *e = cond->ctx.p;
    int OC = m->learn_sigma ? 2 * m->C : m->C, N = m->C * m->HW;
    if (!e || cond->len != TL || cond->dim != TD) return m->bad_t++, 0;
    for (int b = 0; b < B; b++) {
        float lab = e[b * TL * TD] - 5.0f;
        for (int j = 1; j < TL * TD; j++)
            if (e[b * TL * TD + j] != e[b * TL * TD]) m->bad_t++;  // rows must arrive whole
        for (int i = 0; i < N; i++) {
            float xv = xp[b * N + i];
            o[b * OC * m->HW + i] = 0.1f * xv + 0.05f * lab;
            if (m->learn_sigma) o[b * OC * m->HW + N + i] = 0.5f * sinf(xv + tp[b] / 1000.0f);
        }
    }
    m->calls++;
    return 0;
}

static void test_sampler_text(dc_backend *be) {
    enum { B = 3, C = 4, H = 4, W = 4, HW = H * W, N = C * HW };
    const int32_t y[B] = {1, 2, 7};
    const uint32_t idx[B] = {5, 6, 7};
    float emb[B * TL * TD], null_emb[TL * TD];
    for (int j = 0; j < TL * TD; j++) null_emb[j] = 5.0f;
    for (int b = 0; b < B; b++)
        for (int j = 0; j < TL * TD; j++) emb[b * TL * TD + j] = 5.0f + (float)(1 + y[b] % 3);
    dc_gaussian_sampler_opts o = dc_gaussian_sampler_opts_default();
    o.steps = 10, o.cfg_scale = 4.0f, o.guided_channels = 3, o.seed = 31337, o.null_class = 10;
    float xl[B * N], xt[B * N];
    dc_sampler sl, st;
    fake_model ml = {.C = C, .HW = HW, .null_class = 10, .learn_sigma = true}, mt = ml;
    const dc_cond labels = {.y = {(void *)y, DC_I32}};
    const dc_cond text = {.ctx = dc_buf_f32(emb), .len = TL, .dim = TD};
    int rc = dc_gaussian_sampler_init(&sl, be, &o, C, H, W, B);
    rc |= dc_sampler_run(&sl, dc_buf_f32(xl), &labels, idx, B, fake_eval, NULL, &ml, NULL, NULL);
    dc_gaussian_sampler_opts ot = o;
    ot.ctx_len = TL, ot.ctx_dim = TD, ot.null_ctx = dc_buf_f32(null_emb);
    rc |= dc_gaussian_sampler_init(&st, be, &ot, C, H, W, B);
    rc |= dc_sampler_run(&st, dc_buf_f32(xt), &text, idx, B, fake_text_eval, NULL, &mt, NULL, NULL);
    check("sampler, text conditioning with guidance == labels", rc == 0 && mt.bad_t == 0 &&
                                                                    mt.calls == o.steps && !memcmp(xl, xt, sizeof xl),
          "rc %d, bad rows %d, calls %d", rc, mt.bad_t, mt.calls);
    // the wrong conditioning for the model is refused, naming what it takes
    const dc_cond short_text = {.ctx = dc_buf_f32(emb), .len = 1, .dim = TD};
    bool rej = dc_sampler_run(&st, dc_buf_f32(xt), &short_text, idx, B, fake_text_eval, NULL, &mt, NULL, NULL) != 0 &&
               strstr(dc_error(), "text embeddings of 2 x 3");
    check("sampler rejects embeddings of the wrong length", rej, "%s", dc_error());
    rej = dc_sampler_run(&sl, dc_buf_f32(xl), &text, idx, B, fake_eval, NULL, &ml, NULL, NULL) != 0 &&
          strstr(dc_error(), "takes class labels");
    check("sampler rejects embeddings for a label model", rej, "%s", dc_error());
    dc_sampler_free(&sl), dc_sampler_free(&st);
    ot.null_ctx = dc_buf_none();
    rej = dc_gaussian_sampler_init(&st, be, &ot, C, H, W, B) != 0 && strstr(dc_error(), "unconditional embedding");
    check("sampler: text guidance needs the unconditional embedding", rej, "%s", dc_error());
}

// The real CPU backend: its table holds these ops, a sampling run through its
// memory functions equals the host one, and the loss op gives the same bits
// on 1 thread and on all of them (static schedules, per-sample sums).
static void test_cpu_backend(dc_backend *host) {
    dc_backend *cpu = dc_backend_cpu_create();
    if (!cpu) {
        check("cpu backend create", false, "%s", dc_error());
        return;
    }
    bool wired = cpu->randn == dc_cpu_randn && cpu->q_sample == dc_cpu_q_sample &&
                 cpu->diffusion_loss == dc_cpu_diffusion_loss &&
                 cpu->cfg_combine == dc_cpu_cfg_combine && cpu->sampler_step == dc_cpu_sampler_step;
    enum { B = 2, C = 4, S = 8, N = C * S * S };
    dc_gaussian_sampler_opts o = dc_gaussian_sampler_opts_default();
    o.steps = 20, o.cfg_scale = 3.0f, o.seed = 11, o.null_class = 10;
    const int32_t y[B] = {3, 4};
    const uint32_t idx[B] = {0, 1};
    const dc_cond cond = {.y = {(void *)y, DC_I32}};  // both backends keep buffers in host memory
    float xh[B * N], xc[B * N];
    dc_sampler a, b;
    fake_model m = {.C = C, .HW = S * S, .null_class = 10, .learn_sigma = true};
    fake_model m2 = m;
    int rc = dc_gaussian_sampler_init(&a, host, &o, C, S, S, B);
    rc |= dc_sampler_run(&a, dc_buf_f32(xh), &cond, idx, B, fake_eval, NULL, &m, NULL, NULL);
    rc |= dc_gaussian_sampler_init(&b, cpu, &o, C, S, S, B);
    dc_buf xd = {cpu->alloc(cpu, sizeof xc), DC_F32};
    rc |= !xd.p || dc_sampler_run(&b, xd, &cond, idx, B, fake_eval, NULL, &m2, NULL, NULL);
    if (xd.p) cpu->download(cpu, xc, xd.p, sizeof xc), cpu->free(cpu, xd.p);
    check("cpu backend: ops wired, same samples", wired && rc == 0 && !memcmp(xh, xc, sizeof xc),
          "wired %s, rc %d", wired ? "yes" : "no", rc);
    dc_sampler_free(&a);
    dc_sampler_free(&b);

    enum { LB = 16, LC = 4, LHW = 1024, LN = LC * LHW };  // 65536 elements: parallel
    float *out = fbuf(LB * 2 * LN), *x0 = fbuf(LB * LN), *xt = fbuf(LB * LN), *eps = fbuf(LB * LN);
    float *g1 = fbuf(LB * 2 * LN), *g2 = fbuf(LB * 2 * LN), l1[2 * LB], l2[2 * LB];
    uint32_t keys[LB];
    dc_loss_coef coef[LB];
    dc_schedule tr;
    rc = dc_schedule_init_gaussian(&tr, 1000, 1000);
    for (int i = 0; i < LB; i++) keys[i] = (uint32_t)i, dc_schedule_loss_coef(&tr, i * 66, &coef[i]);
    cpu->randn(cpu, dc_buf_f32(out), keys, LB, 2 * LN, 1, 0, DC_STREAM_INIT);
    cpu->randn(cpu, dc_buf_f32(x0), keys, LB, LN, 1, 1, DC_STREAM_INIT);
    cpu->randn(cpu, dc_buf_f32(xt), keys, LB, LN, 1, 2, DC_STREAM_INIT);
    cpu->randn(cpu, dc_buf_f32(eps), keys, LB, LN, 1, 3, DC_STREAM_INIT);
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    cpu->diffusion_loss(cpu, dc_buf_f32(g1), dc_buf_f32(l1), dc_buf_f32(out), dc_buf_f32(x0),
                        dc_buf_f32(xt), dc_buf_f32(eps), coef, LB, LC, 2 * LC, LHW, 0.5f);
    omp_set_num_threads(threads);
    cpu->diffusion_loss(cpu, dc_buf_f32(g2), dc_buf_f32(l2), dc_buf_f32(out), dc_buf_f32(x0),
                        dc_buf_f32(xt), dc_buf_f32(eps), coef, LB, LC, 2 * LC, LHW, 0.5f);
    bool same = rc == 0 && !memcmp(l1, l2, sizeof l1) && !memcmp(g1, g2, sizeof(float) * LB * 2 * LN);
    check("loss op: 1 thread == all threads (bitwise)", same, "%d threads, %d elements", threads,
          LB * LN);
    free(out), free(x0), free(xt), free(eps), free(g1), free(g2);
    dc_schedule_free(&tr);
    dc_backend_destroy(cpu);
}

int main(void) {
    dc_backend be = test_backend();
    ld_base_init();
    test_sampler(&be);
    test_sampler_text(&be);
    test_cpu_backend(&be);
    return finish("test_sampler");
}
