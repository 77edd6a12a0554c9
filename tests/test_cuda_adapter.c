// The LoRA adapter (nn/adapter.h) on the CUDA backend, in both GPU modes
// (fp32 for checking, bf16 mixed precision): for a linear layer and 3x3
// convolutions (NCHW and channels-last), on trainable and frozen base
// weights, a random rank-4 LoRA applied at run time gives the CPU's output,
// dx, base-weight gradient and factor gradients (the CPU's are held against a
// double-precision reference in test_adapter); and merged into the weight
// (rounded once to the weight's dtype) it gives the run-time output and dx.
//
// Error: max |gpu - ref| / max |ref| per output; NaN fails. fp32: the GPU's
// sums in another order, 1e-4. bf16: inputs, weights and activations rounded
// to 8 bits of mantissa (2^-9 relative each), 3e-2.
// Skips (exit 0, with a message) where no GPU is present.
//
//   build/tests/test_cuda_adapter [seed]
#include "cuda_check.h"
#include "lora_case.h"

static void check_err(const char *what, const char *part, const float *got, const float *ref, int64_t n,
                      double tol) {
    char name[160];
    snprintf(name, sizeof name, "%s: %s err %.2e", what, part, lcase_err_f(got, ref, n));
    expect(lcase_err_f(got, ref, n) <= tol, name);
}

static void test_case(const lcase *c, uint64_t seed) {
    lrun rc, rg;
    lout oc = {0}, og = {0}, om = {0};
    const double tol = g_ct == DC_F32 ? 1e-4 : 3e-2;
    int bad = lrun_make(&rc, g_cpu, c, seed) || lrun_make(&rg, g_gpu, c, seed);
    if (!bad) {
        dc_lora_attach(&rc.lo), dc_lora_attach(&rg.lo);
        bad = lrun_run(&rc, &oc) || lrun_run(&rg, &og) || dc_lora_merge(&rg.lo) || lrun_run(&rg, &om);
    }
    if (bad) {
        char name[200];
        snprintf(name, sizeof name, "%s: %s", c->what, dc_error());
        expect(false, name);
    } else {
        check_err(c->what, "run time y", og.y, oc.y, rc.ny, tol);
        check_err(c->what, "run time dx", og.dx, oc.dx, rc.nx, tol);
        if (!c->frozen) check_err(c->what, "run time dW", og.dw, oc.dw, rc.nw, tol);
        check_err(c->what, "d lora_down", og.ddown, oc.ddown, rc.nd, tol);
        check_err(c->what, "d lora_up", og.dup, oc.dup, rc.nu, tol);
        check_err(c->what, "merged y against run time", om.y, og.y, rc.ny, tol);
        check_err(c->what, "merged dx against run time", om.dx, og.dx, rc.nx, tol);
    }
    lout_free(&oc), lout_free(&og), lout_free(&om);
    lrun_free(&rc), lrun_free(&rg);
}

static void run_groups(void) {
    const lcase cases[] = {
        {"linear", false, false, false, DC_F32, 33, 40, 24, 1, 1, 1, 1, 0, 4, 3.0f, 0.8f},
        {"linear, frozen base", false, false, true, DC_F16, 16, 32, 48, 1, 1, 1, 1, 0, 4, 4.0f, 1.0f},
        {"conv 3x3 NCHW", true, false, false, DC_F32, 2, 8, 16, 12, 10, 3, 1, 1, 4, 2.0f, 1.0f},
        {"conv 3x3 NCHW stride 2, frozen", true, false, true, DC_F32, 2, 8, 8, 11, 12, 3, 2, 1, 4, 8.0f, 0.5f},
        {"conv 3x3 channels-last", true, true, false, DC_F32, 2, 16, 8, 10, 12, 3, 1, 1, 4, 4.0f, 1.0f},
        {"conv 3x3 channels-last, frozen", true, true, true, DC_F16, 2, 8, 16, 9, 9, 3, 1, 1, 4, 1.0f, 1.5f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_case(&cases[i], g_rng + i);
}

int main(int argc, char **argv) { return cuda_main("test_cuda_adapter", argc, argv, run_groups); }
