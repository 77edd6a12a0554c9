// DiT configurations: the twelve official ones by name, validation, FLOPs.
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "models/dit.h"

enum { DC_DIT_MAX_TOKENS = 65536 };

static const struct { const char *size; int depth, hidden, heads; } k_sizes[] = {
    {"XL", 28, 1152, 16}, {"L", 24, 1024, 16}, {"B", 12, 768, 12}, {"S", 12, 384, 6},
};

int dc_dit_config_from_name(const char *name, dc_dit_config *cfg) {
    char size[8];
    int patch, used = 0;
    if (sscanf(name, "DiT-%3[A-Z]/%d%n", size, &patch, &used) != 2 || name[used] != 0 ||
        (patch != 2 && patch != 4 && patch != 8))
        return dc_fail("unknown model '%s' (expected DiT-{S,B,L,XL}/{2,4,8})", name);
    for (size_t i = 0; i < sizeof k_sizes / sizeof k_sizes[0]; i++) {
        if (strcmp(size, k_sizes[i].size) != 0) continue;
        *cfg = (dc_dit_config){
            .input_size = 32, .patch = patch, .in_channels = 4, .hidden = k_sizes[i].hidden,
            .depth = k_sizes[i].depth, .heads = k_sizes[i].heads,
            .mlp_hidden = 4 * k_sizes[i].hidden, .num_classes = 1000, .learn_sigma = true,
        };
        return 0;
    }
    return dc_fail("unknown model '%s' (expected DiT-{S,B,L,XL}/{2,4,8})", name);
}

int dc_dit_heads_for_width(int hidden) {
    for (size_t i = 0; i < sizeof k_sizes / sizeof k_sizes[0]; i++)
        if (k_sizes[i].hidden == hidden) return k_sizes[i].heads;
    return 0;
}

int dc_dit_config_validate(const dc_dit_config *c) {
    if (c->patch < 1 || c->patch > 64) return dc_fail("patch size %d is out of range (1..64)", c->patch);
    if (c->input_size < 1 || c->input_size > 4096)
        return dc_fail("input size %d is out of range (1..4096)", c->input_size);
    if (c->input_size < c->patch || c->input_size % c->patch)
        return dc_fail("input size %d is not a multiple of patch size %d", c->input_size, c->patch);
    int tokens = (c->input_size / c->patch) * (c->input_size / c->patch);
    // Attention works in blocks, so its memory does not grow with the square
    // of the length; the bound is a 256 x 256 grid, and dc_dit_reserve refuses
    // a batch whose activations would pass 2^31 elements.
    if (tokens > DC_DIT_MAX_TOKENS)
        return dc_fail("%d tokens (input %d, patch %d): at most %d are supported", tokens,
                       c->input_size, c->patch, DC_DIT_MAX_TOKENS);
    if (c->in_channels < 1 || c->in_channels > 1024)
        return dc_fail("%d input channels is out of range (1..1024)", c->in_channels);
    if (c->hidden < 4 || c->hidden > 65536)
        return dc_fail("hidden width %d is out of range (4..65536)", c->hidden);
    if (c->hidden % 4)
        return dc_fail("hidden width %d must be a multiple of 4 (2-D sin-cos positions)", c->hidden);
    if (c->heads < 1 || c->hidden % c->heads)
        return dc_fail("hidden width %d is not divisible by %d heads", c->hidden, c->heads);
    if (c->depth < 1 || c->depth > 1024) return dc_fail("depth %d is out of range (1..1024)", c->depth);
    if (c->mlp_hidden < 1 || c->mlp_hidden > 16 * 65536)
        return dc_fail("MLP width %d is out of range (1..%d)", c->mlp_hidden, 16 * 65536);
    if (c->num_classes < 1 || c->num_classes > 1000000)
        return dc_fail("%d classes is out of range (1..1000000)", c->num_classes);
    return 0;
}

double dc_dit_macs_per_image(const dc_dit_config *c) {
    double T = dc_dit_tokens(c), D = c->hidden, F = c->mlp_hidden;
    double P = (double)c->patch * c->patch;
    double block = T * (3 * D * D + D * D + 2 * D * F) + 2 * T * T * D + D * 6 * D;
    double embed = T * P * c->in_channels * D + 256 * D + D * D;
    double final = D * 2 * D + T * D * P * dc_dit_out_channels(c);
    return c->depth * block + embed + final;
}
