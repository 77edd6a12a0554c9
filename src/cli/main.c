// diffusion: train, sample and inspect Diffusion Transformers.
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "core/error.h"

int cli_fail(void) {
    fprintf(stderr, "error: %s\n", dc_error());
    return 1;
}

static const struct {
    const char *name;
    int (*run)(int, char **);
    const char *help;
} k_commands[] = {
    {"train", cmd_train, "train a DiT (Fashion-MNIST by default), with checkpoints and --resume"},
    {"sample", cmd_sample, "draw class-conditional samples into a PNG grid and/or PNG files"},
    {"forward", cmd_forward, "evaluate the model on tensors from a safetensors file"},
    {"info", cmd_info, "print a checkpoint's config, size, step and training settings"},
    {"export", cmd_export, "write EMA (or raw) weights under the official DiT key names"},
    {"bench", cmd_bench, "measure training and sampling throughput on synthetic data"},
};

static void usage(FILE *out) {
    fprintf(out, "usage: diffusion <command> [flags]   (diffusion <command> --help for flags)\n\n"
                 "commands:\n");
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        fprintf(out, "  %-8s %s\n", k_commands[i].name, k_commands[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2) return usage(stderr), 2;
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help"))
        return usage(stdout), 0;
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        if (strcmp(argv[1], k_commands[i].name) == 0) return k_commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "error: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
