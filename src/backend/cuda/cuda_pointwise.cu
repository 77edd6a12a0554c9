// Elementwise ops and the DiT embeddings on the GPU. Each buffer may be F32
// or BF16 independently (the residual stream is fp32, activations bf16), so
// the kernels read and write through dc_ld / dc_st, whose dtype branch is the
// same for every thread of a launch. Arithmetic is fp32 throughout, with the
// formulas shared with the CPU (op_math.h).
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ops.h"

#define GRID_STRIDE(i, n) \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

enum { TPB = 256 };

static cudaStream_t S(dc_backend *be) { return dc_cuda(be)->stream; }

__global__ void k_cast(void *dst, int dbf, const void *src, int sbf, int64_t n) {
    dc_pdl_enter();
    GRID_STRIDE(i, n) dc_st(dst, i, dc_ld(src, i, sbf), dbf);
}

extern "C" void dc_cuda_cast(dc_backend *be, dc_buf dst, dc_buf src, int64_t n) {
    DC_CUDA_OP(be);
    if (n <= 0) return;
    if (dst.dt == src.dt) {
        if (dst.p != src.p)
            DC_CUDA(be, cudaMemcpyAsync(dst.p, src.p, (size_t)n * dc_dtype_size(dst.dt), cudaMemcpyDeviceToDevice,
                                        S(be)));
        return;
    }
    dc_launch(be, k_cast, dc_blocks(n, TPB), TPB, 0, dst.p, BF(dst), src.p, BF(src), n);
    DC_CUDA_LAUNCHED(be);
}

// kind: 0 gelu, 1 silu
__global__ void k_act_fwd(void *out, int obf, const void *inp, int ibf, int64_t n, int kind) {
    dc_pdl_enter();
    GRID_STRIDE(i, n) {
        float x = dc_ld(inp, i, ibf);
        dc_st(out, i, kind == 0 ? dc_gelu(x) : dc_silu(x), obf);
    }
}

__global__ void k_act_bwd(void *dinp, int dbf, const void *dout, int gbf, const void *inp, int ibf,
                          int64_t n, int kind, int accumulate) {
    GRID_STRIDE(i, n) {
        float x = dc_ld(inp, i, ibf);
        float g = dc_ld(dout, i, gbf) * (kind == 0 ? dc_gelu_grad(x) : dc_silu_grad(x));
        if (accumulate) g += dc_ld(dinp, i, dbf);
        dc_st(dinp, i, g, dbf);
    }
}

extern "C" void dc_cuda_gelu_fwd(dc_backend *be, dc_buf out, dc_buf inp, int64_t n) {
    DC_CUDA_OP(be);
    dc_launch(be, k_act_fwd, dc_blocks(n, TPB), TPB, 0, out.p, BF(out), inp.p, BF(inp), n, 0);
    DC_CUDA_LAUNCHED(be);
}
extern "C" void dc_cuda_gelu_bwd(dc_backend *be, dc_buf dinp, dc_buf dout, dc_buf inp, int64_t n) {
    DC_CUDA_OP(be);
    k_act_bwd<<<dc_blocks(n, TPB), TPB, 0, S(be)>>>(dinp.p, BF(dinp), dout.p, BF(dout), inp.p, BF(inp), n, 0, 0);
    DC_CUDA_LAUNCHED(be);
}
extern "C" void dc_cuda_silu_fwd(dc_backend *be, dc_buf out, dc_buf inp, int64_t n) {
    DC_CUDA_OP(be);
    dc_launch(be, k_act_fwd, dc_blocks(n, TPB), TPB, 0, out.p, BF(out), inp.p, BF(inp), n, 1);
    DC_CUDA_LAUNCHED(be);
}
extern "C" void dc_cuda_silu_bwd(dc_backend *be, dc_buf dinp, dc_buf dout, dc_buf inp, int64_t n,
                                 bool accumulate) {
    DC_CUDA_OP(be);
    k_act_bwd<<<dc_blocks(n, TPB), TPB, 0, S(be)>>>(dinp.p, BF(dinp), dout.p, BF(dout), inp.p, BF(inp), n, 1,
                                                    accumulate);
    DC_CUDA_LAUNCHED(be);
}

__global__ void k_axpy(void *y, int ybf, const void *x, int xbf, float alpha, int64_t n) {
    GRID_STRIDE(i, n) dc_st(y, i, dc_ld(y, i, ybf) + alpha * dc_ld(x, i, xbf), ybf);
}
extern "C" void dc_cuda_axpy(dc_backend *be, dc_buf y, dc_buf x, float alpha, int64_t n) {
    DC_CUDA_OP(be);
    k_axpy<<<dc_blocks(n, TPB), TPB, 0, S(be)>>>(y.p, BF(y), x.p, BF(x), alpha, n);
    DC_CUDA_LAUNCHED(be);
}

__global__ void k_clamp(void *x, int xbf, float lo, float hi, int64_t n) {
    GRID_STRIDE(i, n) {
        const float v = dc_ld(x, i, xbf);
        dc_st(x, i, v < lo ? lo : v > hi ? hi : v, xbf);  // (NaN fails both: it stays)
    }
}
extern "C" void dc_cuda_clamp(dc_backend *be, dc_buf x, int64_t n, float lo, float hi) {
    DC_CUDA_OP(be);
    if (n <= 0) return;
    k_clamp<<<dc_blocks(n, TPB), TPB, 0, S(be)>>>(x.p, BF(x), lo, hi, n);
    DC_CUDA_LAUNCHED(be);
}

// x[B,T,D] += pos[T,D]
__global__ void k_add_rows(void *x, int xbf, const void *pos, int pbf, int64_t TD, int64_t n) {
    GRID_STRIDE(i, n) dc_st(x, i, dc_ld(x, i, xbf) + dc_ld(pos, i % TD, pbf), xbf);
}
extern "C" void dc_cuda_add_rows(dc_backend *be, dc_buf x, dc_buf pos, int B, int T, int D) {
    DC_CUDA_OP(be);
    int64_t n = (int64_t)B * T * D;
    k_add_rows<<<dc_blocks(n, TPB), TPB, 0, S(be)>>>(x.p, BF(x), pos.p, BF(pos), (int64_t)T * D, n);
    DC_CUDA_LAUNCHED(be);
}

// out[M,N] += b[N]
__global__ void k_add_bias(void *out, int obf, const void *b, int bbf, int N, int64_t n) {
    GRID_STRIDE(i, n) dc_st(out, i, dc_ld(out, i, obf) + dc_ld(b, i % N, bbf), obf);
}
extern "C" void dc_cuda_add_bias(dc_backend *be, dc_buf out, dc_buf b, int M, int N) {
    DC_CUDA_OP(be);
    int64_t n = (int64_t)M * N;
    k_add_bias<<<dc_blocks(n, TPB), TPB, 0, S(be)>>>(out.p, BF(out), b.p, BF(b), N, n);
    DC_CUDA_LAUNCHED(be);
}

// db[N] += sum_m dout[m, n]. A block sums 32 columns over a slice of rows
// (32 x 8 threads, coalesced along the row); slices combine in a fixed order
// in the second kernel, so the result is deterministic.
enum { BG_SLICES = 16 };
__global__ void k_bias_grad_part(float *part, const void *dout, int gbf, int M, int N, int rows_per) {
    __shared__ float acc[8][33];
    int col = blockIdx.x * 32 + threadIdx.x;
    int r0 = blockIdx.y * rows_per, r1 = min(M, r0 + rows_per);
    float s = 0.0f;
    if (col < N)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) s += dc_ld(dout, (int64_t)r * N + col, gbf);
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < N) {
        float t = 0.0f;
        for (int y = 0; y < 8; y++) t += acc[y][threadIdx.x];
        part[(int64_t)blockIdx.y * N + col] = t;
    }
}
// The bf16 case: two columns a thread (4-byte loads, 128 bytes a warp row).
__global__ void k_bias_grad_part_bf2(float *part, const __nv_bfloat162 *dout, int M, int N, int rows_per) {
    __shared__ float2 acc[8][33];
    int c2 = blockIdx.x * 32 + threadIdx.x, N2 = N / 2;
    int r0 = blockIdx.y * rows_per, r1 = min(M, r0 + rows_per);
    float2 s = make_float2(0.0f, 0.0f);
    if (c2 < N2)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            float2 v = __bfloat1622float2(dout[(int64_t)r * N2 + c2]);
            s.x += v.x, s.y += v.y;
        }
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c2 < N2) {
        float2 t = make_float2(0.0f, 0.0f);
        for (int y = 0; y < 8; y++) t.x += acc[y][threadIdx.x].x, t.y += acc[y][threadIdx.x].y;
        part[(int64_t)blockIdx.y * N + 2 * c2] = t.x;
        part[(int64_t)blockIdx.y * N + 2 * c2 + 1] = t.y;
    }
}

// bf16 rows of 8-aligned width: eight columns a thread (one 16-byte load a
// row), 8 row lanes of 32 threads, slices of BG_ROWS rows cut from the shape
// alone (the same bits on any GPU), each lane's rows four loads in flight.
// A linear layer's bias at 32x32 tokens, batch 64 (65536 rows): the 16
// slices of the kernels above left most SMs idle at 320 columns.
// Narrower rows take slices of fewer rows, so that at least BG_THREADS
// threads (8 columns each: N / 8 x 8 row lanes x slices) share the work
// where the rows allow: with 512 rows, 320 columns at 32x32 tokens, batch 64,
// kept 40960 threads at work, 640 at 16x16 20480, against 327680 at 2560.
enum { BG_ROWS = 512, BG_MIN_ROWS = 64, BG_THREADS = 65536 };
__global__ void __launch_bounds__(256) k_bias_grad_part_v8(float *part, const void *dout, int M, int N, int rows_per) {
    __shared__ float acc[8][32 * 8 + 1];
    const int c0 = (blockIdx.x * 32 + threadIdx.x) * 8;
    const int r0 = blockIdx.y * rows_per, r1 = min(M, r0 + rows_per);
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (c0 < N) {
#pragma unroll 4
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            float v[8];
            dc_ldv<8>(v, dout, (int64_t)r * N + c0, 1);
            for (int k = 0; k < 8; k++) s[k] += v[k];
        }
    }
    for (int k = 0; k < 8; k++) acc[threadIdx.y][threadIdx.x * 8 + k] = s[k];
    __syncthreads();
    if (threadIdx.y == 0 && c0 < N)
        for (int k = 0; k < 8; k++) {
            float t = 0.0f;
            for (int y = 0; y < 8; y++) t += acc[y][threadIdx.x * 8 + k];
            part[(int64_t)blockIdx.y * N + c0 + k] = t;
        }
}

// db[col] += the slices' sums (= if set), added as dc_lane_sum adds them.
__global__ void k_bias_grad_sum(float *db, const float *part, int slices, int N, bool set) {
    const int col = blockIdx.x * DC_LS_COLS + threadIdx.x;
    const float t = dc_lane_sum(part + (col < N ? col : 0), N, slices, col < N);
    if (threadIdx.y == 0 && col < N) db[col] = set ? t : db[col] + t;
}
extern "C" void dc_cuda_bias_grad(dc_backend *be, dc_buf db, dc_buf dout, int M, int N, bool set) {
    DC_CUDA_OP(be);
    dc_cuda_ctx *c = dc_cuda(be);
    // The partial sums live in the cuBLASLt workspace's tail: the products
    // that use the workspace run on the same stream, so they never overlap.
    int slices = M >= 1024 ? BG_SLICES : 1;
    if ((size_t)slices * N * sizeof(float) > c->lt_ws_bytes / 2) slices = 1;
    float *part = (float *)((char *)c->lt_ws + c->lt_ws_bytes / 2);
    int rows_per = (M + slices - 1) / slices;
    dim3 block(32, 8);
    // the 8-column kernel's slices: BG_ROWS rows, or fewer where that leaves
    // under BG_THREADS threads at work (narrow rows), down to BG_MIN_ROWS
    int wide_rows = BG_ROWS;
    while (wide_rows > BG_MIN_ROWS && (int64_t)N * ((M + wide_rows - 1) / wide_rows) < BG_THREADS) wide_rows /= 2;
    const int wide = (M + wide_rows - 1) / wide_rows;
    if (dout.dt == DC_BF16 && N % 8 == 0 && dc_aligned(dout.p, 16) && wide > 1 &&
        (size_t)wide * N * sizeof(float) <= c->lt_ws_bytes / 2) {
        slices = wide;
        k_bias_grad_part_v8<<<dim3((N / 8 + 31) / 32, slices), block, 0, c->stream>>>(part, dout.p, M, N, wide_rows);
    } else if (dout.dt == DC_BF16 && N % 2 == 0 && dc_aligned(dout.p, 4)) {
        dim3 grid((N / 2 + 31) / 32, slices);
        k_bias_grad_part_bf2<<<grid, block, 0, c->stream>>>(part, (const __nv_bfloat162 *)dout.p, M, N, rows_per);
    } else {
        dim3 grid((N + 31) / 32, slices);
        k_bias_grad_part<<<grid, block, 0, c->stream>>>(part, dout.p, BF(dout), M, N, rows_per);
    }
    k_bias_grad_sum<<<dc_lane_grid(N), dc_lane_block(), 0, c->stream>>>((float *)db.p, part, slices, N, set);
    DC_CUDA_LAUNCHED(be);
}

// img[B,C,H,W] -> out[B, T, C*p*p], features (c, pr, pc); one thread per output.
__global__ void k_patchify(void *out, int obf, const void *img, int ibf, int C, int H, int W, int p,
                           int64_t n) {
    int gw = W / p, T = (H / p) * gw, P = C * p * p;
    GRID_STRIDE(i, n) {
        int f = (int)(i % P);
        int64_t bt = i / P;
        int tok = (int)(bt % T), b = (int)(bt / T);
        int c = f / (p * p), pr = (f / p) % p, pc = f % p;
        int row = (tok / gw) * p + pr, col = (tok % gw) * p + pc;
        dc_st(out, i, dc_ld(img, (((int64_t)b * C + c) * H + row) * W + col, ibf), obf);
    }
}
extern "C" void dc_cuda_patchify(dc_backend *be, dc_buf out, dc_buf img, int B, int C, int H, int W, int p) {
    DC_CUDA_OP(be);
    int64_t n = (int64_t)B * C * H * W;
    k_patchify<<<dc_blocks(n, TPB), TPB, 0, S(be)>>>(out.p, BF(out), img.p, BF(img), C, H, W, p, n);
    DC_CUDA_LAUNCHED(be);
}

// tok[B, T, p*p*C] in (pr, pc, c) order <-> img[B,C,H,W]; one thread per pixel,
// so the adjoint (dir 1) is a plain gather too.
__global__ void k_unpatchify(void *img, int ibf, void *tok, int tbf, int C, int H, int W, int p,
                             int64_t n, int adjoint) {
    int gw = W / p, T = (H / p) * gw;
    GRID_STRIDE(i, n) {
        int col = (int)(i % W), row = (int)((i / W) % H);
        int c = (int)((i / ((int64_t)W * H)) % C);
        int64_t b = i / ((int64_t)W * H * C);
        int t = (row / p) * gw + col / p, pr = row % p, pc = col % p;
        int64_t j = (b * T + t) * (int64_t)(p * p * C) + (pr * p + pc) * C + c;
        if (adjoint) dc_st(tok, j, dc_ld(img, i, ibf), tbf);
        else dc_st(img, i, dc_ld(tok, j, tbf), ibf);
    }
}
extern "C" void dc_cuda_unpatchify_fwd(dc_backend *be, dc_buf img, dc_buf tok, int B, int C, int H, int W, int p) {
    DC_CUDA_OP(be);
    int64_t n = (int64_t)B * C * H * W;
    k_unpatchify<<<dc_blocks(n, TPB), TPB, 0, S(be)>>>(img.p, BF(img), tok.p, BF(tok), C, H, W, p, n, 0);
    DC_CUDA_LAUNCHED(be);
}
extern "C" void dc_cuda_unpatchify_bwd(dc_backend *be, dc_buf dtok, dc_buf dimg, int B, int C, int H, int W,
                                       int p) {
    DC_CUDA_OP(be);
    int64_t n = (int64_t)B * C * H * W;
    k_unpatchify<<<dc_blocks(n, TPB), TPB, 0, S(be)>>>(dimg.p, BF(dimg), dtok.p, BF(dtok), C, H, W, p, n, 1);
    DC_CUDA_LAUNCHED(be);
}

// out[B, 2*half] = [cos(t f_k) | sin(t f_k)], the angle in double as on the CPU.
__global__ void k_timestep_embed(void *out, int obf, const float *t, int B, int half) {
    dc_pdl_enter();
    GRID_STRIDE(i, (int64_t)B * half) {
        int b = (int)(i / half), k = (int)(i % half);
        double a = (double)t[b] * dc_timestep_freq(k, half);
        dc_st(out, (int64_t)b * 2 * half + k, (float)cos(a), obf);
        dc_st(out, (int64_t)b * 2 * half + half + k, (float)sin(a), obf);
    }
}
extern "C" void dc_cuda_timestep_embed(dc_backend *be, dc_buf out, dc_buf t, int B, int half) {
    DC_CUDA_OP(be);
    dc_launch(be, k_timestep_embed, dc_blocks((int64_t)B * half, TPB), TPB, 0, out.p, BF(out), (const float *)t.p, B,
              half);
    DC_CUDA_LAUNCHED(be);
}

__global__ void k_embed_fwd(void *out, int obf, const void *table, int tbf, const int32_t *idx, int D, int64_t n) {
    GRID_STRIDE(i, n) {
        int b = (int)(i / D), d = (int)(i % D);
        dc_st(out, i, dc_ld(table, (int64_t)idx[b] * D + d, tbf), obf);
    }
}
extern "C" void dc_cuda_embed_fwd(dc_backend *be, dc_buf out, dc_buf table, dc_buf idx, int B, int D) {
    DC_CUDA_OP(be);
    int64_t n = (int64_t)B * D;
    k_embed_fwd<<<dc_blocks(n, TPB), TPB, 0, S(be)>>>(out.p, BF(out), table.p, BF(table), (const int32_t *)idx.p,
                                                      D, n);
    DC_CUDA_LAUNCHED(be);
}

// dtable[idx[b]] += dout[b]. Labels repeat within a batch, so each thread
// owns one column and walks the batch in order: no atomics, deterministic.
__global__ void k_embed_bwd(void *dtable, int tbf, const void *dout, int gbf, const int32_t *idx, int B, int D) {
    int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= D) return;
    for (int b = 0; b < B; b++) {
        int64_t j = (int64_t)idx[b] * D + d;
        dc_st(dtable, j, dc_ld(dtable, j, tbf) + dc_ld(dout, (int64_t)b * D + d, gbf), tbf);
    }
}
extern "C" void dc_cuda_embed_bwd(dc_backend *be, dc_buf dtable, dc_buf dout, dc_buf idx, int B, int D) {
    DC_CUDA_OP(be);
    k_embed_bwd<<<(D + 127) / 128, 128, 0, S(be)>>>(dtable.p, BF(dtable), dout.p, BF(dout), (const int32_t *)idx.p,
                                                    B, D);
    DC_CUDA_LAUNCHED(be);
}

// ---- latent diffusion: activations, GEGLU, nearest upsampling ------------------------
// Each thread takes four consecutive values, with one vector access per
// tensor where every buffer's alignment allows it (the tail one by one).
__global__ void k_activation_fwd(void *out, int obf, const void *inp, int ibf, int64_t n, dc_act act, bool vec) {
    GRID_STRIDE(t, (n + 3) / 4) {
        float4 v = dc_ld4_upto(inp, 4 * t, n, ibf, vec);
        v = make_float4(dc_act_fwd(v.x, act), dc_act_fwd(v.y, act), dc_act_fwd(v.z, act), dc_act_fwd(v.w, act));
        dc_st4_upto(out, 4 * t, n, v, obf, vec);
    }
}

__global__ void k_activation_bwd(void *dinp, int dbf, const void *dout, int gbf, const void *inp, int ibf, int64_t n,
                                 dc_act act, bool accumulate, bool vec) {
    GRID_STRIDE(t, (n + 3) / 4) {
        float4 x = dc_ld4_upto(inp, 4 * t, n, ibf, vec), g = dc_ld4_upto(dout, 4 * t, n, gbf, vec);
        float4 d = make_float4(g.x * dc_act_grad(x.x, act), g.y * dc_act_grad(x.y, act), g.z * dc_act_grad(x.z, act),
                               g.w * dc_act_grad(x.w, act));
        if (accumulate) {
            float4 a = dc_ld4_upto(dinp, 4 * t, n, dbf, vec);
            d.x += a.x, d.y += a.y, d.z += a.z, d.w += a.w;
        }
        dc_st4_upto(dinp, 4 * t, n, d, dbf, vec);
    }
}

extern "C" void dc_cuda_activation_fwd(dc_backend *be, dc_buf out, dc_buf inp, int64_t n, dc_act act) {
    DC_CUDA_OP(be);
    if (n <= 0) return;
    bool vec = dc_vec4(out) && dc_vec4(inp);
    k_activation_fwd<<<dc_blocks((n + 3) / 4, TPB), TPB, 0, S(be)>>>(out.p, BF(out), inp.p, BF(inp), n, act, vec);
    DC_CUDA_LAUNCHED(be);
}

extern "C" void dc_cuda_activation_bwd(dc_backend *be, dc_buf dinp, dc_buf dout, dc_buf inp, int64_t n, dc_act act,
                                       bool accumulate) {
    DC_CUDA_OP(be);
    if (n <= 0) return;
    bool vec = dc_vec4(dinp) && dc_vec4(dout) && dc_vec4(inp);
    k_activation_bwd<<<dc_blocks((n + 3) / 4, TPB), TPB, 0, S(be)>>>(dinp.p, BF(dinp), dout.p, BF(dout), inp.p,
                                                                     BF(inp), n, act, accumulate, vec);
    DC_CUDA_LAUNCHED(be);
}

// GEGLU: x[M, 2F] = [h | gate], out[M, F] = h gelu_erf(gate). A thread takes
// W consecutive features of one row (W = 4 when F and the buffers allow
// vector accesses, else 1).
template <int W>
__global__ void k_geglu_fwd(void *out, int obf, const void *x, int xbf, int64_t M, int F) {
    const int FW = F / W;
    GRID_STRIDE(t, M * FW) {
        int64_t m = t / FW;
        int f = (int)(t % FW) * W;
        const int64_t xi = m * 2 * F + f, oi = m * F + f;
        if (W == 4) {
            float4 h = dc_ld4(x, xi, xbf), g = dc_ld4(x, xi + F, xbf);
            dc_st4(out, oi, make_float4(h.x * dc_gelu_erf(g.x), h.y * dc_gelu_erf(g.y), h.z * dc_gelu_erf(g.z),
                                        h.w * dc_gelu_erf(g.w)), obf);
        } else {
            dc_st(out, oi, dc_ld(x, xi, xbf) * dc_gelu_erf(dc_ld(x, xi + F, xbf)), obf);
        }
    }
}

// dh = dout gelu_erf(gate) ; dgate = dout h gelu_erf'(gate) ; and where out
// is given, out = h gelu_erf(gate) as k_geglu_fwd writes it (out may be dout:
// a thread reads its dout values before it writes the same places).
template <int W>
__global__ void k_geglu_bwd(void *dx, int dbf, void *out, int obf, const void *dout, int gbf, const void *x, int xbf,
                            int64_t M, int F) {
    const int FW = F / W;
    GRID_STRIDE(t, M * FW) {
        int64_t m = t / FW;
        int f = (int)(t % FW) * W;
        const int64_t xi = m * 2 * F + f, oi = m * F + f;
        if (W == 4) {
            float4 h = dc_ld4(x, xi, xbf), g = dc_ld4(x, xi + F, xbf), d = dc_ld4(dout, oi, gbf);
            const float4 gl = make_float4(dc_gelu_erf(g.x), dc_gelu_erf(g.y), dc_gelu_erf(g.z), dc_gelu_erf(g.w));
            dc_st4(dx, xi, make_float4(d.x * gl.x, d.y * gl.y, d.z * gl.z, d.w * gl.w), dbf);
            dc_st4(dx, xi + F, make_float4(d.x * h.x * dc_gelu_erf_grad(g.x), d.y * h.y * dc_gelu_erf_grad(g.y),
                                           d.z * h.z * dc_gelu_erf_grad(g.z), d.w * h.w * dc_gelu_erf_grad(g.w)), dbf);
            if (out) dc_st4(out, oi, make_float4(h.x * gl.x, h.y * gl.y, h.z * gl.z, h.w * gl.w), obf);
        } else {
            float h = dc_ld(x, xi, xbf), g = dc_ld(x, xi + F, xbf), d = dc_ld(dout, oi, gbf), gl = dc_gelu_erf(g);
            dc_st(dx, xi, d * gl, dbf);
            dc_st(dx, xi + F, d * h * dc_gelu_erf_grad(g), dbf);
            if (out) dc_st(out, oi, h * gl, obf);
        }
    }
}

extern "C" void dc_cuda_geglu_fwd(dc_backend *be, dc_buf out, dc_buf x, int64_t M, int F) {
    DC_CUDA_OP(be);
    if (M <= 0 || F <= 0) return;
    if (F % 4 == 0 && dc_vec4(out) && dc_vec4(x))
        k_geglu_fwd<4><<<dc_blocks(M * F / 4, TPB), TPB, 0, S(be)>>>(out.p, BF(out), x.p, BF(x), M, F);
    else
        k_geglu_fwd<1><<<dc_blocks(M * F, TPB), TPB, 0, S(be)>>>(out.p, BF(out), x.p, BF(x), M, F);
    DC_CUDA_LAUNCHED(be);
}

extern "C" void dc_cuda_geglu_bwd(dc_backend *be, dc_buf dx, dc_buf out, dc_buf dout, dc_buf x, int64_t M, int F) {
    DC_CUDA_OP(be);
    if (M <= 0 || F <= 0) return;
    if (F % 4 == 0 && dc_vec4(dx) && dc_vec4(dout) && dc_vec4(x) && (!out.p || dc_vec4(out)))
        k_geglu_bwd<4><<<dc_blocks(M * F / 4, TPB), TPB, 0, S(be)>>>(dx.p, BF(dx), out.p, BF(out), dout.p, BF(dout),
                                                                      x.p, BF(x), M, F);
    else
        k_geglu_bwd<1><<<dc_blocks(M * F, TPB), TPB, 0, S(be)>>>(dx.p, BF(dx), out.p, BF(out), dout.p, BF(dout), x.p,
                                                                  BF(x), M, F);
    DC_CUDA_LAUNCHED(be);
}

// Nearest 2x upsampling of x[B*C, H, W]. A thread takes W2 input columns of
// one row (W2 = 2 when W is even and the buffers allow it: two input values,
// one 4-wide output access in each of the two output rows; else 1).
template <int W2>
__global__ void k_upsample2x_fwd(void *out, int obf, const void *x, int xbf, int64_t rows, int W) {
    const int WW = W / W2;
    GRID_STRIDE(t, rows * WW) {
        int64_t r = t / WW;  // input row (image and row)
        int j = (int)(t % WW) * W2;
        int64_t o = 2 * r * 2 * W + 2 * j;  // output row 2 (r mod H) of the same image
        if (W2 == 2) {
            float a = dc_ld(x, r * W + j, xbf), b = dc_ld(x, r * W + j + 1, xbf);
            float4 v = make_float4(a, a, b, b);
            dc_st4(out, o, v, obf);
            dc_st4(out, o + 2 * W, v, obf);
        } else {
            float a = dc_ld(x, r * W + j, xbf);
            dc_st(out, o, a, obf), dc_st(out, o + 1, a, obf);
            dc_st(out, o + 2 * W, a, obf), dc_st(out, o + 2 * W + 1, a, obf);
        }
    }
}

// dx = the sum of dout over each 2x2 block, in the order (top left, top right,
// bottom left, bottom right).
template <int W2>
__global__ void k_upsample2x_bwd(void *dx, int dbf, const void *dout, int gbf, int64_t rows, int W) {
    const int WW = W / W2;
    GRID_STRIDE(t, rows * WW) {
        int64_t r = t / WW;
        int j = (int)(t % WW) * W2;
        int64_t o = 2 * r * 2 * W + 2 * j;
        if (W2 == 2) {
            float4 u = dc_ld4(dout, o, gbf), d = dc_ld4(dout, o + 2 * W, gbf);
            dc_st(dx, r * W + j, u.x + u.y + d.x + d.y, dbf);
            dc_st(dx, r * W + j + 1, u.z + u.w + d.z + d.w, dbf);
        } else {
            float s = dc_ld(dout, o, gbf) + dc_ld(dout, o + 1, gbf) + dc_ld(dout, o + 2 * W, gbf) +
                      dc_ld(dout, o + 2 * W + 1, gbf);
            dc_st(dx, r * W + j, s, dbf);
        }
    }
}

extern "C" void dc_cuda_upsample2x_fwd(dc_backend *be, dc_buf out, dc_buf x, int B, int C, int H, int W) {
    DC_CUDA_OP(be);
    int64_t rows = (int64_t)B * C * H;
    if (rows <= 0 || W <= 0) return;
    if (W % 2 == 0 && dc_vec4(out))
        k_upsample2x_fwd<2><<<dc_blocks(rows * W / 2, TPB), TPB, 0, S(be)>>>(out.p, BF(out), x.p, BF(x), rows, W);
    else
        k_upsample2x_fwd<1><<<dc_blocks(rows * W, TPB), TPB, 0, S(be)>>>(out.p, BF(out), x.p, BF(x), rows, W);
    DC_CUDA_LAUNCHED(be);
}

extern "C" void dc_cuda_upsample2x_bwd(dc_backend *be, dc_buf dx, dc_buf dout, int B, int C, int H, int W) {
    DC_CUDA_OP(be);
    int64_t rows = (int64_t)B * C * H;
    if (rows <= 0 || W <= 0) return;
    if (W % 2 == 0 && dc_vec4(dout))
        k_upsample2x_bwd<2><<<dc_blocks(rows * W / 2, TPB), TPB, 0, S(be)>>>(dx.p, BF(dx), dout.p, BF(dout), rows, W);
    else
        k_upsample2x_bwd<1><<<dc_blocks(rows * W, TPB), TPB, 0, S(be)>>>(dx.p, BF(dx), dout.p, BF(dout), rows, W);
    DC_CUDA_LAUNCHED(be);
}

// ---- layout ----------------------------------------------------------------------------
// 32 x 32 tiles through shared memory (one padding column against bank
// conflicts), so both the reads of x and the writes of out are coalesced.
__global__ void k_transpose(void *out, int obf, const void *x, int xbf, int64_t M, int64_t N, int64_t mb, int64_t nb) {
    dc_pdl_enter();
    __shared__ float tile[32][33];
    const int64_t t = blockIdx.x, b = t / (mb * nb);
    const int64_t i0 = (t / nb % mb) * 32, j0 = t % nb * 32;
    const int64_t base = b * M * N;
    for (int r = threadIdx.y; r < 32; r += blockDim.y) {
        int64_t i = i0 + r, j = j0 + threadIdx.x;
        if (i < M && j < N) tile[r][threadIdx.x] = dc_ld(x, base + i * N + j, xbf);
    }
    __syncthreads();
    for (int r = threadIdx.y; r < 32; r += blockDim.y) {
        int64_t j = j0 + r, i = i0 + threadIdx.x;
        if (i < M && j < N) dc_st(out, base + j * M + i, tile[threadIdx.x][r], obf);
    }
}

extern "C" void dc_cuda_transpose(dc_backend *be, dc_buf out, dc_buf x, int B, int64_t M, int64_t N) {
    DC_CUDA_OP(be);
    if (B <= 0 || M <= 0 || N <= 0) return;
    const int64_t mb = (M + 31) / 32, nb = (N + 31) / 32;
    dc_launch(be, k_transpose, (unsigned)(B * mb * nb), dim3(32, 8), 0, out.p, BF(out), x.p, BF(x), M, N, mb, nb);
    DC_CUDA_LAUNCHED(be);
}

__global__ void k_add_channel(void *x, int xbf, const void *v, int vbf, int64_t n, int64_t HW) {
    GRID_STRIDE(i, n) dc_st(x, i, dc_ld(x, i, xbf) + dc_ld(v, i / HW, vbf), xbf);
}

extern "C" void dc_cuda_add_channel(dc_backend *be, dc_buf x, dc_buf v, int B, int C, int64_t HW) {
    DC_CUDA_OP(be);
    const int64_t n = (int64_t)B * C * HW;
    if (n <= 0) return;
    k_add_channel<<<dc_blocks(n, TPB), TPB, 0, S(be)>>>(x.p, BF(x), v.p, BF(v), n, HW);
    DC_CUDA_LAUNCHED(be);
}

// One block per (sample, channel); a fixed reduction order, so results repeat.
__global__ void k_channel_sum(void *dv, int vbf, const void *dx, int xbf, int64_t HW) {
    __shared__ float part[TPB / 32];
    const int64_t r = blockIdx.x;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < HW; i += TPB) s += dc_ld(dx, r * HW + i, xbf);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int w = 0; w < TPB / 32; w++) t += part[w];
        dc_st(dv, r, t, vbf);
    }
}

extern "C" void dc_cuda_channel_sum(dc_backend *be, dc_buf dv, dc_buf dx, int B, int C, int64_t HW) {
    DC_CUDA_OP(be);
    if (B <= 0 || C <= 0) return;
    k_channel_sum<<<(unsigned)((int64_t)B * C), TPB, 0, S(be)>>>(dv.p, BF(dv), dx.p, BF(dx), HW);
    DC_CUDA_LAUNCHED(be);
}

// ---- channels-last maps: x[B, HW, C] ---------------------------------------------------
// Each thread keeps V channels (one vector access each, dc_rows_geom) and
// walks a chunk of pixels, so nothing is divided per element.

static bool float_dt(dc_dtype t) { return t == DC_F32 || t == DC_BF16; }

// out[B, 2H, 2W, C]: input pixel p = (b H + h) W + w goes to the 2x2 block at
// output rows 2 (b H + h) + {0, 1}, columns 2w + {0, 1}.
template <int V>
__global__ void k_upsample2x_nhwc(void *out, int obf, const void *x, int xbf, int64_t pixels, int W, int C, int cols,
                                  int64_t chunk) {
    dc_pdl_enter();
    const int col = blockIdx.y * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    const int c = col * V;
    const int64_t p0 = blockIdx.x * chunk, p1 = p0 + chunk < pixels ? p0 + chunk : pixels;
    const int64_t orow = 2 * (int64_t)W * C;  // one output row
    for (int64_t p = p0 + threadIdx.y; p < p1; p += blockDim.y) {
        const int64_t bh = p / W, w = p - bh * W;
        float v[V];
        dc_ldv<V>(v, x, p * C + c, xbf);
        const int64_t o = 2 * bh * orow + 2 * w * C + c;
        dc_stv<V>(out, o, v, obf), dc_stv<V>(out, o + C, v, obf);
        dc_stv<V>(out, o + orow, v, obf), dc_stv<V>(out, o + orow + C, v, obf);
    }
}

extern "C" void dc_cuda_upsample2x_nhwc_fwd(dc_backend *be, dc_buf out, dc_buf x, int B, int C, int H, int W) {
    DC_CUDA_OP(be);
    if (!float_dt(x.dt) || !float_dt(out.dt))
        DC_CUDA_FAIL(be, "upsample dtypes: x %s, out %s (each F32 or BF16)", dc_dtype_name(x.dt),
                     dc_dtype_name(out.dt));
    if (B < 0 || C < 0 || H < 0 || W < 0) DC_CUDA_FAIL(be, "upsample of %d maps of %d channels %dx%d", B, C, H, W);
    const int64_t pixels = (int64_t)B * H * W;
    if (pixels == 0 || C == 0) return;
    const dc_rows_geom g = dc_rows_geom_make(C, dc_vec_width(C, x, out, dc_buf_none()), TPB);
    const int64_t chunk = dc_rows_chunk(&g, pixels, 4);  // up to four pixels a thread: sixteen stores
    const dim3 grid((unsigned)((pixels + chunk - 1) / chunk), (unsigned)g.tiles), block(g.ct, g.rt);
    if (g.V == 8)
        dc_launch(be, k_upsample2x_nhwc<8>, grid, block, 0, out.p, BF(out), x.p, BF(x), pixels, W, C, g.cols, chunk);
    else if (g.V == 4)
        dc_launch(be, k_upsample2x_nhwc<4>, grid, block, 0, out.p, BF(out), x.p, BF(x), pixels, W, C, g.cols, chunk);
    else
        dc_launch(be, k_upsample2x_nhwc<1>, grid, block, 0, out.p, BF(out), x.p, BF(x), pixels, W, C, g.cols, chunk);
    DC_CUDA_LAUNCHED(be);
}

// x[b, p, c] += y[b, p, c] + v[b, c] + bias[c], each term optional (NULL).
// Block (chunk of a sample's pixels, tile of columns): blockIdx.x = b cps +
// chunk; v's and bias's values are read once a thread, one by one (they may
// lie at any offset).
template <int V>
__global__ void k_add_nhwc(void *x, int xbf, const void *y, int ybf, const void *v, int vbf, const void *bias,
                           int bbf, int64_t HW, int C, int cols, int64_t cps, int64_t chunk) {
    dc_pdl_enter();
    const int col = blockIdx.y * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    const int64_t b = blockIdx.x / cps, p0 = blockIdx.x % cps * chunk;
    const int64_t p1 = p0 + chunk < HW ? p0 + chunk : HW;
    const int c = col * V;
    float a[V];
    for (int k = 0; k < V; k++) {
        a[k] = v ? dc_ld(v, b * C + c + k, vbf) : 0.0f;
        if (bias) a[k] += dc_ld(bias, c + k, bbf);
    }
    const int64_t base = b * HW * C + c;
    for (int64_t p = p0 + threadIdx.y; p < p1; p += blockDim.y) {
        float t[V], u[V];
        dc_ldv<V>(t, x, base + p * C, xbf);
        if (y) {
            dc_ldv<V>(u, y, base + p * C, ybf);
            for (int k = 0; k < V; k++) t[k] += u[k] + a[k];
        } else {
            for (int k = 0; k < V; k++) t[k] += a[k];
        }
        dc_stv<V>(x, base + p * C, t, xbf);
    }
}

extern "C" void dc_cuda_add_nhwc(dc_backend *be, dc_buf x, dc_buf y, dc_buf v, dc_buf bias, int B, int C,
                                 int64_t HW) {
    DC_CUDA_OP(be);
    if (!float_dt(x.dt) || (y.p && !float_dt(y.dt)) || (v.p && !float_dt(v.dt)) || (bias.p && !float_dt(bias.dt)))
        DC_CUDA_FAIL(be, "add_nhwc dtypes: x %s, y %s, v %s, bias %s (each F32 or BF16)", dc_dtype_name(x.dt),
                     y.p ? dc_dtype_name(y.dt) : "-", v.p ? dc_dtype_name(v.dt) : "-",
                     bias.p ? dc_dtype_name(bias.dt) : "-");
    if (B < 0 || C < 0 || HW < 0)
        DC_CUDA_FAIL(be, "add_nhwc over %d maps of %d channels and %lld pixels", B, C, (long long)HW);
    if (B == 0 || C == 0 || HW == 0) return;
    const dc_rows_geom g = dc_rows_geom_make(C, dc_vec_width(C, x, y, dc_buf_none()), TPB);
    const int64_t chunk = dc_rows_chunk(&g, (int64_t)B * HW, 8), cps = (HW + chunk - 1) / chunk;
    const dim3 grid((unsigned)(B * cps), (unsigned)g.tiles), block(g.ct, g.rt);
#define ADD_NHWC(n)                                                                                             \
    dc_launch(be, k_add_nhwc<n>, grid, block, 0, x.p, BF(x), y.p, BF(y), v.p, BF(v), bias.p, BF(bias), HW, C, g.cols, \
              cps, chunk)
    if (g.V == 8) ADD_NHWC(8);
    else if (g.V == 4) ADD_NHWC(4);
    else ADD_NHWC(1);
#undef ADD_NHWC
    DC_CUDA_LAUNCHED(be);
}

// Whether [p, p + n) and [q, q + m) share a byte.
static bool overlap(const void *p, size_t n, const void *q, size_t m) {
    const char *a = (const char *)p, *b = (const char *)q;
    return n && m && a < b + m && b < a + n;
}

// out[M, C1 + C2] = [a | b] in 16-byte units (rows of whole units, buffers
// aligned): a thread a unit of out, from a's row or b's.
__global__ void k_concat_rows16(uint4 *out, const uint4 *a, int u1, const uint4 *b, int u2, int64_t n) {
    dc_pdl_enter();
    const int u = u1 + u2;
    GRID_STRIDE(i, n) {
        const int64_t m = i / u;
        const int k = (int)(i - m * u);
        out[i] = k < u1 ? a[m * u1 + k] : b[m * u2 + k - u1];
    }
}

// out[M, C1 + C2] = [a | b] row by row: one kernel where the rows are whole
// 16-byte units, else two strided copies (a memcpy node each in a captured
// graph; with rows of a few hundred bytes they took 13.6 us a UNet concat at
// 2 rows), a's rows into the left columns, b's into the right.
extern "C" void dc_cuda_concat_channels(dc_backend *be, dc_buf out, dc_buf a, int C1, dc_buf b, int C2, int64_t M) {
    DC_CUDA_OP(be);
    if (!float_dt(out.dt) || a.dt != out.dt || b.dt != out.dt)
        DC_CUDA_FAIL(be, "concat_channels dtypes: out %s, a %s, b %s (all F32 or all BF16)", dc_dtype_name(out.dt),
                     dc_dtype_name(a.dt), dc_dtype_name(b.dt));
    if (M < 0 || C1 < 0 || C2 < 0)
        DC_CUDA_FAIL(be, "concat_channels of %lld rows of %d and %d channels", (long long)M, C1, C2);
    if (M == 0 || C1 + C2 == 0) return;
    const size_t es = dc_dtype_size(out.dt), row = (size_t)(C1 + C2) * es, n1 = (size_t)C1 * es, n2 = (size_t)C2 * es;
    if (overlap(out.p, row * M, a.p, n1 * M) || overlap(out.p, row * M, b.p, n2 * M))
        DC_CUDA_FAIL(be, "concat_channels: the output overlaps an input");
    if (n1 % 16 == 0 && n2 % 16 == 0 && dc_aligned(out.p, 16) && dc_aligned(a.p, 16) && dc_aligned(b.p, 16)) {
        const int64_t units = (int64_t)M * (int64_t)(row / 16);
        dc_launch(be, k_concat_rows16, dc_blocks(units, TPB), TPB, 0, (uint4 *)out.p, (const uint4 *)a.p,
                  (int)(n1 / 16), (const uint4 *)b.p, (int)(n2 / 16), units);
        DC_CUDA_LAUNCHED(be);
        return;
    }
    if (C1) DC_CUDA(be, cudaMemcpy2DAsync(out.p, row, a.p, n1, n1, (size_t)M, cudaMemcpyDeviceToDevice, S(be)));
    if (C2)
        DC_CUDA(be, cudaMemcpy2DAsync((char *)out.p + n1, row, b.p, n2, n2, (size_t)M, cudaMemcpyDeviceToDevice, S(be)));
}

// ---- backward passes of the channels-last ops (training the UNet) ------------------------

// A thread per input value: its 2x2 block of dout, added in a fixed order.
__global__ void k_upsample2x_nhwc_bwd(void *dx, int xbf, const void *dout, int obf, int64_t n, int W, int C) {
    GRID_STRIDE(i, n) {
        const int64_t p = i / C, c = i - p * C, bh = p / W, w = p - bh * W;
        const int64_t orow = 2 * (int64_t)W * C, o = 2 * bh * orow + 2 * w * C + c;
        dc_st(dx, i, dc_ld(dout, o, obf) + dc_ld(dout, o + C, obf) + dc_ld(dout, o + orow, obf) +
                         dc_ld(dout, o + orow + C, obf), xbf);
    }
}

extern "C" void dc_cuda_upsample2x_nhwc_bwd(dc_backend *be, dc_buf dx, dc_buf dout, int B, int C, int H, int W) {
    DC_CUDA_OP(be);
    if (!float_dt(dx.dt) || !float_dt(dout.dt))
        DC_CUDA_FAIL(be, "upsample backward dtypes: dx %s, dout %s (each F32 or BF16)", dc_dtype_name(dx.dt),
                     dc_dtype_name(dout.dt));
    if (B < 0 || C < 0 || H < 0 || W < 0) DC_CUDA_FAIL(be, "upsample backward of %d maps of %d channels %dx%d", B, C, H, W);
    const int64_t n = (int64_t)B * H * W * C;
    if (n == 0) return;
    k_upsample2x_nhwc_bwd<<<dc_blocks(n, TPB), TPB, 0, S(be)>>>(dx.p, BF(dx), dout.p, BF(dout), n, W, C);
    DC_CUDA_LAUNCHED(be);
}

// Two strided copies: x's left columns into a, its right ones into b.
extern "C" void dc_cuda_split_channels(dc_backend *be, dc_buf a, int C1, dc_buf b, int C2, dc_buf x, int64_t M) {
    DC_CUDA_OP(be);
    if (!float_dt(x.dt) || (a.p && a.dt != x.dt) || b.dt != x.dt)
        DC_CUDA_FAIL(be, "split_channels dtypes: x %s, a %s, b %s (all F32 or all BF16)", dc_dtype_name(x.dt),
                     a.p ? dc_dtype_name(a.dt) : "-", dc_dtype_name(b.dt));
    if (M < 0 || C1 < 0 || C2 < 0)
        DC_CUDA_FAIL(be, "split_channels of %lld rows of %d and %d channels", (long long)M, C1, C2);
    if (M == 0) return;
    const size_t es = dc_dtype_size(x.dt), row = (size_t)(C1 + C2) * es, n1 = (size_t)C1 * es, n2 = (size_t)C2 * es;
    if (a.p && C1) DC_CUDA(be, cudaMemcpy2DAsync(a.p, n1, x.p, row, n1, (size_t)M, cudaMemcpyDeviceToDevice, S(be)));
    if (C2) DC_CUDA(be, cudaMemcpy2DAsync(b.p, n2, (char *)x.p + n1, row, n2, (size_t)M, cudaMemcpyDeviceToDevice, S(be)));
}
