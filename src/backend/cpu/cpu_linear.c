// Linear layers on OpenBLAS: out = inp w^T + b and its backward.
//
// One thread pool only: OpenBLAS runs single-threaded (see dc_cpu_blas_init)
// and each OpenMP thread multiplies its own slice of the output. Two pools
// (OpenBLAS's pthreads and OpenMP's) spin against each other between ops
// and cost a quarter of the GEMM time on two cores. Slices split the output
// rows or columns, never the contraction: each element is summed whole by one
// thread in one fixed order, so results repeat bit for bit run to run.
#include <cblas.h>
#include <omp.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "core/log.h"

const char *dc_cpu_blas_core(void) { return openblas_get_corename(); }

void dc_cpu_blas_init(void) {
    // 1 = the pthreads build, whose pool must not be entered from OpenMP
    // threads. The OpenMP build runs nested calls single-threaded by itself,
    // and its openblas_set_num_threads would also shrink our OpenMP pool.
    if (openblas_get_parallel() == 1) openblas_set_num_threads(1);
#if defined(__x86_64__) && defined(__GNUC__)
    // In VMs that hide the CPU model, OpenBLAS's DYNAMIC_ARCH falls back to
    // its SSE3 kernels and every GEMM runs ~5x slower (measured: 45 against
    // 220 GFLOP/s on two AVX-512 cores). Say so once, with the fix.
    static bool warned;
    const char *core = openblas_get_corename();
    __builtin_cpu_init();
    if (!warned && core && __builtin_cpu_supports("avx2") &&
        (strcmp(core, "Prescott") == 0 || strcmp(core, "Core2") == 0 ||
         strcmp(core, "Nehalem") == 0 || strcmp(core, "Katmai") == 0)) {
        warned = true;
        dc_warn("OpenBLAS chose its %s kernels on a CPU with AVX2; set OPENBLAS_CORETYPE=%s "
                "for ~5x faster matrix products", core,
                __builtin_cpu_supports("avx512f") ? "SkylakeX" : "Haswell");
    }
#endif
}

// Boundary of slice i of n split into nt parts, on multiples of `align` (so
// OpenBLAS's micro-kernels see full tiles) except at the end.
static int split(int n, int nt, int i, int align) {
    int64_t units = (n + align - 1) / align, b = units * i / nt * align;
    return b < n ? (int)b : n;
}

// Row-major C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C, sliced over threads
// along M (or N when M is too small to give each thread a useful share).
static void sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    const enum CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans;
    const enum CBLAS_TRANSPOSE opb = tb ? CblasTrans : CblasNoTrans;
    const int64_t work = (int64_t)M * N * (K > 0 ? K : 1);
    const int nt = work < 65536 ? 1 : omp_get_max_threads();
    const bool by_rows = M >= 16 * nt || M >= N;
#pragma omp parallel num_threads(nt)
    {
        const int t = omp_get_thread_num(), n = omp_get_num_threads();
        if (by_rows) {
            int m0 = split(M, n, t, 16), m1 = split(M, n, t + 1, 16);
            const float *a = ta ? A + m0 : A + (int64_t)m0 * lda;
            if (m1 > m0)
                cblas_sgemm(CblasRowMajor, opa, opb, m1 - m0, N, K, alpha, a, lda, B, ldb, beta,
                            C + (int64_t)m0 * ldc, ldc);
        } else {
            int n0 = split(N, n, t, 16), n1 = split(N, n, t + 1, 16);
            const float *b = tb ? B + (int64_t)n0 * ldb : B + n0;
            if (n1 > n0)
                cblas_sgemm(CblasRowMajor, opa, opb, M, n1 - n0, K, alpha, A, lda, b, ldb, beta,
                            C + n0, ldc);
        }
    }
}

// out[M,N] (+)= inp w^T + b: the bias goes into out first and the GEMM adds onto it (no extra pass).
// w and b may be F16 or BF16 (weights kept as loaded), widened first.
static void linear_fwd(dc_backend *be, dc_buf out_, dc_buf inp_, dc_buf w_, dc_buf b_, int M, int K, int N,
                       bool accumulate) {
    float *out = dc_cpu_f32(out_);                                            // [M, N]
    const float *inp = dc_cpu_f32(inp_);                                      // [M, K]
    const float *w = dc_cpu_weight(be, w_, (int64_t)N * K, DC_CPU_WIDE_W);    // [N, K]
    const float *b = b_.p ? dc_cpu_weight(be, b_, N, DC_CPU_WIDE_B) : NULL;   // [N]
    if (!w || (b_.p && !b)) return;  // no scratch to widen them: recorded for status
    if (b) {
#pragma omp parallel for schedule(static) if ((int64_t)M * N > DC_CPU_PAR_MIN)
        for (int m = 0; m < M; m++) {
            float *o = out + (int64_t)m * N;
            if (accumulate)
                for (int n = 0; n < N; n++) o[n] += b[n];
            else
                memcpy(o, b, (size_t)N * sizeof(float));
        }
    }
    sgemm(false, true, M, N, K, 1.0f, inp, K, w, K, b || accumulate ? 1.0f : 0.0f, out, N);
}

void dc_cpu_linear_fwd(dc_backend *be, dc_buf out, dc_buf inp, dc_buf w, dc_buf b, int M, int K, int N) {
    linear_fwd(be, out, inp, w, b, M, K, N, false);
}

void dc_cpu_linear_fwd_acc(dc_backend *be, dc_buf out, dc_buf inp, dc_buf w, dc_buf b, int M, int K, int N) {
    linear_fwd(be, out, inp, w, b, M, K, N, true);
}

// w may be F16 or BF16 (a frozen layer that passes gradients through); the
// gradients are F32.
void dc_cpu_linear_bwd(dc_backend *be, dc_buf dinp_, dc_buf dw_, dc_buf db_, dc_buf dout_,
                       dc_buf inp_, dc_buf w_, int M, int K, int N, int flags) {
    const float *dout = dc_cpu_f32(dout_);                          // [M, N]
    const float *inp = dc_cpu_f32(inp_);                            // [M, K]
    const bool accumulate = flags & DC_BWD_DX_ADD;
    dc_cpu_grad_clear(dw_, (int64_t)N * K, db_, N, flags);
    if (dinp_.p) {  // dinp[M,K] (+)= dout @ w
        const float *w = dc_cpu_weight(be, w_, (int64_t)N * K, DC_CPU_WIDE_W);  // [N, K]
        if (!w) return;  // recorded for status
        sgemm(false, false, M, K, N, 1.0f, dout, N, w, K, accumulate ? 1.0f : 0.0f,
                     dc_cpu_f32(dinp_), K);
    }
    if (dw_.p)  // dw[N,K] += dout^T @ inp
        sgemm(true, false, N, K, M, 1.0f, dout, N, inp, K, 1.0f, dc_cpu_f32(dw_), K);
    if (db_.p) {  // db[N] += sum over rows of dout, column blocks per thread
        float *db = dc_cpu_f32(db_);
        enum { CB = 64 };
#pragma omp parallel for schedule(static) if ((int64_t)M * N > DC_CPU_PAR_MIN)
        for (int n0 = 0; n0 < N; n0 += CB) {
            const int nc = N - n0 < CB ? N - n0 : CB;
            float acc[CB] = {0};
            for (int m = 0; m < M; m++) {
                const float *row = dout + (int64_t)m * N + n0;
#pragma omp simd
                for (int j = 0; j < nc; j++) acc[j] += row[j];
            }
            for (int j = 0; j < nc; j++) db[n0 + j] += acc[j];
        }
    }
}

// The MLP's GELU around its products: composed from the two ops on the CPU.
void dc_cpu_linear_gelu_fwd(dc_backend *be, dc_buf out, dc_buf pre, dc_buf inp, dc_buf w, dc_buf b,
                            int M, int K, int N) {
    dc_cpu_linear_fwd(be, pre, inp, w, b, M, K, N);
    dc_cpu_gelu_fwd(be, out, pre, (int64_t)M * N);
}

void dc_cpu_linear_many_fwd(dc_backend *be, const dc_linear_job *jobs, int n, dc_buf inp, int M, int K) {
    for (int i = 0; i < n; i++) dc_cpu_linear_fwd(be, jobs[i].out, inp, jobs[i].w, jobs[i].b, M, K, jobs[i].N);
}

bool dc_cpu_linear_geglu_fwd(dc_backend *be, dc_buf out, dc_buf pre, dc_buf inp, dc_buf w, dc_buf b,
                             int M, int K, int F) {
    if (!pre.p) return false;  // no product with the gate in its epilogue here
    dc_cpu_linear_fwd(be, pre, inp, w, b, M, K, 2 * F);
    dc_cpu_geglu_fwd(be, out, pre, M, F);
    return true;
}

void dc_cpu_linear_bwd_gelu(dc_backend *be, dc_buf dpre, dc_buf dw, dc_buf db, dc_buf dout, dc_buf act,
                            dc_buf w, dc_buf pre, dc_buf scratch, int M, int K, int N) {
    dc_cpu_linear_bwd(be, scratch, dw, db, dout, act, w, M, K, N, false);
    dc_cpu_gelu_bwd(be, dpre, scratch, pre, (int64_t)M * K);
}
