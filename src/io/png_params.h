// How a picture was made, in the text AUTOMATIC1111's web UI writes into the
// `parameters` chunk of its PNGs (and other tools read back):
//   a cat
//   Negative prompt: blurry
//   Steps: 20, Sampler: Euler a, CFG scale: 7, Seed: 42, Size: 512x512, Model: v1-5
// The negative prompt line appears only when there is one. It is a file
// format, so it lives with the PNG code rather than with the samplers.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define DC_PNG_PARAMETERS_KEY "parameters"

typedef struct {
    const char *prompt;           // may hold newlines
    const char *negative_prompt;  // NULL or "" for none
    int steps;
    const char *sampler;          // "Euler a", "DDIM", ...
    float cfg_scale;
    uint64_t seed;
    int width, height;
    const char *model;            // the checkpoint's name
    const char *extra;            // NULL, or more "Key: value, Key: value" after Model, as
                                  // A1111 appends its other settings
} dc_gen_params;

// The parameters text into a new string (free it), or NULL out of memory.
// Numbers are printed as Python prints them in A1111 (7, 7.5); a sampler or
// model name holding ',', ':' or a newline is quoted as JSON, as A1111's
// infotext quote() does.
char *dc_gen_params_format(const dc_gen_params *p);
