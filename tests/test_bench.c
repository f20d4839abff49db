/*
 * test_bench.c — collie-bench run as a program under collie-run: every op
 * checked at 2, 3 and 4 ranks with the nccl-tests size conventions, the CSV
 * format, --inflight, dtypes and reductions, a corrupted result caught by
 * --check, an op missing its deadline, usage errors, --help, a backend
 * that cannot be created (nccl on this machine) failing cleanly,
 * --backend nccl on CUDA buffers against the CPU double of CUDA and NCCL,
 * and --threads: ranks as threads over TCP, and every op through the NCCL
 * plugin on the double at 2 to 4 ranks in one process, and with the ranks
 * in separate processes.
 *
 * Every child runs with its output on pipes read by a bounded poll loop; a
 * run that outlives its bound is a failure, and the teardown SIGKILLs a
 * launcher a failed test left behind (its ranks die with it: collie-run
 * sets PR_SET_PDEATHSIG). CLTEST_QUICK selects smaller sizes (sanitizers).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "runner.h"
#include "spawn.h"

#define RUN_BOUND_MS 50000 /* no run of a test takes longer than this */
#define NUM_OPS      11

static const char *const op_names[NUM_OPS] = {"allreduce",      "broadcast", "reduce", "allgather",
                                              "reduce_scatter", "alltoall",  "gather", "scatter",
                                              "allgatherv",     "alltoallv", "barrier"};

static bool quick(void) {
    const char *q = getenv("CLTEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

/* ---- running a program ------------------------------------------------------- */

/* Start `prog` (a bin/ tool) with args (NULL-terminated) and our
 * environment minus every COLLIE_* variable. */
static spawn_proc *run_start(const char *prog, const char *const *args) {
    return spawn_start(prog, args, NULL, RUN_BOUND_MS);
}

/* collie-run -n ranks --timeout 120 -- collie-bench bench_args..., to the
 * end, with env_extra ("NAME=value", NULL-terminated, may be NULL). */
static spawn_proc *bench_run_env(int ranks, const char *const *env_extra,
                                 const char *const *bench_args) {
    char n[16];
    snprintf(n, sizeof n, "%d", ranks);
    const char *args[SPAWN_MAX_ARGS + 1] = {"-n",  n,    "--timeout",
                                            "120", "--", spawn_bin_path("collie-bench")};
    size_t k = 6;
    for (size_t i = 0; bench_args[i]; i++) {
        assert_true(k < SPAWN_MAX_ARGS);
        args[k++] = bench_args[i];
    }
    args[k] = NULL;
    spawn_proc *r = spawn_start("collie-run", args, env_extra, RUN_BOUND_MS);
    spawn_finish(r);
    return r;
}

static spawn_proc *bench_run(int ranks, const char *const *bench_args) {
    return bench_run_env(ranks, NULL, bench_args);
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- reading the output ----------------------------------------------------------- */

/* The lines of `text` that start with prefix, with the prefix removed, in
 * order; returns how many (at most max). The copies live in `store`. */
static size_t lines_with(const char *text, const char *prefix, char **out, size_t max, char *store,
                         size_t store_len) {
    size_t n = 0, used = 0, plen = strlen(prefix);
    for (const char *p = text; *p;) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        if (len >= plen && strncmp(p, prefix, plen) == 0 && n < max) {
            size_t body = len - plen;
            assert_true(used + body + 1 <= store_len);
            memcpy(store + used, p + plen, body);
            store[used + body] = '\0';
            out[n++] = store + used;
            used += body + 1;
        }
        p += len + (eol ? 1 : 0);
    }
    return n;
}

/* Split a CSV line in place into at most max fields (empty ones kept). */
static size_t csv_split(char *line, char **f, size_t max) {
    size_t n = 0;
    for (char *p = line;;) {
        char *c = strchr(p, ',');
        if (n < max) f[n] = p;
        n++;
        if (!c) break;
        *c = '\0';
        p = c + 1;
    }
    return n;
}

/* nccl-tests' size column for `op` at requested size S (its
 * *GetCollByteCount): allreduce/broadcast/reduce use S/es elements; the
 * others count/n rounded down to 16 bytes per rank, n blocks in all (the
 * v collectives, which nccl-tests lacks, as allgather and alltoall). */
static size_t nccl_tests_bytes(const char *op, size_t S, size_t es, size_t n) {
    size_t count = S / es, base = (count / n) & ~(16 / es - 1);
    if (!strcmp(op, "allreduce") || !strcmp(op, "broadcast") || !strcmp(op, "reduce"))
        return count * es;
    if (!strcmp(op, "barrier")) return 0;
    return base * n * es;
}

static double busbw_factor(const char *op, int n) {
    if (!strcmp(op, "allreduce")) return 2.0 * (n - 1) / n;
    if (!strcmp(op, "broadcast") || !strcmp(op, "reduce")) return 1.0;
    return (double)(n - 1) / n;
}

static int op_index(const char *op) {
    for (int i = 0; i < NUM_OPS; i++)
        if (!strcmp(op, op_names[i])) return i;
    return -1;
}

/* No rank but 0 printed anything on stdout. */
static void assert_only_rank0_stdout(const spawn_proc *r) {
    for (const char *p = r->text[0]; *p;) {
        assert_spawn(r, strncmp(p, "[0] ", 4) == 0);
        const char *eol = strchr(p, '\n');
        if (!eol) break;
        p = eol + 1;
    }
}

/* ---- tests ---------------------------------------------------------------- */

#define MAX_LINES 1024
#define STORE_LEN (256 * 1024)

/* One row of rank 0's table: nccl-tests' 13 columns, collie's two, and the
 * collective named by the "# <op>" line that opens its block. */
typedef struct row {
    int op;
    size_t size, count;
    char type[16], redop[16];
    int root;
    char time[2][16], algbw[2][16], busbw[2][16], wrong[2][16]; /* out of place, in place */
    char lat[16], opss[24];
} row;

/* The rows of rank 0's table, in order; fails on a line that is neither a
 * comment nor a row of 15 fields. */
static size_t table_rows(const spawn_proc *r, row *rows, size_t max) {
    static char store[STORE_LEN];
    char *lines[MAX_LINES];
    size_t nl = lines_with(r->text[0], "[0] ", lines, MAX_LINES, store, sizeof store), n = 0;
    int op = -1;
    for (size_t i = 0; i < nl; i++) {
        char name[32], extra;
        if (lines[i][0] == '#') {
            if (sscanf(lines[i], "# %31s %c", name, &extra) == 1 && op_index(name) >= 0)
                op = op_index(name);
            continue;
        }
        assert_true(n < max);
        row *w = &rows[n++];
        int got = sscanf(
            lines[i], "%zu %zu %15s %15s %d %15s %15s %15s %15s %15s %15s %15s %15s %15s %23s",
            &w->size, &w->count, w->type, w->redop, &w->root, w->time[0], w->algbw[0], w->busbw[0],
            w->wrong[0], w->time[1], w->algbw[1], w->busbw[1], w->wrong[1], w->lat, w->opss);
        if (got != 15 || op < 0) {
            spawn_dump(r);
            fail_msg("table row '%s' (%d fields, op %d)", lines[i], got, op);
        }
        w->op = op;
    }
    return n;
}

static bool reduces(int op) { return op == 0 || op == 2 || op == 4; }

static bool rooted(int op) { return op == 1 || op == 2 || op == 6 || op == 7; }

static bool has_inplace(int op) {
    return op != 5 && op != 7 && op != 9 && op != 10; /* alltoall, scatter, alltoallv, barrier */
}

/* A row's placement p: timed (time > 0), bandwidth printed, checked with
 * nothing wrong (when `checked`); or N/A throughout where it does not apply. */
static void assert_placement(const spawn_proc *r, const row *w, int p, bool applies, bool checked) {
    if (!applies) {
        assert_spawn(r, !strcmp(w->time[p], "N/A") && !strcmp(w->algbw[p], "N/A") &&
                            !strcmp(w->busbw[p], "N/A") && !strcmp(w->wrong[p], "N/A"));
        return;
    }
    assert_spawn(r, strtod(w->time[p], NULL) > 0);
    assert_spawn(r, strtod(w->algbw[p], NULL) >= 0 && strtod(w->busbw[p], NULL) >= 0);
    assert_spawn(r, !strcmp(w->wrong[p], checked && w->op != NUM_OPS - 1 ? "0" : "N/A"));
}

/* The table rank 0 printed: a block per op in `ops` (NULL: all) with a row
 * per size (the barrier: one), sized as nccl-tests sizes them at `ranks`
 * ranks, in float, sum and root 0, both placements timed where collie has
 * them, every row checked with nothing wrong. The header names the world
 * size and nccl-tests. */
static void assert_table(const spawn_proc *r, const size_t *sizes, size_t nsizes, int ranks,
                         const bool *ops) {
    static row rows[MAX_LINES];
    char head[64];
    snprintf(head, sizeof head, ", %d ranks", ranks);
    assert_spawn(r, strstr(r->text[0], head));
    assert_spawn(r, strstr(r->text[0], "nccl-tests"));
    assert_spawn(r, strstr(r->text[0], "[0] # Out of bounds values : 0 OK"));
    size_t n = table_rows(r, rows, MAX_LINES), seen[NUM_OPS] = {0}, want_rows = 0;
    for (size_t i = 0; i < n; i++) {
        const row *w = &rows[i];
        int k = w->op;
        bool barrier = k == NUM_OPS - 1;
        assert_spawn(r, !ops || ops[k]);
        size_t want =
            nccl_tests_bytes(op_names[k], barrier ? 0 : sizes[seen[k] % nsizes], 4, (size_t)ranks);
        if (w->size != want) {
            spawn_dump(r);
            fail_msg("%s row %zu: size %zu, nccl-tests says %zu", op_names[k], seen[k], w->size,
                     want);
        }
        assert_spawn(r, !strcmp(w->type, barrier ? "none" : "float"));
        assert_spawn(r, !strcmp(w->redop, reduces(k) ? "sum" : "none"));
        assert_spawn(r, w->root == (rooted(k) ? 0 : -1));
        assert_placement(r, w, 0, true, true);
        assert_placement(r, w, 1, has_inplace(k), true);
        assert_spawn(r, strtod(w->lat, NULL) > 0);
        seen[k]++;
    }
    for (int k = 0; k < NUM_OPS; k++) {
        size_t want = ops && !ops[k] ? 0 : k == NUM_OPS - 1 ? 1 : nsizes;
        if (seen[k] != want) {
            spawn_dump(r);
            fail_msg("%s: %zu rows, want %zu", op_names[k], seen[k], want);
        }
        want_rows += want;
    }
    assert_int_equal(n, want_rows);
}

/* Every op, --check, at `ranks` ranks: exit 0, one table from rank 0 with a
 * row per op and size, sized as nccl-tests sizes them, every row checked. */
static void all_ops_checked(int ranks) {
    static const size_t full[] = {4, 4099, 1048576}, small[] = {4, 4099, 65536};
    const size_t *sizes = quick() ? small : full;
    const char *size_arg = quick() ? "4,4099,65536" : "4,4099,1048576";
    const char *iters = quick() ? "2" : "3";
    spawn_proc *r =
        bench_run(ranks, ARGS("--op", "all", "--check", "--sizes", size_arg, "--iters", iters));
    assert_spawn(r, r->status == 0);
    assert_spawn(r, !strstr(r->text[1], "collie-bench:"));
    assert_only_rank0_stdout(r);
    assert_table(r, sizes, 3, ranks, NULL);
}

static void test_all_ops_2_ranks(void **state) {
    (void)state;
    all_ops_checked(2);
}

static void test_all_ops_3_ranks(void **state) {
    (void)state;
    all_ops_checked(3);
}

static void test_all_ops_4_ranks(void **state) {
    (void)state;
    all_ops_checked(4);
}

/* --csv: exactly the header, then one row per op and size with 7 fields;
 * sizes, rank count, busbw/algbw factors; empty fields where they do not
 * apply (barrier bandwidth, ops/s without --inflight). */
static void test_csv(void **state) {
    (void)state;
    static const size_t sizes[] = {4, 4096, 65536};
    const int ranks = 3;
    spawn_proc *r = bench_run(ranks, ARGS("--op", "all", "--csv", "--sizes", "4,4096,64K",
                                          "--iters", "2", "--warmup", "1"));
    assert_spawn(r, r->status == 0);
    assert_only_rank0_stdout(r);
    static char store[STORE_LEN];
    char *lines[MAX_LINES];
    size_t nl = lines_with(r->text[0], "[0] ", lines, MAX_LINES, store, sizeof store);
    assert_spawn(r, nl == 1 + (NUM_OPS - 1) * 3 + 1);
    assert_string_equal(lines[0], "op,bytes,ranks,lat_us,algbw_GBps,busbw_GBps,ops_per_s");
    size_t seen[NUM_OPS] = {0};
    for (size_t i = 1; i < nl; i++) {
        char *f[8];
        size_t nf = csv_split(lines[i], f, 8);
        if (nf != 7) {
            spawn_dump(r);
            fail_msg("row %zu has %zu fields", i, nf);
        }
        int k = op_index(f[0]);
        assert_spawn(r, k >= 0);
        bool barrier = k == NUM_OPS - 1;
        size_t want = nccl_tests_bytes(f[0], barrier ? 0 : sizes[seen[k]++ % 3], 4, ranks);
        assert_int_equal(strtoull(f[1], NULL, 10), want);
        assert_string_equal(f[2], "3");
        assert_true(strtod(f[3], NULL) > 0);
        assert_string_equal(f[6], ""); /* no --inflight */
        if (barrier) {
            assert_string_equal(f[4], "");
            assert_string_equal(f[5], "");
            continue;
        }
        double algbw = strtod(f[4], NULL), busbw = strtod(f[5], NULL);
        assert_true(*f[4] && *f[5] && algbw >= 0 && busbw >= 0);
        if (algbw >= 0.01) { /* enough digits for the ratio */
            double ratio = busbw / algbw, want_ratio = busbw_factor(f[0], ranks);
            assert_true(ratio > want_ratio * 0.99 && ratio < want_ratio * 1.01);
        }
    }
    for (int k = 0; k < NUM_OPS; k++)
        assert_int_equal(seen[k], k == NUM_OPS - 1 ? 0 : 3);
}

/* --inflight 16: ops/s is reported and positive, in CSV and in the table. */
static void test_inflight(void **state) {
    (void)state;
    spawn_proc *r = bench_run(2, ARGS("--op", "allreduce,barrier", "--sizes", "4", "--iters", "200",
                                      "--inflight", "16", "--csv", "--check"));
    assert_spawn(r, r->status == 0);
    static char store[STORE_LEN];
    char *lines[MAX_LINES];
    size_t nl = lines_with(r->text[0], "[0] ", lines, MAX_LINES, store, sizeof store);
    assert_spawn(r, nl == 3);
    for (size_t i = 1; i < nl; i++) {
        char *f[8];
        assert_int_equal(csv_split(lines[i], f, 8), 7);
        if (!(strtod(f[6], NULL) > 0)) {
            spawn_dump(r);
            fail_msg("%s: ops_per_s '%s'", f[0], f[6]);
        }
    }
    spawn_free(r);

    r = bench_run(2,
                  ARGS("--op", "allreduce", "--sizes", "4", "--iters", "100", "--inflight", "16"));
    assert_spawn(r, r->status == 0);
    static row rows[4];
    assert_spawn(r, table_rows(r, rows, 4) == 1);
    assert_spawn(r, rows[0].op == 0 && strtod(rows[0].opss, NULL) > 0);
    spawn_free(r);
    /* without --inflight: none */
    r = bench_run(2, ARGS("--op", "allreduce", "--sizes", "4", "--iters", "10"));
    assert_spawn(r, r->status == 0);
    assert_spawn(r, table_rows(r, rows, 4) == 1);
    assert_spawn(r, !strcmp(rows[0].opss, "-") && !strcmp(rows[0].wrong[0], "N/A"));
    assert_spawn(r, strstr(r->text[0], "[0] # Out of bounds values : N/A (no --check)"));
}

/* Reference results for every dtype and reduction, bit-exact. */
static void test_dtypes_and_redops(void **state) {
    (void)state;
    static const char *const combos[][2] = {
        {"f32", "avg"}, {"f16", "avg"}, {"bf16", "prod"}, {"f64", "min"}, {"i8", "sum"},
        {"u8", "avg"},  {"i32", "max"}, {"i64", "prod"},  {"f16", "sum"}, {"bf16", "avg"},
    };
    size_t n = quick() ? 5 : sizeof combos / sizeof combos[0];
    for (size_t i = 0; i < n; i++) {
        spawn_proc *r =
            bench_run(3, ARGS("--op", "allreduce,reduce,reduce_scatter,alltoall,broadcast",
                              "--check", "--sizes", "4099,70000", "--iters", "2", "--warmup", "1",
                              "--inflight", "2", "--dtype", combos[i][0], "--redop", combos[i][1]));
        if (r->status != 0) {
            spawn_dump(r);
            fail_msg("--dtype %s --redop %s: exit %d", combos[i][0], combos[i][1], r->status);
        }
        spawn_free(r);
    }
}

/* A wrong result is reported with its first bad index, counted in the
 * #wrong column (summed over ranks: rank 2 flips one element of its first
 * out-of-place result of each row; a non-root of reduce receives nothing to
 * flip), and the run goes on to every row; the last lines say FAILED and
 * every rank exits 1 at once (nobody is left waiting for a peer that quit). */
static void test_check_catches_corruption(void **state) {
    (void)state;
    spawn_proc *r = bench_run(3, ARGS("--op", "allreduce,reduce", "--check", "--sizes", "4096,8192",
                                      "--iters", "2", "--corrupt-rank", "2"));
    assert_spawn(r, r->status == 1);
    /* 1024 floats, the middle byte flipped: element 512 */
    assert_spawn(r, strstr(r->text[1], "[2] collie-bench: rank 2: check failed for allreduce of "
                                       "4096 bytes (f32, sum) after the first op: first bad index "
                                       "512 of the result (receive slot 0): got "));
    assert_spawn(r, strstr(r->text[1], "(1 of 1024 elements wrong)"));
    assert_spawn(r, spawn_count(r->text[1], "rank 2: check failed for allreduce of 4096") == 1);
    assert_spawn(r, strstr(r->text[1], "rank 2: check failed for allreduce of 8192 bytes"));
    assert_spawn(r, strstr(r->text[1], "[0] collie-bench: allreduce of 4096 bytes: check failed: "
                                       "1 wrong element over all ranks"));
    static row rows[8];
    size_t n = table_rows(r, rows, 8);
    assert_spawn(r, n == 4);
    for (size_t i = 0; i < n; i++) {
        const char *want = rows[i].op == 0 ? "1" : "0";
        if (strcmp(rows[i].wrong[0], want) != 0 || strcmp(rows[i].wrong[1], "0") != 0) {
            spawn_dump(r);
            fail_msg("row %zu (%s): #wrong %s / %s, want %s / 0", i, op_names[rows[i].op],
                     rows[i].wrong[0], rows[i].wrong[1], want);
        }
    }
    assert_spawn(r, strstr(r->text[0], "[0] # Out of bounds values : 2 FAILED"));
    assert_spawn(r, r->elapsed_ms < 20000);
}

/* nccl-tests' flags: -b/-e/-f sweep sizes, -d/-o/-r lists (and all) make
 * a row per dtype, reduction (reducing ops) and root (rooted ops) in
 * nccl-tests' order, with its type names; -i steps linearly; -c 0 and
 * --check 0 turn checking off; a --op item that is a reduction sets it. */
static void test_nccl_tests_flags(void **state) {
    (void)state;
    static const size_t sweep[] = {8, 64, 512, 4096, 32768};
    static const char *const types[] = {"half", "int32"}, *const redops[] = {"sum", "max"};
    static row rows[MAX_LINES];
    spawn_proc *r =
        bench_run(3, ARGS("-b", "8", "-e", "32K", "-f", "8", "-n", "2", "-w", "1", "-c", "1", "-d",
                          "half,int32", "-o", "sum,max", "-r", "all", "--op", "reduce,allgather"));
    if (r->status != 0) {
        spawn_dump(r);
        fail_msg("exit %d", r->status);
    }
    size_t n = table_rows(r, rows, MAX_LINES), i = 0;
    assert_spawn(r, n == 2 * 2 * 3 * 5 + 2 * 5);
    for (int d = 0; d < 2; d++) /* reduce: dtype, redop, root, size */
        for (int o = 0; o < 2; o++)
            for (int root = 0; root < 3; root++)
                for (int z = 0; z < 5; z++, i++) {
                    const row *w = &rows[i];
                    size_t es = d == 0 ? 2 : 4;
                    if (w->op != 2 || strcmp(w->type, types[d]) || strcmp(w->redop, redops[o]) ||
                        w->root != root || w->size != nccl_tests_bytes("reduce", sweep[z], es, 3) ||
                        w->count != sweep[z] / es || strcmp(w->wrong[0], "0") ||
                        strcmp(w->wrong[1], "0")) {
                        spawn_dump(r);
                        fail_msg("row %zu: %s %zu %s %s %d", i, op_names[w->op], w->size, w->type,
                                 w->redop, w->root);
                    }
                }
    for (int d = 0; d < 2; d++) /* allgather: dtype, size; no redop, no root */
        for (int z = 0; z < 5; z++, i++) {
            const row *w = &rows[i];
            size_t es = d == 0 ? 2 : 4;
            assert_spawn(r, w->op == 3 && !strcmp(w->type, types[d]) && !strcmp(w->redop, "none") &&
                                w->root == -1 &&
                                w->size == nccl_tests_bytes("allgather", sweep[z], es, 3));
        }
    spawn_free(r);

    /* -i steps; --datatype, --root, a reduction through --op, -c 0 */
    static const size_t step[] = {1024, 2048, 3072};
    static const char *const off[] = {"-c", "--check"};
    for (int c = 0; c < 2; c++) {
        r = bench_run(2, ARGS("-b", "1K", "-e", "3K", "-i", "1K", "--op", "allreduce,min", "--op",
                              "broadcast", "--datatype", "double", "--root", "1", "-n", "2", off[c],
                              "0"));
        assert_spawn(r, r->status == 0);
        n = table_rows(r, rows, MAX_LINES);
        assert_spawn(r, n == 6);
        for (i = 0; i < n; i++) {
            const row *w = &rows[i];
            assert_spawn(r, w->op == (i < 3 ? 0 : 1) && w->size == step[i % 3]);
            assert_spawn(r, !strcmp(w->type, "double") && w->root == (i < 3 ? -1 : 1));
            assert_spawn(r, !strcmp(w->redop, i < 3 ? "min" : "none"));
            assert_spawn(r, !strcmp(w->wrong[0], "N/A") && !strcmp(w->wrong[1], "N/A"));
        }
        spawn_free(r);
    }

    /* a root outside the world: said once, by rank 0, every rank exits 2 */
    r = bench_run(2, ARGS("-r", "7", "--sizes", "4"));
    assert_spawn(r, r->status == 2);
    assert_spawn(r, strstr(r->text[1], "[0] collie-bench: -r/--root 7: the world has 2 ranks"));
    assert_spawn(r, spawn_count(r->text[1], "-r/--root 7") == 1);
}

/* An op that misses its deadline (--timeout-ms 20 for 16 MiB ops between
 * three ranks on two cores) is reported with the work's error message and
 * every rank exits 1 -- promptly, and never by a signal. */
static void test_op_deadline_fails_cleanly(void **state) {
    (void)state;
    spawn_proc *r = bench_run(3, ARGS("--op", "allreduce,allgather", "--sizes", "16M",
                                      "--timeout-ms", "20", "--iters", "2"));
    assert_spawn(r, r->status == 1);
    assert_spawn(r, strstr(r->text[1], "] collie-bench: rank "));
    assert_spawn(r, strstr(r->text[1], "deadline of 20 ms passed"));
    assert_spawn(r, r->elapsed_ms < 20000);
}

/* Usage errors exit 2 with a message, also under collie-run; --help exits
 * 0 and names the conventions. */
static void test_usage_errors(void **state) {
    (void)state;
    static const char *const cases[][8] = {
        {"--op", "nope", NULL},
        {"--op", "allreduce,", NULL},
        {"--sizes", "12x", NULL},
        {"--sizes", "4,,8", NULL},
        {"--sizes", "-4", NULL},
        {"--sizes", "2T", NULL},
        {"--iters", "0", NULL},
        {"--iters", "1e3", NULL},
        {"--warmup", "-1", NULL},
        {"--dtype", "f17", NULL},
        {"--redop", "xor", NULL},
        {"--inflight", "0", NULL},
        {"--timeout-ms", "0", NULL},
        {"--bogus", NULL},
        {"--iters", NULL},
        {"extra", NULL},
        {"--corrupt-rank", "1", NULL},
        {"--backend", "", NULL},
        {"--sizes", "2", NULL},                     /* half an fp32 */
        {"--sizes", "0", NULL},                     /* no element at all */
        {"--dtype", "f64", "--sizes", "4,8", NULL}, /* 4 B < one fp64 */
        /* nccl-tests' flags */
        {"-g", "1", NULL},
        {"--ngpus=1", NULL},
        {"-d", "uint32", NULL},
        {"-o", "mulsum", NULL},
        {"-b", "1K", "-e", "8", NULL},
        {"--sizes", "4", "-b", "8", NULL},
        {"-f", "0", NULL},
        {"-b", "1", "-e", "1M", "-i", "1", NULL}, /* over 1024 sizes */
        {"-r", "x", NULL},
        {"-c", "x", NULL},
        {"--csv", "-d", "all", "--sizes", "8", NULL},
        {"--csv", "-r", "all", NULL},
        {"-b", "4", "-e", "8", "-d", "f64", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        spawn_proc *r = run_start("collie-bench", cases[i]);
        spawn_finish(r);
        if (r->status != 2 || strncmp(r->text[1], "collie-bench: ", 14) != 0 || r->len[0] != 0) {
            spawn_dump(r);
            fail_msg("usage case %zu (%s)", i, cases[i][0]);
        }
        spawn_free(r);
    }
    spawn_proc *r = bench_run(2, ARGS("--op", "nope"));
    assert_spawn(r, r->status == 2);
    /* said once, by rank 0, not once per rank */
    assert_spawn(r, strstr(r->text[1], "[0] collie-bench: unknown --op in 'nope'"));
    assert_spawn(r, spawn_count(r->text[1], "collie-bench: unknown --op") == 1);
    spawn_free(r);

    r = run_start("collie-bench", ARGS("--help"));
    spawn_finish(r);
    assert_spawn(r, r->status == 0);
    assert_spawn(r, strstr(r->text[0], "usage: collie-run -n N -- collie-bench"));
    assert_spawn(r, strstr(r->text[0], "nccl-tests"));
    assert_spawn(r, strstr(r->text[0], "busbw"));
    assert_spawn(r, strstr(r->text[0], "--inflight"));
    assert_spawn(r, strstr(r->text[0], "-b, --minbytes"));
    spawn_free(r);

    r = run_start("collie-bench", ARGS("-g", "2"));
    spawn_finish(r);
    assert_spawn(r, strstr(r->text[1], "nccl-tests' -g/--ngpus is not a collie-bench option"));
}

/* The build directory made absolute (the ranks resolve the paths). */
static const char *build_dir(void) {
    static char dir[PATH_MAX];
    const char *d = getenv("CLTEST_BUILD_DIR");
    assert_non_null(realpath(d && *d ? d : "build", dir));
    return dir;
}

/* The NCCL plugin was built (not WITH_NCCL=0). */
static bool nccl_plugin_built(void) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/lib/libcollie_nccl.so", build_dir());
    return access(path, R_OK) == 0;
}

/* The environment that puts the CPU double of libcudart/libnccl under the
 * plugin (LD_LIBRARY_PATH) and the plugin in reach (COLLIE_PLUGIN_PATH);
 * skips the test when the plugin was not built (WITH_NCCL=0). */
static void double_env(const char **ld, const char **pp) {
    static char ldv[PATH_MAX + 64], ppv[PATH_MAX + 32];
    if (!nccl_plugin_built())
        skip_because("the NCCL plugin was not built (WITH_NCCL=0 or no CUDA)");
    snprintf(ldv, sizeof ldv, "LD_LIBRARY_PATH=%s/tests/cuda_double", build_dir());
    snprintf(ppv, sizeof ppv, "COLLIE_PLUGIN_PATH=%s/lib", build_dir());
    *ld = ldv;
    *pp = ppv;
}

/* A backend that cannot be created here fails at once with a message naming
 * it, on every rank; no hang: without the plugin, and with the plugin but
 * the real CUDA runtime (no GPU on this machine; with one, skipped). */
static void test_nccl_backend_fails_cleanly(void **state) {
    (void)state;
    spawn_proc *r = bench_run(2, ARGS("--backend", "nccl", "--sizes", "4", "--iters", "1"));
    assert_spawn(r, r->status != 0 && r->status != 124);
    assert_spawn(r, strstr(r->text[1], "cannot create a communicator with backend 'nccl'"));
    assert_spawn(r, r->len[0] == 0);
    assert_spawn(r, r->elapsed_ms < 20000);
    spawn_free(r);
    if (!nccl_plugin_built()) return;

    char pp[PATH_MAX + 32];
    snprintf(pp, sizeof pp, "COLLIE_PLUGIN_PATH=%s/lib", build_dir());
    r = bench_run_env(
        2, ARGS(pp),
        ARGS("--backend", "nccl", "--sizes", "4", "--iters", "1", "--timeout-ms", "5000"));
    if (r->status == 0) skip_because("this machine has a usable GPU: nothing fails here");
    assert_spawn(r, r->status != 124);
    assert_spawn(r, strstr(r->text[1], "collie-bench: "));
    assert_spawn(r, r->elapsed_ms < 20000);
}

/* --backend cuda:nccl,cpu:tcp against the CPU double of libcudart and
 * libnccl: the timed ops run on "device" buffers (cudaMalloc, cudaMemcpy of
 * the double) through collie_cuda_*, checked; the timings are combined on
 * the cpu backend. One rank (ranks in separate processes: below). */
static void test_nccl_backend_on_the_double(void **state) {
    (void)state;
    const char *ld, *pp;
    double_env(&ld, &pp);
    const char *sizes = quick() ? "4,4096,65536" : "4,4096,1048576";
    spawn_proc *r = bench_run_env(1, ARGS(ld, pp),
                                  ARGS("--backend", "cuda:nccl,cpu:tcp", "--op",
                                       "allreduce,broadcast,allgather", "--sizes", sizes, "--iters",
                                       "3", "--check", "--timeout-ms", "10000"));
    if (r->status != 0 && strstr(r->text[1], "unknown backend 'nccl'")) {
        spawn_dump(r);
        fail_msg("collie-bench could not load libcollie_nccl.so: a plugin takes collie's symbols "
                 "from the executable, so collie-bench must be linked with -rdynamic");
    }
    assert_spawn(r, r->status == 0);
    assert_spawn(r, strstr(r->text[0], "CUDA buffers"));
    static const size_t full[] = {4, 4096, 1048576}, small[] = {4, 4096, 65536};
    static const bool ops[NUM_OPS] = {[0] = true, [1] = true, [3] = true};
    assert_table(r, quick() ? small : full, 3, 1, ops);
}

/* --threads T (nccl-tests' -t): each process runs T ranks, one thread
 * each; N processes are N*T ranks. Checked results, one table from rank 0
 * for the whole world; a corrupted result on a rank in a thread (global
 * rank numbering: process 1 of 2 holds ranks 2 and 3) fails every rank. */
static void test_threads(void **state) {
    (void)state;
    static const size_t sizes[] = {4, 4099, 65536};
    static const bool ops[NUM_OPS] = {
        [0] = true, [2] = true, [3] = true, [5] = true, [9] = true, [10] = true};
    const char *op_arg = "allreduce,reduce,allgather,alltoall,alltoallv,barrier";
    static const struct {
        int procs;
        const char *flag, *threads;
    } runs[] = {{1, "--threads", "2"}, {2, "--threads", "2"}, {1, "-t", "3"}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        int world = runs[i].procs * atoi(runs[i].threads);
        spawn_proc *r = bench_run(runs[i].procs,
                                  ARGS(runs[i].flag, runs[i].threads, "--check", "--op", op_arg,
                                       "--sizes", "4,4099,64K", "--iters", "2", "--warmup", "1"));
        if (r->status != 0) {
            spawn_dump(r);
            fail_msg("-n %d %s %s: exit %d", runs[i].procs, runs[i].flag, runs[i].threads,
                     r->status);
        }
        assert_spawn(r, !strstr(r->text[1], "collie-bench:"));
        assert_only_rank0_stdout(r);
        assert_table(r, sizes, 3, world, ops);
        spawn_free(r);
    }

    /* --csv: the ranks column is the world */
    spawn_proc *r = bench_run(
        2, ARGS("-t", "2", "--op", "allreduce", "--sizes", "4096", "--iters", "2", "--csv"));
    assert_spawn(r, r->status == 0);
    assert_spawn(r, strstr(r->text[0], "[0] allreduce,4096,4,"));
    spawn_free(r);

    r = bench_run(2, ARGS("--threads", "2", "--op", "allreduce", "--check", "--sizes", "4096",
                          "--iters", "2", "--corrupt-rank", "3"));
    assert_spawn(r, r->status == 1);
    assert_spawn(r, strstr(r->text[1], "[1] collie-bench: rank 3: check failed for allreduce of "
                                       "4096 bytes (f32, sum) after the first op: first bad index "
                                       "512 of the result"));
    assert_spawn(r, strstr(r->text[1], "[0] collie-bench: allreduce of 4096 bytes: check failed"));
    assert_spawn(r, r->elapsed_ms < 20000);
    spawn_free(r);

    static const char *const bad[][3] = {
        {"--threads", "0", NULL}, {"-t", "257", NULL}, {"--threads", "x", NULL}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = run_start("collie-bench", bad[i]);
        spawn_finish(r);
        assert_spawn(r, r->status == 2 && strstr(r->text[1], "collie-bench: --threads '"));
        spawn_free(r);
    }
}

/* A layout of ranks for the runs on the CPU double: processes x threads. */
typedef struct layout {
    int procs;
    const char *threads;
} layout;

/* Every op through the NCCL plugin on the CPU double, for each layout,
 * every result checked, the table complete for the whole world. */
static void nccl_double_all_ops(const layout *runs, size_t n) {
    const char *ld, *pp;
    double_env(&ld, &pp);
    static const size_t full[] = {4, 4099, 1048576}, small[] = {4, 4099, 65536};
    const size_t *sizes = quick() ? small : full;
    const char *size_arg = quick() ? "4,4099,65536" : "4,4099,1048576";
    for (size_t i = 0; i < n; i++) {
        spawn_proc *r =
            bench_run_env(runs[i].procs, ARGS(ld, pp),
                          ARGS("--backend", "cuda:nccl,cpu:tcp", "--threads", runs[i].threads,
                               "--op", "all", "--check", "--sizes", size_arg, "--iters", "2",
                               "--warmup", "1", "--timeout-ms", "10000"));
        if (r->status != 0) {
            spawn_dump(r);
            fail_msg("-n %d --threads %s: exit %d", runs[i].procs, runs[i].threads, r->status);
        }
        assert_spawn(r, strstr(r->text[0], "CUDA buffers"));
        assert_only_rank0_stdout(r);
        assert_table(r, sizes, 3, runs[i].procs * atoi(runs[i].threads), NULL);
        spawn_free(r);
    }
}

/* A corrupted result on `rank` fails the run (exit 1), named by the rank
 * that saw it. */
static void nccl_double_corrupt(int procs, const char *threads, const char *op, const char *rank,
                                const char *needle) {
    const char *ld, *pp;
    double_env(&ld, &pp);
    spawn_proc *r = bench_run_env(procs, ARGS(ld, pp),
                                  ARGS("--backend", "cuda:nccl,cpu:tcp", "--threads", threads,
                                       "--op", op, "--check", "--sizes", "4096", "--iters", "2",
                                       "--timeout-ms", "10000", "--corrupt-rank", rank));
    assert_spawn(r, r->status == 1);
    assert_spawn(r, strstr(r->text[1], needle));
    assert_spawn(r, r->elapsed_ms < 20000);
}

/* Ranks as threads of one process (2, 3 and 4), which is where the
 * double's ranks meet without its hub (each on device rank % 4). */
static void test_nccl_threads_on_the_double(void **state) {
    (void)state;
    static const layout runs[] = {{1, "2"}, {1, "3"}, {1, "4"}};
    nccl_double_all_ops(runs, sizeof runs / sizeof runs[0]);
    nccl_double_corrupt(1, "2", "allgather", "1",
                        "[0] collie-bench: rank 1: check failed for allgather of 4096 bytes (f32, "
                        "no redop) after the first op");
}

/* Ranks in separate processes (the double's hub in rank 0's process
 * bridges them, over a Unix socket) at 2 and 3 ranks, and 2 processes of
 * 2 threads (a clique mixing local and remote ranks); a corrupted result
 * on a remote rank fails. */
static void test_nccl_processes_on_the_double(void **state) {
    (void)state;
    static const layout runs[] = {{2, "1"}, {3, "1"}, {2, "2"}};
    nccl_double_all_ops(runs, sizeof runs / sizeof runs[0]);
    nccl_double_corrupt(3, "1", "allreduce", "2",
                        "[2] collie-bench: rank 2: check failed for allreduce of 4096 bytes (f32, "
                        "sum) after the first op: first bad index 512 of the result");
}

/* Outside collie-run: a clear error naming what is missing. */
static void test_needs_the_launcher(void **state) {
    (void)state;
    spawn_proc *r = run_start("collie-bench", ARGS("--sizes", "4"));
    spawn_finish(r);
    assert_spawn(r, r->status == 1);
    assert_spawn(r, strstr(r->text[1], "collie-run"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_all_ops_2_ranks, spawn_teardown),
        cmocka_unit_test_teardown(test_all_ops_3_ranks, spawn_teardown),
        cmocka_unit_test_teardown(test_all_ops_4_ranks, spawn_teardown),
        cmocka_unit_test_teardown(test_csv, spawn_teardown),
        cmocka_unit_test_teardown(test_inflight, spawn_teardown),
        cmocka_unit_test_teardown(test_dtypes_and_redops, spawn_teardown),
        cmocka_unit_test_teardown(test_check_catches_corruption, spawn_teardown),
        cmocka_unit_test_teardown(test_nccl_tests_flags, spawn_teardown),
        cmocka_unit_test_teardown(test_op_deadline_fails_cleanly, spawn_teardown),
        cmocka_unit_test_teardown(test_usage_errors, spawn_teardown),
        cmocka_unit_test_teardown(test_nccl_backend_fails_cleanly, spawn_teardown),
        cmocka_unit_test_teardown(test_nccl_backend_on_the_double, spawn_teardown),
        cmocka_unit_test_teardown(test_threads, spawn_teardown),
        cmocka_unit_test_teardown(test_nccl_threads_on_the_double, spawn_teardown),
        cmocka_unit_test_teardown(test_nccl_processes_on_the_double, spawn_teardown),
        cmocka_unit_test_teardown(test_needs_the_launcher, spawn_teardown),
    };
    return cltest_main(tests, NULL, NULL);
}
