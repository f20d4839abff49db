/*
 * kit_report.c — the kit's report: one line per result on stdout, the same
 * lines in report.txt, the same as data in report.json.
 *
 * Design notes
 *  - Each check prints one line `PASS|FAIL|SKIP <name>: <detail>` with its
 *    figures ("name=value" pairs) after " | "; report.json holds every
 *    result with its figures as an object, then the counts.
 *  - Lines go out as they come (stdout is flushed), so a check that hangs
 *    past the caller's bound (run.sh sets none: every check bounds its own
 *    waits) still leaves the earlier ones.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "gpu_check.h"

static FILE *report_txt, *report_json;
static int npass, nfail, nskip;
static bool json_first = true;

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", *s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

void kit_result(const char *status, const char *name, const char *figures, const char *fmt, ...) {
    char detail[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    if (!strcmp(status, "PASS")) npass++;
    if (!strcmp(status, "FAIL")) nfail++;
    if (!strcmp(status, "SKIP")) nskip++;
    printf("%s %s: %s%s%s\n", status, name, detail, figures[0] ? " | " : "", figures);
    fflush(stdout);
    if (report_txt)
        fprintf(report_txt, "%s %s: %s%s%s\n", status, name, detail, figures[0] ? " | " : "",
                figures);
    if (!report_json) return;
    fprintf(report_json, "%s\n  {\"check\": ", json_first ? "" : ",");
    json_first = false;
    json_str(report_json, name);
    fprintf(report_json, ", \"status\": ");
    json_str(report_json, status);
    fprintf(report_json, ", \"detail\": ");
    json_str(report_json, detail);
    fprintf(report_json, ", \"figures\": {");
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", figures);
    bool first = true;
    for (char *save = NULL, *tok = strtok_r(copy, " ", &save); tok;
         tok = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) continue;
        *eq = '\0';
        fprintf(report_json, "%s", first ? "" : ", ");
        first = false;
        json_str(report_json, tok);
        fprintf(report_json, ": ");
        json_str(report_json, eq + 1);
    }
    fprintf(report_json, "}}");
}

int kit_report_open(const char *dir) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "collie-gpucheck: cannot make %s: %s\n", dir, strerror(errno));
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/report.txt", dir);
    report_txt = fopen(path, "w");
    snprintf(path, sizeof path, "%s/report.json", dir);
    report_json = fopen(path, "w");
    if (!report_txt || !report_json) {
        fprintf(stderr, "collie-gpucheck: cannot write the report in %s\n", dir);
        return 2;
    }
    fprintf(report_json, "{\"checks\": [");
    return 0;
}

int kit_report_close(void) {
    fprintf(report_json, "\n], \"passed\": %d, \"failed\": %d, \"skipped\": %d}\n", npass, nfail,
            nskip);
    fprintf(report_txt, "%d passed, %d failed, %d skipped\n", npass, nfail, nskip);
    fclose(report_json);
    fclose(report_txt);
    printf("%d passed, %d failed, %d skipped\n", npass, nfail, nskip);
    return nfail;
}
