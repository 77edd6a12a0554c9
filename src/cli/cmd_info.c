// diffusion info FILE: what a checkpoint or weights file holds.
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/run_folder.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "models/model_io.h"
#include "models/sd_lora_keys.h"
#include "models/registry.h"

// A LoRA file (every tensor a LoRA factor or alpha, or a LyCORIS LoHa's or
// LoKr's tensor; models/sd_lora_keys.h): its format, kinds, layers per part,
// ranks and alphas. 0 when it is not one.
static int lora_info(const dc_st_file *f) {
    static const char *const formats[] = {"kohya", "diffusers", "PEFT", "diffusers attention processors"};
    int layers[2] = {0, 0}, rmin = 0, rmax = 0, ranked = 0, fmt = -1, mixed = 0;
    float amin = 0, amax = 0;
    bool alpha = false, kinds[3] = {false};  // LoRA, LoHa, LoKr
    for (int i = 0; i < f->count; i++) {
        dc_lora_key k;
        if (dc_lora_key_parse(f->tensors[i].name, &k)) return dc_error_clear(), 0;
        mixed |= fmt >= 0 && fmt != (int)k.format && k.role != DC_LORA_ALPHA;
        if (k.role != DC_LORA_ALPHA) fmt = fmt < 0 ? (int)k.format : fmt;
        // one tensor a layer stands for it: the down factor, LoHa's w1_a, LoKr's w2 (or w2_a)
        const dc_st_tensor *t = &f->tensors[i];
        const int kind = k.role == DC_LORA_DOWN ? 0 : k.role == DC_LORA_HADA_W1A ? 1
                       : k.role == DC_LORA_LOKR_W2 || k.role == DC_LORA_LOKR_W2A ? 2 : -1;
        if (kind >= 0) {
            // the rank: the down factor's rows, the decomposed factors' columns (none for a whole LoKr W2)
            const int r = t->ndim < 2 || k.role == DC_LORA_LOKR_W2 ? 0 : (int)t->shape[kind ? 1 : 0];
            layers[k.part]++, kinds[kind] = true;
            if (r) rmin = !ranked++ || r < rmin ? r : rmin, rmax = r > rmax ? r : rmax;
        } else if (k.role == DC_LORA_ALPHA && f->tensors[i].numel == 1) {
            float a;
            if (dc_st_read_f32(f, &f->tensors[i], &a)) return -1;
            amin = !alpha || a < amin ? a : amin, amax = !alpha || a > amax ? a : amax, alpha = true;
        }
    }
    if (!layers[0] && !layers[1]) return 0;
    printf("file          %s\n", f->path);
    printf("LoRA          %s names%s; %d UNet layers, %d text encoder layers\n", fmt >= 0 ? formats[fmt] : "?",
           mixed ? " (mixed with others)" : "", layers[0], layers[1]);
    if (kinds[1] || kinds[2]) {
        static const char *const kind_names[3] = {"LoRA", "LoHa", "LoKr"};
        printf("deltas       ");
        for (int k = 0, n = 0; k < 3; k++)
            if (kinds[k]) printf("%s %s", n++ ? "," : "", kind_names[k]);
        printf(" (LyCORIS)\n");
    }
    if (!ranked) printf("rank          whole matrices\n");
    else if (rmin == rmax) printf("rank          %d\n", rmin);
    else printf("rank          %d to %d\n", rmin, rmax);
    if (!alpha) printf("alpha         none (a scale of 1)\n");
    else if (amin == amax) printf("alpha         %g\n", amin);
    else printf("alpha         %g to %g\n", amin, amax);
    for (int i = 0; i < f->nmeta; i++)
        if (!strncmp(f->meta_keys[i], "ss_", 3)) printf("  %-20s %s\n", f->meta_keys[i], f->meta_values[i]);
    return 1;
}

int cmd_info(int argc, char **argv) {
    int heads = 0;
    bool no_verify = false;
    arg_spec specs[] = {
        {"heads", ARG_INT, &heads, "N", CLI_HEADS_HELP},
        {"no-verify", ARG_FLAG, &no_verify, NULL, CLI_NO_VERIFY_HELP},
    };
    arg_parser ap = {"diffusion info FILE|RUN_FOLDER [--heads N] [--no-verify]",
                     "Prints the model config, parameter count, training step and training\n"
                     "settings stored in a checkpoint, or the config inferred from the tensor\n"
                     "shapes of a plain official-key weights file; for a LoRA file, its\n"
                     "format, layers, ranks and alphas.",
                     specs, (int)(sizeof specs / sizeof specs[0]), 1, {0}, 0, {0}};
    int rc = args_parse(&ap, argc, argv);
    if (rc) return rc > 0 ? 0 : cli_usage_fail();
    if (ap.npositional != 1) return dc_fail("info needs one FILE or RUN_FOLDER (see --help)"), cli_usage_fail();
    if (cli_check_heads(heads)) return cli_usage_fail();
    cli_inputs ins = {0};
    int bad = cli_inputs_add_checkpoint(&ins, "FILE", ap.positional[0]) || cli_check_stdio(&ins);
    cli_inputs_free(&ins);
    if (bad) return cli_fail();
    dc_st_file f;
    if (cli_open_checkpoint(ap.positional[0], no_verify ? DC_ST_NO_VERIFY : 0, &f)) return cli_fail();
    const int lora = lora_info(&f);
    if (lora) return dc_st_close(&f), lora < 0 ? cli_fail() : 0;
    // Our checkpoints hold raw weights under the plain keys and EMA under "ema.".
    // The file's architecture first: only then are its config entries read as
    // that model's, and the model sized from them (nothing allocated).
    dc_kv cfg = {0};
    dc_model *m = NULL;
    if (dc_model_config_of_file(&f, "", heads, &cfg) || dc_model_create(&cfg, NULL, false, &m)) {
        dc_kv_free(&cfg);
        dc_st_close(&f);
        return cli_fail();
    }
    int64_t nparams = 0, ntensors = 0;
    bool ema = false;
    for (int i = 0; i < f.count; i++) {
        const char *n = f.tensors[i].name;
        ema |= strncmp(n, "ema.", 4) == 0;
        if (strncmp(n, "ema.", 4) == 0 || strncmp(n, "train.", 6) == 0) continue;
        int k = dc_params_find(m->params, n);
        if (k < 0 || m->params->items[k].trainable) nparams += f.tensors[i].numel;  // not the fixed ones
        ntensors++;
    }
    char what[512];
    dc_model_describe(m, what, sizeof what);
    printf("file          %s\n", f.path);
    for (char *line = strtok(what, "\n"), *first = line; line; line = strtok(NULL, "\n"))
        printf("%-14s%s\n", line == first ? "model" : "", line);
    printf("parameters    %lld trainable in %lld tensors (%.2f M)\n", (long long)nparams,
           (long long)ntensors, nparams / 1e6);
    printf("forward       %.3f GFLOP per image\n", 2 * dc_model_macs_per_image(m) / 1e9);
    printf("contents      %s%s\n", ema ? "raw + EMA weights" : "weights",
           dc_st_find(&f, "train.adam_m") ? " + optimizer state (resumable)" : "");
    printf("checksums     %s\n", f.verified ? "verified (xxHash64 of every tensor and the metadata)"
                                : no_verify ? "not checked (--no-verify)"
                                            : "none (a file from elsewhere, or an older one)");
    int shown = 0;
    for (int i = 0; i < f.nmeta; i++) {  // the entries besides the model's config (shown above)
        if (dc_kv_get(&cfg, f.meta_keys[i]) || !strncmp(f.meta_keys[i], "checksum.", 9)) continue;
        if (!shown++) printf("metadata\n");
        printf("  %-20s %s\n", f.meta_keys[i], f.meta_values[i]);
    }
    dc_model_free(m);
    dc_kv_free(&cfg);
    dc_st_close(&f);
    return 0;
}
