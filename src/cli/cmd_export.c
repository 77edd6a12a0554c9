// diffusion export: a checkpoint's weights for other programs.
//   - a DiT: a plain state dict under the official keys (the PyTorch state
//     dict's), which the official model loads with load_state_dict(safetensors load_file(..));
//   - a Stable Diffusion UNet: with its base model's other parts, a diffusers
//     pipeline folder or one original-layout file (pipelines/sd_export.h).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/args.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/run_folder.h"
#include "core/error.h"
#include "core/log.h"
#include "models/model.h"
#include "nn/params_io.h"
#include "pipelines/sd_export.h"

static int export_dit(const char *ckpt, const char *out, bool raw, int heads, bool no_verify) {
    cli_inputs in = {0};
    int bad = cli_inputs_add_checkpoint(&in, "--ckpt", ckpt) || cli_check_stdio(&in) || cli_check_output(out, &in);
    cli_inputs_free(&in);
    if (bad) return cli_fail();
    dc_backend *be = NULL;
    dc_model *m = NULL;
    const char *which;
    float *host = NULL;
    dc_st_entry *e = NULL;
    char (*names)[128] = NULL;
    dc_kv kv = {0};
    int status = 1;
    if (dc_backend_create("cpu", &be) || cli_load_model(ckpt, raw, heads, no_verify ? DC_ST_NO_VERIFY : 0, be, &m, &which)) goto done;
    const dc_params *ps = m->params;
    host = malloc((size_t)ps->numel * sizeof *host);
    e = calloc(ps->count, sizeof *e);
    names = calloc(ps->count, sizeof *names);
    if (!host || !e || !names) { dc_fail("out of memory"); goto done; }
    if (dc_params_entries(ps, ps->data, "", host, e, names)) goto done;
    if (dc_model_config_to_kv(m, &kv) || dc_kv_set(&kv, "format", "diffusion.c weights v2") || dc_kv_set(&kv, "weights", "%s", which)) goto done;
    if (dc_st_write(out, e, ps->count, (const char *const *)kv.keys,
                    (const char *const *)kv.values, kv.n)) goto done;
    dc_log("wrote %s: %d tensors, %s weights, official %s keys", out, ps->count, which, m->ops->name);
    status = 0;
done:
    if (status) cli_fail();
    dc_kv_free(&kv);
    free(host), free(e), free(names);
    dc_model_free(m);
    if (be) dc_backend_destroy(be);
    return status;
}

// The output of an SD export may replace no input (the checkpoints, the base
// model's files); a folder must not exist yet, a file may be replaced.
static int check_sd_output(const char *ckpt, const char *base, const char *out) {
    cli_inputs in = {0};
    int bad = cli_inputs_add_checkpoint(&in, "--ckpt", ckpt) || (base && cli_inputs_add(&in, "--base", base)) ||
              cli_check_model_output(&in, out);
    cli_inputs_free(&in);
    return bad;
}

static int export_sd(dc_st_file *f, const char *ckpt, const char *out, dc_sd_export_opts *o) {
    const char *base = o->base ? o->base : dc_st_meta(f, "base_model");
    const char *fallback = NULL;
    if (!o->vocab && cli_find_vocab(&fallback)) dc_error_clear();  // needed only for single-file bases
    if (!o->vocab) o->vocab = fallback;
    dc_backend *be = NULL;
    const char *which = "";
    int rc = check_sd_output(ckpt, base, out) || dc_backend_create("cpu", &be) || dc_sd_export(f, out, o, be, &which);
    if (be) dc_backend_destroy(be);
    if (rc) return cli_fail();
    dc_log("wrote %s: %s, the UNet's %s weights in %s, the other parts from %s", out,
           dc_sd_export_is_file(out) ? "one file in the original layout" : "a diffusers pipeline folder", which,
           o->half ? "fp16" : "fp32", o->base ? o->base : base);
    return 0;
}

int cmd_export(int argc, char **argv) {
    const char *ckpt = NULL, *out = NULL;
    bool raw = false, no_verify = false;
    int heads = 0;
    dc_sd_export_opts o = {0};
    arg_spec specs[] = {
        {"ckpt", ARG_STR, &ckpt, "PATH", "checkpoint or run folder (its newest checkpoint)"},
        {"out", ARG_STR, &out, "PATH",
         "DiT: safetensors file to write; SD: a folder to create (diffusers), or a FILE.safetensors (original layout)"},
        {"raw", ARG_FLAG, &raw, NULL, "export the raw weights instead of EMA"},
        {"half", ARG_FLAG, &o.half, NULL, "SD: write fp16 weights (default: the UNet in fp32)"},
        {"base", ARG_STR, &o.base, "PATH", "SD: the base model, where it lies now (default: the checkpoint's base_model)"},
        {"vocab", ARG_STR, &o.vocab, "FILE",
         "SD: OpenAI's BPE vocabulary, for the tokenizer/ of a folder made from a single-file base (default: the shipped one)"},
        {"heads", ARG_INT, &heads, "N", CLI_HEADS_HELP},
        {"no-verify", ARG_FLAG, &no_verify, NULL, CLI_NO_VERIFY_HELP},
    };
    arg_parser ap = {"diffusion export --ckpt PATH --out PATH [--raw] [--half] [--no-verify]",
                     "Writes the EMA weights (or --raw ones) of a checkpoint for other programs.\n"
                     "DiT: a plain state dict with the official key names (fixed tensors included),\n"
                     "float32, with the model config in __metadata__.\n"
                     "Stable Diffusion (a UNet2DConditionModel run): the trained UNet with the text\n"
                     "encoder, tokenizer, scheduler (with the run's prediction) and VAE of its base\n"
                     "model, as a diffusers pipeline folder (--out DIR: diffusers' from_pretrained)\n"
                     "or one file in the original layout (--out FILE.safetensors: AUTOMATIC1111,\n"
                     "diffusers' from_single_file). A folder is built under a temporary name and\n"
                     "renamed; it must not exist yet.",
                     specs, (int)(sizeof specs / sizeof specs[0]), 0, {0}, 0, {0}};
    int rc = args_parse(&ap, argc, argv);
    if (rc) return rc > 0 ? 0 : cli_usage_fail();
    if (!ckpt || !out) return dc_fail("--ckpt and --out are required (see --help)"), cli_usage_fail();
    if (cli_check_heads(heads)) return cli_usage_fail();
    o.raw = raw, o.st_flags = no_verify ? DC_ST_NO_VERIFY : 0;
    dc_st_file f;
    bool sd = false;
    if (cli_open_checkpoint(ckpt, o.st_flags, &f) == 0) {
        const char *model = dc_st_meta(&f, "model");
        sd = model && !strcmp(model, "UNet2DConditionModel");
        if (!sd) dc_st_close(&f);
    } else {
        dc_error_clear();  // the DiT path says what is wrong with it, as before
    }
    if (!sd) {
        if (o.half || o.base || o.vocab)
            return dc_fail("--half, --base and --vocab are for Stable Diffusion checkpoints (UNet2DConditionModel); "
                           "%s is not one", ckpt), cli_usage_fail();
        return export_dit(ckpt, out, raw, heads, no_verify);
    }
    rc = export_sd(&f, ckpt, out, &o);
    dc_st_close(&f);
    return rc;
}
