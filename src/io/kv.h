// A small ordered list of string key/value pairs: the __metadata__ of the
// safetensors files the engine writes (config, training settings, state).
#pragma once
#include "core/error.h"

#define DC_KV_MAX 96

typedef struct {
    int n;
    char *keys[DC_KV_MAX];
    char *values[DC_KV_MAX];
} dc_kv;

// Sets (or replaces) key to the formatted value. 0 or -1 (message set).
int dc_kv_set(dc_kv *kv, const char *key, const char *fmt, ...) DC_PRINTF(3, 4);
// The value of key, or NULL when it is not set.
const char *dc_kv_get(const dc_kv *kv, const char *key);
void dc_kv_free(dc_kv *kv);
