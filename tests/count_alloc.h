// The CPU backend with every allocation counted (and, for tests of running
// short, capped): count_backend(cpu) returns a copy of cpu's table whose
// alloc and free keep g_now (bytes held), g_peak (their most since the last
// reset) and refuse an allocation that would hold more than g_cap (0: no cap).
#pragma once
#include <stdint.h>
#include <stdio.h>

#include "backend/backend.h"
#include "core/error.h"

static dc_backend *g_cpu;
typedef struct {
    void *p;
    size_t bytes;
} count_rec;
static count_rec g_live[4096];
static int g_nlive;
static int64_t g_now, g_peak, g_cap;

static void *count_alloc(dc_backend *be, size_t bytes) {
    (void)be;
    if (g_cap && g_now + (int64_t)bytes > g_cap) {
        dc_fail("test cap: %zu bytes more would hold %lld of at most %lld", bytes, (long long)(g_now + bytes),
                (long long)g_cap);
        return NULL;
    }
    if (g_nlive == (int)(sizeof g_live / sizeof g_live[0])) return dc_fail("test: too many allocations"), NULL;
    void *p = g_cpu->alloc(g_cpu, bytes);
    if (!p) return NULL;
    g_live[g_nlive++] = (count_rec){p, bytes};
    g_now += (int64_t)bytes;
    if (g_now > g_peak) g_peak = g_now;
    return p;
}

static void count_free(dc_backend *be, void *p) {
    (void)be;
    if (!p) return;
    for (int i = 0; i < g_nlive; i++)
        if (g_live[i].p == p) {
            g_now -= (int64_t)g_live[i].bytes;
            g_live[i] = g_live[--g_nlive];
            break;
        }
    g_cpu->free(g_cpu, p);
}

// A counting copy of cpu (which stays the owner: destroy cpu, not the copy).
static dc_backend count_backend(dc_backend *cpu) {
    g_cpu = cpu;
    dc_backend b = *cpu;
    b.alloc = count_alloc, b.free = count_free;
    return b;
}
