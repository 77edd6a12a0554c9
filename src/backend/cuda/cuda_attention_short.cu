// Attention over few keys (at most 128): Stable Diffusion's cross-attention
// to the text encoder's 77 tokens. The flash kernels fit it badly: ours
// (cuda_attention.cu) loads K and V again for every 64 queries and walks 77
// keys as two 64-key tiles; cuDNN's runs heads of 40 as 64 wide.
//
// Here a block loads the keys and values of its (b, h) once, padded to KP =
// 16 KB rows (zeros past Tk and past Dh), and runs `rounds` tiles of 64
// queries against them, the next tile's queries loading while this one is
// computed. All keys fit one tile, so the softmax is exact in one pass (no
// running max or rescaling). Blocks of one query tile and sample for
// consecutive heads run next to each other, so a row's 16-byte chunks reach
// the caches once for all its heads. Same semantics and fragment layouts as
// cuda_attention.cu (mma.sync m16n8k16, bf16 in, fp32 accumulators); no
// mask: the causal calls (CLIP's 77 tokens) keep the general kernels.
//
// It takes heads of at most 48, which cuDNN runs 64 wide: on an H100 at SD
// 1.x's 16-row step the 64x64 level's call (heads of 40) takes 57.4 us where
// cuDNN's took 74.5 (a block-wide ring of query tiles: 62.8). There the
// exponentials and products, not the 84 MB moved (25 us), bound it. At heads
// of 80 cuDNN's is the faster (28 us against 30.7), so wider heads stay
// with it.
#include "backend/cuda/cuda_attention_tc.h"
#include "backend/cuda/cuda_ops.h"

// KB: blocks of 16 keys (KP = 16 KB >= Tk). The block's queries are
// `rounds` groups of 64; warp w takes rows 16w..16w+15 of each group and
// streams them through a ring of NQ 16-row buffers of its own, loading two
// tiles ahead, so after the keys and values (the one block-wide wait) the
// warps run apart and one's loads overlap another's products.
constexpr int NQ = 3;
template <int DP, int KB>
__global__ void __launch_bounds__(kThreads) attn_fwd_short(const AttnParams p, float scale_log2, int rounds) {
    constexpr int SST = DP + 8, NT = DP / 8, KT = DP / 16, KP = 16 * KB, CPR = DP / 8;
    extern __shared__ __align__(16) unsigned char smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3, g = lane >> 2;
    bf16 *sK = (bf16 *)smem, *sV = sK + KP * SST, *sQ = sV + KP * SST + warp * NQ * 16 * SST;

    dc_pdl_enter();
    const int Tq = p.Tq, Tk = p.Tk, Dh = p.Dh;
    const int groups = (Tq + BT * rounds - 1) / (BT * rounds);  // query groups of a (b, h)
    const int h = blockIdx.x % p.H, rest = blockIdx.x / p.H;
    const int grp = rest % groups, b = rest / groups;
    const bf16 *qg = (const bf16 *)p.q + b * p.qb + h * p.qh;
    const int lrow = lane & 15, lcol = (lane >> 4) * 8;
    // this warp's tiles: rows q_at(j) .. + 15 for j < nt
    const int first = grp * rounds * BT + warp * 16;
    auto q_at = [&](int j) { return first + j * BT; };
    const int nt = first < Tq ? min(rounds, (Tq - first + BT - 1) / BT) : 0;
    auto load_q = [&](int j) {  // 16 rows of tile j into its buffer, zeros past Tq and Dh
        bf16 *dst = sQ + (j % NQ) * 16 * SST;
        const int q0 = q_at(j);
        for (int c = lane; c < 16 * CPR; c += 32) {
            const int r = c / CPR, col = (c % CPR) * 8;
            const bool ok = q0 + r < Tq && col < Dh;
            cp_async16(smem_u32(dst + r * SST + col), ok ? qg + (int64_t)(q0 + r) * p.qt + col : qg, ok ? 16 : 0);
        }
    };

    load_tile<KP, DP>(sK, (const bf16 *)p.k + b * p.kb + h * p.kh, p.kt, Tk, Dh, true);
    load_tile<KP, DP>(sV, (const bf16 *)p.v + b * p.vb + h * p.vh, p.vt, Tk, Dh, true);
    cp_async_commit();
    for (int j = 0; j < NQ - 1; j++) {
        if (j < nt) load_q(j);
        cp_async_commit();  // possibly empty: keeps the group count uniform
    }
    cp_async_wait<NQ - 1>();  // K and V
    __syncthreads();

    for (int j = 0; j < nt; j++) {
        __syncwarp();  // the buffer tile j + NQ - 1 takes was tile j - 1's
        if (j + NQ - 1 < nt) load_q(j + NQ - 1);
        cp_async_commit();
        cp_async_wait<NQ - 1>();  // tile j has landed
        __syncwarp();
        const bf16 *sQj = sQ + (j % NQ) * 16 * SST;

        // S = Q K^T: 16 rows x KP keys.
        float s[2 * KB][4];
        warp_abt<2 * KB, KT, SST>(s, sQj, 0, sK, 0, lrow, lcol);
        // Softmax in base 2. Element (n, e) is row g + 8 (e >> 1), key
        // 8n + 2t + (e & 1); keys past Tk get -inf (every row sees key 0).
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < 2 * KB; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = s[n][e] * scale_log2;
                if (KP > Tk && 8 * n + 2 * t + (e & 1) >= Tk) v = -INFINITY;
                s[n][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
        }
        float l[2] = {0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        }
#pragma unroll
        for (int n = 0; n < 2 * KB; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float pr = exp2f(s[n][e] - mx[e >> 1]);
                s[n][e] = pr;
                l[e >> 1] += pr;
            }
        }
        // O = P V.
        float o[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
        warp_pb<KB, KT, SST>(o, s, sV, 0, lrow, lcol);

        const int q0 = q_at(j);
#pragma unroll
        for (int i = 0; i < 2; i++) {
            l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
            l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
            const int row = q0 + g + 8 * i;
            if (row >= Tq) continue;
            const float inv = 1.0f / l[i];
            bf16 *orow = (bf16 *)p.out + b * p.ob + h * p.oh + row * p.ot;
#pragma unroll
            for (int n = 0; n < NT; n++) store_pair(orow, 8 * n + 2 * t, Dh, o[n][2 * i] * inv, o[n][2 * i + 1] * inv, true);
            if (t == 0) p.lse[((int64_t)b * p.H + h) * Tq + row] = (mx[i] + log2f(l[i])) * kLn2;
        }
    }
}

template <int DP, int KB> static void launch(dc_backend *be, const AttnParams &p, int rounds, unsigned grid) {
    const size_t sm = (size_t)(2 * 16 * KB + NQ * BT) * (DP + 8) * sizeof(bf16);
    allow_smem((const void *)attn_fwd_short<DP, KB>, sm);
    dc_launch(be, attn_fwd_short<DP, KB>, grid, kThreads, sm, p, p.scale * kLog2e, rounds);
}

template <int KB> static void launch_dp(dc_backend *be, const AttnParams &p, int rounds, unsigned grid) {
    switch (attn_pick_dp(p.Dh)) {
    case 16: launch<16, KB>(be, p, rounds, grid); break;
    case 32: launch<32, KB>(be, p, rounds, grid); break;
    default: launch<48, KB>(be, p, rounds, grid); break;  // SD 1.x's 64x64 level
    }
}


bool dc_attn_fwd_short(dc_backend *be, const AttnParams &p, const dc_attn_shape *s) {
    if (s->causal || s->Dh != s->Dv || s->Dh > 48 || s->Dh % 8 || s->Tk > 128) return false;
    const dc_attn_layout l[4] = {s->q, s->k, s->v, s->out};
    const void *ptr[4] = {p.q, p.k, p.v, p.out};
    for (int i = 0; i < 4; i++)
        if (l[i].batch % 8 || l[i].token % 8 || l[i].head % 8 || !dc_aligned(ptr[i], 16)) return false;
    // Query tiles a block: as many as keep at least 4 blocks an SM.
    const int64_t tiles = (s->Tq + BT - 1) / BT, bh = (int64_t)s->B * s->H;
    int rounds = 1;
    while (rounds < 8 && bh * ((tiles + 2 * rounds - 1) / (2 * rounds)) >= 4LL * dc_cuda_sm_count()) rounds *= 2;
    const int64_t grid = bh * ((tiles + rounds - 1) / rounds);
    if (grid > INT32_MAX) return false;
    if (s->Tk <= 80) launch_dp<5>(be, p, rounds, (unsigned)grid);
    else launch_dp<8>(be, p, rounds, (unsigned)grid);
    return true;
}
