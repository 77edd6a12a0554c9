// Status and error messages. Library functions return 0 on success and -1 on
// failure, after leaving a message (naming the file, tensor or flag at fault)
// that the caller reads with dc_error(). Only the CLI decides to exit.
#pragma once
#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DC_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DC_PRINTF(a, b)
#endif

// Set the message and return -1, so `return dc_fail("...")` reads naturally.
int dc_fail(const char *fmt, ...) DC_PRINTF(1, 2);
// Prefix the current message with more context ("loading x.safetensors: ...").
int dc_fail_ctx(const char *fmt, ...) DC_PRINTF(1, 2);
const char *dc_error(void);
void dc_error_clear(void);

#define DC_TRY(expr)                                                           \
    do {                                                                       \
        if ((expr) != 0) return -1;                                            \
    } while (0)

#ifdef __cplusplus
}
#endif
