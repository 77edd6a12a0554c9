// The subcommands of the `diffusion` program. Each returns the exit status:
// 0 on success, 1 when the command failed (a file, the data, the device, a
// value that does not fit the model), 2 for a malformed command line (an
// unknown flag, a bad or missing value), 128 + N when training was stopped
// by signal N after writing its checkpoint.
#pragma once

int cmd_train(int argc, char **argv);
int cmd_sample(int argc, char **argv);
int cmd_forward(int argc, char **argv);
int cmd_forward_sd(int argc, char **argv);  // forward --component
int cmd_info(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_sd(int argc, char **argv);  // bench --sd (main.c picks it)
int cmd_bench_sd_train(int argc, char **argv);  // bench --sd-train (main.c picks it)
int cmd_tokenize(int argc, char **argv);
int cmd_lora(int argc, char **argv);
int cmd_txt2img(int argc, char **argv);
int cmd_img2img(int argc, char **argv);
int cmd_prepare(int argc, char **argv);

#define CLI_EXIT_FAILURE 1
#define CLI_EXIT_USAGE 2
// Print "error: <message>" to stderr and return the exit status: 1 for a
// failed command, 2 for a command line at fault.
int cli_fail(void);
int cli_usage_fail(void);
