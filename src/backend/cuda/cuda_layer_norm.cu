// Affine layer norm on the GPU, forward and backward, with the per-element
// formulas shared with the CPU (op_math.h).
//
// Every sum is taken in a fixed order, so results never depend on timing; the
// parameter gradients' column sums across row slices go through partials in
// the context's norm workspace, added in slice order. No atomics.
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ops.h"

// ---- layer norm with affine weights ------------------------------------------------------
// A warp per row of D values (ROWS rows a block); statistics in double, two
// passes over a row that stays in L1.
enum { ROWS = 8 };

__global__ void k_ln_fwd(void *out, int obf, float *mean, float *rstd, const void *x, int xbf, const void *gamma,
                         int gbf, const void *beta, int bbf, int64_t M, int D, float eps) {
    dc_pdl_enter();
    const int64_t row = blockIdx.x * (int64_t)ROWS + threadIdx.y;
    const int lane = threadIdx.x;
    if (row >= M) return;
    const int64_t base = row * D;
    double s = 0.0;
    for (int d = lane; d < D; d += 32) s += dc_ld(x, base + d, xbf);
    const double mu = dc_warp_sum_d(s) / D;
    double ss = 0.0;
    for (int d = lane; d < D; d += 32) {
        double t = dc_ld(x, base + d, xbf) - mu;
        ss += t * t;
    }
    const float m = (float)mu, r = dc_norm_rstd(dc_warp_sum_d(ss) / D, eps);
    for (int d = lane; d < D; d += 32)
        dc_st(out, base + d, dc_norm_affine(dc_norm_xhat(dc_ld(x, base + d, xbf), m, r), dc_ld(gamma, d, gbf),
                                            dc_ld(beta, d, bbf)), obf);
    if (lane == 0) mean[row] = m, rstd[row] = r;
}

// Rows of whole 16-byte vectors (D a multiple of 8, up to 2048; every buffer
// aligned): LPR lanes a row (8, 16 or 32, so a warp takes 32 / LPR rows),
// each lane holding its NV vectors of 8 values in registers, so x is read
// once with one access per 8 values, and the sums are taken in float (lanes
// in order of their vectors, then the fixed butterfly within the row's
// lanes). A warp per row of 320 that loaded one value at a time and summed in
// double left the SD UNet's layer norms bound by the count of instructions;
// a warp per row of 320 vectors left 24 of its lanes idle for the last 8
// vectors and too few bytes in flight (46 us for 42 MB in and out at 16 rows,
// against 28 of memory time).
template <int NV, int LPR>
__global__ void k_ln_fwd_v8(void *out, int obf, float *mean, float *rstd, const void *x, int xbf, const void *gamma,
                            int gbf, const void *beta, int bbf, int64_t M, int D, float eps) {
    dc_pdl_enter();
    const int lane = threadIdx.x % LPR, nvec = D / 8;
    const int64_t row = (blockIdx.x * (int64_t)ROWS + threadIdx.y) * (32 / LPR) + threadIdx.x / LPR;
    const bool live = row < M;  // every lane takes part in the sums' shuffles
    const int64_t base = row * D;
    float v[NV][8];
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int i = lane + LPR * k;
        if (!live || i >= nvec) break;
        dc_ldv<8>(v[k], x, base + 8 * i, xbf);
#pragma unroll
        for (int e = 0; e < 8; e++) s += v[k][e];
    }
#pragma unroll
    for (int o = LPR / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const float mu = s / D;
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        if (!live || lane + LPR * k >= nvec) break;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const float t = v[k][e] - mu;
            ss += t * t;
        }
    }
#pragma unroll
    for (int o = LPR / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (!live) return;
    const float r = dc_norm_rstd((double)(ss / D), eps);
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int i = lane + LPR * k;
        if (i >= nvec) break;
        float g[8], b[8];
        dc_ldv<8>(g, gamma, 8 * i, gbf), dc_ldv<8>(b, beta, 8 * i, bbf);
#pragma unroll
        for (int e = 0; e < 8; e++) v[k][e] = dc_norm_affine(dc_norm_xhat(v[k][e], mu, r), g[e], b[e]);
        dc_stv<8>(out, base + 8 * i, v[k], obf);
    }
    if (lane == 0) mean[row] = mu, rstd[row] = r;
}

// Calls launch.template operator()<NV, LPR>(rows a block) for the fewest
// lanes a row that leave a lane at most 6 vectors (8 at 32 lanes): 320 wide
// 8 lanes of 5 vectors, 640 16 of 5, 1280 32 of 5, 768 16 of 6, 1152 32 of 5.
template <class L>
static void ln_v8_dispatch(int D, L launch) {
    const int nvec = D / 8, lpr = nvec <= 48 ? 8 : nvec <= 96 ? 16 : 32, nv = (nvec + lpr - 1) / lpr;
    const int64_t rows = (int64_t)ROWS * (32 / lpr);
    if (lpr == 8) {
        switch (nv) {
        case 1: launch.template operator()<1, 8>(rows); break;
        case 2: launch.template operator()<2, 8>(rows); break;
        case 3: launch.template operator()<3, 8>(rows); break;
        case 4: launch.template operator()<4, 8>(rows); break;
        case 5: launch.template operator()<5, 8>(rows); break;
        default: launch.template operator()<6, 8>(rows); break;
        }
    } else if (lpr == 16) {
        switch (nv) {
        case 4: launch.template operator()<4, 16>(rows); break;
        case 5: launch.template operator()<5, 16>(rows); break;
        default: launch.template operator()<6, 16>(rows); break;
        }
    } else {
        switch (nv) {
        case 4: launch.template operator()<4, 32>(rows); break;
        case 5: launch.template operator()<5, 32>(rows); break;
        case 6: launch.template operator()<6, 32>(rows); break;
        default: launch.template operator()<8, 32>(rows); break;
        }
    }
}

// Whether rows of D values of every buffer (NULL ones aside) take the
// 16-byte kernels: D a multiple of 8 up to 2048, each buffer 16-byte aligned.
static bool ln_v8_ok(int D, dc_buf a, dc_buf b, dc_buf c, dc_buf d) {
    return D % 8 == 0 && D <= 2048 && dc_vec_width(8, a, b, c) == 8 && (!d.p || dc_aligned(d.p, 16));
}

extern "C" void dc_cuda_layer_norm_fwd(dc_backend *be, dc_buf out, dc_buf mean, dc_buf rstd, dc_buf x, dc_buf gamma,
                                       dc_buf beta, int64_t M, int D, float eps) {
    DC_CUDA_OP(be);
    if (mean.dt != DC_F32 || rstd.dt != DC_F32)
        DC_CUDA_FAIL(be, "layer norm statistics must be F32 (mean %s, rstd %s)", dc_dtype_name(mean.dt),
                     dc_dtype_name(rstd.dt));
    if (M <= 0 || D <= 0) return;
    float *mu = (float *)mean.p, *r = (float *)rstd.p;
    if (ln_v8_ok(D, x, out, gamma, beta)) {
        ln_v8_dispatch(D, [&]<int NV, int LPR>(int64_t rows) {
            dc_launch(be, k_ln_fwd_v8<NV, LPR>, (unsigned)((M + rows - 1) / rows), dim3(32, ROWS), 0, out.p, BF(out),
                      mu, r, x.p, BF(x), gamma.p, BF(gamma), beta.p, BF(beta), M, D, eps);
        });
        DC_CUDA_LAUNCHED(be);
        return;
    }
    const dim3 block(32, ROWS);
    const unsigned grid = (unsigned)((M + ROWS - 1) / ROWS);
    dc_launch(be, k_ln_fwd, grid, block, 0, out.p, BF(out), mu, r, x.p, BF(x), gamma.p, BF(gamma), beta.p, BF(beta), M,
              D, eps);
    DC_CUDA_LAUNCHED(be);
}

// dx (+)= rstd (g - mean(g) - xhat mean(g xhat)), g = dout gamma.
__global__ void k_ln_bwd_dx(void *dx, int dxbf, const void *dout, int obf, const void *x, int xbf, const float *mean,
                            const float *rstd, const void *gamma, int gbf, int64_t M, int D, bool accumulate) {
    const int64_t row = blockIdx.x * (int64_t)ROWS + threadIdx.y;
    const int lane = threadIdx.x;
    if (row >= M) return;
    const int64_t base = row * D;
    const float mu = mean[row], r = rstd[row];
    float sg = 0.0f, sgx = 0.0f;
    for (int d = lane; d < D; d += 32) {
        float g = dc_ld(dout, base + d, obf) * dc_ld(gamma, d, gbf);
        sg += g, sgx += g * dc_norm_xhat(dc_ld(x, base + d, xbf), mu, r);
    }
    const float mg = dc_warp_sum(sg) / D, mgx = dc_warp_sum(sgx) / D;
    for (int d = lane; d < D; d += 32) {
        float g = dc_ld(dout, base + d, obf) * dc_ld(gamma, d, gbf);
        float v = dc_ln_dx(g, dc_norm_xhat(dc_ld(x, base + d, xbf), mu, r), r, mg, mgx);
        if (accumulate) v += dc_ld(dx, base + d, dxbf);
        dc_st(dx, base + d, v, dxbf);
    }
}

// The same from registers, rows of whole 16-byte vectors as k_ln_fwd_v8
// reads them: dout and x read once, 8 values an access (the warp-a-row
// kernel above, one 2-byte value a lane and each row read twice, took
// 99 us a call in the SD UNet's training step).
template <int NV, int LPR>
__global__ void k_ln_bwd_dx_v8(void *dx, int dxbf, const void *dout, int obf, const void *x, int xbf,
                               const float *mean, const float *rstd, const void *gamma, int gbf, int64_t M, int D,
                               bool accumulate) {
    dc_pdl_enter();
    const int lane = threadIdx.x % LPR, nvec = D / 8;
    const int64_t row = (blockIdx.x * (int64_t)ROWS + threadIdx.y) * (32 / LPR) + threadIdx.x / LPR;
    const bool live = row < M;  // every lane takes part in the sums' shuffles
    const int64_t base = row * D;
    const float mu = live ? mean[row] : 0.0f, r = live ? rstd[row] : 0.0f;
    float g[NV][8], xh[NV][8];  // dout gamma and xhat
    float sg = 0.0f, sgx = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int i = lane + LPR * k;
        if (!live || i >= nvec) break;
        float ga[8];
        dc_ldv<8>(g[k], dout, base + 8 * i, obf), dc_ldv<8>(xh[k], x, base + 8 * i, xbf), dc_ldv<8>(ga, gamma, 8 * i, gbf);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            g[k][e] *= ga[e], xh[k][e] = dc_norm_xhat(xh[k][e], mu, r);
            sg += g[k][e], sgx += g[k][e] * xh[k][e];
        }
    }
#pragma unroll
    for (int o = LPR / 2; o > 0; o >>= 1)
        sg += __shfl_xor_sync(0xffffffffu, sg, o), sgx += __shfl_xor_sync(0xffffffffu, sgx, o);
    if (!live) return;
    const float mg = sg / D, mgx = sgx / D;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int i = lane + LPR * k;
        if (i >= nvec) break;
        float o[8];
        if (accumulate) dc_ldv<8>(o, dx, base + 8 * i, dxbf);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const float v = dc_ln_dx(g[k][e], xh[k][e], r, mg, mgx);
            o[e] = accumulate ? o[e] + v : v;
        }
        dc_stv<8>(dx, base + 8 * i, o, dxbf);
    }
}

// Column sums over a slice of rows: part[0][slice][d] = sum dout xhat,
// part[1][slice][d] = sum dout. A block covers 32 x V columns with 8 row lanes.
template <int V>
__global__ void k_ln_bwd_param_part(float *part, const void *dout, int obf, const void *x, int xbf, const float *mean,
                                    const float *rstd, int64_t M, int D, int64_t rows_per, int slices) {
    __shared__ float acc[2][8][32 * V + 1];
    const int d0 = (blockIdx.x * 32 + threadIdx.x) * V;
    const int64_t r0 = blockIdx.y * rows_per, r1 = min(M, r0 + rows_per);
    float sg[V], sb[V];
    for (int k = 0; k < V; k++) sg[k] = 0.0f, sb[k] = 0.0f;
    if (d0 < D)
        for (int64_t m = r0 + threadIdx.y; m < r1; m += 8) {
            float g[V], xv[V];
            dc_ldv<V>(g, dout, m * D + d0, obf);
            dc_ldv<V>(xv, x, m * D + d0, xbf);
            const float mu = mean[m], r = rstd[m];
            for (int k = 0; k < V; k++) sg[k] += g[k] * dc_norm_xhat(xv[k], mu, r), sb[k] += g[k];
        }
    for (int k = 0; k < V; k++)
        acc[0][threadIdx.y][threadIdx.x * V + k] = sg[k], acc[1][threadIdx.y][threadIdx.x * V + k] = sb[k];
    __syncthreads();
    if (threadIdx.y < 2 && d0 < D)
        for (int k = 0; k < V; k++) {
            float t = 0.0f;
            for (int y = 0; y < 8; y++) t += acc[threadIdx.y][y][threadIdx.x * V + k];
            part[((int64_t)threadIdx.y * slices + blockIdx.y) * D + d0 + k] = t;
        }
}

// dgamma, dbeta += each column's slices (= if set), added as dc_lane_sum adds them.
__global__ void k_ln_bwd_param_sum(void *dgamma, int dgbf, void *dbeta, int dbbf, const float *part, int slices, int D,
                                   bool set) {
    const int d = blockIdx.x * DC_LS_COLS + threadIdx.x;
    const float *p = part + (d < D ? d : 0);
    const float sg = dc_lane_sum(p, D, slices, d < D), sb = dc_lane_sum(p + (int64_t)slices * D, D, slices, d < D);
    if (threadIdx.y || d >= D) return;
    if (dgamma) dc_st(dgamma, d, set ? sg : dc_ld(dgamma, d, dgbf) + sg, dgbf);
    if (dbeta) dc_st(dbeta, d, set ? sb : dc_ld(dbeta, d, dbbf) + sb, dbbf);
}

extern "C" void dc_cuda_layer_norm_bwd(dc_backend *be, dc_buf dx, dc_buf dgamma, dc_buf dbeta, dc_buf dout, dc_buf x,
                                       dc_buf mean, dc_buf rstd, dc_buf gamma, int64_t M, int D, int flags) {
    DC_CUDA_OP(be);
    const bool accumulate = flags & DC_BWD_DX_ADD;
    if (mean.dt != DC_F32 || rstd.dt != DC_F32)
        DC_CUDA_FAIL(be, "layer norm statistics must be F32 (mean %s, rstd %s)", dc_dtype_name(mean.dt),
                     dc_dtype_name(rstd.dt));
    if (M <= 0 || D <= 0) return;
    dc_cuda_ctx *c = dc_cuda(be);
    if (dx.p && ln_v8_ok(D, dx, dout, x, gamma)) {
        const float *mu = (const float *)mean.p, *r = (const float *)rstd.p;
        ln_v8_dispatch(D, [&]<int NV, int LPR>(int64_t rows) {
            dc_launch(be, k_ln_bwd_dx_v8<NV, LPR>, (unsigned)((M + rows - 1) / rows), dim3(32, ROWS), 0, dx.p, BF(dx),
                      dout.p, BF(dout), x.p, BF(x), mu, r, gamma.p, BF(gamma), M, D, accumulate);
        });
    } else if (dx.p) {
        dim3 block(32, ROWS);
        k_ln_bwd_dx<<<(unsigned)((M + ROWS - 1) / ROWS), block, 0, c->stream>>>(dx.p, BF(dx), dout.p, BF(dout), x.p, BF(x),
                                                                (const float *)mean.p, (const float *)rstd.p,
                                                                gamma.p, BF(gamma), M, D, accumulate);
    }
    if (dgamma.p || dbeta.p) {
        // Slices of at least 256 rows, as many as the workspace holds (two floats a column each).
        const int64_t cap = DC_CUDA_NORM_WS * 2 / (2 * (int64_t)D);
        if (cap < 1) DC_CUDA_FAIL(be, "layer norm over %d features is too wide for its parameter gradients", D);
        int64_t slices = (M + 255) / 256;
        if (slices > 64) slices = 64;
        if (slices > cap) slices = cap;
        const int64_t rows_per = (M + slices - 1) / slices;
        float *part = (float *)c->norm_ws;
        // 4 columns a thread where rows allow it: a quarter of the loads (each column's sums in the same order)
        const int V = dc_vec_width(D, dout, x, dc_buf_none()) >= 4 ? 4 : 1;
        dim3 grid((unsigned)((D / V + 31) / 32), (unsigned)slices), block(32, 8);
        if (V == 4)
            k_ln_bwd_param_part<4><<<grid, block, 0, c->stream>>>(part, dout.p, BF(dout), x.p, BF(x),
                                                                 (const float *)mean.p, (const float *)rstd.p, M, D,
                                                                 rows_per, (int)slices);
        else
            k_ln_bwd_param_part<1><<<grid, block, 0, c->stream>>>(part, dout.p, BF(dout), x.p, BF(x),
                                                                 (const float *)mean.p, (const float *)rstd.p, M, D,
                                                                 rows_per, (int)slices);
        k_ln_bwd_param_sum<<<dc_lane_grid(D), dc_lane_block(), 0, c->stream>>>(
            dgamma.p, BF(dgamma), dbeta.p, BF(dbeta), part, (int)slices, D, flags & DC_BWD_DW_SET);
    }
    DC_CUDA_LAUNCHED(be);
}
