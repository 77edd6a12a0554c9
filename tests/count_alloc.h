// The CPU backend with every allocation counted (and, for tests of running
// short, capped). A counter's `be` is a copy of the CPU backend's table whose
// alloc and free keep `now` (bytes held) and `peak` (their most since the
// last reset), and refuse an allocation that would hold more than `cap`
// (0: no cap). Each counter counts on its own (one per rank of a job).
#pragma once
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"

typedef struct {
    void *p;
    size_t bytes;
} count_rec;

typedef struct {
    dc_backend be;  // first: the callbacks find their counter from the backend they are given
    dc_backend *cpu;
    count_rec live[4096];
    int nlive;
    int64_t now, peak, cap;
    int64_t allocs, frees;  // calls so far
} counter;

static void *count_alloc(dc_backend *be, size_t bytes) {
    counter *k = (counter *)be;
    if (k->cap && k->now + (int64_t)bytes > k->cap) {
        dc_fail("test cap: %zu bytes more would hold %lld of at most %lld", bytes, (long long)(k->now + bytes),
                (long long)k->cap);
        return NULL;
    }
    if (k->nlive == (int)(sizeof k->live / sizeof k->live[0])) return dc_fail("test: too many allocations"), NULL;
    void *p = k->cpu->alloc(k->cpu, bytes);
    if (!p) return NULL;
    k->live[k->nlive++] = (count_rec){p, bytes};
    k->allocs++;
    k->now += (int64_t)bytes;
    if (k->now > k->peak) k->peak = k->now;
    return p;
}

static void count_free(dc_backend *be, void *p) {
    counter *k = (counter *)be;
    if (!p) return;
    k->frees++;
    for (int i = 0; i < k->nlive; i++)
        if (k->live[i].p == p) {
            k->now -= (int64_t)k->live[i].bytes;
            k->live[i] = k->live[--k->nlive];
            break;
        }
    k->cpu->free(k->cpu, p);
}

// Counts on a new CPU backend (k is large: static or on the heap); 0 or -1.
static int counter_init(counter *k) {
    memset(k, 0, sizeof *k);
    if (!(k->cpu = dc_backend_cpu_create())) return -1;
    k->be = *k->cpu;
    k->be.alloc = count_alloc, k->be.free = count_free;
    return 0;
}

static void counter_free(counter *k) {
    if (k->cpu) dc_backend_destroy(k->cpu);
    k->cpu = NULL;
}

// Forgets the peak and sets a cap (0: none) for what comes next.
static void counter_reset(counter *k, int64_t cap) { k->peak = k->now, k->cap = cap; }
