/*
 * run_stats.c — --stats: after the job, one line per comm and rank from the
 * files the ranks wrote.
 *
 * Design notes
 *  - --stats: the ranks write each comm's stats into a directory when they
 *    destroy it (COLLIE_STATS_DIR: the caller's if set, and kept; else a
 *    private one under /tmp, removed after the job); after the job the
 *    launcher prints one line per comm and rank from those files.
 *  - A file that does not parse is named and skipped; the latency columns
 *    are bucket bounds (the histogram's), not exact quantiles.
 *  - A comm that failed says so after its status with the same fault data
 *    collie_comm_fault and the flight recorder give: the root fault's kind,
 *    the failed works by kind, and its peers dead, suspected and left then
 *    (comm/stats.c writes them; only what is not zero is shown, the peers only
 *    when one is dead or suspected: peers that left first are how every
 *    job ends).
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "run.h"

typedef struct run_stat_row {
    char comm[80], status[32];
    long long gen, rank, posted, completed, failed, in_flight, bytes, stalls;
    long long p50_us, p99_us; /* bucket upper bounds, -1: beyond the last */
    char failures[160];
    char fault_kind[24], kinds[160];
    long long peers_dead, peers_suspected, peers_left, shrinks, grows;
} run_stat_row;

static long long run_json_int(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (long long)json_integer_value(v) : 0;
}

/* The bucket bound under which `q` of the latencies (all kinds) fall. */
static long long run_quantile_us(json_t *root, double q) {
    json_t *le = json_object_get(root, "latency_us_le"), *lat = json_object_get(root, "latency");
    size_t nb = json_array_size(le);
    if (nb == 0 || nb > 64) return 0;
    unsigned long long sum[64] = {0}, total = 0;
    const char *op;
    json_t *h;
    json_object_foreach(lat, op, h) {
        json_t *b = json_object_get(h, "buckets");
        for (size_t i = 0; i < nb && i < json_array_size(b); i++) {
            sum[i] += (unsigned long long)json_integer_value(json_array_get(b, i));
            total += (unsigned long long)json_integer_value(json_array_get(b, i));
        }
    }
    if (total == 0) return 0;
    unsigned long long seen = 0;
    for (size_t i = 0; i < nb; i++) {
        seen += sum[i];
        if ((double)seen >= q * (double)total)
            return (long long)json_integer_value(json_array_get(le, i));
    }
    return -1;
}

/* "name n, name n" of a JSON object of counts */
static void run_json_counts(json_t *o, char *buf, size_t cap) {
    const char *name;
    json_t *n;
    size_t len = 0;
    buf[0] = '\0';
    json_object_foreach(o, name, n) {
        int k = snprintf(buf + len, cap - len, "%s%s %lld", len ? ", " : "", name,
                         (long long)json_integer_value(n));
        if (k < 0 || (size_t)k >= cap - len) break;
        len += (size_t)k;
    }
}

static bool run_stat_read(const char *path, run_stat_row *row) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        fprintf(stderr, "collie-run: stats file %s: %s\n", path, je.text);
        return false;
    }
    memset(row, 0, sizeof *row);
    snprintf(row->comm, sizeof row->comm, "%s",
             json_string_value(json_object_get(root, "comm")) ?: "?");
    snprintf(row->status, sizeof row->status, "%s",
             json_string_value(json_object_get(root, "status")) ?: "?");
    row->gen = run_json_int(root, "generation");
    row->rank = run_json_int(root, "rank");
    row->posted = run_json_int(root, "posted");
    row->completed = run_json_int(root, "completed");
    row->failed = run_json_int(root, "failed");
    row->in_flight = run_json_int(root, "in_flight");
    row->bytes = run_json_int(root, "bytes");
    row->stalls = run_json_int(root, "stalls");
    row->p50_us = run_quantile_us(root, 0.5);
    row->p99_us = run_quantile_us(root, 0.99);
    run_json_counts(json_object_get(root, "failed_by_status"), row->failures, sizeof row->failures);
    snprintf(row->fault_kind, sizeof row->fault_kind, "%s",
             json_string_value(json_object_get(root, "fault_kind")) ?: "none");
    run_json_counts(json_object_get(root, "failed_by_kind"), row->kinds, sizeof row->kinds);
    row->peers_dead = run_json_int(root, "peers_dead");
    row->peers_suspected = run_json_int(root, "peers_suspected");
    row->peers_left = run_json_int(root, "peers_left");
    row->shrinks = run_json_int(root, "shrinks");
    row->grows = run_json_int(root, "grows");
    json_decref(root);
    return true;
}

static int run_stat_cmp(const void *a, const void *b) {
    const run_stat_row *x = a, *y = b;
    int c = strcmp(x->comm, y->comm);
    if (c) return c;
    if (x->gen != y->gen) return x->gen < y->gen ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

static int run_stat_file(const struct dirent *d) {
    size_t n = strlen(d->d_name);
    return strncmp(d->d_name, "stats-", 6) == 0 && n > 5 && strcmp(d->d_name + n - 5, ".json") == 0;
}

static void run_fmt_us(char *buf, size_t n, long long us) {
    if (us < 0)
        snprintf(buf, n, "long");
    else
        snprintf(buf, n, "<=%lld", us);
}

/* After the job: one line per comm and rank from the files the ranks wrote. */
void run_print_stats(const char *dir) {
    struct dirent **names = NULL;
    int n = scandir(dir, &names, run_stat_file, alphasort);
    if (n < 0) {
        fprintf(stderr, "collie-run: stats: cannot read %s: %s\n", dir, strerror(errno));
        return;
    }
    run_stat_row *rows = calloc((size_t)n + 1, sizeof *rows);
    int nrows = 0;
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
        if (rows && run_stat_read(path, &rows[nrows])) nrows++;
        free(names[i]);
    }
    free(names);
    if (nrows == 0) {
        fprintf(stderr, "collie-run: stats: no comm wrote any (none was destroyed?)\n");
        free(rows);
        return;
    }
    qsort(rows, (size_t)nrows, sizeof *rows, run_stat_cmp);
    fprintf(stderr, "collie-run: stats per comm and rank (latency: post to completion, "
                    "all kinds)\n");
    fprintf(stderr, "%-16s %4s %5s %9s %9s %7s %8s %13s %9s %9s %6s  %s\n", "comm", "gen", "rank",
            "posted", "completed", "failed", "inflight", "bytes", "p50_us", "p99_us", "stalls",
            "status");
    for (int i = 0; i < nrows; i++) {
        const run_stat_row *r = &rows[i];
        char p50[24], p99[24];
        run_fmt_us(p50, sizeof p50, r->p50_us);
        run_fmt_us(p99, sizeof p99, r->p99_us);
        char kind[40] = "", fault[400] = "";
        size_t at = 0;
        if (strcmp(r->fault_kind, "none") != 0) snprintf(kind, sizeof kind, " (%s)", r->fault_kind);
        if (r->kinds[0])
            at += (size_t)snprintf(fault + at, sizeof fault - at, "; by fault: %s", r->kinds);
        /* a peer that left first is the common end of a job: no news alone */
        if (r->peers_dead + r->peers_suspected > 0 && at < sizeof fault)
            at += (size_t)snprintf(fault + at, sizeof fault - at,
                                   "; peers dead %lld, suspected %lld, left %lld", r->peers_dead,
                                   r->peers_suspected, r->peers_left);
        if (r->shrinks + r->grows > 0 && at < sizeof fault)
            snprintf(fault + at, sizeof fault - at, "; line: %lld shrinks, %lld grows", r->shrinks,
                     r->grows);
        fprintf(stderr,
                "%-16s %4lld %5lld %9lld %9lld %7lld %8lld %13lld %9s %9s %6lld  %s%s%s%s%s\n",
                r->comm, r->gen, r->rank, r->posted, r->completed, r->failed, r->in_flight,
                r->bytes, p50, p99, r->stalls, r->status, kind, r->failures[0] ? "; failed: " : "",
                r->failures, fault);
    }
    free(rows);
}

/* Remove the directory --stats made, with the files the ranks wrote. */
void run_stats_cleanup(const char *dir) {
    struct dirent **names = NULL;
    int n = scandir(dir, &names, NULL, alphasort);
    for (int i = 0; i < n; i++) {
        if (names[i]->d_name[0] != '.') {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
            unlink(path);
        }
        free(names[i]);
    }
    free(names);
    rmdir(dir);
}
