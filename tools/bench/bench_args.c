/*
 * bench_args.c — collie-bench's command line: its own long options and
 * nccl-tests' flags, side by side.
 *
 * Design notes
 *  - nccl-tests' flags mean what they mean there: -b/--minbytes,
 *    -e/--maxbytes, -i/--stepbytes, -f/--stepfactor build the size list as
 *    its sweep does (from min to max, times the factor when it is above 1,
 *    else plus the step; defaults 32M, 32M, 1M, 1); -n/--iters,
 *    -w/--warmup_iters, -c/--check N (0 off), -d/--datatype T|all,
 *    -o R|all (the reduction), -r/--root R|all, -t/--threads.
 *  - Two names collide, and collie's meaning is kept for its long form:
 *    --op names collectives (nccl-tests has a binary per collective), so
 *    `--op all` is every collective; a --op item that is a reduction
 *    (sum, prod, min, max, avg) sets the reduction, as nccl-tests' --op
 *    does. The short -o is always the reduction. --check takes no value, or
 *    nccl-tests' count (`--check 0`, `--check=1`).
 *  - nccl-tests' flags collie-bench has no use for (-g, -G, -z, -a, -m, -p,
 *    -C, -R, -T) are refused by name with what to do instead, not as
 *    "unknown option".
 *  - A usage error is said once, by rank 0: every rank parses the same
 *    arguments, rank 0 says why and exits, and collie-run stops the others
 *    while they hold back (BENCH_USAGE_HOLD_MS). One still running after
 *    that (rank 0 did not fail: different arguments per rank?) says it too.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "bench.h"

#define BENCH_USAGE_HOLD_MS 2000
#define BENCH_NCCL_MIN      ((size_t)32 << 20) /* nccl-tests' default -b and -e */
#define BENCH_NCCL_STEP     ((size_t)1 << 20)  /* and -i */
#define BENCH_MAX_FACTOR    1024

const char *const bench_op_names[BENCH_NUM_OPS] = {
    "allreduce", "broadcast", "reduce",     "allgather", "reduce_scatter", "alltoall",
    "gather",    "scatter",   "allgatherv", "alltoallv", "barrier"};

const char *const bench_redops[COLLIE_NUM_REDOPS] = {"sum", "prod", "min", "max", "avg"};

const char *bench_prog = "collie-bench";

const bench_dtype_info bench_dtypes[BENCH_NUM_DTYPES] = {
    {"f32", "float", {"fp32", "float32", NULL}, COLLIE_FP32},
    {"f16", "half", {"fp16", "float16", NULL}, COLLIE_FP16},
    {"bf16", "bfloat16", {"bf16", NULL, NULL}, COLLIE_BF16},
    {"f64", "double", {"fp64", "float64", NULL}, COLLIE_FP64},
    {"i8", "int8", {"char", NULL, NULL}, COLLIE_INT8},
    {"u8", "uint8", {NULL, NULL, NULL}, COLLIE_UINT8},
    {"i32", "int32", {"int", NULL, NULL}, COLLIE_INT32},
    {"i64", "int64", {NULL, NULL, NULL}, COLLIE_INT64},
};

const char *bench_dtype_name(collie_dtype dt) {
    for (size_t i = 0; i < BENCH_NUM_DTYPES; i++)
        if (bench_dtypes[i].dt == dt) return bench_dtypes[i].name;
    return "?";
}

const char *bench_dtype_nccl_name(collie_dtype dt) {
    for (size_t i = 0; i < BENCH_NUM_DTYPES; i++)
        if (bench_dtypes[i].dt == dt) return bench_dtypes[i].nccl;
    return "?";
}

bool bench_op_reduces(bench_op op) {
    return op == BENCH_ALLREDUCE || op == BENCH_REDUCE || op == BENCH_REDUCE_SCATTER;
}

bool bench_op_rooted(bench_op op) {
    return op == BENCH_BROADCAST || op == BENCH_REDUCE || op == BENCH_GATHER || op == BENCH_SCATTER;
}

bool bench_has_inplace(bench_op op) {
    return op != BENCH_ALLTOALL && op != BENCH_SCATTER && op != BENCH_ALLTOALLV &&
           op != BENCH_BARRIER;
}

/* The launcher's rank: collie-run's, Open MPI's, MPICH's (PMI). */
bool bench_quiet_rank(void) {
    static const char *const vars[] = {"COLLIE_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *r = getenv(vars[i]);
        if (r && *r) return strcmp(r, "0") != 0;
    }
    return false;
}

int bench_usage_error(const char *fmt, const char *arg) {
    if (bench_quiet_rank()) {
        struct timespec hold = {BENCH_USAGE_HOLD_MS / 1000,
                                (BENCH_USAGE_HOLD_MS % 1000) * 1000000L};
        while (nanosleep(&hold, &hold) != 0 && errno == EINTR)
            continue;
    }
    fprintf(stderr, "%s: ", bench_prog);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(%s --help for usage)\n", bench_prog);
    return BENCH_EXIT_USAGE;
}

bool bench_parse_int(const char *s, long long lo, long long hi, int *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

/* A byte count with an optional K/M/G suffix (x1024), as nccl-tests'. */
static bool bench_parse_size(const char *s, size_t len, size_t *out) {
    char tmp[32];
    if (len == 0 || len >= sizeof tmp || s[0] == '-' || s[0] == '+') return false;
    memcpy(tmp, s, len);
    tmp[len] = '\0';
    char *end;
    errno = 0;
    unsigned long long v = strtoull(tmp, &end, 10);
    if (errno || end == tmp) return false;
    unsigned long long mult = 1;
    if (*end) {
        switch (*end) {
        case 'k':
        case 'K': mult = 1ULL << 10; break;
        case 'm':
        case 'M': mult = 1ULL << 20; break;
        case 'g':
        case 'G': mult = 1ULL << 30; break;
        default: return false;
        }
        if (end[1]) return false;
    }
    if (v > BENCH_MAX_BYTES / mult) return false;
    *out = (size_t)(v * mult);
    return true;
}

/* collie-bench's own options */
static void bench_usage_options(FILE *f) {
    fprintf(f,
            "usage: collie-run -n N -- collie-bench [options]\n"
            "\n"
            "Sweeps message sizes for each collective over a communicator created from\n"
            "the environment collie-run sets, and prints one table per collective in\n"
            "nccl-tests' columns (rank 0 only).\n"
            "\n"
            "  -t, --threads T    ranks per process, one thread each (default 1), as\n"
            "                     nccl-tests' -t: N processes of T threads are N*T ranks,\n"
            "                     rank = process rank * T + thread\n"
            "  --backend SPEC     backend spec of the comm (default auto: shared memory\n"
            "                     between same-host ranks, TCP otherwise; tcp, shm, nccl,...);\n"
            "                     with a cuda backend (nccl, cuda:nccl, cpu:tcp,cuda:nccl)\n"
            "                     the ops run on CUDA buffers (libcudart.so.13, loaded at\n"
            "                     run time) and the timings are combined on the cpu backend:\n"
            "                     a spec without one gets cpu:auto (nccl: cpu:auto,nccl)\n"
            "  --device N         CUDA device of every rank (default rank %% devices)\n"
            "  --op LIST          comma list of allreduce, broadcast, reduce, allgather,\n"
            "                     reduce_scatter, alltoall, gather, scatter, allgatherv,\n"
            "                     alltoallv, barrier, or all\n"
            "                     (default all); an item sum|prod|min|max|avg sets the\n"
            "                     reduction instead, as nccl-tests' --op\n"
            "  --sizes LIST       comma list of sizes in bytes, K/M/G suffixes (x1024)\n"
            "                     (default " BENCH_DEFAULT_SIZES ")\n"
            "  --dtype T          f32 f16 bf16 f64 i8 u8 i32 i64, NCCL's names (float half\n"
            "                     bfloat16 double int8 uint8 int32 int64), or all (default f32)\n"
            "  --redop R          sum prod min max avg, or all (default sum)\n"
            "  --root R           root rank of broadcast, reduce, gather, scatter, or all\n"
            "                     (each rank in turn; default 0)\n"
            "  --iters N          timed ops per measurement (default %d)\n"
            "  --warmup N         untimed ops before timing, per size (default %d)\n"
            "  --inflight K       also keep K ops in flight for iters ops; report ops/s\n"
            "  --check [N]        verify every result against a locally computed reference\n"
            "                     and count the wrong elements (N 0: off, as nccl-tests' -c)\n"
            "  --csv              print op,bytes,ranks,lat_us,algbw_GBps,busbw_GBps,ops_per_s\n"
            "                     (one dtype, reduction and root)\n"
            "  --timeout-ms T     deadline of every op (default %d); creating the comm\n"
            "                     may take max(T, 60000) ms\n"
            "  --corrupt-rank R   testing --check itself: rank R flips a bit of its first\n"
            "                     checked result of each row (a rank that receives nothing\n"
            "                     there, such as a non-root of reduce, flips none)\n"
            "  -h, --help         this text\n",
            BENCH_DEFAULT_ITERS, BENCH_DEFAULT_WARMUP, BENCH_DEFAULT_TMO_MS);
}

/* nccl-tests' flags, then what the sizes and the columns mean */
static void bench_usage_notes(FILE *f) {
    fputs("\n"
          "nccl-tests' flags, with nccl-tests' meaning:\n"
          "  -b, --minbytes S   smallest size (default 32M)     \\  instead of --sizes:\n"
          "  -e, --maxbytes S   largest size (default 32M)       | S, S*f, ... up to max\n"
          "  -f, --stepfactor F size factor (default 1: -i)      | (f > 1), else S, S+i,\n"
          "  -i, --stepbytes I  size increment (default 1M)     /  ...\n"
          "  -n, --iters N      as --iters        -w, --warmup_iters N  as --warmup\n"
          "  -c, --check N      as --check N      -d, --datatype T      as --dtype\n"
          "  -o R               as --redop        -r, --root R          as --root\n"
          "\n"
          "Sizes follow nccl-tests: a size S is S/sizeof(dtype) elements in total.\n"
          "allreduce, broadcast, reduce: count = S/sizeof(dtype) elements per rank.\n"
          "allgather, gather: each rank sends count = S/sizeof(dtype)/N elements (rounded\n"
          "down to 16 bytes), the result holds N*count; reduce_scatter, scatter: the send\n"
          "buffer holds N*count, each rank gets count; alltoall: count per peer, N*count\n"
          "each way. The size column is the op's largest buffer (nccl-tests' size),\n"
          "count is the count argument of the call. The barrier is one row of size 0.\n"
          "allgatherv, alltoallv: allgather's and alltoall's sizes, split unevenly (block p\n"
          "of N weighs p+1; alltoallv's rank r sends rank p block (r+p) mod N); count is\n"
          "the whole receive buffer.\n"
          "\n"
          "Columns (nccl-tests'): size count type redop root, then out-of-place and\n"
          "in-place time algbw busbw #wrong; then collie's lat_us and ops/s. time: iters\n"
          "ops posted back to back, per-op mean, averaged over ranks. algbw = size/time;\n"
          "busbw = algbw * factor: allreduce 2(N-1)/N; broadcast, reduce 1; allgather,\n"
          "reduce_scatter, alltoall, gather, scatter (N-1)/N. In place: sendbuf ==\n"
          "recvbuf (allgather, gather: at rank*count of it; reduce_scatter: the result\n"
          "at rank*count of the send buffer); alltoall and scatter have no in-place form\n"
          "in collie (N/A; nor alltoallv); allgatherv in place sends from its own block of\n"
          "the result; broadcast has one buffer, so both columns time the same call.\n"
          "#wrong: wrong elements over all ranks (N/A without --check). lat_us: median\n"
          "over iters of one op posted and waited alone (the slowest rank's time per\n"
          "iteration). ops/s: iters divided by the slowest rank's time with K ops in\n"
          "flight. Works in flight never share a receive buffer (collie runs them\n"
          "concurrently): each gets a slot of a 64 MiB arena, which caps the depth for\n"
          "large sizes.\n"
          "\n"
          "Exit status: 0 ok, 1 error or wrong results, 2 usage error.\n",
          f);
}

static void bench_usage(FILE *f) {
    bench_usage_options(f);
    bench_usage_notes(f);
}

/* ---- values ---------------------------------------------------------------- */

static int bench_find_redop(const char *s, size_t len) {
    for (int i = 0; i < COLLIE_NUM_REDOPS; i++)
        if (strlen(bench_redops[i]) == len && !strncasecmp(s, bench_redops[i], len)) return i;
    return -1;
}

/* A comma list of reductions, or all. */
static int bench_parse_redops(const char *list, const char *flag, bench_opts *o) {
    for (const char *p = list;;) {
        size_t len = strcspn(p, ",");
        int i = bench_find_redop(p, len);
        if (len == 3 && !strncasecmp(p, "all", 3)) {
            for (int r = 0; r < COLLIE_NUM_REDOPS; r++)
                o->redops[r] = true;
        } else if (i >= 0) {
            o->redops[i] = true;
        } else {
            char what[160];
            snprintf(what, sizeof what, "unknown %s in '%.60s' (sum prod min max avg, or all%s)",
                     flag, list,
                     len == 6 && !strncasecmp(p, "mulsum", 6) ? "; collie has no mulsum" : "");
            return bench_usage_error("%s", what);
        }
        if (!p[len]) return BENCH_EXIT_OK;
        p += len + 1;
    }
}

/* --op: collectives, all, or reductions (nccl-tests' --op). */
static int bench_parse_ops(const char *list, bench_opts *o) {
    for (const char *p = list;;) {
        size_t len = strcspn(p, ",");
        bool found = false;
        if (len == 3 && !strncmp(p, "all", 3)) {
            for (int i = 0; i < BENCH_NUM_OPS; i++)
                o->ops[i] = true;
            found = true;
        }
        for (int i = 0; i < BENCH_NUM_OPS && !found; i++)
            if (strlen(bench_op_names[i]) == len && !strncmp(p, bench_op_names[i], len))
                o->ops[i] = found = true;
        int r = found ? -1 : bench_find_redop(p, len);
        if (r >= 0) o->redops[r] = found = true;
        if (!found)
            return bench_usage_error(
                "unknown --op in '%s' (allreduce broadcast reduce allgather reduce_scatter "
                "alltoall gather scatter allgatherv alltoallv barrier all, or a reduction: sum "
                "prod min max avg)",
                list);
        if (!p[len]) return BENCH_EXIT_OK;
        p += len + 1;
    }
}

/* A comma list of dtypes (any of their names), or all. */
static int bench_parse_dtypes(const char *list, bench_opts *o) {
    static const char *const nccl_only[] = {"uint32", "uint64", "fp8_e4m3", "fp8_e5m2"};
    for (const char *p = list;;) {
        size_t len = strcspn(p, ","), i;
        char item[32];
        snprintf(item, sizeof item, "%.*s", (int)(len < 31 ? len : 31), p);
        if (!strcasecmp(item, "all")) {
            for (i = 0; i < BENCH_NUM_DTYPES; i++)
                o->dtypes[i] = true;
        } else {
            for (i = 0; i < BENCH_NUM_DTYPES; i++) {
                const bench_dtype_info *d = &bench_dtypes[i];
                bool hit = !strcasecmp(item, d->name) || !strcasecmp(item, d->nccl);
                for (int a = 0; a < 3 && d->alias[a] && !hit; a++)
                    hit = !strcasecmp(item, d->alias[a]);
                if (hit) break;
            }
            if (i == BENCH_NUM_DTYPES) {
                for (size_t n = 0; n < sizeof nccl_only / sizeof nccl_only[0]; n++)
                    if (!strcasecmp(item, nccl_only[n]))
                        return bench_usage_error(
                            "--dtype '%s': collie has no such type (f32 f16 bf16 f64 i8 u8 i32 "
                            "i64)",
                            item);
                return bench_usage_error("unknown --dtype '%s' (f32 f16 bf16 f64 i8 u8 i32 i64, "
                                         "NCCL's names, or all)",
                                         list);
            }
            o->dtypes[i] = true;
        }
        if (!p[len]) return BENCH_EXIT_OK;
        p += len + 1;
    }
}

/* The size list of -b/-e/-i/-f, as nccl-tests sweeps it. */
static int bench_sweep(bench_opts *o, size_t minb, size_t maxb, size_t step, int factor) {
    char what[128];
    if (minb > maxb) {
        snprintf(what, sizeof what, "-b/--minbytes %zu is larger than -e/--maxbytes %zu", minb,
                 maxb);
        return bench_usage_error("%s", what);
    }
    if (factor <= 1 && step == 0 && minb < maxb)
        return bench_usage_error("-i/--stepbytes 0 with -f/--stepfactor 1 never reaches "
                                 "-e/--maxbytes%s",
                                 "");
    for (size_t s = minb; s <= maxb;) {
        if (o->nsizes == BENCH_MAX_SIZES) {
            snprintf(what, sizeof what, "-b %zu -e %zu gives more than %d sizes: raise -f or -i",
                     minb, maxb, BENCH_MAX_SIZES);
            return bench_usage_error("%s", what);
        }
        o->sizes[o->nsizes++] = s;
        if (s == maxb) break;
        size_t next = factor > 1 ? s * (size_t)factor : s + step;
        if (s == 0 || next <= s || next > maxb) {
            if (factor > 1 && s == 0) return bench_usage_error("-b 0 with a step factor%s", "");
            break;
        }
        s = next;
    }
    return BENCH_EXIT_OK;
}

/* The comma list of --sizes. */
static int bench_parse_sizes(const char *sizes, bench_opts *o) {
    for (const char *p = sizes;;) {
        size_t len = strcspn(p, ",");
        if (o->nsizes == BENCH_MAX_SIZES)
            return bench_usage_error("--sizes: at most 1024 sizes ('%.60s...')", sizes);
        if (!bench_parse_size(p, len, &o->sizes[o->nsizes++]))
            return bench_usage_error("--sizes '%s': want byte counts like 4,4K,1M (at most 1T)",
                                     sizes);
        if (!p[len]) return BENCH_EXIT_OK;
        p += len + 1;
    }
}

/* nccl-tests' flags that mean nothing here, refused with what to do. */
static int bench_nccl_tests_only(int ch, const char *arg) {
    static const struct {
        char ch;
        const char *name, *instead;
    } flags[] = {
        {'g', "ngpus", "a rank drives one device: more ranks are collie-run -n or -t"},
        {'G', "cudagraph", "collie posts each op itself"},
        {'z', "blocking", "collie-bench always waits on the works"},
        {'a', "average", "the time column is the mean over ranks (nccl-tests' -a 1)"},
        {'m', "agg_iters", "--inflight K keeps K ops in flight"},
        {'p', "parallel_init", "every rank creates its comm at once"},
        {'C', "report_cputime", "lat_us is each op's wall time"},
        {'R', "local_register", "collie registers nothing"},
        {'T', "timeout", "use --timeout-ms"},
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        size_t nl = strlen(flags[i].name);
        bool hit = ch == flags[i].ch;
        if (!hit && ch == 0 && !strncmp(arg, "--", 2) && !strncmp(arg + 2, flags[i].name, nl))
            hit = arg[2 + nl] == '\0' || arg[2 + nl] == '=';
        if (hit) {
            char what[160];
            snprintf(what, sizeof what, "nccl-tests' -%c/--%s is not a collie-bench option: %s",
                     flags[i].ch, flags[i].name, flags[i].instead);
            return bench_usage_error("%s", what);
        }
    }
    return 0;
}

/* ---- the command line ---------------------------------------------------- */

enum {
    OPT_BACKEND = 256,
    OPT_OP,
    OPT_SIZES,
    OPT_REDOP,
    OPT_INFLIGHT,
    OPT_CSV,
    OPT_TIMEOUT,
    OPT_CORRUPT,
    OPT_DEVICE,
};

static const struct option bench_longopts[] = {
    {"backend", required_argument, NULL, OPT_BACKEND},
    {"op", required_argument, NULL, OPT_OP},
    {"sizes", required_argument, NULL, OPT_SIZES},
    {"dtype", required_argument, NULL, 'd'},
    {"datatype", required_argument, NULL, 'd'},
    {"redop", required_argument, NULL, OPT_REDOP},
    {"root", required_argument, NULL, 'r'},
    {"iters", required_argument, NULL, 'n'},
    {"warmup", required_argument, NULL, 'w'},
    {"warmup_iters", required_argument, NULL, 'w'},
    {"inflight", required_argument, NULL, OPT_INFLIGHT},
    {"check", optional_argument, NULL, 'c'},
    {"csv", no_argument, NULL, OPT_CSV},
    {"timeout-ms", required_argument, NULL, OPT_TIMEOUT},
    {"threads", required_argument, NULL, 't'},
    {"corrupt-rank", required_argument, NULL, OPT_CORRUPT},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"minbytes", required_argument, NULL, 'b'},
    {"maxbytes", required_argument, NULL, 'e'},
    {"stepbytes", required_argument, NULL, 'i'},
    {"stepfactor", required_argument, NULL, 'f'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0}};

/* The options that take an integer from lo to hi into an int of
 * bench_opts, and what a value out of range is told. */
static const struct bench_int_opt {
    int ch;
    size_t off;
    long long lo, hi;
    const char *bad;
} bench_int_opts[] = {
    {'n', offsetof(bench_opts, iters), 1, BENCH_MAX_ITERS,
     "--iters '%s': want an integer from 1 to 1000000"},
    {'w', offsetof(bench_opts, warmup), 0, BENCH_MAX_ITERS,
     "--warmup '%s': want an integer from 0 to 1000000"},
    {OPT_INFLIGHT, offsetof(bench_opts, inflight), 1, BENCH_MAX_INFLIGHT,
     "--inflight '%s': want an integer from 1 to 1048576"},
    {OPT_TIMEOUT, offsetof(bench_opts, timeout_ms), 1, 86400000,
     "--timeout-ms '%s': want milliseconds from 1 to 86400000"},
    {'t', offsetof(bench_opts, threads), 1, BENCH_MAX_THREADS,
     "--threads '%s': want an integer from 1 to 256"},
    {OPT_CORRUPT, offsetof(bench_opts, corrupt_rank), 0, INT32_MAX,
     "--corrupt-rank '%s': want a rank"},
    {OPT_DEVICE, offsetof(bench_opts, device), 0, INT32_MAX,
     "--device '%s': want a CUDA device number"},
};

/* Where the sizes come from while parsing: --sizes, or nccl-tests' sweep. */
typedef struct bench_size_args {
    const char *sizes;
    size_t minb, maxb, step;
    int factor;
    bool sweep;
} bench_size_args;

/* An option of bench_int_opts: 1 when ch is none of them, else
 * BENCH_EXIT_OK or the usage error. */
static int bench_parse_int_opt(int ch, bench_opts *o) {
    for (size_t i = 0; i < sizeof bench_int_opts / sizeof bench_int_opts[0]; i++) {
        const struct bench_int_opt *t = &bench_int_opts[i];
        if (t->ch != ch) continue;
        int v;
        if (!bench_parse_int(optarg, t->lo, t->hi, &v)) return bench_usage_error(t->bad, optarg);
        _Static_assert(sizeof(int32_t) == sizeof(int), "timeout_ms is set as an int");
        *(int *)(void *)((char *)o + t->off) = v;
        return BENCH_EXIT_OK;
    }
    return 1;
}

/* -b, -e, -i, -f: nccl-tests' sweep. */
static int bench_parse_sweep_opt(int ch, bench_size_args *sz) {
    sz->sweep = true;
    if (ch == 'f') {
        if (!bench_parse_int(optarg, 1, BENCH_MAX_FACTOR, &sz->factor))
            return bench_usage_error("-f/--stepfactor '%s': want an integer from 1 to 1024",
                                     optarg);
        return BENCH_EXIT_OK;
    }
    size_t *dst = ch == 'b' ? &sz->minb : ch == 'e' ? &sz->maxb : &sz->step;
    if (!bench_parse_size(optarg, strlen(optarg), dst))
        return bench_usage_error("-b/-e/-i '%s': want a byte count like 8, 4K, 1M, 1G", optarg);
    return BENCH_EXIT_OK;
}

/* --check alone, --check N / --check=N, -c N (nccl-tests) */
static int bench_parse_check(int argc, char **argv, bench_opts *o) {
    const char *n = optarg;
    int v = 0;
    if (!n && optind < argc && argv[optind][0] >= '0' && argv[optind][0] <= '9') n = argv[optind++];
    if (n && !bench_parse_int(n, 0, INT32_MAX, &v))
        return bench_usage_error("-c/--check '%s': want 0 (off) or a count", n);
    o->check = !n || v > 0;
    return BENCH_EXIT_OK;
}

/* One option ch (getopt_long's answer): BENCH_EXIT_OK to go on, -1 after
 * --help, or the usage error. */
static int bench_parse_opt(int ch, int argc, char **argv, bench_opts *o, bench_size_args *sz) {
    int res = bench_parse_int_opt(ch, o);
    if (res != 1) return res;
    switch (ch) {
    case OPT_BACKEND:
        if (!*optarg) return bench_usage_error("--backend needs a spec%s", "");
        o->backend = optarg;
        return BENCH_EXIT_OK;
    case OPT_OP: return bench_parse_ops(optarg, o);
    case OPT_SIZES: sz->sizes = optarg; return BENCH_EXIT_OK;
    case 'b':
    case 'e':
    case 'i':
    case 'f': return bench_parse_sweep_opt(ch, sz);
    case 'd': return bench_parse_dtypes(optarg, o);
    case 'o': return bench_parse_redops(optarg, "-o", o);
    case OPT_REDOP: return bench_parse_redops(optarg, "--redop", o);
    case 'r':
        if (!strcasecmp(optarg, "all"))
            o->root = BENCH_ALL_ROOTS;
        else if (!bench_parse_int(optarg, 0, INT32_MAX, &o->root))
            return bench_usage_error("-r/--root '%s': want a rank or all", optarg);
        return BENCH_EXIT_OK;
    case 'c': return bench_parse_check(argc, argv, o);
    case OPT_CSV: o->csv = true; return BENCH_EXIT_OK;
    case 'h':
        if (!bench_quiet_rank()) bench_usage(stdout);
        return -1;
    default:
        if ((res = bench_nccl_tests_only(optopt, argv[optind - 1])) != 0) return res;
        return bench_usage_error("unknown or incomplete option '%s'", argv[optind - 1]);
    }
}

/* The defaults of what was not chosen: every op, sum, f32. */
static void bench_default_choices(bench_opts *o) {
    bool any_op = false, any_redop = false, any_dtype = false;
    for (int i = 0; i < BENCH_NUM_OPS; i++)
        any_op |= o->ops[i];
    for (int i = 0; i < COLLIE_NUM_REDOPS; i++)
        any_redop |= o->redops[i];
    for (int i = 0; i < BENCH_NUM_DTYPES; i++)
        any_dtype |= o->dtypes[i];
    if (!any_op)
        for (int i = 0; i < BENCH_NUM_OPS; i++)
            o->ops[i] = true;
    if (!any_redop) o->redops[COLLIE_SUM] = true;
    if (!any_dtype) o->dtypes[0] = true; /* f32 */
}

/* Sizes: --sizes, or nccl-tests' sweep, or the default list. A size must
 * hold one element of every dtype chosen (nccl-tests would run 0 elements
 * and report nothing). */
static int bench_choose_sizes(bench_opts *o, const bench_size_args *sz) {
    int res;
    if (sz->sizes && sz->sweep)
        return bench_usage_error("--sizes and -b/-e/-i/-f both give the sizes: use one%s", "");
    if (sz->sweep) {
        o->sizes_from = "-b/-e";
        res = bench_sweep(o, sz->minb, sz->maxb, sz->step, sz->factor);
    } else {
        o->sizes_from = "--sizes";
        res = bench_parse_sizes(sz->sizes ? sz->sizes : BENCH_DEFAULT_SIZES, o);
    }
    if (res != BENCH_EXIT_OK) return res;
    for (int d = 0; d < BENCH_NUM_DTYPES; d++) {
        size_t es = collie_dtype_size(bench_dtypes[d].dt);
        for (size_t i = 0; o->dtypes[d] && i < o->nsizes; i++)
            if (o->sizes[i] < es) {
                char what[128];
                snprintf(what, sizeof what, "%s: %zu B is less than one %s element (%zu B)",
                         o->sizes_from, o->sizes[i], collie_dtype_name(bench_dtypes[d].dt), es);
                return bench_usage_error("%s", what);
            }
    }
    return BENCH_EXIT_OK;
}

/* --csv has one dtype, reduction and root. */
static int bench_check_csv(const bench_opts *o) {
    int nd = 0, nr = 0;
    for (int i = 0; i < BENCH_NUM_DTYPES; i++)
        nd += o->dtypes[i];
    for (int i = 0; i < COLLIE_NUM_REDOPS; i++)
        nr += o->redops[i];
    if (nd > 1 || nr > 1 || o->root == BENCH_ALL_ROOTS)
        return bench_usage_error("--csv has no dtype, redop or root column: give one of "
                                 "each%s",
                                 "");
    return BENCH_EXIT_OK;
}

/* Which devices the spec serves ("cuda:X" or a bare nccl is cuda), and the
 * comm's spec: the timings are combined on the cpu backend, so one without
 * gets cpu:auto. */
static int bench_choose_spec(bench_opts *o) {
    bool cpu = false;
    for (const char *p = o->backend;;) {
        size_t len = strcspn(p, ",");
        if (!strncasecmp(p, "cuda:", 5) || (len == 4 && !strncasecmp(p, "nccl", 4)))
            o->cuda = true;
        else
            cpu = true;
        if (!p[len]) break;
        p += len + 1;
    }
    o->spec = o->backend;
    if (o->cuda && !cpu) {
        int len = snprintf(o->spec_buf, sizeof o->spec_buf, "cpu:auto,%s", o->backend);
        if (len < 0 || (size_t)len >= sizeof o->spec_buf)
            return bench_usage_error("--backend '%s' is too long", o->backend);
        o->spec = o->spec_buf;
    }
    if (o->device >= 0 && !o->cuda)
        return bench_usage_error("--device needs a cuda backend in --backend ('%s')", o->backend);
    return BENCH_EXIT_OK;
}

int bench_parse_args(int argc, char **argv, bench_opts *o) {
    bench_size_args sz = {
        .minb = BENCH_NCCL_MIN, .maxb = BENCH_NCCL_MIN, .step = BENCH_NCCL_STEP, .factor = 1};
    *o = (bench_opts){.backend = "auto",
                      .root = 0,
                      .iters = BENCH_DEFAULT_ITERS,
                      .warmup = BENCH_DEFAULT_WARMUP,
                      .timeout_ms = BENCH_DEFAULT_TMO_MS,
                      .corrupt_rank = -1,
                      .device = -1,
                      .threads = 1};
    opterr = 0;
    int ch, res;
    while ((ch = getopt_long(argc, argv, "+ht:b:e:i:f:n:w:c:d:o:r:", bench_longopts, NULL)) != -1)
        if ((res = bench_parse_opt(ch, argc, argv, o, &sz)) != BENCH_EXIT_OK) return res;
    if (optind < argc) return bench_usage_error("unexpected argument '%s'", argv[optind]);
    bench_default_choices(o);
    for (int i = 0; i < BENCH_NUM_OPS; i++)
        o->inplace[i] = bench_has_inplace((bench_op)i);
    if ((res = bench_choose_sizes(o, &sz)) != BENCH_EXIT_OK) return res;
    if (o->csv && (res = bench_check_csv(o)) != BENCH_EXIT_OK) return res;
    if (o->inflight > o->iters) o->inflight = o->iters;
    if ((res = bench_choose_spec(o)) != BENCH_EXIT_OK) return res;
    if (o->corrupt_rank >= 0 && !o->check)
        return bench_usage_error("--corrupt-rank needs --check%s", "");
    return BENCH_EXIT_OK;
}
