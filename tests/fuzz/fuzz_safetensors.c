// libFuzzer harness for the safetensors reader (and the JSON parser under it),
// checksum verification included. Built by `make fuzz-build` and run by
// `make fuzz` with the other harnesses (tests/fuzz/run.sh).
// Any accepted file must keep every tensor inside its buffer; reading each
// tensor lets ASan catch an out-of-bounds conversion. The input is also fed
// to the JSON parser alone, which the safetensors reader only ever hands
// UTF-8 it has already checked.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dc_json_doc doc;
    if (dc_json_parse(&doc, (const char *)data, size, 0) == 0) dc_json_free(&doc);
    dc_st_file f;
    if (dc_st_parse(&f, data, size, "fuzz") != 0) return 0;
    for (int i = 0; i < f.count; i++) {
        const dc_st_tensor *t = &f.tensors[i];
        if (t->begin > t->end || t->end > f.data_len ||
            t->end - t->begin != (uint64_t)t->numel * dc_dtype_size(t->dtype))
            abort();  // the reader accepted a tensor outside its buffer
        if (t->numel > (1 << 20)) continue;
        void *out = malloc((size_t)(t->numel ? t->numel : 1) * 8);
        if (dc_st_read_f32(&f, t, out) != 0 && dc_st_read_i64(&f, t, out) != 0) abort();
        free(out);
    }
    dc_st_close(&f);
    return 0;
}
