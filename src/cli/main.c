// diffusion: train, sample and inspect diffusion models.
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/version.h"
#include "backend/backend.h"
#include "core/error.h"

int cli_fail(void) {
    fprintf(stderr, "error: %s\n", dc_error());
    return CLI_EXIT_FAILURE;
}

int cli_usage_fail(void) {
    fprintf(stderr, "error: %s\n", dc_error());
    return CLI_EXIT_USAGE;
}

// bench times a class-conditional model's training and sampling, with
// --sd PATH a Stable Diffusion model's components and pictures, with
// --sd-train an SD UNet's training (each its own flags).
static int bench(int argc, char **argv) {
    for (int k = 1; k < argc; k++) {
        if (!strcmp(argv[k], "--sd") || !strncmp(argv[k], "--sd=", 5)) return cmd_bench_sd(argc, argv);
        if (!strcmp(argv[k], "--sd-train")) return cmd_bench_sd_train(argc, argv);
    }
    return cmd_bench(argc, argv);
}

static const struct {
    const char *name;
    int (*run)(int, char **);
    const char *help;
} k_commands[] = {
    {"train", cmd_train, "train a model (a small DiT on Fashion-MNIST by default), with checkpoints and --resume"},
    {"sample", cmd_sample, "draw class-conditional samples into a PNG grid, PNG files or a tensor file"},
    {"txt2img", cmd_txt2img, "draw pictures from a prompt with a Stable Diffusion 1.x/2.x model"},
    {"img2img", cmd_img2img, "redraw a picture toward a prompt with a Stable Diffusion model"},
    {"forward", cmd_forward, "evaluate a model (DiT, or an SD component) on tensors from a file"},
    {"info", cmd_info, "print a checkpoint's config, size, step and training settings"},
    {"export", cmd_export, "write EMA (or raw) weights under the official DiT key names"},
    {"bench", bench, "measure training and sampling throughput on synthetic data (--sd PATH: SD's; --sd-train: SD training's)"},
    {"prepare", cmd_prepare, "encode captioned pictures into MDS shards of latents and text embeddings"},
    {"lora", cmd_lora, "fold LoRA files into a Stable Diffusion model and write it (lora merge)"},
    {"tokenize", cmd_tokenize, "print the CLIP token ids of prompts, 77 a line, and their token counts"},
};

static void usage(FILE *out) {
    fprintf(out, "usage: diffusion <command> [flags]   (diffusion <command> --help for flags)\n"
                 "       diffusion --version\n\n"
                 "commands:\n");
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        fprintf(out, "  %-8s %s\n", k_commands[i].name, k_commands[i].help);
    fprintf(out, "\nexit status: 0 done, 1 the command failed, 2 a malformed command line,\n"
                 "128+N training stopped by signal N (after writing a checkpoint)\n");
}

static void version(void) {
#if defined(__clang__)
    const char *cc = "clang " __clang_version__;
#elif defined(__GNUC__)
    const char *cc = "gcc " __VERSION__;
#else
    const char *cc = "an unknown C compiler";
#endif
#ifdef DC_HAVE_CUDA
    const char *cuda = "yes";
#else
    const char *cuda = "no (rebuild with nvcc present for GPUs)";
#endif
    printf("diffusion " DC_VERSION "\nbuilt with %s; CUDA backend: %s\nOpenBLAS kernels: %s\n", cc, cuda,
           dc_cpu_blas_core());
}

int main(int argc, char **argv) {
    if (argc < 2) return usage(stderr), CLI_EXIT_USAGE;
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help"))
        return usage(stdout), 0;
    if (!strcmp(argv[1], "--version")) return version(), 0;
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        if (strcmp(argv[1], k_commands[i].name) == 0) return k_commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "error: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return CLI_EXIT_USAGE;
}
