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
 * number on two ranks). Exit 0 when the dumps could be read, 2 for a usage
 * error or input that is not a dump (with the file, line and reason).
 *
 * Design notes
 *  - The input is what comm/flight.c writes: a header object on the first
 *    line ending in "entries":[, one entry object per line (a ',' after all
 *    but the last), then "]}". The parser here reads exactly that shape with
 *    a small JSON reader for flat objects (strings with escapes, integers,
 *    true/false/null); anything else is rejected, never guessed at.
 *    Unknown keys are skipped, so newer dumps still read.
 *  - "Completed" means completed successfully, counted as a prefix: rank
 *    r has completed seq s when every collective up to s that its ring
 *    still holds is done. Entries older than the ring's first one are
 *    taken as completed (the ring only forgets the oldest works).
 *  - send/recv have their own sequence space (matched by tag), so the
 *    divergence analysis looks at collectives only.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TR_EXIT_BAD       2
#define TR_TEXT_MAX       1024 /* longest string value kept (longer ones are cut) */
#define TR_SHOW_ERRORS    300  /* characters of an error message shown */
#define TR_MAX_MISMATCHES 10

typedef struct tr_entry {
    uint64_t seq, count;
    char op[24], dtype[16], redop[16], state[16], status[32];
    int64_t peer;
    int64_t post_us, start_us, end_us;
    char error[TR_TEXT_MAX];
} tr_entry;

typedef struct tr_dump {
    const char *path;
    char comm[80];
    uint64_t generation, last_posted;
    int64_t rank, size, capacity;
    char status[32];
    char error[TR_TEXT_MAX];
    tr_entry *e; /* collectives first-to-last as recorded */
    size_t n, cap;
    size_t n_p2p_pending;
    /* analysis */
    uint64_t completed;
    const tr_entry *oldest; /* oldest unfinished collective, or NULL */
} tr_dump;

/* ---- reading ------------------------------------------------------------- */

typedef struct tr_reader {
    const char *path;
    size_t line;
    const char *p; /* cursor in the current line */
    char err[256];
} tr_reader;

static bool tr_fail(tr_reader *r, const char *fmt, const char *arg) {
    char what[200];
    snprintf(what, sizeof what, fmt, arg);
    snprintf(r->err, sizeof r->err, "%s:%zu: %s", r->path, r->line, what);
    return false;
}

static void tr_skip_ws(tr_reader *r) {
    while (*r->p == ' ' || *r->p == '\t' || *r->p == '\r' || *r->p == '\n')
        r->p++;
}

static void tr_put_utf8(char *out, size_t cap, size_t *n, unsigned cp) {
    char b[4];
    size_t k = 0;
    if (cp < 0x80) {
        b[k++] = (char)cp;
    } else if (cp < 0x800) {
        b[k++] = (char)(0xC0 | (cp >> 6));
        b[k++] = (char)(0x80 | (cp & 0x3F));
    } else {
        b[k++] = (char)(0xE0 | (cp >> 12));
        b[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[k++] = (char)(0x80 | (cp & 0x3F));
    }
    for (size_t i = 0; i < k; i++)
        if (*n + 1 < cap) out[(*n)++] = b[i];
}

/* A JSON string at the cursor into out (cut to cap-1 bytes). */
static bool tr_string(tr_reader *r, char *out, size_t cap) {
    size_t n = 0;
    if (*r->p != '"') return tr_fail(r, "expected a string%s", "");
    r->p++;
    for (;;) {
        unsigned char ch = (unsigned char)*r->p;
        if (ch == '\0' || ch == '\n') return tr_fail(r, "unterminated string%s", "");
        r->p++;
        if (ch == '"') break;
        if (ch < 0x20) return tr_fail(r, "control character in a string%s", "");
        if (ch != '\\') {
            if (n + 1 < cap) out[n++] = (char)ch;
            continue;
        }
        char esc = *r->p++;
        switch (esc) {
        case '"':
        case '\\':
        case '/': ch = (unsigned char)esc; break;
        case 'b': ch = '\b'; break;
        case 'f': ch = '\f'; break;
        case 'n': ch = '\n'; break;
        case 'r': ch = '\r'; break;
        case 't': ch = '\t'; break;
        case 'u': {
            unsigned cp = 0;
            for (int i = 0; i < 4; i++) {
                char h = *r->p++;
                unsigned v;
                if (h >= '0' && h <= '9')
                    v = (unsigned)(h - '0');
                else if (h >= 'a' && h <= 'f')
                    v = (unsigned)(h - 'a' + 10);
                else if (h >= 'A' && h <= 'F')
                    v = (unsigned)(h - 'A' + 10);
                else
                    return tr_fail(r, "bad \\u escape in a string%s", "");
                cp = cp * 16 + v;
            }
            tr_put_utf8(out, cap, &n, cp);
            continue;
        }
        default: return tr_fail(r, "bad escape in a string%s", "");
        }
        if (n + 1 < cap) out[n++] = (char)ch;
    }
    out[n] = '\0';
    return true;
}

/* One value: its kind and, for strings and integers, the value. */
typedef struct tr_value {
    enum { TV_STRING, TV_INT, TV_BOOL, TV_NULL, TV_OPEN_ARRAY } kind;
    char s[TR_TEXT_MAX];
    int64_t i;
    bool b;
} tr_value;

static bool tr_value_read(tr_reader *r, tr_value *v) {
    tr_skip_ws(r);
    if (*r->p == '"') {
        v->kind = TV_STRING;
        return tr_string(r, v->s, sizeof v->s);
    }
    if (*r->p == '[') {
        r->p++;
        v->kind = TV_OPEN_ARRAY;
        return true;
    }
    static const struct {
        const char *word;
        int kind;
        bool b;
    } words[] = {{"true", TV_BOOL, true}, {"false", TV_BOOL, false}, {"null", TV_NULL, false}};
    for (size_t k = 0; k < sizeof words / sizeof words[0]; k++)
        if (strncmp(r->p, words[k].word, strlen(words[k].word)) == 0) {
            r->p += strlen(words[k].word);
            v->kind = words[k].kind;
            v->b = words[k].b;
            return true;
        }
    const char *start = r->p;
    if (*r->p == '-') r->p++;
    if (*r->p < '0' || *r->p > '9') return tr_fail(r, "expected a value%s", "");
    errno = 0;
    char *end;
    long long x = strtoll(start, &end, 10);
    if (errno != 0) return tr_fail(r, "number out of range%s", "");
    if (*end == '.' || *end == 'e' || *end == 'E')
        return tr_fail(r, "expected an integer, not a fraction%s", "");
    r->p = end;
    v->kind = TV_INT;
    v->i = x;
    return true;
}

/* What a key of an object means for us. */
typedef bool (*tr_member_fn)(tr_reader *r, const char *key, const tr_value *v, void *arg);

/* Read "{" members, calling fn for each. With `open_key` set, the object
 * ends at that key's '[' (the header line); otherwise at '}' (an entry). */
static bool tr_object(tr_reader *r, const char *open_key, tr_member_fn fn, void *arg) {
    static tr_value v; /* large: keep it off the stack; this tool is single-threaded */
    tr_skip_ws(r);
    if (*r->p != '{') return tr_fail(r, "expected '{'%s", "");
    r->p++;
    tr_skip_ws(r);
    if (*r->p == '}' && !open_key) {
        r->p++;
        return true;
    }
    for (;;) {
        char key[64];
        tr_skip_ws(r);
        if (!tr_string(r, key, sizeof key)) return false;
        tr_skip_ws(r);
        if (*r->p != ':') return tr_fail(r, "expected ':' after \"%s\"", key);
        r->p++;
        if (!tr_value_read(r, &v)) return false;
        if (v.kind == TV_OPEN_ARRAY) {
            if (!open_key || strcmp(key, open_key) != 0)
                return tr_fail(r, "unexpected array in \"%s\"", key);
            return true;
        }
        if (!fn(r, key, &v, arg)) return false;
        tr_skip_ws(r);
        if (*r->p == ',') {
            r->p++;
            continue;
        }
        if (*r->p == '}' && !open_key) {
            r->p++;
            return true;
        }
        return tr_fail(
            r, open_key ? "expected ',' (the header ends with \"%s\":[)" : "expected ',' or '}'%s",
            open_key ? open_key : "");
    }
}

static void tr_copy(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static bool tr_want(tr_reader *r, const char *key, const tr_value *v, int kind) {
    if ((int)v->kind == kind) return true;
    static const char *const kinds[] = {"a string", "an integer", "true or false", "null"};
    char what[96];
    snprintf(what, sizeof what, "\"%s\" must be %s", key, kinds[kind]);
    return tr_fail(r, "%s", what);
}

#define TR_STR(field, name)                                                                        \
    if (strcmp(key, name) == 0) {                                                                  \
        if (!tr_want(r, key, v, TV_STRING)) return false;                                          \
        tr_copy(field, sizeof field, v->s);                                                        \
        return true;                                                                               \
    }
#define TR_INT(field, name, min)                                                                   \
    if (strcmp(key, name) == 0) {                                                                  \
        if (!tr_want(r, key, v, TV_INT)) return false;                                             \
        if (v->i < (min)) return tr_fail(r, "\"%s\" is out of range", key);                        \
        field = (__typeof__(field))v->i;                                                           \
        *seen |= 1u << bit;                                                                        \
        return true;                                                                               \
    }                                                                                              \
    bit++;

typedef struct tr_header_ctx {
    tr_dump *d;
    unsigned seen;
} tr_header_ctx;

enum { TR_H_GEN = 1, TR_H_RANK = 2, TR_H_SIZE = 4, TR_H_POSTED = 8 };

static bool tr_header_member(tr_reader *r, const char *key, const tr_value *v, void *arg) {
    tr_header_ctx *ctx = arg;
    tr_dump *d = ctx->d;
    unsigned *seen = &ctx->seen;
    int bit = 0;
    TR_STR(d->comm, "comm");
    TR_STR(d->status, "status");
    TR_STR(d->error, "error");
    TR_INT(d->generation, "generation", 0);
    TR_INT(d->rank, "rank", 0);
    TR_INT(d->size, "size", 1);
    TR_INT(d->last_posted, "last_posted", 0);
    TR_INT(d->capacity, "capacity", 0);
    (void)bit;
    return true; /* unknown keys are skipped */
}

typedef struct tr_entry_ctx {
    tr_entry *e;
    unsigned seen;
} tr_entry_ctx;

static bool tr_entry_member(tr_reader *r, const char *key, const tr_value *v, void *arg) {
    tr_entry_ctx *ctx = arg;
    tr_entry *e = ctx->e;
    unsigned *seen = &ctx->seen;
    int bit = 0;
    TR_STR(e->op, "op");
    TR_STR(e->dtype, "dtype");
    TR_STR(e->redop, "redop");
    TR_STR(e->state, "state");
    TR_STR(e->status, "status");
    TR_STR(e->error, "error");
    TR_INT(e->seq, "seq", 0);
    TR_INT(e->count, "count", 0);
    TR_INT(e->peer, "peer", -1);
    TR_INT(e->post_us, "post_us", 0);
    TR_INT(e->start_us, "start_us", 0);
    TR_INT(e->end_us, "end_us", 0);
    (void)bit;
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

static bool tr_read_file(const char *path, tr_dump *d, char *err, size_t errlen) {
    tr_reader r = {.path = path};
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return false;
    }
    memset(d, 0, sizeof *d);
    d->path = path;
    d->rank = -1;
    d->capacity = -1; /* unknown: older dumps may not say */
    char *line = NULL;
    size_t cap = 0;
    bool ok = false, closed = false;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) >= 0) {
        r.line++;
        if ((size_t)len != strlen(line)) {
            tr_fail(&r, "NUL byte in the input%s", "");
            goto out;
        }
        r.p = line;
        tr_skip_ws(&r);
        if (closed) {
            if (*r.p != '\0') {
                tr_fail(&r, "text after the closing ']}'%s", "");
                goto out;
            }
            continue;
        }
        if (r.line == 1) {
            tr_header_ctx hc = {.d = d};
            if (*r.p != '{') {
                tr_fail(&r, "not a collie flight-recorder dump (expected '{\"comm\":...')%s", "");
                goto out;
            }
            if (!tr_object(&r, "entries", tr_header_member, &hc)) goto out;
            tr_skip_ws(&r);
            if (*r.p != '\0') {
                tr_fail(&r, "expected the end of the header line after \"entries\":[%s", "");
                goto out;
            }
            unsigned need = TR_H_GEN | TR_H_RANK | TR_H_SIZE | TR_H_POSTED;
            if (d->comm[0] == '\0' || (hc.seen & need) != need) {
                tr_fail(&r, "the header lacks one of comm, generation, rank, size, last_posted%s",
                        "");
                goto out;
            }
            if (d->rank >= d->size) {
                tr_fail(&r, "rank is not below size%s", "");
                goto out;
            }
            continue;
        }
        if (*r.p == ']') {
            r.p++;
            tr_skip_ws(&r);
            if (*r.p != '}') {
                tr_fail(&r, "expected ']}' to close the dump%s", "");
                goto out;
            }
            r.p++;
            tr_skip_ws(&r);
            if (*r.p != '\0') {
                tr_fail(&r, "text after the closing ']}'%s", "");
                goto out;
            }
            closed = true;
            continue;
        }
        tr_entry e;
        memset(&e, 0, sizeof e);
        e.peer = -1;
        tr_entry_ctx ec = {.e = &e};
        if (!tr_object(&r, NULL, tr_entry_member, &ec)) goto out;
        tr_skip_ws(&r);
        if (*r.p == ',') r.p++;
        tr_skip_ws(&r);
        if (*r.p != '\0') {
            tr_fail(&r, "expected one entry per line%s", "");
            goto out;
        }
        if (!(ec.seen & 1u << 0) || e.op[0] == '\0' || e.state[0] == '\0') {
            tr_fail(&r, "an entry needs seq, op and state%s", "");
            goto out;
        }
        bool known = false;
        for (size_t k = 0; k < 4; k++)
            known = known || strcmp(e.state, tr_states[k]) == 0;
        if (!known) {
            tr_fail(&r, "unknown state \"%s\"", e.state);
            goto out;
        }
        if (tr_is_p2p(&e)) {
            if (strcmp(e.state, "done") != 0 && strcmp(e.state, "failed") != 0) d->n_p2p_pending++;
            continue;
        }
        if (!tr_entry_add(d, &e)) {
            tr_fail(&r, "out of memory%s", "");
            goto out;
        }
    }
    if (r.line == 0) {
        snprintf(r.err, sizeof r.err, "%s: empty file", path);
        goto out;
    }
    if (!closed) {
        snprintf(r.err, sizeof r.err, "%s:%zu: truncated: the dump does not end with ']}'", path,
                 r.line);
        goto out;
    }
    ok = true;
out:
    free(line);
    fclose(f);
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
        bool off = d->capacity == 0;
        if (!off && d->completed + 1 < first) first = d->completed + 1;
        if (off)
            printf("  rank %" PRId64 ": posted %" PRIu64 ", completed ?, comm ", r, d->last_posted);
        else
            printf("  rank %" PRId64 ": posted %" PRIu64 ", completed %" PRIu64 ", comm ", r,
                   d->last_posted, d->completed);
        tr_print_error(d->status[0] ? d->status : "?", d->error);
        printf("\n");
        if (off) {
            printf("          flight recorder off (COLLIE_TRACE_BUFFER=0)\n");
            continue;
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
            }
            printf("\n");
        }
        if (d->n_p2p_pending) printf("          send/recv not finished: %zu\n", d->n_p2p_pending);
    }
    if (ndumps == 0) return;
    if (first == UINT64_MAX) {
        printf("  no rank recorded its works\n");
    } else if (first > max_posted) {
        printf("  every rank with a dump completed every collective it posted (up to seq "
               "%" PRIu64 ")\n",
               max_posted);
    } else {
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
    /* mismatches: compare every rank's entries with the first rank that
     * recorded the same sequence number */
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
