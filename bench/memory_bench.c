/*
 * memory_bench.c — memory figures of a rank: peak RSS against the
 * buffers it was given while running 64 MiB allreduces, and a fixed number
 * of allreduces for the allocation count (bench/memory.sh runs it under
 * valgrind with two counts and compares the totals).
 *
 * usage (under collie-run): memory_bench rss [inplace] | memory_bench ops N BYTES
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collie.h"

static long proc_status_kib(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n)) v = atol(line + n);
    if (f) fclose(f);
    return v;
}

static int run(collie_comm *c, float *s, float *r, size_t count, int n) {
    for (int i = 0; i < n; i++) {
        collie_work *w;
        int rc = collie_allreduce(c, s, r, count, COLLIE_FP32, COLLIE_SUM, NULL, &w);
        if (rc == COLLIE_OK) rc = collie_work_wait(w, 60000);
        if (rc != COLLIE_OK) {
            fprintf(stderr, "allreduce: %s %s\n", collie_strerror(rc),
                    w ? collie_work_error_message(w) : collie_last_error());
            return 1;
        }
        collie_work_release(w);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: memory_bench rss [inplace] | memory_bench ops N BYTES\n");
        return 2;
    }
    collie_engine *e;
    collie_comm *c;
    if (collie_engine_create(NULL, &e) || collie_comm_create_from_env(e, NULL, &c)) {
        fprintf(stderr, "setup: %s\n", collie_last_error());
        return 1;
    }
    int rc;
    if (!strcmp(argv[1], "ops") && argc == 4) {
        int n = atoi(argv[2]);
        size_t bytes = strtoul(argv[3], NULL, 10);
        float *buf = calloc(bytes / 4 + 1, 4);
        rc = run(c, buf, buf, bytes / 4, n);
        free(buf);
    } else {
        size_t bytes = 64u << 20;
        int inplace = argc > 2 && !strcmp(argv[2], "inplace");
        long before = proc_status_kib("VmRSS:");
        float *s = malloc(bytes), *r = inplace ? s : malloc(bytes);
        memset(s, 1, bytes);
        if (!inplace) memset(r, 0, bytes);
        rc = run(c, s, r, bytes / 4, 10);
        long given = (inplace ? 1L : 2L) * (long)(bytes >> 10);
        long peak = proc_status_kib("VmHWM:");
        if (collie_comm_rank(c) == 0)
            printf("| %s | %ld | %ld | %ld | %.2f |\n", inplace ? "in place" : "out of place",
                   given, before, peak, (double)peak / (double)given);
        free(s);
        if (!inplace) free(r);
    }
    collie_comm_destroy(c);
    collie_engine_destroy(e);
    return rc;
}
