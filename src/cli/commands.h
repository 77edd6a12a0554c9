// The subcommands of the `diffusion` program. Each returns the exit status.
#pragma once

int cmd_train(int argc, char **argv);
int cmd_sample(int argc, char **argv);
int cmd_forward(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_bench(int argc, char **argv);

// Prints "error: <message>" to stderr and returns 1 (the CLI's exit status).
int cli_fail(void);
