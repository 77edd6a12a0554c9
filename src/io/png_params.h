// How a picture was made, in the text AUTOMATIC1111's web UI writes into the
// `parameters` chunk of its PNGs (and other tools read back):
//   a cat
//   Negative prompt: blurry
//   Steps: 20, Sampler: Euler a, CFG scale: 7, Seed: 42, Size: 512x512, Model hash: 6ce0161689, Model: v1-5
// The negative prompt line appears only when there is one, the model hash
// only when it is known. It is a file format, so it lives with the PNG code
// rather than with the samplers.
//
// Readers split the text into lines (A1111 at each '\n', others wherever
// Python's str.splitlines() does), so a line break inside a prompt could
// plant a line of its own ("Negative prompt: ..." or "Steps: ..."). The
// CLIP tokenizer reads every line break as a space (ftfy's fix_line_breaks,
// then whitespace collapsing), so the prompts are written that way: each of
// \n, \r\n, \r, \v, \f, U+001C..U+001E, U+0085, U+2028 and U+2029 becomes one
// space. The text then has exactly the lines above, and says what the text
// encoder saw.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define DC_PNG_PARAMETERS_KEY "parameters"

typedef struct {
    const char *prompt;           // UTF-8; line breaks are written as spaces
    const char *negative_prompt;  // NULL or "" for none; line breaks as in prompt
    int steps;
    const char *sampler;          // "Euler a", "DDIM", ...
    float cfg_scale;
    uint64_t seed;
    int width, height;
    const char *model_hash;       // NULL or "" for none; A1111: the first 10 hex digits of
                                  // the model file's SHA-256
    const char *model;            // the checkpoint's name
    const char *extra;            // NULL, or more "Key: value, Key: value" after Model, as
                                  // A1111 appends its other settings
} dc_gen_params;

// The parameters text into a new string (free it), or NULL out of memory.
// Numbers are printed as Python prints them in A1111 (7, 7.5); a sampler or
// model name holding ',', ':' or a line break is quoted as JSON, as A1111's
// infotext quote() does (line breaks escaped, so the value stays on its line).
char *dc_gen_params_format(const dc_gen_params *p);
