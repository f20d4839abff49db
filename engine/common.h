/*
 * common.h — small helpers every module uses: the monotonic clock, the
 * error-check macros, container_of, the thread-local last-error slot (the
 * little-endian helpers of the wire formats come from base/endian.h).
 */
#ifndef CL_COMMON_H
#define CL_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "collie.h"
#include "base/endian.h" /* cl_put32le and friends (the wire formats) */

#define CL_NS_PER_MS 1000000LL

/* cl_now_ns: CLOCK_MONOTONIC in nanoseconds. */
int64_t cl_now_ns(void);

/* cl_deadline_ns: now + timeout_ms, or INT64_MAX for COLLIE_TIMEOUT_INFINITE. */
int64_t cl_deadline_ns(int64_t now_ns, int32_t timeout_ms);

#define cl_container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

#define CL_UNUSED(x) ((void)(x))

/* CL_CHECK_GOTO: evaluate a status expression; on error store it in `res`
 * and jump to `label` (the function's one cleanup label). */
#define CL_CHECK_GOTO(expr, res, label)                                                            \
    do {                                                                                           \
        int cl_st_ = (expr);                                                                       \
        if (cl_st_ < 0) {                                                                          \
            (res) = cl_st_;                                                                        \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* cl_set_last_error: record the detail of a failed call for this thread
 * (collie_last_error) and return `status`, so a caller can write
 * `return cl_set_last_error(COLLIE_EINVAL, "...")`. Logged at debug level. */
int cl_set_last_error(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* cl_clear_last_error: reset this thread's slot (at the start of API calls
 * that report details). */
void cl_clear_last_error(void);

/* cl_status_is_error: is `status` one of collie's errors (COLLIE_STATUS_MAP,
 * below 0)? A status read from outside (a store reply, a poison) that is
 * not, is no code a caller can name (status.c). */
bool cl_status_is_error(long status);

/* cl_errno_status: map an errno value to a collie status. */
int cl_errno_status(int err);

/* cl_strdup / cl_memdup: allocation helpers returning NULL on failure. */
char *cl_strdup(const char *s);
void *cl_memdup(const void *p, size_t n);

/* cl_opts_ok: an options struct pointer is acceptable if NULL, or if its
 * size field is at least `min_size` (the first version of the struct). */
#define cl_opts_ok(o, min_size) ((o) == NULL || (o)->size >= (min_size))

/* cl_opt: read field `f` of a size-versioned options struct, or `dflt` if
 * the struct is NULL or too old to have the field. */
#define cl_opt(o, f, dflt)                                                                         \
    (((o) != NULL && (o)->size >= offsetof(__typeof__(*(o)), f) + sizeof((o)->f)) ? (o)->f : (dflt))

#endif
