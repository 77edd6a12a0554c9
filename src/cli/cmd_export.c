// diffusion export: weights under the plain official keys (the PyTorch
// state dict's), which the official PyTorch model loads with load_state_dict(safetensors load_file(..)).
#include <stdio.h>
#include <stdlib.h>

#include "cli/args.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "models/model.h"
#include "nn/params_io.h"

int cmd_export(int argc, char **argv) {
    const char *ckpt = NULL, *out = NULL;
    bool raw = false, no_verify = false;
    int heads = 0;
    arg_spec specs[] = {
        {"ckpt", ARG_STR, &ckpt, "PATH", "checkpoint or run folder (its newest checkpoint)"},
        {"out", ARG_STR, &out, "PATH", "safetensors file to write"},
        {"raw", ARG_FLAG, &raw, NULL, "export the raw weights instead of EMA"},
        {"heads", ARG_INT, &heads, "N", CLI_HEADS_HELP},
        {"no-verify", ARG_FLAG, &no_verify, NULL, CLI_NO_VERIFY_HELP},
    };
    arg_parser ap = {"diffusion export --ckpt PATH --out FILE [--raw] [--no-verify]",
                     "Writes the EMA weights (or --raw ones) of a checkpoint as a plain state dict\n"
                     "with the official key names (fixed tensors included), float32, with the\n"
                     "model config in __metadata__.",
                     specs, (int)(sizeof specs / sizeof specs[0]), 0, {0}, 0, {0}};
    int rc = args_parse(&ap, argc, argv);
    if (rc) return rc > 0 ? 0 : cli_usage_fail();
    if (!ckpt || !out) return dc_fail("--ckpt and --out are required (see --help)"), cli_usage_fail();
    if (cli_check_heads(heads)) return cli_usage_fail();
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
