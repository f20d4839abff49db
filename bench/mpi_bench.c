/*
 * mpi_bench.c — the MPI peer of collie-bench for bench/peers.sh: sweeps
 * message sizes for MPI_Iallreduce, MPI_Ibcast and MPI_Iallgather, driven
 * by MPI_Test polling, and prints collie-bench's CSV. Built twice, against
 * Open MPI and against MPICH:
 *
 *   mpirun -np N mpi_bench [--op LIST|all] [--sizes LIST] [--iters N]
 *       [--warmup N] [--inflight K] [--check] [--csv]
 *
 * Design notes
 *  - Same rules as tools/collie_bench.c, so one table can hold both: fp32
 *    sum, root 0; sizes follow nccl-tests (a size S is S/4 elements;
 *    allgather sends base = (S/4/N) rounded down to 16 bytes and receives
 *    N*base); "bytes" is the op's largest buffer; busbw factors are
 *    nccl-tests' (allreduce 2(N-1)/N, broadcast 1, allgather (N-1)/N).
 *  - Three timings per size, each after an MPI_Barrier:
 *    batch: `iters` ops posted back to back (up to one receive slot per op
 *    in flight), per-op mean averaged over ranks -> algbw, busbw;
 *    lat: `iters` times post one op and poll MPI_Test until it is done; the
 *    per-iteration times are combined with one MPI_Allreduce(MAX) after the
 *    loop (nothing is exchanged inside it) and the median is lat_us;
 *    inflight (--inflight K): `iters` ops with K in flight (post K, post
 *    another as the oldest completes); ops_per_s = iters / the slowest
 *    rank's elapsed time.
 *  - Completion is always found by polling MPI_Test (never MPI_Wait), the
 *    way a server polls collie's work handles from its own loop.
 *  - Buffers: one send buffer of the largest size, and a receive arena of
 *    max(iters, warmup) slots of the largest size capped at 64 MiB (at least
 *    one slot), exactly as collie-bench, so both run the same depth at every
 *    size. Everything is allocated and touched before timing.
 *  - --check: inputs are small integers (exact in fp32), the reference is
 *    computed locally; results are verified after the first op and, for
 *    every slot used, after the timed loops. A mismatch on any rank makes
 *    every rank exit 1 (the flag travels in the statistics allreduce).
 *  - Only rank 0 prints results. Exit 0 ok, 1 error or check failure,
 *    2 usage. MPI errors abort the job (MPI_ERRORS_ARE_FATAL); the caller
 *    bounds the run with timeout(1).
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MB_EXIT_OK        0
#define MB_EXIT_ERROR     1
#define MB_EXIT_USAGE     2
#define MB_MAX_SIZES      64
#define MB_MAX_BYTES      ((size_t)1 << 34)
#define MB_MAX_ITERS      1000000
#define MB_MAX_INFLIGHT   65536
#define MB_ROOT           0
#define MB_POISON         0xA5
#define MB_SLOT_ALIGN     64
#define MB_ARENA_BYTES    ((size_t)64 << 20)
#define MB_DEFAULT_SIZES  "4,4096,1048576,16777216"
#define MB_DEFAULT_ITERS  20
#define MB_DEFAULT_WARMUP 5

typedef enum mb_op { MB_ALLREDUCE, MB_BROADCAST, MB_ALLGATHER, MB_NUM_OPS } mb_op;

static const char *const mb_op_names[MB_NUM_OPS] = {"allreduce", "broadcast", "allgather"};

typedef struct mb_opts {
    bool ops[MB_NUM_OPS];
    size_t sizes[MB_MAX_SIZES];
    size_t nsizes;
    int iters, warmup, inflight; /* inflight 0: off */
    bool check, csv;
} mb_opts;

typedef struct mb_counts {
    size_t param;      /* the count argument of the call */
    size_t send, recv; /* elements */
    size_t bytes;      /* the larger buffer, in bytes */
} mb_counts;

typedef struct mb {
    mb_opts o;
    int rank, size;
    float *sendbuf;
    unsigned char *arena;
    size_t arena_bytes, slot_bytes, nslots;
    MPI_Request *reqs;
    size_t nreqs;
    double *lat; /* iters per-op seconds, then inflight elapsed, then the bad flag */
} mb;

static double mb_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int mb_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double mb_busbw_factor(mb_op op, int n) {
    switch (op) {
    case MB_ALLREDUCE: return 2.0 * (n - 1) / n;
    case MB_BROADCAST: return 1.0;
    default: return (double)(n - 1) / n;
    }
}

/* nccl-tests' *GetCollByteCount for S bytes of fp32. */
static mb_counts mb_counts_for(mb_op op, size_t S, int nranks) {
    size_t n = (size_t)nranks, count = S / sizeof(float);
    size_t base = (count / n) & ~(16 / sizeof(float) - 1);
    mb_counts k = {0, 0, 0, 0};
    if (op == MB_ALLGATHER) {
        k.param = k.send = base;
        k.recv = base * n;
    } else {
        k.param = k.send = k.recv = count;
    }
    k.bytes = (k.send > k.recv ? k.send : k.recv) * sizeof(float);
    return k;
}

/* ---- check values -------------------------------------------------------- */

static uint64_t mb_mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* Input of rank q at index j: an integer in [-4, 4] for sums, a 24-bit
 * integer for data movement; both exact in fp32. */
static float mb_val(mb_op op, uint32_t seed, int q, size_t j) {
    uint64_t h = mb_mix((uint64_t)j * 0x9e3779b97f4a7c15ULL ^
                        ((uint64_t)(unsigned)q + 1) * 0xd1b54a32d192ed03ULL ^ seed);
    if (op == MB_ALLREDUCE) return (float)((int64_t)(h % 9) - 4);
    return (float)((int64_t)(h % (1u << 24)) - (1 << 23));
}

static float *mb_slot(const mb *b, size_t slot) {
    return (float *)(void *)(b->arena + slot * b->slot_bytes);
}

static void mb_fill(mb *b, mb_op op, const mb_counts *k, uint32_t seed, size_t slots) {
    memset(mb_slot(b, 0), MB_POISON, k->recv * sizeof(float));
    if (op == MB_BROADCAST) {
        if (b->rank == MB_ROOT)
            for (size_t sl = 0; sl < slots; sl++)
                for (size_t j = 0; j < k->recv; j++)
                    mb_slot(b, sl)[j] = mb_val(op, seed, MB_ROOT, j);
        return;
    }
    for (size_t j = 0; j < k->send; j++)
        b->sendbuf[j] = mb_val(op, seed, b->rank, j);
}

static bool mb_verify(const mb *b, mb_op op, const mb_counts *k, uint32_t seed, size_t slot,
                      const char *when) {
    const float *r = mb_slot(b, slot);
    for (size_t i = 0; i < k->recv; i++) {
        float want;
        if (op == MB_ALLREDUCE) {
            want = 0;
            for (int q = 0; q < b->size; q++)
                want += mb_val(op, seed, q, i);
        } else if (op == MB_BROADCAST) {
            want = mb_val(op, seed, MB_ROOT, i);
        } else {
            want = mb_val(op, seed, (int)(i / k->param), i % k->param);
        }
        if (memcmp(&want, &r[i], sizeof want) != 0) {
            fprintf(stderr, "mpi_bench: rank %d: %s of %zu bytes, %s: element %zu is %g, want %g\n",
                    b->rank, mb_op_names[op], k->bytes, when, i, (double)r[i], (double)want);
            return false;
        }
    }
    return true;
}

/* ---- posting and polling ------------------------------------------------- */

static void mb_post(mb *b, mb_op op, const mb_counts *k, size_t slot, MPI_Request *req) {
    float *r = mb_slot(b, slot);
    int n = (int)k->param;
    switch (op) {
    case MB_ALLREDUCE:
        MPI_Iallreduce(b->sendbuf, r, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, req);
        break;
    case MB_BROADCAST: MPI_Ibcast(r, n, MPI_FLOAT, MB_ROOT, MPI_COMM_WORLD, req); break;
    default: MPI_Iallgather(b->sendbuf, n, MPI_FLOAT, r, n, MPI_FLOAT, MPI_COMM_WORLD, req); break;
    }
}

static void mb_poll(MPI_Request *req) {
    int done = 0;
    while (!done)
        MPI_Test(req, &done, MPI_STATUS_IGNORE);
}

/* `total` ops with up to `depth` in flight; op i receives into slot
 * i % depth. Returns the elapsed seconds. */
static double mb_ring(mb *b, mb_op op, const mb_counts *k, size_t total, size_t depth) {
    size_t posted = 0, done = 0;
    double t0 = mb_now();
    while (done < total) {
        while (posted < total && posted - done < depth) {
            mb_post(b, op, k, posted % depth, &b->reqs[posted % depth]);
            posted++;
        }
        mb_poll(&b->reqs[done % depth]);
        done++;
    }
    return mb_now() - t0;
}

/* ---- one size -------------------------------------------------------------- */

static void mb_print_header(const mb *b) {
    if (b->o.csv) {
        printf("op,bytes,ranks,lat_us,algbw_GBps,busbw_GBps,ops_per_s\n");
    } else {
        printf("# mpi_bench: %d ranks, fp32 sum, root %d, iters %d, warmup %d, inflight %d\n",
               b->size, MB_ROOT, b->o.iters, b->o.warmup, b->o.inflight);
        printf("# %14s %13s %10s %10s %11s %11s %12s\n", "op", "bytes", "time_us", "lat_us",
               "algbw_GBps", "busbw_GBps", "ops_per_s");
    }
    fflush(stdout);
}

static void mb_print_row(const mb *b, mb_op op, const mb_counts *k, double time_s, double lat_s,
                         double ops_s) {
    double algbw = time_s > 0 ? (double)k->bytes / 1e9 / time_s : 0;
    double busbw = algbw * mb_busbw_factor(op, b->size);
    if (b->o.csv) {
        printf("%s,%zu,%d,%.3f,%.6f,%.6f,", mb_op_names[op], k->bytes, b->size, lat_s * 1e6, algbw,
               busbw);
        if (b->o.inflight)
            printf("%.1f\n", ops_s);
        else
            printf("\n");
    } else {
        printf("  %14s %13zu %10.2f %10.2f %11.3f %11.3f %12.0f\n", mb_op_names[op], k->bytes,
               time_s * 1e6, lat_s * 1e6, algbw, busbw, ops_s);
    }
    fflush(stdout);
}

/* Returns false when some rank's check failed (every rank knows). */
static bool mb_size(mb *b, mb_op op, size_t S, size_t size_idx) {
    mb_counts k = mb_counts_for(op, S, b->size);
    uint32_t seed = (uint32_t)(op * 7919 + size_idx * 104729 + 1);
    size_t iters = (size_t)b->o.iters, warmup = (size_t)b->o.warmup;
    size_t inflight = (size_t)b->o.inflight;
    b->slot_bytes = (k.recv * sizeof(float) + MB_SLOT_ALIGN - 1) / MB_SLOT_ALIGN * MB_SLOT_ALIGN;
    if (b->slot_bytes == 0) b->slot_bytes = MB_SLOT_ALIGN;
    b->nslots = b->arena_bytes / b->slot_bytes;
    size_t batch_depth = iters < b->nslots ? iters : b->nslots;
    size_t warm_depth = warmup < b->nslots ? warmup : b->nslots;
    size_t infl_depth = inflight < b->nslots ? inflight : b->nslots;
    size_t used = batch_depth > warm_depth ? batch_depth : warm_depth;
    if (infl_depth > used) used = infl_depth;
    bool ok = true;
    if (b->o.check) {
        mb_fill(b, op, &k, seed, used);
        mb_ring(b, op, &k, 1, 1);
        ok = mb_verify(b, op, &k, seed, 0, "after the first op");
    }
    if (warmup) mb_ring(b, op, &k, warmup, warm_depth);

    MPI_Barrier(MPI_COMM_WORLD);
    double avg = mb_ring(b, op, &k, iters, batch_depth) / (double)iters;

    MPI_Barrier(MPI_COMM_WORLD);
    for (size_t i = 0; i < iters; i++)
        b->lat[i] = mb_ring(b, op, &k, 1, 1);

    b->lat[iters] = 0;
    if (inflight) {
        MPI_Barrier(MPI_COMM_WORLD);
        b->lat[iters] = mb_ring(b, op, &k, iters, infl_depth);
    }
    for (size_t sl = 0; b->o.check && ok && sl < used; sl++)
        ok = mb_verify(b, op, &k, seed, sl, "after the timed loops");
    b->lat[iters + 1] = ok ? 0.0 : 1.0;

    MPI_Allreduce(MPI_IN_PLACE, b->lat, (int)iters + 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &avg, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    avg /= b->size;
    if (b->lat[iters + 1] != 0.0) {
        if (b->rank == 0)
            fprintf(stderr, "mpi_bench: %s of %zu bytes: check failed (see the ranks above)\n",
                    mb_op_names[op], k.bytes);
        return false;
    }
    double inflight_s = b->lat[iters];
    qsort(b->lat, iters, sizeof(double), mb_cmp_double);
    double median =
        iters % 2 ? b->lat[iters / 2] : (b->lat[iters / 2 - 1] + b->lat[iters / 2]) / 2.0;
    double ops_s = inflight_s > 0 ? (double)iters / inflight_s : 0;
    if (b->rank == 0) mb_print_row(b, op, &k, avg, median, ops_s);
    return true;
}

/* ---- options ----------------------------------------------------------------- */

static void mb_usage(FILE *f) {
    fprintf(f,
            "usage: mpirun -np N mpi_bench [options]\n"
            "  --op LIST      comma list of allreduce, broadcast, allgather, or all\n"
            "  --sizes LIST   sizes in bytes, K/M/G suffixes (default " MB_DEFAULT_SIZES ")\n"
            "  --iters N      timed ops per measurement (default %d)\n"
            "  --warmup N     untimed ops before timing, per size (default %d)\n"
            "  --inflight K   also keep K ops in flight for iters ops; report ops/s\n"
            "  --check        verify results against a locally computed reference\n"
            "  --csv          print op,bytes,ranks,lat_us,algbw_GBps,busbw_GBps,ops_per_s\n"
            "Same sizes, timings and columns as collie-bench (fp32 sum, root 0).\n",
            MB_DEFAULT_ITERS, MB_DEFAULT_WARMUP);
}

static bool mb_parse_int(const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

static bool mb_parse_size(const char *s, size_t len, size_t *out) {
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
    if (v > MB_MAX_BYTES / mult) return false;
    *out = (size_t)(v * mult);
    return true;
}

/* Returns MB_EXIT_OK, MB_EXIT_USAGE, or -1 after --help. */
static int mb_parse_args(int argc, char **argv, mb_opts *o, bool quiet) {
    const char *ops = "all", *sizes = MB_DEFAULT_SIZES;
    *o = (mb_opts){.iters = MB_DEFAULT_ITERS, .warmup = MB_DEFAULT_WARMUP};
    const char *bad = NULL;
    for (int i = 1; i < argc && !bad; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = true;
        if (!strcmp(a, "--op") && v)
            ops = v;
        else if (!strcmp(a, "--sizes") && v)
            sizes = v;
        else if (!strcmp(a, "--iters") && v)
            bad = mb_parse_int(v, 1, MB_MAX_ITERS, &o->iters) ? NULL : a;
        else if (!strcmp(a, "--warmup") && v)
            bad = mb_parse_int(v, 0, MB_MAX_ITERS, &o->warmup) ? NULL : a;
        else if (!strcmp(a, "--inflight") && v)
            bad = mb_parse_int(v, 1, MB_MAX_INFLIGHT, &o->inflight) ? NULL : a;
        else {
            takes = false;
            if (!strcmp(a, "--check"))
                o->check = true;
            else if (!strcmp(a, "--csv"))
                o->csv = true;
            else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
                if (!quiet) mb_usage(stdout);
                return -1;
            } else
                bad = a;
        }
        if (takes) i++;
    }
    for (const char *p = ops; !bad;) {
        size_t len = strcspn(p, ",");
        bool found = false;
        if (len == 3 && !strncmp(p, "all", 3)) {
            for (int i = 0; i < MB_NUM_OPS; i++)
                o->ops[i] = true;
            found = true;
        }
        for (int i = 0; i < MB_NUM_OPS && !found; i++)
            if (strlen(mb_op_names[i]) == len && !strncmp(p, mb_op_names[i], len))
                o->ops[i] = found = true;
        if (!found) bad = ops;
        if (!p[len]) break;
        p += len + 1;
    }
    for (const char *p = sizes; !bad;) {
        size_t len = strcspn(p, ",");
        if (o->nsizes == MB_MAX_SIZES || !mb_parse_size(p, len, &o->sizes[o->nsizes++])) {
            bad = sizes;
            break;
        }
        if (!p[len]) break;
        p += len + 1;
    }
    if (bad) {
        if (!quiet) fprintf(stderr, "mpi_bench: bad or incomplete option near '%s'\n", bad);
        return MB_EXIT_USAGE;
    }
    if (o->inflight > o->iters) o->inflight = o->iters;
    return MB_EXIT_OK;
}

/* ---- main -------------------------------------------------------------------- */

static bool mb_setup(mb *b) {
    size_t max_bytes = MB_SLOT_ALIGN, depth = (size_t)b->o.iters;
    for (size_t i = 0; i < b->o.nsizes; i++)
        if (b->o.sizes[i] > max_bytes) max_bytes = b->o.sizes[i];
    max_bytes = (max_bytes + MB_SLOT_ALIGN - 1) / MB_SLOT_ALIGN * MB_SLOT_ALIGN;
    if ((size_t)b->o.warmup > depth) depth = (size_t)b->o.warmup;
    b->nreqs = depth;
    if (depth > MB_ARENA_BYTES / max_bytes) depth = MB_ARENA_BYTES / max_bytes;
    if (depth == 0) depth = 1;
    b->arena_bytes = depth * max_bytes;
    void *s = NULL, *r = NULL;
    if (posix_memalign(&s, 4096, max_bytes) || posix_memalign(&r, 4096, b->arena_bytes) ||
        !(b->reqs = calloc(b->nreqs, sizeof *b->reqs)) ||
        !(b->lat = calloc((size_t)b->o.iters + 2, sizeof *b->lat))) {
        free(s);
        free(r);
        fprintf(stderr, "mpi_bench: rank %d: cannot allocate %zu + %zu bytes of buffers\n", b->rank,
                max_bytes, b->arena_bytes);
        return false;
    }
    b->sendbuf = s;
    b->arena = r;
    memset(b->sendbuf, 0, max_bytes); /* fault the pages in before timing */
    memset(b->arena, 0, b->arena_bytes);
    return true;
}

int main(int argc, char **argv) {
    mb b;
    memset(&b, 0, sizeof b);
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &b.size);
    int rc = mb_parse_args(argc, argv, &b.o, b.rank != 0);
    if (rc != MB_EXIT_OK) {
        MPI_Finalize();
        return rc < 0 ? MB_EXIT_OK : rc;
    }
    int ok = mb_setup(&b), all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all_ok && b.rank == 0) mb_print_header(&b);
    for (int op = 0; op < MB_NUM_OPS && all_ok; op++) {
        if (!b.o.ops[op]) continue;
        for (size_t i = 0; i < b.o.nsizes && all_ok; i++)
            all_ok = mb_size(&b, (mb_op)op, b.o.sizes[i], i);
    }
    free(b.reqs);
    free(b.lat);
    free(b.sendbuf);
    free(b.arena);
    MPI_Finalize();
    return all_ok ? MB_EXIT_OK : MB_EXIT_ERROR;
}
