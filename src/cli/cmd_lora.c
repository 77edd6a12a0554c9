// diffusion lora merge: LoRA files folded into a Stable Diffusion model's
// weights, written as a model other programs load (pipelines/sd_export.h).
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "pipelines/sd_export.h"

#define MAX_LORAS 16

static int merge(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *vocab = NULL;
    arg_list loras = {0};
    bool half = false, no_verify = false;
    arg_spec specs[] = {
        {"model", ARG_STR, &model, "PATH", "the base: a diffusers folder or a single-file checkpoint (SD 1.x, 2.x)"},
        {"lora", ARG_LIST, &loras, "FILE[:W]", "a LoRA file (kohya's, diffusers' or PEFT's; LoCon too) merged at "
                                               "weight W (default 1); repeatable, merged in order"},
        {"out", ARG_STR, &out, "PATH", "a folder to create (diffusers), or a FILE.safetensors (original layout)"},
        {"half", ARG_FLAG, &half, NULL, "write fp16 weights (default: the UNet in fp32, the others as loaded)"},
        {"vocab", ARG_STR, &vocab, "FILE", "OpenAI's BPE vocabulary, for the tokenizer/ of a folder made from a "
                                           "single-file base (default: the shipped one)"},
        {"no-verify", ARG_FLAG, &no_verify, NULL, CLI_NO_VERIFY_HELP},
    };
    arg_parser ap = {"diffusion lora merge --model PATH --lora FILE[:W] [--lora ...] --out PATH [--half]",
                     "Folds LoRA files into a Stable Diffusion model's UNet and text encoder, W += weight\n"
                     "x alpha / rank x up @ down (summed in fp32, rounded once), and writes the model\n"
                     "with the base's VAE, tokenizer and scheduler: a diffusers pipeline folder (--out\n"
                     "DIR) or one file in the original layout (--out FILE.safetensors), which this\n"
                     "engine, diffusers and AUTOMATIC1111 load. A folder is built under a temporary\n"
                     "name and renamed; it must not exist yet.",
                     specs, (int)(sizeof specs / sizeof specs[0]), 0, {0}, 0, {0}};
    int rc = args_parse(&ap, argc, argv);
    if (rc) return rc > 0 ? 0 : cli_usage_fail();
    if (!model || !out || !loras.n) return dc_fail("--model, --lora and --out are required (see --help)"), cli_usage_fail();
    if (loras.n > MAX_LORAS) return dc_fail("--lora: at most %d files", MAX_LORAS), cli_usage_fail();
    static char paths[MAX_LORAS][4096];
    const char *files[MAX_LORAS];
    float weights[MAX_LORAS];
    for (int i = 0; i < loras.n; i++) {
        if (cli_lora_arg(loras.v[i], paths[i], sizeof paths[i], &weights[i])) return cli_usage_fail();
        files[i] = paths[i];
    }
    // the output may replace none of the inputs; a folder must not exist yet, a file may be replaced
    cli_inputs in = {0};
    int bad = cli_inputs_add(&in, "--model", model);
    for (int i = 0; i < loras.n && !bad; i++) bad = cli_inputs_add(&in, "--lora", files[i]);
    if (!bad) bad = cli_check_model_output(&in, out);
    cli_inputs_free(&in);
    if (bad) return cli_fail();
    const char *fallback = NULL;
    if (!vocab && cli_find_vocab(&fallback)) dc_error_clear();  // needed only for single-file bases
    const dc_sd_export_opts o = {.half = half, .vocab = vocab ? vocab : fallback,
                                 .st_flags = no_verify ? DC_ST_NO_VERIFY : 0};
    dc_backend *be = NULL;
    rc = dc_backend_create("cpu", &be) || dc_sd_lora_merge_write(model, files, weights, loras.n, out, &o, be);
    if (be) dc_backend_destroy(be);
    if (rc) return cli_fail();
    dc_log("wrote %s: %s, %d LoRA%s merged into %s's UNet and text encoder (%s)", out,
           dc_sd_export_is_file(out) ? "one file in the original layout" : "a diffusers pipeline folder", loras.n,
           loras.n > 1 ? "s" : "", model, half ? "fp16" : "the UNet in fp32");
    return 0;
}

int cmd_lora(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "merge")) return merge(argc - 1, argv + 1);
    const bool help = argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"));
    printf("usage: diffusion lora merge --model PATH --lora FILE[:W] --out PATH   fold LoRAs into a model and write it\n"
           "       (train a LoRA with `diffusion train --lora RANK`; apply one with `txt2img --lora FILE`)\n");
    if (help) return 0;
    dc_fail("diffusion lora: a subcommand expected (merge)");
    return cli_usage_fail();
}
