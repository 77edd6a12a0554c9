// The CUDA backend's attention op against the CPU backend's, over the shapes
// the models need: DiT's packed self-attention, Stable Diffusion's separate
// projections and packed k|v cross-attention (Tq != Tk), CLIP's causal mask,
// head sizes from 16 to 512 (the VAE's one head), Dv != Dh, any scale, and
// layouts whose strides are not the dense ones (padded samples, head-major).
// Each case runs forward (out, lse) and backward (dq, dk, dv) in four GPU
// modes: cuda-fp32 (checking kernels and fp32 products); cuda (bf16 tensor
// cores; on a Hopper GPU the forward's wgmma kernel where a call fits it, the
// few-keys kernel where one has at most 128 keys, cuDNN's forward elsewhere
// and its backward where it covers the call); and cuda with those off
// (opts attention_sm90, attention_short and cudnn_attention_bwd off:
// cuDNN's forward, else ours; our backward); and cuda with cuDNN's attention
// off (the engine's kernels alone). Every backward runs twice and
// must repeat its bytes. The CPU reads the same values the GPU does (rounded to bf16 where
// the GPU's input is bf16); backward starts from the CPU's forward results,
// so it is checked on its own.
//
// Error: ||gpu - cpu|| / ||cpu|| over the elements the op writes (padding
// between them is left NaN on both sides and not read); NaN fails. With one
// key, softmax is constant and dq, dk vanish: both sides hold rounding noise
// alone, so there the error is measured against an RMS of 0.1 (it checks
// that the GPU's dq, dk are that small).
// Tolerances: fp32 1e-4 (lse 1e-5); bf16 2e-2 (lse 1e-4, computed in fp32).
// Skips (exit 0, with a message) where no GPU is present.
//
//   build/tests/test_cuda_attention [seed] [case-name-substring]
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "core/error.h"
#include "cuda_pair.h"

static int g_fail, g_count;

// The elements of tensor [B, H, T, D] in layout l, from element `off` of p:
// relative error of the GPU against the CPU; NaN (unwritten) fails.
static void compare_view(const char *what, const char *name, pair p, int64_t off, dc_attn_layout l, int B, int H,
                         int T, int D, double tol, double rms_floor) {
    float *c = malloc(p.n * 4), *g = get_gpu(p);
    g_cpu->download(g_cpu, c, p.c.p, p.n * 4);
    double num = 0, den = 0;
    int64_t nan = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++)
                for (int d = 0; d < D; d++) {
                    const int64_t i = off + b * l.batch + h * l.head + t * l.token + d;
                    if (!isfinite(g[i]) || !isfinite(c[i])) { nan++; continue; }
                    num += ((double)g[i] - c[i]) * ((double)g[i] - c[i]);
                    den += (double)c[i] * c[i];
                }
    const double floor = rms_floor * rms_floor * B * H * T * D;
    const double err = nan ? INFINITY : sqrt(num / (den > floor ? den : floor > 0 ? floor : 1e-300));
    const bool ok = err <= tol;
    g_count++;
    if (!ok) g_fail++;
    printf("%-4s %-52s %-4s err %.2e (tol %.0e)%s\n", ok ? "ok" : "FAIL", name, what, err, tol,
           nan ? "  NaN or unwritten values" : "");
    free(c), free(g);
}

// ---- cases -------------------------------------------------------------------------------------
enum {
    PACKED,  // qkv [B, T, 3 H Dh] (DiT), out [B, T, H Dh]
    ROWS,    // q [B, Tq, H Dh], k [B, Tk, H Dh], v [B, Tk, H Dv], out [B, Tq, H Dv]; `pad` elements after each sample
    KV,      // q and out as ROWS, k | v packed [B, Tk, H Dh + H Dv] (cross-attention to text)
    HEADS,   // every tensor head-major [B, H, T, D]
};

typedef struct {
    const char *name;
    int B, H, Tq, Tk, Dh, Dv;
    bool causal;
    float scale;
    int layout, pad;
} attn_case;

// Elements a tensor [B, H, T, D] in layout l spans from its first one.
static int64_t span(dc_attn_layout l, int B, int H, int T, int D) {
    return (B - 1) * l.batch + (H - 1) * l.head + (T - 1) * l.token + D;
}

static void run_case(const attn_case *c) {
    dc_attn_shape s = {.B = c->B, .H = c->H, .Tq = c->Tq, .Tk = c->Tk, .Dh = c->Dh, .Dv = c->Dv,
                       .causal = c->causal, .scale = c->scale};
    const int B = c->B, H = c->H, Tq = c->Tq, Tk = c->Tk, Dh = c->Dh, Dv = c->Dv;
    const int64_t Dq = (int64_t)H * Dh, Do = (int64_t)H * Dv;
    int64_t koff = 0, voff = 0;  // offsets of k and v in their buffers
    bool shared_qkv = false, shared_kv = false;
    switch (c->layout) {
    case PACKED:
        s = dc_attn_packed(B, Tq, (int)Dq, H);
        s.causal = c->causal, s.scale = c->scale;
        shared_qkv = true, koff = Dq, voff = 2 * Dq;
        break;
    case ROWS:
    case KV: {
        s.q = dc_attn_rows(Tq, Dq, Dh), s.q.batch += c->pad;
        s.out = dc_attn_rows(Tq, Do, Dv), s.out.batch += c->pad;
        const int64_t krow = c->layout == KV ? Dq + Do : Dq;
        s.k = dc_attn_rows(Tk, krow, Dh), s.k.batch += c->pad;
        s.v = dc_attn_rows(Tk, c->layout == KV ? krow : Do, Dv), s.v.batch += c->pad;
        if (c->layout == KV) shared_kv = true, voff = Dq;
        break;
    }
    case HEADS:
        s.q = (dc_attn_layout){(int64_t)H * Tq * Dh, Dh, (int64_t)Tq * Dh};
        s.k = (dc_attn_layout){(int64_t)H * Tk * Dh, Dh, (int64_t)Tk * Dh};
        s.v = (dc_attn_layout){(int64_t)H * Tk * Dv, Dv, (int64_t)Tk * Dv};
        s.out = (dc_attn_layout){(int64_t)H * Tq * Dv, Dv, (int64_t)Tq * Dv};
        break;
    }
    const int64_t nq = span(s.q, B, H, Tq, Dh), nk = span(s.k, B, H, Tk, Dh), nv = span(s.v, B, H, Tk, Dv);
    const int64_t no = span(s.out, B, H, Tq, Dv), nl = (int64_t)B * H * Tq;
    int64_t nall = koff + nk > nq ? koff + nk : nq;  // the span of a buffer that holds several
    if (voff + nv > nall) nall = voff + nv;

    // inputs: q, k, v (in one buffer where the layout packs them)
    pair q, k, v, dq, dk, dv;
    if (shared_qkv) {
        q = k = v = rand_pair(nall, g_ct, -2, 2);
    } else {
        q = rand_pair(nq, g_ct, -2, 2);
        k = v = rand_pair(shared_kv ? nall : nk, g_ct, -2, 2);
        if (!shared_kv) v = rand_pair(nv, g_ct, -2, 2);
    }
    pair out = nan_pair(no, g_ct), lse = nan_pair(nl, DC_F32);
    dc_buf cq = q.c, ck = dc_buf_at(k.c, koff), cv = dc_buf_at(v.c, voff);
    dc_buf gq = q.g, gk = dc_buf_at(k.g, koff), gv = dc_buf_at(v.g, voff);
    g_cpu->attention_fwd(g_cpu, out.c, lse.c, cq, ck, cv, &s);
    g_gpu->attention_fwd(g_gpu, out.g, lse.g, gq, gk, gv, &s);
    if (dc_backend_status(g_gpu)) {
        printf("FAIL %-52s fwd: %s\n", c->name, dc_error());
        g_fail++, g_count++;
        release();
        return;
    }
    const bool f32 = g_ct == DC_F32;
    compare_view("out", c->name, out, 0, s.out, B, H, Tq, Dv, f32 ? 1e-4 : 2e-2, 0);
    const dc_attn_layout lse_l = {(int64_t)H * Tq, 1, Tq};
    compare_view("lse", c->name, lse, 0, lse_l, B, H, Tq, 1, f32 ? 1e-5 : 1e-4, 0);

    // backward from the CPU's forward results
    float *ho = malloc(no * 4), *hl = malloc(nl * 4);
    g_cpu->download(g_cpu, ho, out.c.p, no * 4), g_cpu->download(g_cpu, hl, lse.c.p, nl * 4);
    put(out, ho), put(lse, hl);
    free(ho), free(hl);
    pair dout = rand_pair(no, g_ct, -1, 1);
    if (shared_qkv) {
        dq = dk = dv = nan_pair(nall, g_ct);
    } else {
        dq = nan_pair(nq, g_ct);
        dk = dv = nan_pair(shared_kv ? nall : nk, g_ct);
        if (!shared_kv) dv = nan_pair(nv, g_ct);
    }
    g_cpu->attention_bwd(g_cpu, dq.c, dc_buf_at(dk.c, koff), dc_buf_at(dv.c, voff), dout.c, cq, ck, cv, out.c,
                         lse.c, &s);
    g_gpu->attention_bwd(g_gpu, dq.g, dc_buf_at(dk.g, koff), dc_buf_at(dv.g, voff), dout.g, gq, gk, gv, out.g,
                         lse.g, &s);
    if (dc_backend_status(g_gpu)) {
        printf("FAIL %-52s bwd: %s\n", c->name, dc_error());
        g_fail++, g_count++;
        release();
        return;
    }
    const double gt = f32 ? 1e-4 : 2e-2;
    const double vanish = Tk == 1 ? 0.1 : 0;
    compare_view("dq", c->name, dq, 0, s.q, B, H, Tq, Dh, gt, vanish);
    compare_view("dk", c->name, dk, koff, s.k, B, H, Tk, Dh, gt, vanish);
    compare_view("dv", c->name, dv, voff, s.v, B, H, Tk, Dv, gt, 0);
    {  // run again: the same bytes (every path is deterministic)
        float *first[3] = {get_gpu(dq), get_gpu(dk), get_gpu(dv)};
        g_gpu->attention_bwd(g_gpu, dq.g, dc_buf_at(dk.g, koff), dc_buf_at(dv.g, voff), dout.g, gq, gk, gv, out.g,
                             lse.g, &s);
        float *again[3] = {get_gpu(dq), get_gpu(dk), get_gpu(dv)};
        const int64_t n[3] = {dq.n, dk.n, dv.n};
        int64_t differ = 0;
        for (int t = 0; t < 3; t++) {
            differ += memcmp(first[t], again[t], (size_t)n[t] * 4) != 0;
            free(first[t]), free(again[t]);
        }
        const bool ok = !dc_backend_status(g_gpu) && differ == 0;
        g_count++, g_fail += !ok;
        printf("%-4s %-52s bwd run twice: %s\n", ok ? "ok" : "FAIL", c->name,
               differ ? "results differ" : "the same bytes");
    }
    release();
}

static const attn_case g_cases[] = {
    // name                                         B  H   Tq     Tk    Dh   Dv  causal scale layout pad
    {"DiT-XL/2 packed qkv T256 Dh72", 2, 16, 256, 256, 72, 72, false, 0, PACKED, 0},
    {"demo packed qkv T49 Dh16", 2, 4, 49, 49, 16, 16, false, 0, PACKED, 0},
    {"SD1.5 self T4096 Dh40", 2, 2, 4096, 4096, 40, 40, false, 0, ROWS, 0},
    {"SD1.5 cross Tq4096 Tk77 Dh40, padded samples", 2, 8, 4096, 77, 40, 40, false, 0, ROWS, 64},
    {"SD1.5 cross Tq1024 Tk77 Dh80, packed kv", 2, 8, 1024, 77, 80, 80, false, 0, KV, 0},
    {"SD1.5 self T256 Dh160", 2, 8, 256, 256, 160, 160, false, 0, ROWS, 0},
    {"SD1.5 cross Tq64 Tk77 Dh160, packed kv", 2, 8, 64, 77, 160, 160, false, 0, KV, 0},
    {"SD2 self T1024 Dh64, head-major", 2, 5, 1024, 1024, 64, 64, false, 0, HEADS, 0},
    {"CLIP causal T77 Dh64", 2, 12, 77, 77, 64, 64, true, 0, ROWS, 0},
    {"causal Tq100 Tk130 Dh72, odd padding", 3, 2, 100, 130, 72, 72, true, 0, ROWS, 37},
    {"causal T130 Dh128, head-major", 1, 2, 130, 130, 128, 128, true, 0, HEADS, 0},
    {"Tq77 Tk1 Dh25", 2, 3, 77, 1, 25, 25, false, 0, ROWS, 0},
    {"Tq130 Tk100 Dh80, head-major", 2, 3, 130, 100, 80, 80, false, 0, HEADS, 0},
    {"scale 0.3 Tq100 Tk77 Dh64, packed kv", 3, 2, 100, 77, 64, 64, false, 0.3f, KV, 8},
    {"SD VAE one head T4096 Dh512", 1, 1, 4096, 4096, 512, 512, false, 0, ROWS, 0},
    {"VAE-size head, causal Tq100 Tk130 Dh200", 2, 1, 100, 130, 200, 200, true, 0, ROWS, 5},
    {"Dh64 Dv32 Tq77 Tk100, packed kv", 2, 3, 77, 100, 64, 32, false, 0, KV, 0},
    {"SD 1024 px self T16384 Dh40", 1, 1, 16384, 16384, 40, 40, false, 0, ROWS, 0},
    {"Tq300 Tk700 Dh32, head-major", 2, 3, 300, 700, 32, 32, false, 0, HEADS, 0},
    {"Tq200 Tk260 Dh40, padded samples", 2, 2, 200, 260, 40, 40, false, 0.2f, ROWS, 16},
    {"Tq129 Tk129 Dh24, packed qkv", 3, 2, 129, 129, 24, 24, false, 0, PACKED, 0},
    {"Tq1000 Tk128 Dh48, padded samples", 3, 5, 1000, 128, 48, 48, false, 0, ROWS, 8},
    {"Tq700 Tk81 Dh32, head-major", 2, 2, 700, 81, 32, 32, false, 0, HEADS, 0},
    {"Tq333 Tk1 Dh16, packed kv", 2, 3, 333, 1, 16, 16, false, 0, KV, 0},
    {"Tq5000 Tk80 Dh40 rows", 1, 3, 5000, 80, 40, 40, false, 0.5f, ROWS, 0},
    // cuDNN's deterministic backward would need over 1 GiB of workspace for
    // both samples at once (2 bytes a score): it runs them one at a time
    {"sliced backward B2 T16384 Dh32", 2, 1, 16384, 16384, 32, 32, false, 0, ROWS, 0},
};

int main(int argc, char **argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (uint64_t)time(NULL);
    const char *only = argc > 2 ? argv[2] : NULL;
    g_rng = seed * 2654435761u + 88172645463325252ull;
    printf("test_cuda_attention: seed %llu\n", (unsigned long long)seed);
    g_cpu = dc_backend_cpu_create();
    if (g_cpu->reserve(g_cpu, 16384, 512)) return printf("cpu reserve: %s\n", dc_error()), 1;
    // Modes: fp32; bf16 (on a Hopper GPU its wgmma forward where the call
    // fits, the few-keys kernel where that fits, else cuDNN's; cuDNN's
    // backward where it covers the call); bf16 with our Hopper kernels and
    // cuDNN's backward off (cuDNN's forward, then our flash kernels' backward).
    // Then bf16 with cuDNN's attention off (the engine's kernels alone).
    static const char *off[4] = {"", "", "attention_sm90,attention_short,cudnn_attention_bwd", "cudnn_attention"};
    for (int mode = 0; mode < 4; mode++) {
        dc_backend_opts o = dc_backend_opts_default();
        dc_backend_opts_disable(&o, off[mode]);
        g_gpu = dc_backend_cuda_create_opts(mode == 0, &o);
        if (!g_gpu) {
            printf("SKIP (no GPU) test_cuda_attention: %s\n", dc_error());
            dc_backend_destroy(g_cpu);
            return 0;
        }
        g_ct = g_gpu->compute;
        printf("== %s (compute %s%s%s) ==\n", g_gpu->name, dc_dtype_name(g_ct),
               *off[mode] ? "; off: " : "", off[mode]);
        if (g_gpu->reserve(g_gpu, 16384, 512)) {
            printf("FAIL reserve for 16384 tokens, head size 512: %s\n", dc_error());
            return 1;
        }
        for (size_t i = 0; i < sizeof g_cases / sizeof g_cases[0]; i++)
            if (!only || strstr(g_cases[i].name, only)) run_case(&g_cases[i]);
        dc_backend_destroy(g_gpu);
    }
    dc_backend_destroy(g_cpu);
    printf("test_cuda_attention: %d checks, %d failed\n", g_count, g_fail);
    return g_fail ? 1 : 0;
}
