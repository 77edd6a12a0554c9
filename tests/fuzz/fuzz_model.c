// libFuzzer harness for loading a model from weights, as `diffusion sample`,
// `forward` and `export` do: the config from a file's metadata or inferred
// from its tensor shapes (dc_dit_config_from_file), then the weights (EMA
// when the file has them) into a CPU model, then one forward pass. Checksums
// are not verified, so that mutations reach the config and weight checks
// (fuzz_safetensors covers verification). An accepted config must validate;
// one whose model is small is built, loaded and run.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "fuzz/fuzz_util.h"
#include "io/safetensors.h"
#include "models/dit_io.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static dc_backend *g_cpu;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    g_cpu = dc_backend_cpu_create();
    if (!g_cpu) abort();
    return 0;
}

// One forward pass of one image at mid-schedule, the null class.
static void run_once(dc_dit *m) {
    const dc_dit_config *c = &m->cfg;
    int64_t img = (int64_t)c->in_channels * c->input_size * c->input_size;
    int64_t oimg = (int64_t)dc_dit_out_channels(c) * c->input_size * c->input_size;
    if (dc_dit_reserve(m, 1) != 0) return;
    dc_backend *be = m->be;
    dc_buf x = {be->alloc(be, img * 4), DC_F32}, out = {be->alloc(be, oimg * 4), DC_F32};
    dc_buf t = {be->alloc(be, 4), DC_F32}, y = {be->alloc(be, 4), DC_I32};
    if (!x.p || !out.p || !t.p || !y.p) abort();
    float *h = calloc((size_t)(img > oimg ? img : oimg), sizeof *h), tt = 500.0f;
    int32_t yy = c->num_classes;
    if (!h) abort();
    be->upload(be, x.p, h, img * 4), be->upload(be, t.p, &tt, 4), be->upload(be, y.p, &yy, 4);
    if (dc_dit_forward(m, out, x, t, y, 1) == 0) be->download(be, h, out.p, oimg * 4);
    free(h);
    be->free(be, x.p), be->free(be, out.p), be->free(be, t.p), be->free(be, y.p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dc_st_file f;
    if (dc_st_parse_opts(&f, data, size, "fuzz.safetensors", DC_ST_NO_VERIFY) != 0) return 0;
    dc_dit_config c;
    // as the CLI does: the official table's heads first; then as with --heads 2
    int rc = dc_dit_config_from_file(&f, "", 0, &c);
    if (rc != 0) rc = dc_dit_config_from_file(&f, "", 2, &c);
    if (rc == 0) {
        if (dc_dit_config_validate(&c) != 0) abort();  // returned a config it does not accept
        if (fuzz_model_small(&c)) {
            dc_dit m;
            const char *prefix = dc_st_find(&f, "ema.x_embedder.proj.weight") ? "ema." : "";
            if (dc_dit_create(&m, &c, g_cpu, false) == 0) {
                if (dc_dit_load_weights(&m, &f, prefix) == 0) run_once(&m);
                dc_dit_free(&m);
            }
        }
    }
    dc_st_close(&f);
    return 0;
}
