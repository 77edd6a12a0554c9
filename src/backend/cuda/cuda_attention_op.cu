// The attention op of the CUDA backend (backend.h: attention_fwd and
// attention_bwd): checks a call, then picks its path (cuda_attention.h):
// cuDNN's flash attention for a bf16 forward or backward it covers, the bf16
// tensor-core kernels or the fp32 kernels where the head fits, else the
// product path. A call none can run is recorded as the op's error, in the
// caller's terms.
#include <stdio.h>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ops.h"
#include "core/error.h"

// Empty string if the shape is one the op defines, else what is wrong.
static void shape_problem(char *msg, size_t size, const dc_attn_shape *s) {
    msg[0] = 0;
    if (s->B < 1 || s->H < 1 || s->Tq < 1 || s->Tk < 1 || s->Dh < 1 || s->Dv < 1)
        snprintf(msg, size, "attention shape B %d, H %d, Tq %d, Tk %d, Dh %d, Dv %d: every size must be at least 1",
                 s->B, s->H, s->Tq, s->Tk, s->Dh, s->Dv);
    else if (s->causal && s->Tq > s->Tk)
        snprintf(msg, size, "causal attention needs at least as many keys as queries (%d queries, %d keys)", s->Tq,
                 s->Tk);
}

static AttnParams params_for(const dc_attn_shape *s) {
    AttnParams p;
    memset(&p, 0, sizeof p);
    p.qb = s->q.batch, p.qt = s->q.token, p.qh = s->q.head;
    p.kb = s->k.batch, p.kt = s->k.token, p.kh = s->k.head;
    p.vb = s->v.batch, p.vt = s->v.token, p.vh = s->v.head;
    p.ob = s->out.batch, p.ot = s->out.token, p.oh = s->out.head;
    p.B = s->B, p.H = s->H, p.Tq = s->Tq, p.Tk = s->Tk, p.Dh = s->Dh, p.Dv = s->Dv;
    p.causal = s->causal;
    p.scale = dc_attn_scale(s);
    return p;
}

// Whether every base address and stride of the tensors is a multiple of
// `elems` elements (of `es` bytes): the fused kernels' 16-byte loads and
// 4-byte paired stores need it.
static bool strides_multiple(const dc_attn_layout *l, int n, int64_t elems) {
    for (int i = 0; i < n; i++)
        if (l[i].batch % elems || l[i].token % elems || l[i].head % elems) return false;
    return true;
}
static bool bases_aligned(const void *const *ptrs, int n, uintptr_t bytes) {
    for (int i = 0; i < n; i++)
        if (!dc_aligned(ptrs[i], bytes)) return false;
    return true;
}

// The path for this shape and dtype: 1 fused kernels, 0 products.
static bool fused(const dc_attn_shape *s, bool bf16) {
    return s->Dh == s->Dv && s->Dh <= (bf16 ? ATTN_TC_MAX_DH : ATTN_F32_MAX_DH);
}

extern "C" void dc_cuda_attention_fwd(dc_backend *be, dc_buf out, dc_buf lse, dc_buf q, dc_buf k, dc_buf v,
                                      const dc_attn_shape *s) {
    DC_CUDA_OP(be);
    char msg[200];
    shape_problem(msg, sizeof msg, s);
    if (msg[0]) DC_CUDA_FAIL(be, "%s", msg);
    const bool bf16 = q.dt == DC_BF16;
    if ((q.dt != DC_F32 && !bf16) || k.dt != q.dt || v.dt != q.dt || out.dt != q.dt || lse.dt != DC_F32)
        DC_CUDA_FAIL(be, "attention dtypes: q %s, k %s, v %s, out %s (one of F32, BF16), lse %s (F32)",
                     dc_dtype_name(q.dt), dc_dtype_name(k.dt), dc_dtype_name(v.dt), dc_dtype_name(out.dt),
                     dc_dtype_name(lse.dt));
    AttnParams p = params_for(s);
    p.q = q.p, p.k = k.p, p.v = v.p, p.out = out.p, p.lse = (float *)lse.p;
    cudaStream_t st = dc_cuda(be)->stream;
    if (bf16 && ((be->opts.attention_sm90 && dc_attn_fwd_sm90(be, p, s)) ||
                 (be->opts.attention_short && dc_attn_fwd_short(be, p, s)))) {
        DC_CUDA_LAUNCHED(be);
        return;
    }
    if (bf16 && dc_cuda_attention_cudnn_fwd(be, &p, s)) return;
    if (!fused(s, bf16)) {
        if (!dc_attn_big_fits(be, s->Tq, s->Tk, bf16))
            DC_CUDA_FAIL(be, "attention over %d queries and %d keys with head size %d is too long for the GPU's "
                         "score workspace", s->Tq, s->Tk, s->Dh);
        dc_attn_big_fwd(be, p, bf16);
        return;
    }
    if (bf16) {
        const dc_attn_layout in[3] = {s->q, s->k, s->v};
        const void *inp[3] = {q.p, k.p, v.p};
        const bool vec = s->Dh % 8 == 0 && strides_multiple(in, 3, 8) && bases_aligned(inp, 3, 16);
        const bool pair = s->Dh % 2 == 0 && strides_multiple(&s->out, 1, 2) && dc_aligned(out.p, 4);
        dc_attn_fwd_bf16(st, p, vec, pair);
    } else {
        dc_attn_fwd_f32(st, p);
    }
    DC_CUDA_LAUNCHED(be);
}

extern "C" void dc_cuda_attention_bwd(dc_backend *be, dc_buf dq, dc_buf dk, dc_buf dv, dc_buf dout, dc_buf q,
                                      dc_buf k, dc_buf v, dc_buf out, dc_buf lse, const dc_attn_shape *s) {
    DC_CUDA_OP(be);
    char msg[200];
    shape_problem(msg, sizeof msg, s);
    if (msg[0]) DC_CUDA_FAIL(be, "%s", msg);
    const bool bf16 = q.dt == DC_BF16;
    const dc_buf same[7] = {k, v, out, dout, dq, dk, dv};
    bool ok = (q.dt == DC_F32 || bf16) && lse.dt == DC_F32;
    for (int i = 0; i < 7; i++) ok = ok && same[i].dt == q.dt;
    if (!ok)
        DC_CUDA_FAIL(be, "attention dtypes: q %s, k %s, v %s, out %s, dout %s, dq %s, dk %s, dv %s (all F32 or all "
                     "BF16), lse %s (F32)", dc_dtype_name(q.dt), dc_dtype_name(k.dt), dc_dtype_name(v.dt),
                     dc_dtype_name(out.dt), dc_dtype_name(dout.dt), dc_dtype_name(dq.dt), dc_dtype_name(dk.dt),
                     dc_dtype_name(dv.dt), dc_dtype_name(lse.dt));
    AttnParams p = params_for(s);
    p.q = q.p, p.k = k.p, p.v = v.p, p.o = out.p, p.dout = dout.p, p.lse = (float *)lse.p;
    p.dq = dq.p, p.dk = dk.p, p.dv = dv.p;
    if (bf16 && dc_cuda_attention_cudnn_bwd(be, &p, s)) return;
    cudaStream_t st = dc_cuda(be)->stream;
    if (!fused(s, bf16) || (bf16 && !dc_attn_bwd_bf16_fits(s->Dh))) {
        if (!dc_attn_big_fits(be, s->Tq, s->Tk, bf16))
            DC_CUDA_FAIL(be, "attention over %d queries and %d keys with head size %d is too long for the GPU's "
                         "score workspace", s->Tq, s->Tk, s->Dh);
        dc_attn_big_bwd(be, p, bf16);
        return;
    }
    if (bf16) {
        const dc_attn_layout all[4] = {s->q, s->k, s->v, s->out};
        const void *inp[5] = {q.p, k.p, v.p, out.p, dout.p}, *outp[3] = {dq.p, dk.p, dv.p};
        const bool vec = s->Dh % 8 == 0 && strides_multiple(all, 4, 8) && bases_aligned(inp, 5, 16);
        const bool pair = s->Dh % 2 == 0 && strides_multiple(all, 3, 2) && bases_aligned(outp, 3, 4);
        dc_attn_bwd_bf16(st, p, vec, pair);
    } else {
        dc_attn_bwd_f32(st, p);
    }
    DC_CUDA_LAUNCHED(be);
}

// Heads of any size run (the largest through the product path); what limits
// a reserve is the product path's score block for the longest sequence.
extern "C" int dc_cuda_attention_reserve(dc_backend *be, int max_tokens, int head_dim) {
    if (max_tokens < 1) return dc_fail("cuda: reserve for %d tokens", max_tokens);
    if (head_dim < 1) return dc_fail("cuda: attention head size %d", head_dim);
    const bool bf16 = be->compute == DC_BF16;
    if (head_dim > (bf16 ? ATTN_TC_MAX_DH : ATTN_F32_MAX_DH) && !dc_attn_big_fits(be, max_tokens, max_tokens, bf16))
        return dc_fail("cuda: attention over %d tokens with head size %d is too long for the GPU's score workspace",
                       max_tokens, head_dim);
    return 0;
}
