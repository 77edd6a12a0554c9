// Logging to stderr. Progress lines redraw in place on a terminal and are
// printed as plain lines when stderr is piped to a file.
#pragma once
#include <stdbool.h>
#include "core/error.h"

#ifdef __cplusplus
extern "C" {
#endif

void dc_log(const char *fmt, ...) DC_PRINTF(1, 2);
void dc_warn(const char *fmt, ...) DC_PRINTF(1, 2);
// A progress line; `final` ends it with a newline on a terminal.
void dc_progress(bool final, const char *fmt, ...) DC_PRINTF(2, 3);
bool dc_log_is_tty(void);
double dc_time_now(void);  // monotonic seconds
// Formats seconds as "1h02m", "3m05s" or "12s" into buf.
const char *dc_format_duration(double sec, char *buf, int n);

#ifdef __cplusplus
}
#endif
