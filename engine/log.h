/*
 * log.h — leveled logging to stderr. The level comes from COLLIE_LOG
 * (error|warn|info|debug, default warn). Each line carries a timestamp, the
 * pid, the module and the message.
 */
#ifndef CL_LOG_H
#define CL_LOG_H

#include <stdarg.h>
#include <stdbool.h>

enum cl_log_level { CL_LOG_ERROR = 0, CL_LOG_WARN = 1, CL_LOG_INFO = 2, CL_LOG_DEBUG = 3 };

/* cl_log_enabled: would a message at `level` be printed? */
bool cl_log_enabled(int level);

void cl_log(int level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void cl_vlog(int level, const char *module, const char *fmt, va_list ap);

#define CL_ERROR(mod, ...) cl_log(CL_LOG_ERROR, mod, __VA_ARGS__)
#define CL_WARN(mod, ...)  cl_log(CL_LOG_WARN, mod, __VA_ARGS__)
#define CL_INFO(mod, ...)                                                                          \
    do {                                                                                           \
        if (cl_log_enabled(CL_LOG_INFO)) cl_log(CL_LOG_INFO, mod, __VA_ARGS__);                    \
    } while (0)
#define CL_DEBUG(mod, ...)                                                                         \
    do {                                                                                           \
        if (cl_log_enabled(CL_LOG_DEBUG)) cl_log(CL_LOG_DEBUG, mod, __VA_ARGS__);                  \
    } while (0)

#endif
