// CHECK(cond, fmt, ...): counts a passed check, or prints the failure with
// its place and counts it; the program reports g_pass and g_fail at the end.
#pragma once
#include <stdio.h>

static int g_pass, g_fail;

#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (cond) g_pass++;                                                    \
        else {                                                                 \
            g_fail++;                                                          \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                        \
            printf(__VA_ARGS__);                                               \
            printf("\n");                                                      \
        }                                                                      \
    } while (0)
