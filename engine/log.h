/*
 * log.h — leveled logging to stderr, COLLIE_LOG_FILE or the program's
 * handler (collie_set_log_handler). The level comes from COLLIE_LOG
 * (error|warn|info|debug, default warn) or collie_set_log_level. Each line
 * carries a timestamp, the pid, the module, the comm and rank when there is
 * one, and the message.
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
/* cl_log_comm: a line about communicator `comm` (its name), rank `rank`
 * (-1: none); handlers get them as fields, stderr shows "comm 'x' rank r: " */
void cl_log_comm(int level, const char *module, const char *comm, int rank, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void cl_vlog_comm(int level, const char *module, const char *comm, int rank, const char *fmt,
                  va_list ap);

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

/* The same for a line about a communicator (a struct with name and rank). */
#define CL_CERROR(mod, c, ...) cl_log_comm(CL_LOG_ERROR, mod, (c)->name, (c)->rank, __VA_ARGS__)
#define CL_CWARN(mod, c, ...)  cl_log_comm(CL_LOG_WARN, mod, (c)->name, (c)->rank, __VA_ARGS__)
#define CL_CINFO(mod, c, ...)                                                                      \
    do {                                                                                           \
        if (cl_log_enabled(CL_LOG_INFO))                                                           \
            cl_log_comm(CL_LOG_INFO, mod, (c)->name, (c)->rank, __VA_ARGS__);                      \
    } while (0)
#define CL_CDEBUG(mod, c, ...)                                                                     \
    do {                                                                                           \
        if (cl_log_enabled(CL_LOG_DEBUG))                                                          \
            cl_log_comm(CL_LOG_DEBUG, mod, (c)->name, (c)->rank, __VA_ARGS__);                     \
    } while (0)

#endif
