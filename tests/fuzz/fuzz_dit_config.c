// libFuzzer harness for inferring a DiT's config from tensor shapes, as for
// a plain official state dict (dc_dit_config_from_file without metadata).
// A mutated file rarely keeps its data offsets tiling the buffer, so the
// input here is not a file but the shapes: the harness builds a valid
// safetensors file holding the tensors the inference reads, with the ranks
// and dimensions the input bytes give (zeros and odd sizes included), and
// parses it as a loader would. An accepted config must validate and agree
// with the shapes it came from.
//   byte 0: bit 0 names the tensors "ema.<key>" (the prefix a checkpoint's
//           EMA weights have), bit 1 lets each tensor's rank vary too
//   byte 1: blocks (0..3), byte 2: heads (0: the official table's)
//   then, per tensor: [rank byte,] one byte per dimension (0..39)
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "models/dit_io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
    const uint8_t *p;
    size_t n, at;
} reader;

static int next(reader *r) { return r->at < r->n ? r->p[r->at++] : 0; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    reader r = {data, size, 0};
    int flags = next(&r), depth = next(&r) % 4, heads = next(&r) % 5;
    const char *prefix = flags & 1 ? "ema." : "";
    // the tensors infer_from_shapes reads, with their official ranks
    const char *keys[8] = {"x_embedder.proj.weight", "pos_embed", "blocks.0.mlp.fc1.weight",
                           "y_embedder.embedding_table.weight", "final_layer.linear.weight"};
    int ranks[8] = {4, 3, 2, 2, 2}, count = 5;
    static const char *const qkv[3] = {"blocks.0.attn.qkv.weight", "blocks.1.attn.qkv.weight",
                                       "blocks.2.attn.qkv.weight"};
    for (int i = 0; i < depth; i++) keys[count] = qkv[i], ranks[count++] = 2;

    dc_st_entry e[8];
    char names[8][64];
    static float zeros[1 << 16];  // every tensor's data
    int64_t total = 0;
    for (int i = 0; i < count; i++) {
        int rank = flags & 2 ? next(&r) % 6 : ranks[i];
        e[i] = (dc_st_entry){.name = names[i], .dtype = DC_F32, .ndim = rank, .data = zeros};
        snprintf(names[i], sizeof names[i], "%s%s", prefix, keys[i]);
        int64_t numel = 1;
        for (int d = 0; d < rank; d++) numel *= e[i].shape[d] = next(&r) % 40;
        // a few thousand values suffice for every case; keep runs fast
        if ((total += numel) > (int64_t)(sizeof zeros / sizeof zeros[0])) return 0;
    }
    uint8_t *file;
    size_t len;
    if (dc_st_serialize(e, count, NULL, NULL, 0, &file, &len) != 0) abort();
    dc_st_file f;
    if (dc_st_parse(&f, file, len, "fuzz.safetensors") != 0) abort();  // the writer's own file
    free(file);
    dc_dit_config c;
    if (dc_dit_config_from_file(&f, prefix, heads, &c) == 0) {
        if (dc_dit_config_validate(&c) != 0) abort();  // returned a config it does not accept
        const dc_st_tensor *xe = dc_st_find(&f, names[0]);
        if (c.hidden != xe->shape[0] || c.in_channels != xe->shape[1] || c.patch != xe->shape[2] ||
            c.depth != depth || (heads && c.heads != heads))
            abort();  // a config that is not what the shapes say
    }
    dc_st_close(&f);
    return 0;
}
