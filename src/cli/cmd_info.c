// diffusion info FILE: what a checkpoint or weights file holds.
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/run_folder.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "models/dit_io.h"
#include "models/model_io.h"

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
                     "shapes of a plain official-key weights file.",
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
    // Our checkpoints hold raw weights under the plain keys and EMA under "ema.".
    // The file's architecture first: only then are its config entries read as that model's.
    dc_dit_config c;
    if (!dc_model_kind_of_file(&f) || dc_dit_config_from_file(&f, "", heads, &c)) {
        dc_st_close(&f);
        return cli_fail();
    }
    int64_t nparams = 0, ntensors = 0;
    for (int i = 0; i < f.count; i++) {
        const char *n = f.tensors[i].name;
        if (strncmp(n, "ema.", 4) == 0 || strncmp(n, "train.", 6) == 0) continue;
        if (strcmp(n, "pos_embed") != 0) nparams += f.tensors[i].numel;
        ntensors++;
    }
    printf("file          %s\n", f.path);
    printf("model         DiT depth %d, hidden %d, heads %d, patch %d, input %dx%dx%d\n", c.depth,
           c.hidden, c.heads, c.patch, c.input_size, c.input_size, c.in_channels);
    printf("              %d classes (+1 null), mlp %d, learn_sigma %s, %d tokens\n",
           c.num_classes, c.mlp_hidden, c.learn_sigma ? "yes" : "no", dc_dit_tokens(&c));
    printf("parameters    %lld trainable in %lld tensors (%.2f M)\n", (long long)nparams,
           (long long)ntensors, nparams / 1e6);
    printf("forward       %.3f GFLOP per image\n", 2 * dc_dit_macs_per_image(&c) / 1e9);
    printf("contents      %s%s\n", dc_st_find(&f, "ema.pos_embed") || dc_st_find(&f, "ema.x_embedder.proj.weight") ? "raw + EMA weights" : "weights",
           dc_st_find(&f, "train.adam_m") ? " + optimizer state (resumable)" : "");
    printf("checksums     %s\n", f.verified ? "verified (xxHash64 of every tensor and the metadata)"
                                : no_verify ? "not checked (--no-verify)"
                                            : "none (a file from elsewhere, or an older one)");
    static const char *k_skip[] = {"model", "input_size", "patch_size", "in_channels", "hidden_size",
                                   "depth", "num_heads", "mlp_hidden", "num_classes", "learn_sigma"};
    int shown = 0;
    for (int i = 0; i < f.nmeta; i++) {
        bool skip = false;
        for (size_t k = 0; k < sizeof k_skip / sizeof k_skip[0]; k++) skip |= !strcmp(f.meta_keys[i], k_skip[k]);
        if (skip || !strncmp(f.meta_keys[i], "checksum.", 9)) continue;
        if (!shown++) printf("metadata\n");
        printf("  %-20s %s\n", f.meta_keys[i], f.meta_values[i]);
    }
    dc_st_close(&f);
    return 0;
}
