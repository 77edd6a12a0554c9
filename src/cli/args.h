// Command-line flags: a table per command, strict parsing, generated --help.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum { ARG_INT, ARG_FLOAT, ARG_STR, ARG_FLAG, ARG_U64, ARG_LIST } arg_kind;

#define ARGS_MAX_LIST 16
// An ARG_LIST flag's values, in the order given: the one flag that may repeat.
typedef struct {
    const char *v[ARGS_MAX_LIST];
    int n;
} arg_list;

typedef struct {
    const char *name;  // without the leading "--"
    arg_kind kind;
    void *dst;         // int*, float*, const char**, bool*, uint64_t*, arg_list*
    const char *meta;  // value placeholder in help ("N", "PATH")
    const char *help;  // --help appends " (default X)" from *dst, unless the
                       // text already says "default" (then it says it better)
} arg_spec;

#define ARGS_MAX_SPECS 96

typedef struct {
    const char *usage;    // "diffusion train [flags]"
    const char *summary;  // one paragraph
    const arg_spec *specs;
    int nspecs;           // at most ARGS_MAX_SPECS
    int max_positional;
    const char *positional[4];
    int npositional;
    bool given[ARGS_MAX_SPECS];  // set by args_parse: which flags the command line holds
} arg_parser;

// Parses argv[1..argc). Returns 0, 1 when --help was printed, or -1 with an
// error message naming the flag (unknown, malformed or out-of-range values,
// a flag given twice unless it is a list, a list given too often).
int args_parse(arg_parser *p, int argc, char **argv);
void args_help(const arg_parser *p, FILE *out);
// Was the flag given on the command line (by the last args_parse)?
bool args_given(const arg_parser *p, const char *name);
