/*
 * chaos_report.c — the chaos rank's report lines (chaos_report.h).
 */
#include "tests/chaos/chaos_report.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

bool ch_report_open(ch_report *r, const char *dir, int rank) {
    memset(r, 0, sizeof *r);
    r->fd = -1;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) return false;
    char path[4096];
    if (snprintf(path, sizeof path, "%s/rank-%d.log", dir, rank) >= (int)sizeof path) {
        errno = ENAMETOOLONG;
        return false;
    }
    r->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_TRUNC | O_CLOEXEC, 0666);
    return r->fd >= 0;
}

void ch_report_close(ch_report *r) {
    if (r->fd >= 0) close(r->fd);
    r->fd = -1;
}

static void write_line(ch_report *r, char *line, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (line[i] == '\n' || line[i] == '\r') line[i] = ' ';
    line[len++] = '\n';
    if (r->fd < 0) return;
    ssize_t n;
    do
        n = write(r->fd, line, len);
    while (n < 0 && errno == EINTR);
}

static void vline(ch_report *r, const char *msg, const char *fmt, va_list ap) {
    char line[CH_LINE_MAX + 1];
    size_t cap = CH_LINE_MAX; /* leaves room for the newline */
    int n = vsnprintf(line, cap, fmt, ap);
    size_t len = n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
    if (msg) {
        int m = snprintf(line + len, cap - len, " msg=%s", msg);
        len += m < 0 ? 0 : (size_t)m < cap - len ? (size_t)m : cap - len - 1;
    }
    write_line(r, line, len);
}

void ch_report_line(ch_report *r, const char *msg, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vline(r, msg, fmt, ap);
    va_end(ap);
}

void ch_violation(ch_report *r, const char *kind, int round, int seq, const char *fmt, ...) {
    char msg[CH_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->violations++;
    ch_report_line(r, msg, "violation kind=%s r=%d seq=%d", kind, round, seq);
    /* also on stderr: collie-run prefixes it with the rank */
    fprintf(stderr, "chaos violation kind=%s r=%d seq=%d: %s\n", kind, round, seq, msg);
}
