/*
 * log.c — leveled logging to stderr.
 *
 * Design notes: one fprintf per line under stdio's own FILE lock, so lines
 * from different threads never interleave. The level is read once from the
 * parsed config; log calls made while the config is being parsed use the
 * default level (no recursion into the parser).
 */
#include "engine/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/config.h"

static const char *const cl_level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};

bool cl_log_enabled(int level) { return level <= cl_config_get()->log_level; }

void cl_log(int level, const char *module, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cl_vlog(level, module, fmt, ap);
    va_end(ap);
}

void cl_vlog(int level, const char *module, const char *fmt, va_list ap) {
    if (!cl_log_enabled(level)) return;
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "%02d:%02d:%02d.%06ld collie[%d] %-5s %s: %s\n", tm.tm_hour, tm.tm_min,
            tm.tm_sec, ts.tv_nsec / 1000, (int)getpid(), cl_level_names[level], module, msg);
}
