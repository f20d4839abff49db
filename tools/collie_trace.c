/*
 * collie_trace.c — collie-trace, the reader of flight-recorder dumps: given
 * the dumps of the ranks of a communicator, show where they diverge.
 *
 *   collie-trace DUMP.json...
 *
 * For each communicator incarnation (name, generation) found in the files:
 * per rank the last posted and completed collective sequence numbers and
 * the oldest unfinished work (op, seq, state, error); the first sequence
 * number not completed by every rank, which ranks never posted it and
 * where the others stand on it; ranks without a dump; and any mismatch
 * (different op, dtype, reduction, count or root at the same sequence
 * number on two ranks). Exit 0 when the dumps could be read; 2 for a usage
 * error, input that is not a dump (with the file, the place and the
 * reason) or dumps that disagree (two sizes for one comm and generation,
 * one rank twice); 1 when out of memory.
 *
 * Design notes
 *  - The input is the JSON object comm/flight.c writes (a header with an
 *    "entries" array), read with jansson: any valid layout of it reads,
 *    as written (one entry per line) or after `jq .` or `jq -c`. Types
 *    are checked key by key and anything off is rejected with the file,
 *    the place (header, entries[i]) and why, never guessed at. Unknown
 *    keys are skipped, so newer dumps still read.
 *  - "Completed" means completed successfully, counted as a prefix: rank
 *    r has completed seq s when every collective up to s that its ring
 *    still holds is done. Entries older than the ring's first one are
 *    taken as completed (the ring only forgets the oldest works).
 *  - send/recv have their own sequence space (matched by tag), so the
 *    divergence analysis looks at collectives only.
 *  - Failure as data: the header's comm fault (kind, origin, ranks) and a
 *    failed entry's (kind and its first ranks) are printed beside their
 *    errors, "[peer_dead: ranks 3]"; dumps from before they existed lack
 *    them and read as before.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#define TR_EXIT_BAD       2
#define TR_TEXT_MAX       1024 /* longest string value kept (longer ones are cut) */
#define TR_SHOW_ERRORS    300  /* characters of an error message shown */
#define TR_MAX_MISMATCHES 10

#define TR_FAULT_RANKS 8 /* ranks of a fault shown */

/* a fault's data as a dump has it ("fault", "fault_ranks", "fault_nranks") */
typedef struct tr_fault {
    char kind[24]; /* "" when the dump has none */
    int64_t ranks[TR_FAULT_RANKS];
    int64_t nlisted, nranks;
} tr_fault;

typedef struct tr_entry {
    uint64_t seq, count;
    char op[24], dtype[16], redop[16], state[16], status[32];
    int64_t peer;
    int64_t post_us, start_us, end_us;
    tr_fault fault;
    char error[TR_TEXT_MAX];
} tr_entry;

typedef struct tr_dump {
    const char *path;
    char comm[80];
    uint64_t generation, last_posted;
    int64_t rank, size, capacity;
    char status[32];
    char error[TR_TEXT_MAX];
    tr_fault fault;
    tr_entry *e; /* collectives first-to-last as recorded */
    size_t n, cap;
    size_t n_p2p_pending;
    /* analysis */
    uint64_t completed;
    const tr_entry *oldest; /* oldest unfinished collective, or NULL */
} tr_dump;

/* ---- reading ------------------------------------------------------------- */

/* Where a value sits, for messages: "header" or "entries[3]". */
typedef struct tr_reader {
    const char *path;
    char where[32];
    char err[256];
} tr_reader;

static bool tr_fail(tr_reader *r, const char *fmt, const char *arg) {
    char what[200];
    snprintf(what, sizeof what, fmt, arg);
    snprintf(r->err, sizeof r->err, "%s: %s: %s", r->path, r->where, what);
    return false;
}

static void tr_copy(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* obj[key] as a string into dst (absent: left as is). */
static bool tr_str(tr_reader *r, json_t *obj, const char *key, char *dst, size_t cap) {
    json_t *v = json_object_get(obj, key);
    if (!v) return true;
    if (!json_is_string(v)) return tr_fail(r, "\"%s\" must be a string", key);
    tr_copy(dst, cap, json_string_value(v));
    return true;
}

/* obj[key] as an integer >= min into *dst; *seen says whether it was there. */
static bool tr_int(tr_reader *r, json_t *obj, const char *key, int64_t min, int64_t *dst,
                   bool *seen) {
    json_t *v = json_object_get(obj, key);
    if (seen) *seen = v != NULL;
    if (!v) return true;
    if (json_is_real(v)) return tr_fail(r, "\"%s\" must be an integer, not a fraction", key);
    if (!json_is_integer(v)) return tr_fail(r, "\"%s\" must be an integer", key);
    if (json_integer_value(v) < min) return tr_fail(r, "\"%s\" is out of range", key);
    *dst = json_integer_value(v);
    return true;
}

static bool tr_uint(tr_reader *r, json_t *obj, const char *key, uint64_t *dst, bool *seen) {
    int64_t x = 0;
    if (!tr_int(r, obj, key, 0, &x, seen)) return false;
    if (!seen || *seen) *dst = (uint64_t)x;
    return true;
}

/* obj's fault keys into *f (all optional; a present one must be well formed) */
static bool tr_fault_read(tr_reader *r, json_t *obj, tr_fault *f) {
    memset(f, 0, sizeof *f);
    json_t *v = json_object_get(obj, "fault_ranks");
    if (!tr_str(r, obj, "fault", f->kind, sizeof f->kind) ||
        !tr_int(r, obj, "fault_nranks", 0, &f->nranks, NULL))
        return false;
    if (!v) return true;
    if (!json_is_array(v)) return tr_fail(r, "\"%s\" must be an array", "fault_ranks");
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return tr_fail(r, "\"%s\" must hold ranks (integers >= 0)", "fault_ranks");
        if (f->nlisted < TR_FAULT_RANKS) f->ranks[f->nlisted++] = json_integer_value(x);
    }
    if (f->nranks < (int64_t)i) f->nranks = (int64_t)i;
    return true;
}

/* " [peer_dead: ranks 3,5]" (nothing for no fault or none recorded) */
static void tr_print_fault(const tr_fault *f) {
    if (!f->kind[0] || !strcmp(f->kind, "none")) return;
    printf(" [%s", f->kind);
    for (int64_t i = 0; i < f->nlisted; i++)
        printf("%s%" PRId64, i ? "," : ": ranks ", f->ranks[i]);
    if (f->nranks > f->nlisted)
        printf("%s%" PRId64 " more", f->nlisted ? " +" : ": ", f->nranks - f->nlisted);
    printf("]");
}

static bool tr_header(tr_reader *r, json_t *root, tr_dump *d) {
    snprintf(r->where, sizeof r->where, "header");
    if (!json_is_object(root))
        return tr_fail(r, "not a collie flight-recorder dump (expected an object)%s", "");
    bool has_gen, has_rank, has_size, has_posted, has_cap;
    int64_t cap = -1;
    if (!tr_str(r, root, "comm", d->comm, sizeof d->comm) ||
        !tr_str(r, root, "status", d->status, sizeof d->status) ||
        !tr_str(r, root, "error", d->error, sizeof d->error) ||
        !tr_uint(r, root, "generation", &d->generation, &has_gen) ||
        !tr_int(r, root, "rank", 0, &d->rank, &has_rank) ||
        !tr_int(r, root, "size", 1, &d->size, &has_size) ||
        !tr_uint(r, root, "last_posted", &d->last_posted, &has_posted) ||
        !tr_int(r, root, "capacity", 0, &cap, &has_cap) || !tr_fault_read(r, root, &d->fault))
        return false;
    if (has_cap) d->capacity = cap;
    if (d->comm[0] == '\0' || !has_gen || !has_rank || !has_size || !has_posted)
        return tr_fail(r, "the header lacks one of comm, generation, rank, size, last_posted%s",
                       "");
    if (d->rank >= d->size) return tr_fail(r, "rank is not below size%s", "");
    if (!json_is_array(json_object_get(root, "entries")))
        return tr_fail(r, "not a collie flight-recorder dump (no \"entries\" array)%s", "");
    return true;
}

static bool tr_is_p2p(const tr_entry *e) {
    return strcmp(e->op, "send") == 0 || strcmp(e->op, "recv") == 0;
}

static bool tr_entry_add(tr_dump *d, const tr_entry *e) {
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 64;
        tr_entry *ne = realloc(d->e, cap * sizeof *ne);
        if (!ne) return false;
        d->e = ne;
        d->cap = cap;
    }
    d->e[d->n++] = *e;
    return true;
}

static const char *const tr_states[] = {"queued", "running", "done", "failed"};

static bool tr_entry_read(tr_reader *r, json_t *o, tr_entry *e) {
    if (!json_is_object(o)) return tr_fail(r, "an entry must be an object%s", "");
    bool has_seq;
    if (!tr_str(r, o, "op", e->op, sizeof e->op) ||
        !tr_str(r, o, "dtype", e->dtype, sizeof e->dtype) ||
        !tr_str(r, o, "redop", e->redop, sizeof e->redop) ||
        !tr_str(r, o, "state", e->state, sizeof e->state) ||
        !tr_str(r, o, "status", e->status, sizeof e->status) ||
        !tr_str(r, o, "error", e->error, sizeof e->error) ||
        !tr_uint(r, o, "seq", &e->seq, &has_seq) || !tr_uint(r, o, "count", &e->count, NULL) ||
        !tr_int(r, o, "peer", -1, &e->peer, NULL) ||
        !tr_int(r, o, "post_us", 0, &e->post_us, NULL) ||
        !tr_int(r, o, "start_us", 0, &e->start_us, NULL) ||
        !tr_int(r, o, "end_us", 0, &e->end_us, NULL) || !tr_fault_read(r, o, &e->fault))
        return false;
    if (!has_seq || e->op[0] == '\0' || e->state[0] == '\0')
        return tr_fail(r, "an entry needs seq, op and state%s", "");
    for (size_t k = 0; k < sizeof tr_states / sizeof tr_states[0]; k++)
        if (strcmp(e->state, tr_states[k]) == 0) return true;
    return tr_fail(r, "unknown state \"%s\"", e->state);
}

/* Read one dump: any valid JSON layout of the object comm/flight.c writes
 * (as written, or after `jq .` / `jq -c`). */
static bool tr_read_file(const char *path, tr_dump *d, char *err, size_t errlen) {
    tr_reader r = {.path = path};
    memset(d, 0, sizeof *d);
    d->path = path;
    d->rank = -1;
    d->capacity = -1; /* unknown: older dumps may not say */
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return false;
    }
    int c = fgetc(f);
    if (c == EOF) {
        fclose(f);
        snprintf(err, errlen, "%s: empty file", path);
        return false;
    }
    ungetc(c, f);
    json_error_t je;
    json_t *root = json_loadf(f, 0, &je);
    fclose(f);
    if (!root) {
        bool eof = strstr(je.text, "near end of file") || strstr(je.text, "premature end");
        snprintf(err, errlen, "%s:%d:%d: %s%s", path, je.line, je.column,
                 eof ? "truncated: " : "not a valid JSON dump: ", je.text);
        return false;
    }
    bool ok = tr_header(&r, root, d);
    json_t *entries = ok ? json_object_get(root, "entries") : NULL;
    size_t i;
    json_t *o;
    json_array_foreach(entries, i, o) {
        if (!ok) break;
        snprintf(r.where, sizeof r.where, "entries[%zu]", i);
        tr_entry e;
        memset(&e, 0, sizeof e);
        e.peer = -1;
        ok = tr_entry_read(&r, o, &e);
        if (!ok) break;
        if (tr_is_p2p(&e)) {
            if (strcmp(e.state, "done") != 0 && strcmp(e.state, "failed") != 0) d->n_p2p_pending++;
            continue;
        }
        if (!tr_entry_add(d, &e)) ok = tr_fail(&r, "out of memory%s", "");
    }
    json_decref(root);
    if (!ok) snprintf(err, errlen, "%s", r.err);
    return ok;
}

/* ---- analysis ------------------------------------------------------------ */

static int tr_cmp_seq(const void *a, const void *b) {
    const tr_entry *x = a, *y = b;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static void tr_analyse_rank(tr_dump *d) {
    if (d->n > 1) qsort(d->e, d->n, sizeof *d->e, tr_cmp_seq);
    d->oldest = NULL;
    for (size_t i = 0; i < d->n; i++)
        if (strcmp(d->e[i].state, "done") != 0) {
            d->oldest = &d->e[i];
            break;
        }
    if (d->n == 0) { /* nothing recorded: the recorder is off or nothing was posted */
        d->completed = d->capacity == 0 ? 0 : d->last_posted;
        return;
    }
    uint64_t c = d->e[0].seq - 1; /* older ones left the ring: completed */
    for (size_t i = 0; i < d->n; i++) {
        if (d->e[i].seq != c + 1 || strcmp(d->e[i].state, "done") != 0) break;
        c = d->e[i].seq;
    }
    d->completed = c;
}

static const tr_entry *tr_find(const tr_dump *d, uint64_t seq) {
    size_t lo = 0, hi = d->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (d->e[mid].seq < seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < d->n && d->e[lo].seq == seq ? &d->e[lo] : NULL;
}

static void tr_print_error(const char *status, const char *error) {
    size_t n = strlen(error);
    if (n == 0) {
        printf("%s", status);
        return;
    }
    if (n > TR_SHOW_ERRORS)
        printf("%s: %.*s...", status, TR_SHOW_ERRORS, error);
    else
        printf("%s: %s", status, error);
}

static bool tr_rooted(const char *op) {
    return !strcmp(op, "broadcast") || !strcmp(op, "reduce") || !strcmp(op, "gather") ||
           !strcmp(op, "scatter");
}

static void tr_describe_op(const tr_entry *e) {
    printf("%s seq %" PRIu64 " (%" PRIu64 " x %s", e->op, e->seq, e->count, e->dtype);
    bool reduces =
        !strcmp(e->op, "allreduce") || !strcmp(e->op, "reduce") || !strcmp(e->op, "reduce_scatter");
    if (reduces) printf(" %s", e->redop);
    if (tr_rooted(e->op) && e->peer >= 0) printf(", root %" PRId64, e->peer);
    printf(")");
}

/* Two ranks posted different things at the same sequence number? */
static bool tr_mismatch(const tr_entry *a, const tr_entry *b) {
    if (strcmp(a->op, b->op) != 0 || strcmp(a->dtype, b->dtype) != 0 || a->count != b->count)
        return true;
    bool reduces =
        !strcmp(a->op, "allreduce") || !strcmp(a->op, "reduce") || !strcmp(a->op, "reduce_scatter");
    if (reduces && strcmp(a->redop, b->redop) != 0) return true;
    return tr_rooted(a->op) && a->peer != b->peer;
}

/* Rank r's lines: posted, completed, the comm's error, its oldest
 * unfinished work. */
static void tr_report_rank(tr_dump *d, int64_t r) {
    bool off = d->capacity == 0;
    if (off)
        printf("  rank %" PRId64 ": posted %" PRIu64 ", completed ?, comm ", r, d->last_posted);
    else
        printf("  rank %" PRId64 ": posted %" PRIu64 ", completed %" PRIu64 ", comm ", r,
               d->last_posted, d->completed);
    tr_print_error(d->status[0] ? d->status : "?", d->error);
    tr_print_fault(&d->fault);
    printf("\n");
    if (off) {
        printf("          flight recorder off (COLLIE_TRACE_BUFFER=0)\n");
        return;
    }
    printf("          oldest unfinished: ");
    if (!d->oldest) {
        printf("none\n");
    } else {
        tr_describe_op(d->oldest);
        printf(" %s", d->oldest->state);
        if (strcmp(d->oldest->state, "failed") == 0) {
            printf(" ");
            tr_print_error(d->oldest->status, d->oldest->error);
            tr_print_fault(&d->oldest->fault);
        }
        printf("\n");
    }
    if (d->n_p2p_pending) printf("          send/recv not finished: %zu\n", d->n_p2p_pending);
}

/* The first collective not completed by every rank, and where each rank
 * stands with it: one line per kind of rank. */
static void tr_report_first(tr_dump **ranks, int64_t size, uint64_t first) {
    const char *op = NULL;
    for (int64_t r = 0; r < size && !op; r++) {
        const tr_entry *e = ranks[r] ? tr_find(ranks[r], first) : NULL;
        if (e) op = e->op;
    }
    printf("  first collective not completed by every rank: seq %" PRIu64 "%s%s%s\n", first,
           op ? " (" : "", op ? op : "", op ? ")" : "");
    const char *labels[] = {"never posted it", "posted it, not completed", "completed it",
                            "posted it, recorder off", "no dump"};
    for (int pass = 0; pass < 5; pass++) {
        int shown = 0;
        for (int64_t r = 0; r < size; r++) {
            tr_dump *d = ranks[r];
            const tr_entry *e = d ? tr_find(d, first) : NULL;
            int kind = !d                       ? 4
                       : d->last_posted < first ? 0
                       : d->capacity == 0       ? 3
                       : d->completed >= first  ? 2
                                                : 1;
            if (kind != pass) continue;
            if (shown++ == 0)
                printf("    %s: rank %" PRId64, labels[pass], r);
            else
                printf(", rank %" PRId64, r);
            if (kind == 0)
                printf(" (last posted %" PRIu64 ")", d->last_posted);
            else if (kind == 1)
                printf(" (%s%s%s)", e ? e->state : "not in the ring",
                       e && strcmp(e->state, "failed") == 0 ? " " : "",
                       e && strcmp(e->state, "failed") == 0 ? e->status : "");
        }
        if (shown) printf("\n");
    }
}

/* Mismatches: compare every rank's entries with the first rank that
 * recorded the same sequence number. */
static void tr_report_mismatches(tr_dump **ranks, int64_t size) {
    int reported = 0, more = 0;
    for (int64_t r = 0; r < size; r++) {
        tr_dump *d = ranks[r];
        if (!d) continue;
        for (size_t i = 0; i < d->n; i++) {
            const tr_entry *e = &d->e[i];
            for (int64_t q = 0; q < r; q++) {
                const tr_entry *o = ranks[q] ? tr_find(ranks[q], e->seq) : NULL;
                if (!o) continue;
                if (tr_mismatch(o, e)) {
                    if (reported++ < TR_MAX_MISMATCHES) {
                        printf("  mismatch at seq %" PRIu64 ": rank %" PRId64 " posted ", e->seq,
                               q);
                        tr_describe_op(o);
                        printf(", rank %" PRId64 " posted ", r);
                        tr_describe_op(e);
                        printf("\n");
                    } else {
                        more++;
                    }
                }
                break; /* compared with the first rank that has it */
            }
        }
    }
    if (more) printf("  ... and %d more mismatches\n", more);
    if (reported == 0) printf("  mismatches: none\n");
}

static void tr_report_group(tr_dump **ranks, int64_t size, const char *comm, uint64_t gen,
                            int ndumps) {
    printf("comm '%s' generation %" PRIu64 ": %" PRId64 " ranks, %d dump%s\n", comm, gen, size,
           ndumps, ndumps == 1 ? "" : "s");
    uint64_t max_posted = 0, first = UINT64_MAX;
    for (int64_t r = 0; r < size; r++) {
        tr_dump *d = ranks[r];
        if (!d) {
            printf("  rank %" PRId64 ": no dump (dead, stopped, or never aborted)\n", r);
            continue;
        }
        tr_analyse_rank(d);
        if (d->last_posted > max_posted) max_posted = d->last_posted;
        if (d->capacity != 0 && d->completed + 1 < first) first = d->completed + 1;
        tr_report_rank(d, r);
    }
    if (ndumps == 0) return;
    if (first == UINT64_MAX)
        printf("  no rank recorded its works\n");
    else if (first > max_posted)
        printf("  every rank with a dump completed every collective it posted (up to seq "
               "%" PRIu64 ")\n",
               max_posted);
    else
        tr_report_first(ranks, size, first);
    tr_report_mismatches(ranks, size);
}

static int tr_cmp_dump(const void *a, const void *b) {
    const tr_dump *x = a, *y = b;
    int c = strcmp(x->comm, y->comm);
    if (c) return c;
    if (x->generation != y->generation) return x->generation < y->generation ? -1 : 1;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        FILE *f = argc < 2 ? stderr : stdout;
        fprintf(f, "usage: collie-trace DUMP.json...\n"
                   "Read the flight-recorder dumps of the ranks of a communicator (written by\n"
                   "collie_comm_dump, or on abort into COLLIE_DUMP_DIR) and show where they\n"
                   "diverge: per rank the last posted/completed collective and the oldest\n"
                   "unfinished work, the first sequence number not completed by every rank,\n"
                   "the ranks that never posted it, and mismatched collectives.\n");
        return argc < 2 ? TR_EXIT_BAD : 0;
    }
    int n = argc - 1;
    tr_dump *dumps = calloc((size_t)n, sizeof *dumps);
    if (!dumps) return 1;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        char err[512];
        if (!tr_read_file(argv[i + 1], &dumps[i], err, sizeof err)) {
            fprintf(stderr, "collie-trace: %s\n", err);
            rc = TR_EXIT_BAD;
            goto out;
        }
    }
    qsort(dumps, (size_t)n, sizeof *dumps, tr_cmp_dump);
    for (int i = 0; i < n;) {
        int j = i;
        while (j < n && !strcmp(dumps[j].comm, dumps[i].comm) &&
               dumps[j].generation == dumps[i].generation)
            j++;
        int64_t size = dumps[i].size;
        for (int k = i; k < j; k++) {
            if (dumps[k].size != size) {
                fprintf(stderr,
                        "collie-trace: %s and %s: comm '%s' generation %" PRIu64
                        " has size %" PRId64 " in one and %" PRId64 " in the other\n",
                        dumps[i].path, dumps[k].path, dumps[i].comm, dumps[i].generation, size,
                        dumps[k].size);
                rc = TR_EXIT_BAD;
                goto out;
            }
            if (k > i && dumps[k].rank == dumps[k - 1].rank) {
                fprintf(stderr,
                        "collie-trace: %s and %s are both rank %" PRId64 " of comm '%s' "
                        "generation %" PRIu64 "\n",
                        dumps[k - 1].path, dumps[k].path, dumps[k].rank, dumps[k].comm,
                        dumps[k].generation);
                rc = TR_EXIT_BAD;
                goto out;
            }
        }
        tr_dump **ranks = calloc((size_t)size, sizeof *ranks);
        if (!ranks) {
            rc = 1;
            goto out;
        }
        for (int k = i; k < j; k++)
            ranks[dumps[k].rank] = &dumps[k];
        if (i > 0) printf("\n");
        tr_report_group(ranks, size, dumps[i].comm, dumps[i].generation, j - i);
        free(ranks);
        i = j;
    }
out:
    for (int i = 0; i < n; i++)
        free(dumps[i].e);
    free(dumps);
    return rc;
}
