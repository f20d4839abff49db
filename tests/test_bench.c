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
#define NUM_OPS      9

static const char *const op_names[NUM_OPS] = {"allreduce", "broadcast",      "reduce",
                                              "allgather", "reduce_scatter", "alltoall",
                                              "gather",    "scatter",        "barrier"};

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
 * others count/n rounded down to 16 bytes per rank, n blocks in all. */
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

#define MAX_LINES 256
#define STORE_LEN (64 * 1024)

/* The table rank 0 printed: a row per op in `ops` (NULL: all) and size
 * (the barrier: one), sized as nccl-tests sizes them at `ranks` ranks, in
 * dtype f32, every row checked. The header names the world size. */
static void assert_table(const spawn_proc *r, const size_t *sizes, size_t nsizes, int ranks,
                         const bool *ops) {
    static char store[STORE_LEN];
    char *rows[MAX_LINES], head[64];
    snprintf(head, sizeof head, ", %d ranks", ranks);
    assert_spawn(r, strstr(r->text[0], head));
    size_t nl = lines_with(r->text[0], "[0] ", rows, MAX_LINES, store, sizeof store);
    size_t seen[NUM_OPS] = {0}, nrows = 0, want_rows = 0;
    for (size_t i = 0; i < nl; i++) {
        if (rows[i][0] == '#') continue;
        char op[32], algbw[32], busbw[32], opss[32], check[8];
        size_t bytes, count;
        double t, lat;
        int got = sscanf(rows[i], "%31s %zu %zu %lf %lf %31s %31s %31s %7s", op, &bytes, &count, &t,
                         &lat, algbw, busbw, opss, check);
        if (got != 9) {
            spawn_dump(r);
            fail_msg("table row '%s'", rows[i]);
        }
        int k = op_index(op);
        assert_spawn(r, k >= 0 && (!ops || ops[k]));
        size_t want =
            nccl_tests_bytes(op, k == NUM_OPS - 1 ? 0 : sizes[seen[k] % nsizes], 4, (size_t)ranks);
        if (bytes != want) {
            spawn_dump(r);
            fail_msg("%s row %zu: bytes %zu, nccl-tests says %zu", op, seen[k], bytes, want);
        }
        assert_spawn(r, t > 0 && lat > 0);
        assert_spawn(r, strcmp(check, "ok") == 0);
        seen[k]++;
        nrows++;
    }
    for (int k = 0; k < NUM_OPS; k++) {
        size_t want = ops && !ops[k] ? 0 : k == NUM_OPS - 1 ? 1 : nsizes;
        if (seen[k] != want) {
            spawn_dump(r);
            fail_msg("%s: %zu rows, want %zu", op_names[k], seen[k], want);
        }
        want_rows += want;
    }
    assert_int_equal(nrows, want_rows);
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
    assert_spawn(r, strstr(r->text[0], "nccl-tests"));
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
    nl = lines_with(r->text[0], "[0] ", lines, MAX_LINES, store, sizeof store);
    size_t found = 0;
    for (size_t i = 0; i < nl; i++) {
        char op[32], algbw[32], busbw[32], ops[32], check[8];
        size_t bytes, count;
        double t, lat;
        if (sscanf(lines[i], "%31s %zu %zu %lf %lf %31s %31s %31s %7s", op, &bytes, &count, &t,
                   &lat, algbw, busbw, ops, check) != 9 ||
            strcmp(op, "allreduce") != 0)
            continue;
        found++;
        assert_spawn(r, strtod(ops, NULL) > 0);
    }
    assert_spawn(r, found == 1);
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

/* A wrong result is reported with its first bad index; every rank exits 1
 * at once (nobody is left waiting for a peer that quit). */
static void test_check_catches_corruption(void **state) {
    (void)state;
    spawn_proc *r = bench_run(3, ARGS("--op", "allreduce", "--check", "--sizes", "4096", "--iters",
                                      "2", "--corrupt-rank", "2"));
    assert_spawn(r, r->status == 1);
    /* 1024 floats, the middle byte flipped: element 512 */
    assert_spawn(r, strstr(r->text[1], "[2] collie-bench: rank 2: check failed for allreduce of "
                                       "4096 bytes (f32, sum) after the first op: first bad index "
                                       "512 of the result"));
    assert_spawn(r, r->elapsed_ms < 20000);
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
    static const char *const cases[][6] = {
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
    static char store[STORE_LEN];
    char *rows[MAX_LINES];
    size_t nl = lines_with(r->text[0], "[0] ", rows, MAX_LINES, store, sizeof store), nrows = 0;
    for (size_t i = 0; i < nl; i++) {
        if (rows[i][0] == '#') continue;
        size_t len = strlen(rows[i]);
        assert_spawn(r, len > 3 && strcmp(rows[i] + len - 3, " ok") == 0);
        nrows++;
    }
    assert_int_equal(nrows, 9);
}

/* --threads T (nccl-tests' -t): each process runs T ranks, one thread
 * each; N processes are N*T ranks. Checked results, one table from rank 0
 * for the whole world; a corrupted result on a rank in a thread (global
 * rank numbering: process 1 of 2 holds ranks 2 and 3) fails every rank. */
static void test_threads(void **state) {
    (void)state;
    static const size_t sizes[] = {4, 4099, 65536};
    static const bool ops[NUM_OPS] = {[0] = true, [2] = true, [3] = true, [5] = true, [8] = true};
    const char *op_arg = "allreduce,reduce,allgather,alltoall,barrier";
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
