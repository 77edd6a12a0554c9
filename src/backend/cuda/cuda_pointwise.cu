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
    k_cast<<<dc_blocks(n, TPB), TPB, 0, S(be)>>>(dst.p, BF(dst), src.p, BF(src), n);
    DC_CUDA_LAUNCHED(be);
}

// kind: 0 gelu, 1 silu
__global__ void k_act_fwd(void *out, int obf, const void *inp, int ibf, int64_t n, int kind) {
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
    k_act_fwd<<<dc_blocks(n, TPB), TPB, 0, S(be)>>>(out.p, BF(out), inp.p, BF(inp), n, 0);
    DC_CUDA_LAUNCHED(be);
}
extern "C" void dc_cuda_gelu_bwd(dc_backend *be, dc_buf dinp, dc_buf dout, dc_buf inp, int64_t n) {
    DC_CUDA_OP(be);
    k_act_bwd<<<dc_blocks(n, TPB), TPB, 0, S(be)>>>(dinp.p, BF(dinp), dout.p, BF(dout), inp.p, BF(inp), n, 0, 0);
    DC_CUDA_LAUNCHED(be);
}
extern "C" void dc_cuda_silu_fwd(dc_backend *be, dc_buf out, dc_buf inp, int64_t n) {
    DC_CUDA_OP(be);
    k_act_fwd<<<dc_blocks(n, TPB), TPB, 0, S(be)>>>(out.p, BF(out), inp.p, BF(inp), n, 1);
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

__global__ void k_bias_grad_sum(float *db, const float *part, int slices, int N) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= N) return;
    float t = 0.0f;
    for (int s = 0; s < slices; s++) t += part[(int64_t)s * N + col];
    db[col] += t;
}
extern "C" void dc_cuda_bias_grad(dc_backend *be, dc_buf db, dc_buf dout, int M, int N) {
    DC_CUDA_OP(be);
    dc_cuda_ctx *c = dc_cuda(be);
    // The partial sums live in the cuBLASLt workspace's tail: the products
    // that use the workspace run on the same stream, so they never overlap.
    int slices = M >= 1024 ? BG_SLICES : 1;
    if ((size_t)slices * N * sizeof(float) > c->lt_ws_bytes / 2) slices = 1;
    float *part = (float *)((char *)c->lt_ws + c->lt_ws_bytes / 2);
    int rows_per = (M + slices - 1) / slices;
    dim3 block(32, 8);
    if (dout.dt == DC_BF16 && N % 2 == 0 && dc_aligned(dout.p, 4)) {
        dim3 grid((N / 2 + 31) / 32, slices);
        k_bias_grad_part_bf2<<<grid, block, 0, c->stream>>>(part, (const __nv_bfloat162 *)dout.p, M, N, rows_per);
    } else {
        dim3 grid((N + 31) / 32, slices);
        k_bias_grad_part<<<grid, block, 0, c->stream>>>(part, dout.p, BF(dout), M, N, rows_per);
    }
    k_bias_grad_sum<<<(N + 255) / 256, 256, 0, c->stream>>>((float *)db.p, part, slices, N);
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
    GRID_STRIDE(i, (int64_t)B * half) {
        int b = (int)(i / half), k = (int)(i % half);
        double a = (double)t[b] * dc_timestep_freq(k, half);
        dc_st(out, (int64_t)b * 2 * half + k, (float)cos(a), obf);
        dc_st(out, (int64_t)b * 2 * half + half + k, (float)sin(a), obf);
    }
}
extern "C" void dc_cuda_timestep_embed(dc_backend *be, dc_buf out, dc_buf t, int B, int half) {
    DC_CUDA_OP(be);
    k_timestep_embed<<<dc_blocks((int64_t)B * half, TPB), TPB, 0, S(be)>>>(out.p, BF(out), (const float *)t.p, B,
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
