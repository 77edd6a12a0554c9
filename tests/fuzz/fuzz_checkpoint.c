// libFuzzer harness for resuming training from a checkpoint, as `diffusion
// train --resume` does: model config and training settings from the
// metadata, the raw weights into a CPU model built for training, then EMA,
// AdamW moments and the position (dc_trainer_restore), then one training
// step on a tiny synthetic data set of the model's shape. Checksums are not
// verified, so that mutations reach these checks (fuzz_safetensors covers
// verification). Small models with small batches only, to keep runs short.
#include <stdint.h>
#include <stdlib.h>

#include "fuzz/fuzz_util.h"
#include "io/safetensors.h"
#include "models/dit_io.h"
#include "train/trainer.h"

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

// Three images of the model's shape, labels 0..num_classes-1 in turn.
static int make_data(dc_dataset *ds, const dc_dit_config *c) {
    *ds = (dc_dataset){.n = 3, .channels = c->in_channels, .height = c->input_size,
                       .width = c->input_size, .num_classes = c->num_classes};
    size_t per = (size_t)c->in_channels * c->input_size * c->input_size;
    ds->images = malloc(3 * per * sizeof *ds->images);
    ds->labels = malloc(3 * sizeof *ds->labels);
    if (!ds->images || !ds->labels) abort();
    for (size_t i = 0; i < 3 * per; i++) ds->images[i] = (float)(i % 7) / 3.5f - 1.0f;
    for (int i = 0; i < 3; i++) ds->labels[i] = i % c->num_classes;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dc_st_file f;
    if (dc_st_parse_opts(&f, data, size, "fuzz.safetensors", DC_ST_NO_VERIFY) != 0) return 0;
    dc_dit_config mc;
    dc_train_config tc = dc_train_config_default();
    if (dc_dit_config_from_file(&f, "", 0, &mc) != 0 ||
        dc_train_config_from_kv(&tc, (const char *const *)f.meta_keys,
                                (const char *const *)f.meta_values, f.nmeta, f.path) != 0 ||
        !fuzz_model_small(&mc) || tc.batch > 8) {
        dc_st_close(&f);
        return 0;
    }
    if (dc_dit_config_validate(&mc) != 0 || dc_train_config_validate(&tc) != 0) abort();
    dc_dit m;
    dc_dataset ds;
    dc_trainer tr;
    make_data(&ds, &mc);
    if (dc_dit_create(&m, &mc, g_cpu, true) == 0) {
        if (dc_dit_load_weights(&m, &f, "") == 0 && dc_trainer_init(&tr, &m.base, &ds, &tc) == 0) {
            tr.allow_data_change = true;  // the data set here is not the one the run had
            dc_step_stats st;
            if (dc_trainer_restore(&tr, &f) == 0) dc_trainer_step(&tr, &st);
            dc_trainer_free(&tr);
        }
        dc_dit_free(&m);
    }
    dc_dataset_free(&ds);
    dc_st_close(&f);
    return 0;
}
