/*
 * fuzz_fault_text.c — the fault data of an abort notice as a rank reads it
 * from the store's control channel (comm/fault.c cl_fault_parse, called by
 * comm_ctl.c for every "abort" message), and a rendezvous poison as a
 * creating rank reads it from "<prefix>conflict" (cl_rendezvous_poison_parse,
 * with the rank that wrote it): text another process wrote.
 *
 * Design notes
 *  - Input: byte 0 = the comm's size (1..256), then the text (not
 *    NUL-terminated: a copy with a NUL is parsed).
 *  - Invariants asserted: a parse that succeeds gives a known kind (not
 *    none), an origin in [-1, size), a set counted in [0, size] whose
 *    listed ranks are ascending and in [0, size), view PEER, and a rest
 *    within the text; writing that fault back (cl_fault_format) and
 *    parsing it again gives the same fault; the writer's text is exactly
 *    the accepted prefix less the separator (the parser takes only what
 *    the writer writes).
 */
#include "tests/fuzz/fuzz.h"

#include "comm/comm.h"

static void check_fault(const cl_fault *f, int size) {
    FUZZ_CHECK(f->kind > COLLIE_FAULT_NONE && f->kind < COLLIE_FAULT_NUM_KINDS, "kind %d",
               (int)f->kind);
    FUZZ_CHECK(f->origin >= -1 && f->origin < size, "origin %d of %d", (int)f->origin, size);
    FUZZ_CHECK(f->nranks >= 0 && f->nranks <= size, "%d ranks of %d", (int)f->nranks, size);
    FUZZ_CHECK(f->view == COLLIE_FAULT_VIEW_PEER, "view %d", (int)f->view);
    int n = f->nranks < COLLIE_FAULT_RANKS ? f->nranks : COLLIE_FAULT_RANKS;
    for (int i = 0; i < n; i++) {
        FUZZ_CHECK(f->ranks[i] >= 0 && f->ranks[i] < size, "rank %d of %d", (int)f->ranks[i], size);
        FUZZ_CHECK(i == 0 || f->ranks[i] > f->ranks[i - 1], "ranks not ascending");
    }
}

/* The same bytes as a rendezvous poison ("<status>@<origin>|<why>",
 * comm_rendezvous_text.c): a status collie names (EINVAL when uncoded), an
 * origin in [-1, 2^24) (-1 when uncoded), a why that is a C string within
 * its buffer, and a coded text re-read the same. */
static void check_poison(const uint8_t *val, size_t len) {
    char why[64];
    memset(why, 'Z', sizeof why);
    int origin = 7;
    int st = cl_rendezvous_poison_parse((const char *)val, len, why, sizeof why, &origin);
    FUZZ_CHECK(cl_status_is_error(st), "status %d is not one of collie's errors", st);
    FUZZ_CHECK(origin >= -1 && origin < (1 << 24), "origin %d", origin);
    FUZZ_CHECK(memchr(why, '\0', sizeof why) != NULL, "why not terminated");
    if (origin >= 0) {
        char again[128], why2[64];
        int n = snprintf(again, sizeof again, "%d@%d|%s", st, origin, why);
        int origin2 = -5;
        FUZZ_CHECK(cl_rendezvous_poison_parse(again, (size_t)n, why2, sizeof why2, &origin2) ==
                           st &&
                       origin2 == origin && strcmp(why2, why) == 0,
                   "'%.80s' re-read differently", again);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
    if (len < 1) return 0;
    int size = data[0] + 1;
    char *text = malloc(len);
    if (!text) return 0;
    memcpy(text, data + 1, len - 1);
    text[len - 1] = '\0';
    cl_fault f, g;
    const char *rest = NULL;
    if (cl_fault_parse(text, size, &f, &rest)) {
        check_fault(&f, size);
        FUZZ_CHECK(rest >= text && rest <= text + strlen(text), "rest outside the text");
        char out[1024];
        cl_fault_format(&f, out, sizeof out);
        if (f.nranks <= COLLIE_FAULT_RANKS) { /* all listed: the text is the writer's */
            size_t used = (size_t)(rest - text);
            size_t n = strlen(out);
            FUZZ_CHECK(used == n || used == n + 1, "accepted %zu bytes, the writer writes %zu",
                       used, n);
            FUZZ_CHECK(memcmp(text, out, n) == 0, "accepted '%.60s', the writer writes '%.60s'",
                       text, out);
        }
        strcat(out, " why");
        const char *rest2;
        FUZZ_CHECK(cl_fault_parse(out, size, &g, &rest2), "its own text refused: '%.80s'", out);
        FUZZ_CHECK(g.kind == f.kind && g.origin == f.origin, "kind or origin changed");
        FUZZ_CHECK(strcmp(rest2, "why") == 0, "rest '%.20s'", rest2);
        int n = f.nranks < COLLIE_FAULT_RANKS ? f.nranks : COLLIE_FAULT_RANKS;
        FUZZ_CHECK(g.nranks == n && memcmp(g.ranks, f.ranks, (size_t)n * sizeof f.ranks[0]) == 0,
                   "ranks changed");
    }
    check_poison(data + 1, len - 1);
    free(text);
    return 0;
}

static void fuzz_seeds(const char *dir) {
    static const char *const texts[] = {"1 2 3 rank 3 died", "2 -1 0,1,2 x", "6 0 - operator",
                                        "4 1 0,3 mismatch",  "8 -1 - local", "7 2 5 left"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        uint8_t buf[64];
        buf[0] = 7; /* size 8 */
        size_t n = strlen(texts[i]);
        memcpy(buf + 1, texts[i], n);
        char name[32];
        snprintf(name, sizeof name, "seed%zu", i);
        fuzz_seed_write(dir, name, buf, n + 1);
    }
}

FUZZ_SEEDS_MAIN(fuzz_seeds)
