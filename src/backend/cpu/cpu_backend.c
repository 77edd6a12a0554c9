// The CPU backend: host memory, per-thread scratch, and the table of ops.
// Memory is ordinary 64-byte aligned host memory (a cache line, and the
// widest vector load; large blocks on huge pages), so upload, download and
// copy are all memcpy.
#include <assert.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"

#define DC_CPU_ALIGN 64

static void *aligned(size_t bytes) {
    // aligned_alloc wants a size that is a multiple of the alignment.
    size_t n = (bytes + DC_CPU_ALIGN - 1) / DC_CPU_ALIGN * DC_CPU_ALIGN;
    return aligned_alloc(DC_CPU_ALIGN, n ? n : DC_CPU_ALIGN);
}

// Allocations of at least this many bytes (weights, activation arenas) sit on
// 2 MiB boundaries and ask the kernel for huge pages: a 4 GB model then
// takes two thousand page faults to touch instead of a million.
#define DC_CPU_HUGE ((size_t)4 << 20)
#define DC_CPU_HUGE_PAGE ((size_t)2 << 20)

static void *cpu_alloc(dc_backend *be, size_t bytes) {
    (void)be;
    void *p;
    if (bytes >= DC_CPU_HUGE) {
        size_t n = (bytes + DC_CPU_HUGE_PAGE - 1) / DC_CPU_HUGE_PAGE * DC_CPU_HUGE_PAGE;
        p = aligned_alloc(DC_CPU_HUGE_PAGE, n);
#ifdef MADV_HUGEPAGE
        if (p) madvise(p, n, MADV_HUGEPAGE);  // advice only: without huge pages all still works
#endif
    } else {
        p = aligned(bytes);
    }
    if (!p) dc_fail("cpu backend: out of memory allocating %zu bytes", bytes);
    return p;
}

static void cpu_free(dc_backend *be, void *p) {
    (void)be;
    free(p);
}

static void cpu_copy(dc_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memcpy(dst, src, bytes);
}

static void cpu_zero(dc_backend *be, void *dst, size_t bytes) {
    (void)be;
    if (bytes) memset(dst, 0, bytes);
}

// Every op finishes before it returns.
static void cpu_sync(dc_backend *be) { (void)be; }

// The one failure an op can meet: no memory to widen F16/BF16 weights.
static int cpu_status(dc_backend *be) {
    const dc_cpu_ctx *ctx = be->ctx;
    return ctx->error[0] ? dc_fail("%s", ctx->error) : 0;
}

// Host memory is the device's, so an asynchronous copy is done when it
// returns: there is never a ticket to wait for.
static int64_t cpu_copy_async(dc_backend *be, void *dst, const void *src, size_t bytes, bool to_host) {
    (void)to_host;
    cpu_copy(be, dst, src, bytes);
    return 0;
}

static int cpu_host_wait(dc_backend *be, int64_t ticket) {
    (void)be, (void)ticket;
    return 0;
}

static void cpu_wait_ticket(dc_backend *be, int64_t ticket) { (void)be, (void)ticket; }

static void cpu_destroy(dc_backend *be) {
    if (!be) return;
    dc_cpu_ctx *ctx = be->ctx;
    if (ctx) {
        free(ctx->scratch), free(ctx->conv_ws);
        for (int i = 0; i < DC_CPU_WIDE_SLOTS; i++) free(ctx->wide[i]);
    }
    free(ctx);
    free(be);
}

// Attention keeps two blocks of scores per thread, bounded whatever the
// length (see cpu_attention.c).
static int cpu_reserve(dc_backend *be, int max_tokens, int head_dim) {
    (void)head_dim;  // any head size works on the CPU
    dc_cpu_ctx *ctx = be->ctx;
    // Round each thread's slice to a cache line so threads never share one.
    size_t per_thread = (dc_cpu_attn_scratch(max_tokens) + 15) / 16 * 16;
    int threads = omp_get_max_threads();
    if (per_thread <= ctx->scratch_per_thread && threads <= ctx->scratch_threads) return 0;
    if (per_thread < ctx->scratch_per_thread) per_thread = ctx->scratch_per_thread;
    if (threads < ctx->scratch_threads) threads = ctx->scratch_threads;
    float *p = aligned(per_thread * threads * sizeof(float));
    if (!p)
        return dc_fail("out of memory for %.1f MiB of attention workspace (%d tokens)",
                       per_thread * threads * sizeof(float) / 1048576.0, max_tokens);
    free(ctx->scratch);
    ctx->scratch = p;
    ctx->scratch_per_thread = per_thread;
    ctx->scratch_threads = threads;
    return 0;
}

// The im2col workspace of the largest conv reserved so far (grow-only), shared
// by every thread of a conv (see cpu_conv.c); the same size for NCHW and
// channels-last shapes. Also where a conv's shape is checked, once, before
// any conv of it runs.
static int cpu_reserve_conv(dc_backend *be, const dc_conv2d_shape *s, bool backward) {
    (void)backward;  // both directions unfold into the same columns
    dc_cpu_ctx *ctx = be->ctx;
    if (s->B < 1 || s->Ci < 1 || s->Co < 1 || s->H < 1 || s->W < 1 || s->k < 1 || s->stride < 1 ||
        s->pad_t < 0 || s->pad_b < 0 || s->pad_l < 0 || s->pad_r < 0 || dc_conv2d_ho(s) < 1 ||
        dc_conv2d_wo(s) < 1)
        return dc_fail("conv2d: invalid shape: %d images of %d channels %dx%d, %d output channels, "
                       "kernel %d, stride %d, padding %d,%d,%d,%d (top, bottom, left, right)",
                       s->B, s->Ci, s->H, s->W, s->Co, s->k, s->stride, s->pad_t, s->pad_b,
                       s->pad_l, s->pad_r);
    // Every index of one image, and of the kernel times one band, fits an int.
    const int64_t kk = (int64_t)s->Ci * s->k * s->k, wo = dc_conv2d_wo(s);
    const int64_t ni = (int64_t)s->Ci * s->H * s->W, no = (int64_t)s->Co * dc_conv2d_ho(s) * wo;
    if (ni > INT32_MAX || no > INT32_MAX || kk * wo > INT32_MAX || kk * s->Co > INT32_MAX)
        return dc_fail("conv2d: %d channels of %dx%d to %d channels (kernel %d) is too large "
                       "for one image", s->Ci, s->H, s->W, s->Co, s->k);
    size_t n = dc_cpu_conv_ws_floats(s);
    if (n <= ctx->conv_ws_floats) return 0;
    float *p = aligned(n * sizeof(float));
    if (!p)
        return dc_fail("out of memory for %.1f MiB of convolution workspace",
                       n * sizeof(float) / 1048576.0);
    free(ctx->conv_ws);
    ctx->conv_ws = p;
    ctx->conv_ws_floats = n;
    return 0;
}

float *dc_cpu_scratch(dc_backend *be, size_t per_thread, size_t *stride) {
    dc_cpu_ctx *ctx = be->ctx;
    // Reserved up front by cpu_reserve; a shortfall is a caller's bug.
    assert(per_thread <= ctx->scratch_per_thread && omp_get_max_threads() <= ctx->scratch_threads);
    (void)per_thread;
    *stride = ctx->scratch_per_thread;
    return ctx->scratch;
}

dc_backend *dc_backend_cpu_create(void) {
    dc_backend *be = calloc(1, sizeof *be);
    dc_cpu_ctx *ctx = calloc(1, sizeof *ctx);
    if (!be || !ctx) {
        free(be);
        free(ctx);
        dc_fail("cpu backend: out of memory");
        return NULL;
    }
    dc_cpu_blas_init();
    *be = (dc_backend){
        .name = "cpu",
        .ctx = ctx,
        .opts = dc_backend_opts_default(),
        .compute = DC_F32,
        .half_weights = true,
        .alloc = cpu_alloc,
        .free = cpu_free,
        .upload = cpu_copy,
        .download = cpu_copy,
        .copy = cpu_copy,
        .zero = cpu_zero,
        .cast = dc_cpu_cast,
        .sync = cpu_sync,
        .status = cpu_status,
        .reserve = cpu_reserve,
        .destroy = cpu_destroy,
        .linear_fwd = dc_cpu_linear_fwd,
        .linear_fwd_acc = dc_cpu_linear_fwd_acc,
        .linear_many_fwd = dc_cpu_linear_many_fwd,
        .linear_bwd = dc_cpu_linear_bwd,
        .linear_gelu_fwd = dc_cpu_linear_gelu_fwd,
        .linear_geglu_fwd = dc_cpu_linear_geglu_fwd,
        .linear_bwd_gelu = dc_cpu_linear_bwd_gelu,
        .gelu_fwd = dc_cpu_gelu_fwd,
        .gelu_bwd = dc_cpu_gelu_bwd,
        .silu_fwd = dc_cpu_silu_fwd,
        .silu_bwd = dc_cpu_silu_bwd,
        .axpy = dc_cpu_axpy,
        .clamp = dc_cpu_clamp,
        .add_rows = dc_cpu_add_rows,
        .ln_mod_fwd = dc_cpu_ln_mod_fwd,
        .ln_mod_bwd = dc_cpu_ln_mod_bwd,
        .gate_res_fwd = dc_cpu_gate_res_fwd,
        .gate_res_bwd = dc_cpu_gate_res_bwd,
        .attention_fwd = dc_cpu_attention_fwd,
        .attention_bwd = dc_cpu_attention_bwd,
        .patchify = dc_cpu_patchify,
        .unpatchify_fwd = dc_cpu_unpatchify_fwd,
        .unpatchify_bwd = dc_cpu_unpatchify_bwd,
        .timestep_embed = dc_cpu_timestep_embed,
        .embed_fwd = dc_cpu_embed_fwd,
        .embed_bwd = dc_cpu_embed_bwd,
        .randn = dc_cpu_randn,
        .q_sample = dc_cpu_q_sample,
        .diffusion_loss = dc_cpu_diffusion_loss,
        .cfg_combine = dc_cpu_cfg_combine,
        .sampler_step = dc_cpu_sampler_step,
        .adamw = dc_cpu_adamw,
        .grad_norm = dc_cpu_grad_norm,
        .reserve_conv = cpu_reserve_conv,
        .conv2d_fwd = dc_cpu_conv2d_fwd,
        .conv2d_fwd_res = dc_cpu_conv2d_fwd_res,
        .conv2d_bwd = dc_cpu_conv2d_bwd,
        .group_norm_fwd = dc_cpu_group_norm_fwd,
        .group_norm_bwd = dc_cpu_group_norm_bwd,
        .layer_norm_fwd = dc_cpu_layer_norm_fwd,
        .layer_norm_bwd = dc_cpu_layer_norm_bwd,
        .upsample2x_fwd = dc_cpu_upsample2x_fwd,
        .upsample2x_bwd = dc_cpu_upsample2x_bwd,
        .geglu_fwd = dc_cpu_geglu_fwd,
        .geglu_bwd = dc_cpu_geglu_bwd,
        .activation_fwd = dc_cpu_activation_fwd,
        .activation_bwd = dc_cpu_activation_bwd,
        .transpose = dc_cpu_transpose,
        .add_channel = dc_cpu_add_channel,
        .channel_sum = dc_cpu_channel_sum,
        .group_norm_nhwc_fwd = dc_cpu_group_norm_nhwc_fwd,
        .group_norm_nhwc_apply = dc_cpu_group_norm_nhwc_apply,
        .upsample2x_nhwc_fwd = dc_cpu_upsample2x_nhwc_fwd,
        .add_nhwc = dc_cpu_add_nhwc,
        .concat_channels = dc_cpu_concat_channels,
        .group_norm_nhwc_bwd = dc_cpu_group_norm_nhwc_bwd,
        .upsample2x_nhwc_bwd = dc_cpu_upsample2x_nhwc_bwd,
        .channel_sum_nhwc = dc_cpu_channel_sum_nhwc,
        .split_channels = dc_cpu_split_channels,
        .alloc_pinned = cpu_alloc,
        .free_pinned = cpu_free,
        .copy_async = cpu_copy_async,
        .host_wait = cpu_host_wait,
        .wait_ticket = cpu_wait_ticket,
    };
    return be;
}
