/*
 * common.c — clock, last-error slot, errno mapping, small allocation helpers.
 */
#include "engine/common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/log.h"

int64_t cl_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t cl_deadline_ns(int64_t now_ns, int32_t timeout_ms) {
    if (timeout_ms < 0) return INT64_MAX;
    return now_ns + (int64_t)timeout_ms * CL_NS_PER_MS;
}

static _Thread_local char cl_last_error_buf[512];

int cl_set_last_error(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cl_last_error_buf, sizeof cl_last_error_buf, fmt, ap);
    va_end(ap);
    CL_DEBUG("api", "%s: %s", collie_status_name(status), cl_last_error_buf);
    return status;
}

void cl_clear_last_error(void) { cl_last_error_buf[0] = '\0'; }

const char *collie_last_error(void) { return cl_last_error_buf; }

int cl_errno_status(int err) {
    switch (err) {
    case 0: return COLLIE_OK;
    case EINVAL: return COLLIE_EINVAL;
    case ENOMEM: return COLLIE_ENOMEM;
    case ETIMEDOUT: return COLLIE_ETIMEDOUT;
    case ECANCELED: return COLLIE_ECANCELED;
    case ECONNRESET:
    case ECONNREFUSED:
    case ECONNABORTED:
    case EPIPE:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN: return COLLIE_EPEER;
    case ENOTSUP: return COLLIE_ENOTSUP;
    case EEXIST: return COLLIE_EEXIST;
    case ENOENT: return COLLIE_ENOENT;
    case EMFILE:
    case ENFILE: return COLLIE_ELIMIT;
    default: return COLLIE_ESYSTEM;
    }
}

char *cl_strdup(const char *s) { return s ? cl_memdup(s, strlen(s) + 1) : NULL; }

void *cl_memdup(const void *p, size_t n) {
    void *q = malloc(n ? n : 1);
    if (q && n) memcpy(q, p, n);
    return q;
}
