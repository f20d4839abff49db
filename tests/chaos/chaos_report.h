/*
 * chaos_report.h — the chaos rank's report: DIR/rank-<R>.log, one record a
 * line (the format is these notes'; tests/chaos/chaos_report.py reads it,
 * docs/chaos.md says what the driver makes of the records).
 *
 * Design notes
 *  - One write() per line, with O_APPEND: a rank killed at any moment
 *    leaves only whole lines, which the driver reads.
 *  - `key=value` fields separated by single spaces; only the last field,
 *    msg=, may hold spaces. Newlines in a message become spaces and a line
 *    is cut at CH_LINE_MAX bytes, so a record is always one line.
 *  - Also counts what the end line sums up (works, ok, failed, bytes
 *    checked, violations). Called from the main thread only.
 */
#ifndef CHAOS_REPORT_H
#define CHAOS_REPORT_H

#include <stdbool.h>
#include <stdint.h>

#define CH_LINE_MAX 8192

typedef struct ch_report {
    int fd;
    uint64_t works, ok, failed, bytes_checked, violations, faults;
} ch_report;

/* ch_report_open: create DIR (if missing) and DIR/rank-<rank>.log.
 * Returns false (with errno) on failure. */
bool ch_report_open(ch_report *r, const char *dir, int rank);
void ch_report_close(ch_report *r);

/* ch_report_line: one record, printf-style, without the newline; `msg` (may
 * be NULL) is appended as the last field, msg=... */
void ch_report_line(ch_report *r, const char *msg, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ch_violation: a violation record (and the count). */
void ch_violation(ch_report *r, const char *kind, int round, int seq, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#endif
