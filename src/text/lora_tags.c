#include "text/lora_tags.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

// One multiplier, "0.8" or "te=0.8"; *which: 0 te, 1 unet, -1 positional.
static int multiplier(const char *s, size_t n, float *v, int *which, const char *tag, int len) {
    char buf[64];
    *which = -1;
    if (n > 3 && !strncmp(s, "te=", 3)) *which = 0, s += 3, n -= 3;
    else if (n > 5 && !strncmp(s, "unet=", 5)) *which = 1, s += 5, n -= 5;
    else if (n > 4 && !strncmp(s, "dyn=", 4))
        return dc_fail("<%.*s>: dyn= (DyLoRA's rank) is not supported", len, tag);
    if (n == 0 || n >= sizeof buf) return dc_fail("<%.*s>: a multiplier expected", len, tag);
    memcpy(buf, s, n);
    buf[n] = 0;
    char *end;
    *v = strtof(buf, &end);
    if (*end || !(*v >= -10 && *v <= 10)) return dc_fail("<%.*s>: '%s' is not a multiplier in -10..10", len, tag, buf);
    return 0;
}

// The tag body "lora:NAME[:A[:B]]" (len bytes at t) into *out.
static int parse_tag(const char *t, int len, dc_lora_tag *out) {
    const char *body = t + 5, *end = t + len;  // after "lora:"
    const char *colon = memchr(body, ':', (size_t)(end - body));
    const char *name_end = colon ? colon : end;
    if (name_end == body || name_end - body >= DC_LORA_TAG_NAME) return dc_fail("<%.*s>: a LoRA name expected", len, t);
    memcpy(out->name, body, (size_t)(name_end - body));
    out->name[name_end - body] = 0;
    float v[2] = {1.0f, 1.0f};
    bool set[2] = {false, false};
    int k = 0;
    for (const char *s = colon ? colon + 1 : end; s < end; k++) {
        const char *c = memchr(s, ':', (size_t)(end - s));
        const char *e = c ? c : end;
        if (k == 2) return dc_fail("<%.*s>: at most two multipliers (text encoder, UNet)", len, t);
        float x = 1.0f;
        int which = -1;
        DC_TRY(multiplier(s, (size_t)(e - s), &x, &which, t, len));
        const int slot = which >= 0 ? which : k;
        v[slot] = x, set[slot] = true;
        s = c ? c + 1 : end;
    }
    out->te = v[0];
    out->unet = set[1] ? v[1] : v[0];  // the UNet's follows the text encoder's unless given
    return 0;
}

int dc_lora_tags_parse(const char *prompt, char *clean, size_t cap, dc_lora_tag *tags, int *n) {
    *n = 0;
    size_t k = 0;
    for (const char *p = prompt; *p;) {
        const char *close = !strncmp(p, "<lora:", 6) ? strchr(p, '>') : NULL;
        if (close) {
            if (*n == DC_LORA_TAGS_MAX) return dc_fail("a prompt holds more than %d LoRA tags", DC_LORA_TAGS_MAX);
            DC_TRY(parse_tag(p + 1, (int)(close - p - 1), &tags[(*n)++]));
            p = close + 1;
            continue;
        }
        if (k + 1 >= cap) return dc_fail("the prompt is too long");
        clean[k++] = *p++;
    }
    clean[k] = 0;
    return 0;
}
