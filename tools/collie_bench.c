/*
 * collie_bench.c — collie-bench: sweeps message sizes for each collective
 * and prints latency, algbw and busbw with the nccl-tests conventions. Run
 * it under the launcher:
 *
 *   collie-run -n N -- collie-bench [-t|--threads T] [--backend SPEC]
 *       [--op LIST|all] [--sizes LIST] [--dtype T] [--redop R] [--iters N]
 *       [--warmup N] [--inflight K] [--check] [--csv] [--timeout-ms T]
 *
 * Design notes
 *  - Sizes follow nccl-tests exactly (its *GetCollByteCount): a requested
 *    size S gives count = S / sizeof(dtype); allreduce, broadcast and reduce
 *    pass that count; allgather, gather, reduce_scatter, alltoall and scatter
 *    pass base = (count / nranks) rounded down to a multiple of 16 bytes, so
 *    their largest buffer holds base * nranks elements. The "bytes" column is
 *    nccl-tests' size column: the op's largest buffer (max of send and
 *    receive bytes), and "count" is the count argument of the call. algbw is
 *    bytes / time and busbw = algbw * factor (allreduce 2(n-1)/n; broadcast
 *    and reduce 1; allgather, reduce_scatter, alltoall, gather, scatter
 *    (n-1)/n). The barrier has no size: one row, bytes 0, no bandwidth.
 *  - Three timings per size, each after a barrier. time_us (nccl-tests):
 *    `iters` ops posted back to back, then waited; the per-op mean, averaged
 *    over ranks (nccl-tests' default -a 1); algbw and busbw come from it.
 *    lat_us: `iters` times post one op and wait for it; the per-op times of
 *    all ranks are reduced with one MAX allreduce after the loop (nothing is
 *    exchanged inside it) and the median is reported. ops_per_s (--inflight
 *    K): `iters` ops with K in flight (post K, post another as each
 *    completes); iters / the slowest rank's elapsed time.
 *  - Receive buffers: collie runs a comm's works concurrently, each on its
 *    own schedule step (transports/tcp/tcp_exec.c), so works in flight must
 *    not share a receive buffer: two reduces accumulating into one buffer
 *    double-count (a CUDA stream would serialise them; collie does not).
 *    Work i of a loop of depth d receives into slot i % d of one arena of at
 *    most BENCH_ARENA_BYTES (or one slot of the largest size); the depth of
 *    the batch and of --inflight is capped by the slots that fit at that
 *    size, and the table says so when it is. Send buffers are only read, so
 *    all works share one. Everything is allocated once, for the largest
 *    size, and touched before timing; nothing of ours is allocated per
 *    iteration (the works are the library's; their handles live in one
 *    array).
 *  - --check: inputs are a deterministic function of (op, size, rank,
 *    index) and the reference is recomputed locally from that function, so
 *    no rank needs another's data. Reductions use small integers (sum, min,
 *    max, avg: [-4, 4], uint8 [0, 8]; prod: {-2, -1, 1, 2}, uint8 {1, 2,
 *    3}) whose partial results are exact in every dtype up to 64 ranks (the
 *    bf16 sums; fp16 products overflow to Inf on both sides alike), so the
 *    order of reduction does not matter and results compare bit-exactly: integers wrap and avg
 * truncates as collie specifies; floating avg is one correctly rounded division. Data movement uses
 *    hashed values exact in the dtype. Slot 0 is poisoned before the
 *    checked op; after the timed loops every slot used is verified (it
 *    holds the result of the last work that received into it). A rank that
 *    finds a mismatch prints the first bad index; a flag travels in the
 *    statistics allreduce so every rank then exits 1 together (no rank is
 *    left waiting for a peer that quit).
 *  - --threads T (nccl-tests' -t): a process runs T ranks, one thread each
 *    (thread 0 on the main thread); rank = process rank * T + thread, world
 *    size = processes * T. A rank in a thread is a rank in a process minus
 *    the address space: its own engine (progress thread), store connection,
 *    comm, buffers, work array, CUDA stream and device (rank % devices), so
 *    -n 4 and -n 2 -t 2 time the same thing, and memory per process grows T
 *    times. Only the parsed options and where the process sits in the world
 *    (bench_proc) are shared, read-only. Ranks in threads are what lets the
 *    CPU double of CUDA and NCCL, whose ranks meet only inside one process,
 *    run a multi-rank --backend nccl.
 *  - Errors: a failed post prints collie_last_error(), a failed work its
 *    collie_work_error_message(); the comm is aborted and the rank exits 1
 *    (a process of several ranks exits 1 if any of them failed). A rank that
 *    fails also aborts the comms of the other ranks of its process, as
 *    collie-run stops the other processes, so none of them waits out a
 *    deadline for it; comms are created with collie_comm_create_post and
 *    published at once, so one still in its rendezvous can be aborted too.
 *    A failed check is not such a failure: every rank learns it together.
 *    Every op carries --timeout-ms as its deadline (post options and comm
 *    default), and every wait is additionally bounded by that plus a slack.
 *    Creating the comm waits for every rank to start, so its bound is
 *    --timeout-ms but at least BENCH_CREATE_TMO_MS (plus the slack).
 *  - Output: only rank 0 (thread 0 of process 0) prints results, and only
 *    process 0 --help (one table under collie-run); every rank reports its
 *    own errors on stderr; a usage error is said once, by rank 0 (the
 *    others hold back until the launcher stops them). --csv prints exactly one header line and the
 *    rows. Exit 0 ok, 1 error or check failure, 2 usage.
 *  - A spec with a cuda backend ("nccl", "cuda:X"): the timed ops run on
 *    CUDA buffers through collie_cuda.h on the bench's own stream, waited
 *    with collie_work_wait; libcudart.so.13 is dlopen'ed (no CUDA headers or
 *    link dependency) after the comm exists, so a missing plugin or device
 *    is the comm's error. Host buffers stay as staging for --check
 *    (cudaMemcpy up before, down after). Barriers between timings and the
 *    statistics allreduce run on the cpu backend: a spec without one gets
 *    "cpu:tcp," in front.
 *  - No libm: fp16/bf16 rounding is integer code, plus float arithmetic in
 *    the default rounding mode for fp16 subnormals.
 */
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "collie.h"
#include "collie_cuda.h"

#define BENCH_EXIT_OK        0
#define BENCH_EXIT_ERROR     1
#define BENCH_EXIT_USAGE     2
#define BENCH_MAX_SIZES      64
#define BENCH_MAX_BYTES      ((size_t)1 << 40) /* per buffer */
#define BENCH_MAX_ITERS      1000000
#define BENCH_MAX_INFLIGHT   (1 << 20)
#define BENCH_WAIT_SLACK_MS  5000 /* wait bound beyond the op deadline */
#define BENCH_DEFAULT_SIZES  "4,4096,1048576,16777216"
#define BENCH_DEFAULT_ITERS  20
#define BENCH_DEFAULT_WARMUP 5
#define BENCH_DEFAULT_TMO_MS 60000
#define BENCH_CREATE_TMO_MS  60000 /* comm creation: at least this */
#define BENCH_ROOT           0
#define BENCH_POISON         0xA5
#define BENCH_SLOT_ALIGN     64                 /* receive slots start on cache lines */
#define BENCH_ARENA_BYTES    ((size_t)64 << 20) /* receive slots, unless one size needs more */
#define BENCH_CHECK_FAILED   1000               /* bench_size: a rank's check failed */
#define BENCH_MAX_THREADS    256                /* --threads: ranks per process */

typedef enum bench_op {
    BENCH_ALLREDUCE,
    BENCH_BROADCAST,
    BENCH_REDUCE,
    BENCH_ALLGATHER,
    BENCH_REDUCE_SCATTER,
    BENCH_ALLTOALL,
    BENCH_GATHER,
    BENCH_SCATTER,
    BENCH_BARRIER,
    BENCH_NUM_OPS
} bench_op;

static const char *const bench_op_names[BENCH_NUM_OPS] = {"allreduce", "broadcast",      "reduce",
                                                          "allgather", "reduce_scatter", "alltoall",
                                                          "gather",    "scatter",        "barrier"};

/* nccl-tests' busbw factors (its *GetBw). */
static double bench_busbw_factor(bench_op op, int n) {
    switch (op) {
    case BENCH_ALLREDUCE: return 2.0 * (n - 1) / n;
    case BENCH_BROADCAST:
    case BENCH_REDUCE: return 1.0;
    case BENCH_BARRIER: return 0.0;
    default: return (double)(n - 1) / n;
    }
}

static const struct {
    const char *name, *alias;
    collie_dtype dt;
} bench_dtypes[] = {
    {"f32", "fp32", COLLIE_FP32},      {"f16", "fp16", COLLIE_FP16},
    {"bf16", "bfloat16", COLLIE_BF16}, {"f64", "fp64", COLLIE_FP64},
    {"i8", "int8", COLLIE_INT8},       {"u8", "uint8", COLLIE_UINT8},
    {"i32", "int32", COLLIE_INT32},    {"i64", "int64", COLLIE_INT64},
};

static const char *const bench_redops[COLLIE_NUM_REDOPS] = {"sum", "prod", "min", "max", "avg"};

typedef struct bench_opts {
    const char *backend; /* as given */
    const char *spec;    /* of the comm: backend, with cpu:tcp added when it has no cpu backend */
    char spec_buf[256];
    bool cuda;  /* the spec has a cuda backend: the timed ops run on CUDA buffers */
    int device; /* --device, or -1 */
    bool ops[BENCH_NUM_OPS];
    size_t sizes[BENCH_MAX_SIZES];
    size_t nsizes;
    collie_dtype dt;
    collie_redop redop;
    int iters, warmup, inflight; /* inflight 0: off */
    bool check, csv;
    int32_t timeout_ms;
    int corrupt_rank; /* -1, or the rank that spoils its first checked result */
    int threads;      /* ranks per process, one thread each */
} bench_opts;

/* What one op is called with for one requested size (nccl-tests). */
typedef struct bench_counts {
    size_t param;      /* the count argument of the call */
    size_t send, recv; /* elements of the send and receive buffers */
    size_t bytes;      /* nccl-tests' size: the larger buffer, in bytes */
} bench_counts;

/* The few CUDA runtime calls the bench makes, loaded with dlopen (no CUDA
 * headers, no link dependency). cudaError_t is an int, 0 success. */
typedef struct bench_cuda {
    void *lib;
    int (*GetDeviceCount)(int *);
    int (*SetDevice)(int);
    int (*Malloc)(void **, size_t);
    int (*Free)(void *);
    int (*Memcpy)(void *, const void *, size_t, int); /* kind: 1 to device, 2 to host */
    int (*StreamCreate)(collie_cuda_stream_t *);
    int (*StreamSynchronize)(collie_cuda_stream_t);
    int (*StreamDestroy)(collie_cuda_stream_t);
    const char *(*GetErrorString)(int);
    collie_cuda_stream_t stream;
    unsigned char *send, *arena; /* device buffers, the size of the host ones */
} bench_cuda;

#define BENCH_CUDA_TO_DEVICE 1
#define BENCH_CUDA_TO_HOST   2

/* What the ranks of one process share. The options and the place in the
 * world are read-only once the threads start; `failed_rank`, `comms` and `why`
 * live under `mu`. */
typedef struct bench_proc {
    const bench_opts *o;
    const char *store_addr; /* COLLIE_STORE_ADDR */
    int prank, nprocs;      /* COLLIE_RANK, COLLIE_WORLD_SIZE: processes, not ranks */
    pthread_mutex_t mu;
    int failed_rank;     /* -1, or the first rank of this process that failed: the others stop */
    collie_comm **comms; /* thread t's comm from its creation to its destruction */
    char why[96];        /* the abort reason given to the others */
} bench_proc;

/* One rank: everything it touches is its own (one per thread). */
typedef struct bench {
    const bench_opts *o;
    bench_proc *proc;
    int thread; /* of this process, 0 .. threads-1 */
    int res;    /* how the rank ended: COLLIE_OK, an error, BENCH_CHECK_FAILED */
    bench_cuda cu;
    collie_engine *engine;
    collie_store *store;
    collie_comm *comm;
    int rank, size;         /* global: prank * threads + thread, nprocs * threads */
    size_t es;              /* bytes per element */
    unsigned char *sendbuf; /* sized for the largest size; only read by the ops */
    unsigned char *arena;   /* receive slots, one per work in flight */
    size_t arena_bytes;
    size_t slot_bytes, nslots; /* of the current size */
    collie_work **works;       /* outstanding works; NULL entries are free */
    size_t nworks;
    double *lat;   /* iters per-op seconds, then inflight elapsed, then the bad flag */
    double avg[1]; /* batch per-op seconds, averaged over ranks */
    collie_post_opts po;
    double busbw_sum;
    int busbw_rows;
} bench;

/* ---- small helpers ------------------------------------------------------- */

static int64_t bench_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static bool bench_quiet_rank(void) {
    const char *r = getenv("COLLIE_RANK");
    return r && *r && strcmp(r, "0") != 0;
}

static int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static bool bench_dtype_is_float(collie_dtype dt) {
    return dt == COLLIE_FP16 || dt == COLLIE_BF16 || dt == COLLIE_FP32 || dt == COLLIE_FP64;
}

static const char *bench_dtype_name(collie_dtype dt) {
    for (size_t i = 0; i < sizeof bench_dtypes / sizeof bench_dtypes[0]; i++)
        if (bench_dtypes[i].dt == dt) return bench_dtypes[i].name;
    return "?";
}

/* ---- fp16 / bf16 without libm ---------------------------------------------- */

/* Round a float to IEEE binary16, to nearest even (Inf on overflow). */
static uint16_t bench_f2h(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffff;
    if (ax > 0x7f800000) return sign | 0x7e00;   /* NaN */
    if (ax >= 0x477ff000) return sign | 0x7c00;  /* >= 65520 rounds to Inf */
    if (ax >= 0x38800000) {                      /* normal: rebias 127 -> 15 */
        uint32_t r = ax - ((uint32_t)112 << 23); /* exponent - 112 */
        r += 0xfff + ((r >> 13) & 1);
        return sign | (uint16_t)(r >> 13);
    }
    /* subnormal: |f| * 2^24 is exact; round it to an integer, ties to even */
    float a;
    memcpy(&a, &ax, 4);
    float t = a * 16777216.0f;
    float r = (t + 8388608.0f) - 8388608.0f;
    return sign | (uint16_t)r;
}

static uint16_t bench_f2bf(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

/* Widen for messages only. */
static double bench_h2d(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31) return m ? __builtin_nan("") : ((h & 0x8000) ? -__builtin_inf() : __builtin_inf());
    v = e ? (double)(1024 + m) : (double)m;
    for (int k = 0; k < (e ? e - 1 : 0); k++)
        v *= 2.0;
    v /= 16777216.0; /* 2^-24 */
    return (h & 0x8000) ? -v : v;
}

static double bench_bf2d(uint16_t b) {
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* ---- element values ------------------------------------------------------ */

static uint64_t bench_mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint64_t bench_hash(uint32_t seed, int q, size_t j) {
    return bench_mix((uint64_t)j * 0x9e3779b97f4a7c15ULL ^
                     ((uint64_t)(unsigned)q + 1) * 0xd1b54a32d192ed03ULL ^ seed);
}

/* Input of rank q at index j for a reduction: small integers (see notes). */
static int64_t bench_red_val(const bench *b, uint32_t seed, int q, size_t j) {
    uint64_t h = bench_hash(seed, q, j);
    if (b->o->redop == COLLIE_PROD) {
        static const int64_t f[4] = {-2, -1, 1, 2};
        return b->o->dt == COLLIE_UINT8 ? (int64_t)(1 + h % 3) : f[h % 4];
    }
    return b->o->dt == COLLIE_UINT8 ? (int64_t)(h % 9) : (int64_t)(h % 9) - 4;
}

/* Input of rank q at index j for data movement: exact in the dtype. */
static int64_t bench_move_val(const bench *b, uint32_t seed, int q, size_t j) {
    uint64_t h = bench_hash(seed, q, j);
    switch (b->o->dt) {
    case COLLIE_INT8: return (int64_t)(h & 0xff) - 128;
    case COLLIE_UINT8: return (int64_t)(h & 0xff);
    case COLLIE_INT32: return (int64_t)(h & 0xffffffff) - ((int64_t)1 << 31);
    case COLLIE_INT64: return (int64_t)(h >> 1) - ((int64_t)1 << 62);
    case COLLIE_FP16: return (int64_t)(h % 4095) - 2047;
    case COLLIE_BF16: return (int64_t)(h % 511) - 255;
    case COLLIE_FP32: return (int64_t)(h % (1u << 24)) - (1 << 23);
    default: return (int64_t)(h >> 12) - ((int64_t)1 << 51); /* FP64 */
    }
}

/* Store a float value (already exact or to be rounded once) as dtype dt. */
static void bench_store_fp(collie_dtype dt, void *p, double v) {
    switch (dt) {
    case COLLIE_FP16: {
        uint16_t h = bench_f2h((float)v);
        memcpy(p, &h, 2);
        break;
    }
    case COLLIE_BF16: {
        uint16_t h = bench_f2bf((float)v);
        memcpy(p, &h, 2);
        break;
    }
    case COLLIE_FP32: {
        float f = (float)v;
        memcpy(p, &f, 4);
        break;
    }
    default: memcpy(p, &v, 8); break;
    }
}

/* Store the low bits of an integer (two's complement) as dtype dt. */
static void bench_store_int(collie_dtype dt, void *p, uint64_t u) {
    switch (dt) {
    case COLLIE_INT8:
    case COLLIE_UINT8: {
        uint8_t v = (uint8_t)u;
        memcpy(p, &v, 1);
        break;
    }
    case COLLIE_INT32: {
        uint32_t v = (uint32_t)u;
        memcpy(p, &v, 4);
        break;
    }
    default: memcpy(p, &u, 8); break;
    }
}

static void bench_store(collie_dtype dt, void *p, int64_t v) {
    if (bench_dtype_is_float(dt))
        bench_store_fp(dt, p, (double)v);
    else
        bench_store_int(dt, p, (uint64_t)v);
}

/* The reference result at input index j of a reduction over all ranks. */
static void bench_red_ref(const bench *b, uint32_t seed, size_t j, void *out) {
    collie_dtype dt = b->o->dt;
    collie_redop op = b->o->redop;
    int n = b->size;
    if (bench_dtype_is_float(dt)) {
        double acc = 0;
        for (int q = 0; q < n; q++) {
            double v = (double)bench_red_val(b, seed, q, j);
            if (q == 0)
                acc = v;
            else if (op == COLLIE_PROD)
                acc *= v;
            else if (op == COLLIE_MIN)
                acc = v < acc ? v : acc;
            else if (op == COLLIE_MAX)
                acc = v > acc ? v : acc;
            else
                acc += v;
        }
        if (op == COLLIE_AVG) acc /= n; /* exact sum, one rounding (see notes) */
        bench_store_fp(dt, out, acc);
        return;
    }
    uint64_t acc = 0;
    int64_t mm = 0;
    for (int q = 0; q < n; q++) {
        int64_t v = bench_red_val(b, seed, q, j);
        if (q == 0) {
            acc = (uint64_t)v;
            mm = v;
        } else if (op == COLLIE_PROD) {
            acc *= (uint64_t)v;
        } else {
            acc += (uint64_t)v;
            if (op == COLLIE_MIN && v < mm) mm = v;
            if (op == COLLIE_MAX && v > mm) mm = v;
        }
    }
    if (op == COLLIE_MIN || op == COLLIE_MAX) {
        acc = (uint64_t)mm;
    } else if (op == COLLIE_AVG) {
        /* the wrapped sum, read as signed (unsigned for uint8), truncated */
        int64_t s;
        switch (dt) {
        case COLLIE_INT8: s = (int64_t)(int8_t)(uint8_t)acc; break;
        case COLLIE_UINT8: s = (int64_t)(uint8_t)acc; break;
        case COLLIE_INT32: s = (int64_t)(int32_t)(uint32_t)acc; break;
        default: s = (int64_t)acc; break;
        }
        acc = (uint64_t)(s / n);
    }
    bench_store_int(dt, out, acc);
}

/* ---- sizes --------------------------------------------------------------- */

/* nccl-tests' *GetCollByteCount for a requested size of S bytes. */
static bench_counts bench_counts_for(bench_op op, size_t S, size_t es, int nranks) {
    size_t n = (size_t)nranks, count = S / es;
    size_t base = (count / n) & ~(16 / es - 1);
    bench_counts k = {0, 0, 0, 0};
    switch (op) {
    case BENCH_ALLREDUCE:
    case BENCH_BROADCAST:
    case BENCH_REDUCE: k.param = k.send = k.recv = count; break;
    case BENCH_ALLGATHER:
    case BENCH_GATHER:
        k.param = k.send = base;
        k.recv = base * n;
        break;
    case BENCH_REDUCE_SCATTER:
    case BENCH_SCATTER:
        k.param = k.recv = base;
        k.send = base * n;
        break;
    case BENCH_ALLTOALL:
        k.param = base;
        k.send = k.recv = base * n;
        break;
    default: break; /* barrier */
    }
    k.bytes = (k.send > k.recv ? k.send : k.recv) * es;
    return k;
}

/* ---- posting and waiting ------------------------------------------------- */

static unsigned char *bench_slot(const bench *b, size_t slot) {
    return b->arena + slot * b->slot_bytes;
}

static void bench_post_failed(bench *b, bench_op op, const bench_counts *k, int res) {
    const char *why = collie_last_error();
    fprintf(stderr, "collie-bench: rank %d: %s of %zu bytes: post failed: %s (%s)\n", b->rank,
            bench_op_names[op], k->bytes, *why ? why : collie_strerror(res),
            collie_status_name(res));
}

/* Post op on the CUDA buffers and stream (collie_cuda.h). */
static int bench_post_cuda(bench *b, bench_op op, const bench_counts *k, size_t slot,
                           collie_work **w) {
    collie_comm *c = b->comm;
    collie_dtype dt = b->o->dt;
    collie_redop rop = b->o->redop;
    collie_cuda_stream_t st = b->cu.stream;
    void *s = b->cu.send, *r = b->cu.arena + slot * b->slot_bytes;
    size_t n = k->param;
    switch (op) {
    case BENCH_ALLREDUCE: return collie_cuda_allreduce(c, s, r, n, dt, rop, st, &b->po, w);
    case BENCH_BROADCAST: return collie_cuda_broadcast(c, r, n, dt, BENCH_ROOT, st, &b->po, w);
    case BENCH_REDUCE: return collie_cuda_reduce(c, s, r, n, dt, rop, BENCH_ROOT, st, &b->po, w);
    case BENCH_ALLGATHER: return collie_cuda_allgather(c, s, r, n, dt, st, &b->po, w);
    case BENCH_REDUCE_SCATTER:
        return collie_cuda_reduce_scatter(c, s, r, n, dt, rop, st, &b->po, w);
    case BENCH_ALLTOALL: return collie_cuda_alltoall(c, s, r, n, dt, st, &b->po, w);
    case BENCH_GATHER: return collie_cuda_gather(c, s, r, n, dt, BENCH_ROOT, st, &b->po, w);
    case BENCH_SCATTER: return collie_cuda_scatter(c, s, r, n, dt, BENCH_ROOT, st, &b->po, w);
    default: return collie_cuda_barrier(c, st, &b->po, w);
    }
}

static int bench_post(bench *b, bench_op op, const bench_counts *k, size_t slot, collie_work **w) {
    if (b->o->cuda) {
        int res = bench_post_cuda(b, op, k, slot, w);
        if (res != COLLIE_OK) bench_post_failed(b, op, k, res);
        return res;
    }
    collie_comm *c = b->comm;
    collie_dtype dt = b->o->dt;
    collie_redop rop = b->o->redop;
    void *s = b->sendbuf, *r = bench_slot(b, slot);
    size_t n = k->param;
    int res;
    switch (op) {
    case BENCH_ALLREDUCE: res = collie_allreduce(c, s, r, n, dt, rop, &b->po, w); break;
    case BENCH_BROADCAST: res = collie_broadcast(c, r, n, dt, BENCH_ROOT, &b->po, w); break;
    case BENCH_REDUCE: res = collie_reduce(c, s, r, n, dt, rop, BENCH_ROOT, &b->po, w); break;
    case BENCH_ALLGATHER: res = collie_allgather(c, s, r, n, dt, &b->po, w); break;
    case BENCH_REDUCE_SCATTER: res = collie_reduce_scatter(c, s, r, n, dt, rop, &b->po, w); break;
    case BENCH_ALLTOALL: res = collie_alltoall(c, s, r, n, dt, &b->po, w); break;
    case BENCH_GATHER: res = collie_gather(c, s, r, n, dt, BENCH_ROOT, &b->po, w); break;
    case BENCH_SCATTER: res = collie_scatter(c, s, r, n, dt, BENCH_ROOT, &b->po, w); break;
    default: res = collie_barrier(c, &b->po, w); break;
    }
    if (res != COLLIE_OK) {
        bench_post_failed(b, op, k, res);
        if (res == COLLIE_ENOTSUP)
            fprintf(stderr,
                    "collie-bench: it posts on CPU buffers, and backend spec '%s' has no "
                    "cpu backend\n",
                    b->o->spec);
    }
    return res;
}

/* Wait for b->works[i] (bounded) and release it. */
static int bench_wait(bench *b, size_t i, bench_op op, const bench_counts *k) {
    collie_work *w = b->works[i];
    int res = collie_work_wait(w, b->o->timeout_ms + BENCH_WAIT_SLACK_MS);
    if (res != COLLIE_OK) {
        const char *msg = collie_work_error_message(w);
        if (res == COLLIE_INPROGRESS)
            fprintf(stderr,
                    "collie-bench: rank %d: %s of %zu bytes did not complete within %d ms "
                    "(its deadline is %d ms)\n",
                    b->rank, bench_op_names[op], k->bytes, b->o->timeout_ms + BENCH_WAIT_SLACK_MS,
                    b->o->timeout_ms);
        else
            fprintf(stderr, "collie-bench: rank %d: %s of %zu bytes failed: %s (%s)\n", b->rank,
                    bench_op_names[op], k->bytes, *msg ? msg : collie_strerror(res),
                    collie_status_name(res));
        return res == COLLIE_INPROGRESS ? COLLIE_ETIMEDOUT : res;
    }
    collie_work_release(w);
    b->works[i] = NULL;
    return COLLIE_OK;
}

/* Run `total` ops with up to `depth` in flight: post `depth`, then post
 * another each time the oldest completes. Work i receives into slot
 * i % depth, which work i - depth (the oldest, waited for) has left, so
 * works in flight never share a receive buffer. *elapsed (if not NULL)
 * gets the seconds taken. */
static int bench_ring(bench *b, bench_op op, const bench_counts *k, size_t total, size_t depth,
                      double *elapsed) {
    size_t posted = 0, done = 0;
    int64_t t0 = bench_now_ns();
    while (done < total) {
        while (posted < total && posted - done < depth) {
            int res = bench_post(b, op, k, posted % depth, &b->works[posted % depth]);
            if (res != COLLIE_OK) return res;
            posted++;
        }
        int res = bench_wait(b, done % depth, op, k);
        if (res != COLLIE_OK) return res;
        done++;
    }
    if (elapsed) *elapsed = (double)(bench_now_ns() - t0) / 1e9;
    return COLLIE_OK;
}

static int bench_one(bench *b, bench_op op, const bench_counts *k) {
    return bench_ring(b, op, k, 1, 1, NULL);
}

/* A barrier on the CPU backend, also with CUDA buffers. */
static int bench_sync(bench *b) {
    bench_counts none = {0, 0, 0, 0};
    int res = collie_barrier(b->comm, &b->po, &b->works[0]);
    if (res != COLLIE_OK) {
        bench_post_failed(b, BENCH_BARRIER, &none, res);
        if (res == COLLIE_ENOTSUP)
            fprintf(stderr, "collie-bench: backend spec '%s' has no cpu backend\n", b->o->spec);
        return res;
    }
    return bench_wait(b, 0, BENCH_BARRIER, &none);
}

/* ---- CUDA buffers ---------------------------------------------------------- */

static int bench_cuda_failed(const bench *b, const char *call, int e) {
    fprintf(stderr, "collie-bench: rank %d: %s: %s\n", b->rank, call, b->cu.GetErrorString(e));
    return COLLIE_EBACKEND;
}

/* Copy the send buffer's first `send` bytes and the first `slots` receive
 * slots between host and device (all works on them have completed). */
static int bench_cuda_copy(bench *b, int kind, size_t send, size_t slots) {
    bool up = kind == BENCH_CUDA_TO_DEVICE;
    size_t len = slots * b->slot_bytes;
    int e = 0;
    if (send)
        e = up ? b->cu.Memcpy(b->cu.send, b->sendbuf, send, kind)
               : b->cu.Memcpy(b->sendbuf, b->cu.send, send, kind);
    if (!e && len)
        e = up ? b->cu.Memcpy(b->cu.arena, b->arena, len, kind)
               : b->cu.Memcpy(b->arena, b->cu.arena, len, kind);
    return e ? bench_cuda_failed(b, "cudaMemcpy", e) : COLLIE_OK;
}

/* ---- check ----------------------------------------------------------------- */

/* Fill the inputs of op, poison the result in slot 0; a broadcast root
 * fills its first `slots` slots (its input). */
static void bench_fill(bench *b, bench_op op, const bench_counts *k, uint32_t seed, size_t slots) {
    size_t es = b->es;
    int r = b->rank;
    memset(bench_slot(b, 0), BENCH_POISON, k->recv * es);
    switch (op) {
    case BENCH_ALLREDUCE:
    case BENCH_REDUCE:
    case BENCH_REDUCE_SCATTER:
        for (size_t j = 0; j < k->send; j++)
            bench_store(b->o->dt, b->sendbuf + j * es, bench_red_val(b, seed, r, j));
        break;
    case BENCH_BROADCAST:
        if (r == BENCH_ROOT)
            for (size_t sl = 0; sl < slots; sl++)
                for (size_t j = 0; j < k->recv; j++)
                    bench_store(b->o->dt, bench_slot(b, sl) + j * es,
                                bench_move_val(b, seed, r, j));
        break;
    case BENCH_ALLGATHER:
    case BENCH_GATHER:
    case BENCH_ALLTOALL:
    case BENCH_SCATTER:
        for (size_t j = 0; j < k->send; j++)
            bench_store(b->o->dt, b->sendbuf + j * es, bench_move_val(b, seed, r, j));
        break;
    default: break;
    }
}

static void bench_print_elem(const bench *b, const unsigned char *p, char *buf, size_t len) {
    switch (b->o->dt) {
    case COLLIE_INT8: snprintf(buf, len, "%d", (int)(int8_t)p[0]); break;
    case COLLIE_UINT8: snprintf(buf, len, "%u", (unsigned)p[0]); break;
    case COLLIE_INT32: {
        int32_t v;
        memcpy(&v, p, 4);
        snprintf(buf, len, "%" PRId32, v);
        break;
    }
    case COLLIE_INT64: {
        int64_t v;
        memcpy(&v, p, 8);
        snprintf(buf, len, "%" PRId64, v);
        break;
    }
    case COLLIE_FP16:
    case COLLIE_BF16: {
        uint16_t h;
        memcpy(&h, p, 2);
        snprintf(buf, len, "%g (0x%04x)", b->o->dt == COLLIE_FP16 ? bench_h2d(h) : bench_bf2d(h),
                 (unsigned)h);
        break;
    }
    case COLLIE_FP32: {
        float f;
        memcpy(&f, p, 4);
        snprintf(buf, len, "%.9g", (double)f);
        break;
    }
    default: {
        double d;
        memcpy(&d, p, 8);
        snprintf(buf, len, "%.17g", d);
        break;
    }
    }
}

/* Verify op's result on this rank; true if it is right. `when` names the
 * moment ("after the first op", "after the timed loops"). */
static bool bench_verify(bench *b, bench_op op, const bench_counts *k, uint32_t seed, size_t slot,
                         const char *when) {
    const unsigned char *res = bench_slot(b, slot);
    size_t es = b->es, n = (size_t)b->size, c = k->param, len = 0;
    int r = b->rank;
    bool root = r == BENCH_ROOT;
    switch (op) {
    case BENCH_ALLREDUCE:
    case BENCH_BROADCAST:
    case BENCH_REDUCE_SCATTER:
    case BENCH_SCATTER: len = c; break;
    case BENCH_REDUCE: len = root ? c : 0; break;
    case BENCH_ALLGATHER:
    case BENCH_ALLTOALL: len = c * n; break;
    case BENCH_GATHER: len = root ? c * n : 0; break;
    default: return true;
    }
    unsigned char want[8];
    size_t bad = 0, first = 0;
    unsigned char first_want[8];
    for (size_t j = 0; j < len; j++) {
        size_t q = c ? j / c : 0, i = c ? j % c : 0;
        switch (op) {
        case BENCH_ALLREDUCE:
        case BENCH_REDUCE: bench_red_ref(b, seed, j, want); break;
        case BENCH_REDUCE_SCATTER: bench_red_ref(b, seed, (size_t)r * c + j, want); break;
        case BENCH_BROADCAST: bench_store(b->o->dt, want, bench_move_val(b, seed, 0, j)); break;
        case BENCH_SCATTER:
            bench_store(b->o->dt, want, bench_move_val(b, seed, BENCH_ROOT, (size_t)r * c + j));
            break;
        case BENCH_ALLGATHER:
        case BENCH_GATHER: bench_store(b->o->dt, want, bench_move_val(b, seed, (int)q, i)); break;
        default: /* alltoall: block q came from rank q, its block r */
            bench_store(b->o->dt, want, bench_move_val(b, seed, (int)q, (size_t)r * c + i));
            break;
        }
        if (memcmp(want, res + j * es, es) != 0) {
            if (bad++ == 0) {
                first = j;
                memcpy(first_want, want, es);
            }
        }
    }
    if (bad == 0) return true;
    char got_s[64], want_s[64];
    bench_print_elem(b, res + first * es, got_s, sizeof got_s);
    bench_print_elem(b, first_want, want_s, sizeof want_s);
    fprintf(stderr,
            "collie-bench: rank %d: check failed for %s of %zu bytes (%s, %s) %s: first bad "
            "index %zu of the result (receive slot %zu): got %s, expected %s (%zu of %zu "
            "elements wrong)\n",
            r, bench_op_names[op], k->bytes, bench_dtype_name(b->o->dt),
            op == BENCH_ALLREDUCE || op == BENCH_REDUCE || op == BENCH_REDUCE_SCATTER
                ? bench_redops[b->o->redop]
                : "no redop",
            when, first, slot, got_s, want_s, bad, len);
    return false;
}

/* ---- one row --------------------------------------------------------------- */

static void bench_print_header(bench *b) {
    if (b->o->csv) {
        printf("op,bytes,ranks,lat_us,algbw_GBps,busbw_GBps,ops_per_s\n");
        fflush(stdout);
        return;
    }
    char layout[64] = "";
    if (b->o->threads > 1)
        snprintf(layout, sizeof layout, " (%d process%s x %d threads)", b->proc->nprocs,
                 b->proc->nprocs == 1 ? "" : "es", b->o->threads);
    printf("# collie-bench: backend %s, %d ranks%s, dtype %s, redop %s, root %d%s\n", b->o->spec,
           b->size, layout, bench_dtype_name(b->o->dt), bench_redops[b->o->redop], BENCH_ROOT,
           b->o->cuda ? ", CUDA buffers" : "");
    char inflight[32] = "off";
    if (b->o->inflight) snprintf(inflight, sizeof inflight, "%d", b->o->inflight);
    printf("# iters %d, warmup %d, inflight %s, check %s, op timeout %d ms\n", b->o->iters,
           b->o->warmup, inflight, b->o->check ? "on" : "off", b->o->timeout_ms);
    printf("# bytes, count: nccl-tests' size (the op's largest buffer) and the count argument\n");
    printf("# time_us: per-op mean of iters back-to-back ops, averaged over ranks (nccl-tests);\n"
           "#   algbw = bytes / time_us, busbw = algbw * nccl-tests' factor\n");
    printf("# lat_us: median over iters of one op's post-to-completion time (max over ranks)\n");
    printf("#\n");
    printf("# %14s %13s %12s %10s %10s %11s %11s %12s %6s\n", "op", "bytes", "count", "time_us",
           "lat_us", "algbw_GBps", "busbw_GBps", "ops_per_s", "check");
    fflush(stdout);
}

static void bench_print_row(bench *b, bench_op op, const bench_counts *k, double time_s,
                            double lat_s, double ops_s) {
    bool bw = op != BENCH_BARRIER;
    double algbw = time_s > 0 ? (double)k->bytes / 1e9 / time_s : 0;
    double busbw = algbw * bench_busbw_factor(op, b->size);
    if (bw) {
        b->busbw_sum += busbw;
        b->busbw_rows++;
    }
    if (b->o->csv) {
        printf("%s,%zu,%d,%.3f,", bench_op_names[op], k->bytes, b->size, lat_s * 1e6);
        if (bw)
            printf("%.6f,%.6f", algbw, busbw);
        else
            printf(",");
        if (b->o->inflight)
            printf(",%.1f\n", ops_s);
        else
            printf(",\n");
    } else {
        char a[32] = "-", u[32] = "-", s[32] = "-";
        if (bw) {
            snprintf(a, sizeof a, "%.3f", algbw);
            snprintf(u, sizeof u, "%.3f", busbw);
        }
        if (b->o->inflight) snprintf(s, sizeof s, "%.0f", ops_s);
        printf("  %14s %13zu %12zu %10.2f %10.2f %11s %11s %12s %6s\n", bench_op_names[op],
               k->bytes, k->param, time_s * 1e6, lat_s * 1e6, a, u, s, b->o->check ? "ok" : "-");
    }
    fflush(stdout);
}

/* Run one op at one requested size: check, warm up, time, report.
 * Returns COLLIE_OK, an error status (already reported), or
 * BENCH_CHECK_FAILED when some rank's check failed (every rank knows). */
static int bench_size(bench *b, bench_op op, size_t S, size_t size_idx) {
    bench_counts k = bench_counts_for(op, S, b->es, b->size);
    uint32_t seed = (uint32_t)(op * 7919 + size_idx * 104729 + 1);
    size_t iters = (size_t)b->o->iters, warmup = (size_t)b->o->warmup;
    size_t inflight = (size_t)b->o->inflight;
    b->slot_bytes = (k.recv * b->es + BENCH_SLOT_ALIGN - 1) / BENCH_SLOT_ALIGN * BENCH_SLOT_ALIGN;
    if (b->slot_bytes == 0) b->slot_bytes = BENCH_SLOT_ALIGN;
    b->nslots = b->arena_bytes / b->slot_bytes;
    size_t batch_depth = iters < b->nslots ? iters : b->nslots;
    size_t warm_depth = warmup < b->nslots ? warmup : b->nslots;
    size_t infl_depth = inflight < b->nslots ? inflight : b->nslots;
    size_t used = batch_depth > warm_depth ? batch_depth : warm_depth;
    if (infl_depth > used) used = infl_depth;
    bool ok = true;
    int res;
    if (b->o->check) {
        bench_fill(b, op, &k, seed, used);
        if (b->o->cuda &&
            (res = bench_cuda_copy(b, BENCH_CUDA_TO_DEVICE, k.send * b->es, used)) != COLLIE_OK)
            return res;
        if ((res = bench_one(b, op, &k)) != COLLIE_OK) return res;
        if (b->o->cuda && (res = bench_cuda_copy(b, BENCH_CUDA_TO_HOST, 0, 1)) != COLLIE_OK)
            return res;
        if (b->rank == b->o->corrupt_rank && k.recv > 0) bench_slot(b, 0)[k.recv * b->es / 2] ^= 1;
        ok = bench_verify(b, op, &k, seed, 0, "after the first op");
    }
    if (warmup && (res = bench_ring(b, op, &k, warmup, warm_depth, NULL)) != COLLIE_OK) return res;

    /* nccl-tests: iters back to back, per-op mean */
    if ((res = bench_sync(b)) != COLLIE_OK) return res;
    double batch_s;
    if ((res = bench_ring(b, op, &k, iters, batch_depth, &batch_s)) != COLLIE_OK) return res;
    b->avg[0] = batch_s / (double)iters;

    /* one at a time, per-op times */
    if ((res = bench_sync(b)) != COLLIE_OK) return res;
    for (size_t i = 0; i < iters; i++) {
        int64_t t = bench_now_ns();
        if ((res = bench_one(b, op, &k)) != COLLIE_OK) return res;
        b->lat[i] = (double)(bench_now_ns() - t) / 1e9;
    }

    b->lat[iters] = 0;
    if (inflight) {
        if ((res = bench_sync(b)) != COLLIE_OK) return res;
        if ((res = bench_ring(b, op, &k, iters, infl_depth, &b->lat[iters])) != COLLIE_OK)
            return res;
    }
    /* every slot used holds the result of the last op that received into it */
    if (b->o->check && ok && b->o->cuda &&
        (res = bench_cuda_copy(b, BENCH_CUDA_TO_HOST, 0, used)) != COLLIE_OK)
        return res;
    for (size_t sl = 0; b->o->check && ok && sl < used; sl++)
        ok = bench_verify(b, op, &k, seed, sl, "after the timed loops");
    b->lat[iters + 1] = ok ? 0.0 : 1.0;

    /* statistics: per-op times, inflight time and the check flag (MAX),
     * the batch mean (AVG) */
    bench_counts st = {iters + 2, iters + 2, iters + 2, (iters + 2) * sizeof(double)};
    if ((res = collie_allreduce(b->comm, b->lat, b->lat, iters + 2, COLLIE_FP64, COLLIE_MAX, &b->po,
                                &b->works[0])) != COLLIE_OK ||
        (res = bench_wait(b, 0, BENCH_ALLREDUCE, &st)) != COLLIE_OK)
        return res;
    st = (bench_counts){1, 1, 1, sizeof(double)};
    if ((res = collie_allreduce(b->comm, b->avg, b->avg, 1, COLLIE_FP64, COLLIE_AVG, &b->po,
                                &b->works[0])) != COLLIE_OK ||
        (res = bench_wait(b, 0, BENCH_ALLREDUCE, &st)) != COLLIE_OK)
        return res;
    if (b->lat[iters + 1] != 0.0) {
        if (b->rank == 0)
            fprintf(stderr, "collie-bench: %s of %zu bytes: check failed (see the ranks above)\n",
                    bench_op_names[op], k.bytes);
        return BENCH_CHECK_FAILED;
    }
    double inflight_s = b->lat[iters];
    qsort(b->lat, iters, sizeof(double), bench_cmp_double);
    double median =
        iters % 2 ? b->lat[iters / 2] : (b->lat[iters / 2 - 1] + b->lat[iters / 2]) / 2.0;
    double ops_s = inflight_s > 0 ? (double)iters / inflight_s : 0;
    if (b->rank == 0) {
        bench_print_row(b, op, &k, b->avg[0], median, ops_s);
        if (!b->o->csv && (batch_depth < iters || infl_depth < inflight)) {
            printf("#   (receive slots for %zu works in flight at this size: batch depth %zu",
                   b->nslots, batch_depth);
            if (inflight) printf(", --inflight depth %zu", infl_depth);
            printf(")\n");
        }
    }
    return COLLIE_OK;
}

/* ---- usage ------------------------------------------------------------------- */

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: collie-run -n N -- collie-bench [options]\n"
            "\n"
            "Sweeps message sizes for each collective over a communicator created from\n"
            "the environment collie-run sets, and prints one table (rank 0 only).\n"
            "\n"
            "  -t, --threads T    ranks per process, one thread each (default 1), as\n"
            "                     nccl-tests' -t: N processes of T threads are N*T ranks,\n"
            "                     rank = process rank * T + thread\n"
            "  --backend SPEC     backend spec of the comm (default tcp; nccl, cpu:tcp,...);\n"
            "                     with a cuda backend (nccl, cuda:nccl, cpu:tcp,cuda:nccl)\n"
            "                     the ops run on CUDA buffers (libcudart.so.13, loaded at\n"
            "                     run time) and the timings are combined on the cpu backend:\n"
            "                     a spec without one gets cpu:tcp (nccl: cpu:tcp,nccl)\n"
            "  --device N         CUDA device of every rank (default rank %% devices)\n"
            "  --op LIST          comma list of allreduce, broadcast, reduce, allgather,\n"
            "                     reduce_scatter, alltoall, gather, scatter, barrier, or all\n"
            "                     (default all); rooted ops use root 0\n"
            "  --sizes LIST       comma list of sizes in bytes, K/M/G suffixes (x1024)\n"
            "                     (default " BENCH_DEFAULT_SIZES ")\n"
            "  --dtype T          f32 f16 bf16 f64 i8 u8 i32 i64 (default f32)\n"
            "  --redop R          sum prod min max avg (default sum)\n"
            "  --iters N          timed ops per measurement (default %d)\n"
            "  --warmup N         untimed ops before timing, per size (default %d)\n"
            "  --inflight K       also keep K ops in flight for iters ops; report ops/s\n"
            "  --check            verify every result against a locally computed reference\n"
            "  --csv              print op,bytes,ranks,lat_us,algbw_GBps,busbw_GBps,ops_per_s\n"
            "  --timeout-ms T     deadline of every op (default %d); creating the comm\n"
            "                     may take max(T, 60000) ms\n"
            "  --corrupt-rank R   testing --check itself: rank R flips a bit of its first\n"
            "                     checked result of each op and size (a rank that receives\n"
            "                     nothing there, such as a non-root of reduce, flips none)\n"
            "  -h, --help         this text\n"
            "\n"
            "Sizes follow nccl-tests: a size S is S/sizeof(dtype) elements in total.\n"
            "allreduce, broadcast, reduce: count = S/sizeof(dtype) elements per rank.\n"
            "allgather, gather: each rank sends count = S/sizeof(dtype)/N elements (rounded\n"
            "down to 16 bytes), the result holds N*count; reduce_scatter, scatter: the send\n"
            "buffer holds N*count, each rank gets count; alltoall: count per peer, N*count\n"
            "each way. The bytes column is the op's largest buffer (nccl-tests' size column),\n"
            "count is the count argument of the call. The barrier is one row of bytes 0.\n"
            "\n"
            "time_us: iters ops posted back to back, per-op mean, averaged over ranks\n"
            "(nccl-tests' default). algbw = bytes/time_us; busbw = algbw * factor:\n"
            "allreduce 2(N-1)/N; broadcast, reduce 1; allgather, reduce_scatter, alltoall,\n"
            "gather, scatter (N-1)/N. lat_us: median over iters of one op posted and waited\n"
            "alone (the slowest rank's time per iteration). ops_per_s: iters divided by the\n"
            "slowest rank's time with K ops in flight. CSV fields that do not apply are empty.\n"
            "Works in flight never share a receive buffer (collie runs them concurrently):\n"
            "each gets a slot of a 64 MiB arena, which caps the depth for large sizes.\n"
            "\n"
            "Exit status: 0 ok, 1 error or check failure, 2 usage error.\n",
            BENCH_DEFAULT_ITERS, BENCH_DEFAULT_WARMUP, BENCH_DEFAULT_TMO_MS);
}

/* A usage error is said once, by rank 0: every rank parses the same
 * arguments, rank 0 says why and exits, and collie-run stops the others
 * while they hold back (BENCH_USAGE_HOLD_MS). One still running after that
 * (rank 0 did not fail: different arguments per rank?) says it too. */
#define BENCH_USAGE_HOLD_MS 2000
static int bench_usage_error(const char *fmt, const char *arg) {
    if (bench_quiet_rank()) {
        struct timespec hold = {BENCH_USAGE_HOLD_MS / 1000,
                                (BENCH_USAGE_HOLD_MS % 1000) * 1000000L};
        while (nanosleep(&hold, &hold) != 0 && errno == EINTR)
            continue;
    }
    fprintf(stderr, "collie-bench: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(collie-bench --help for usage)\n");
    return BENCH_EXIT_USAGE;
}

static bool bench_parse_int(const char *s, long long lo, long long hi, int *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

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

static int bench_parse_args(int argc, char **argv, bench_opts *o) {
    static const struct option longopts[] = {{"backend", required_argument, NULL, 'b'},
                                             {"op", required_argument, NULL, 'o'},
                                             {"sizes", required_argument, NULL, 's'},
                                             {"dtype", required_argument, NULL, 'd'},
                                             {"redop", required_argument, NULL, 'r'},
                                             {"iters", required_argument, NULL, 'n'},
                                             {"warmup", required_argument, NULL, 'w'},
                                             {"inflight", required_argument, NULL, 'k'},
                                             {"check", no_argument, NULL, 'c'},
                                             {"csv", no_argument, NULL, 'v'},
                                             {"timeout-ms", required_argument, NULL, 'm'},
                                             {"threads", required_argument, NULL, 't'},
                                             {"corrupt-rank", required_argument, NULL, 'x'},
                                             {"device", required_argument, NULL, 'g'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    const char *ops = "all", *sizes = BENCH_DEFAULT_SIZES;
    *o = (bench_opts){.backend = "tcp",
                      .dt = COLLIE_FP32,
                      .redop = COLLIE_SUM,
                      .iters = BENCH_DEFAULT_ITERS,
                      .warmup = BENCH_DEFAULT_WARMUP,
                      .timeout_ms = BENCH_DEFAULT_TMO_MS,
                      .corrupt_rank = -1,
                      .device = -1,
                      .threads = 1};
    opterr = 0;
    int ch, v;
    while ((ch = getopt_long(argc, argv, "+ht:", longopts, NULL)) != -1) {
        switch (ch) {
        case 'b':
            if (!*optarg) return bench_usage_error("--backend needs a spec%s", "");
            o->backend = optarg;
            break;
        case 'o': ops = optarg; break;
        case 's': sizes = optarg; break;
        case 'd': {
            size_t i, nd = sizeof bench_dtypes / sizeof bench_dtypes[0];
            for (i = 0; i < nd; i++)
                if (!strcasecmp(optarg, bench_dtypes[i].name) ||
                    !strcasecmp(optarg, bench_dtypes[i].alias))
                    break;
            if (i == nd)
                return bench_usage_error("unknown --dtype '%s' (f32 f16 bf16 f64 i8 u8 i32 i64)",
                                         optarg);
            o->dt = bench_dtypes[i].dt;
            break;
        }
        case 'r': {
            int i;
            for (i = 0; i < COLLIE_NUM_REDOPS; i++)
                if (!strcasecmp(optarg, bench_redops[i])) break;
            if (i == COLLIE_NUM_REDOPS)
                return bench_usage_error("unknown --redop '%s' (sum prod min max avg)", optarg);
            o->redop = (collie_redop)i;
            break;
        }
        case 'n':
            if (!bench_parse_int(optarg, 1, BENCH_MAX_ITERS, &o->iters))
                return bench_usage_error("--iters '%s': want an integer from 1 to 1000000", optarg);
            break;
        case 'w':
            if (!bench_parse_int(optarg, 0, BENCH_MAX_ITERS, &o->warmup))
                return bench_usage_error("--warmup '%s': want an integer from 0 to 1000000",
                                         optarg);
            break;
        case 'k':
            if (!bench_parse_int(optarg, 1, BENCH_MAX_INFLIGHT, &o->inflight))
                return bench_usage_error("--inflight '%s': want an integer from 1 to 65536",
                                         optarg);
            break;
        case 'c': o->check = true; break;
        case 'v': o->csv = true; break;
        case 'm':
            if (!bench_parse_int(optarg, 1, 86400000, &v))
                return bench_usage_error("--timeout-ms '%s': want milliseconds from 1 to 86400000",
                                         optarg);
            o->timeout_ms = v;
            break;
        case 't':
            if (!bench_parse_int(optarg, 1, BENCH_MAX_THREADS, &o->threads))
                return bench_usage_error("--threads '%s': want an integer from 1 to 256", optarg);
            break;
        case 'x':
            if (!bench_parse_int(optarg, 0, INT32_MAX, &o->corrupt_rank))
                return bench_usage_error("--corrupt-rank '%s': want a rank", optarg);
            break;
        case 'g':
            if (!bench_parse_int(optarg, 0, INT32_MAX, &o->device))
                return bench_usage_error("--device '%s': want a CUDA device number", optarg);
            break;
        case 'h':
            if (!bench_quiet_rank()) bench_usage(stdout);
            return -1;
        default: return bench_usage_error("unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return bench_usage_error("unexpected argument '%s'", argv[optind]);

    /* ops: a comma list of names, or all */
    for (const char *p = ops;;) {
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
        if (!found) return bench_usage_error("unknown --op in '%s'", ops);
        if (!p[len]) break;
        p += len + 1;
    }
    /* sizes */
    for (const char *p = sizes;;) {
        size_t len = strcspn(p, ",");
        if (o->nsizes == BENCH_MAX_SIZES)
            return bench_usage_error("--sizes: at most 64 sizes ('%s')", sizes);
        if (!bench_parse_size(p, len, &o->sizes[o->nsizes++]))
            return bench_usage_error("--sizes '%s': want byte counts like 4,4K,1M (at most 1T)",
                                     sizes);
        if (!p[len]) break;
        p += len + 1;
    }
    /* a size must hold one element of the dtype (nccl-tests would run 0
     * elements and report nothing) */
    for (size_t i = 0; i < o->nsizes; i++)
        if (o->sizes[i] < collie_dtype_size(o->dt)) {
            char what[96];
            snprintf(what, sizeof what, "%zu B is less than one %s element (%zu B)", o->sizes[i],
                     collie_dtype_name(o->dt), collie_dtype_size(o->dt));
            return bench_usage_error("--sizes: %s", what);
        }
    if (o->inflight > o->iters) o->inflight = o->iters;
    /* which devices the spec serves: "cuda:X" or a bare nccl is cuda */
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
    if (o->cuda && !cpu) { /* the timings are combined on the cpu backend */
        int len = snprintf(o->spec_buf, sizeof o->spec_buf, "cpu:tcp,%s", o->backend);
        if (len < 0 || (size_t)len >= sizeof o->spec_buf)
            return bench_usage_error("--backend '%s' is too long", o->backend);
        o->spec = o->spec_buf;
    }
    if (o->device >= 0 && !o->cuda)
        return bench_usage_error("--device needs a cuda backend in --backend ('%s')", o->backend);
    if (o->corrupt_rank >= 0 && !o->check)
        return bench_usage_error("--corrupt-rank needs --check%s", "");
    return BENCH_EXIT_OK;
}

/* ---- main -------------------------------------------------------------------- */

/* Load the CUDA runtime, pick the device (--device, else rank % devices, as
 * the NCCL plugin does), create our stream and device buffers the size of
 * the host ones (zeroed from them). */
static int bench_cuda_setup(bench *b, size_t send_bytes) {
    bench_cuda *cu = &b->cu;
    cu->lib = dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!cu->lib) {
        fprintf(stderr, "collie-bench: --backend %s needs the CUDA runtime (libcudart.so.13): %s\n",
                b->o->backend, dlerror());
        return COLLIE_EBACKEND;
    }
    static const char *const names[] = {"cudaGetDeviceCount",
                                        "cudaSetDevice",
                                        "cudaMalloc",
                                        "cudaFree",
                                        "cudaMemcpy",
                                        "cudaStreamCreate",
                                        "cudaStreamSynchronize",
                                        "cudaStreamDestroy",
                                        "cudaGetErrorString"};
    void **slots[] = {(void **)&cu->GetDeviceCount,
                      (void **)&cu->SetDevice,
                      (void **)&cu->Malloc,
                      (void **)&cu->Free,
                      (void **)&cu->Memcpy,
                      (void **)&cu->StreamCreate,
                      (void **)&cu->StreamSynchronize,
                      (void **)&cu->StreamDestroy,
                      (void **)&cu->GetErrorString};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(*slots[i] = dlsym(cu->lib, names[i]))) {
            fprintf(stderr, "collie-bench: libcudart.so.13 has no %s: %s\n", names[i], dlerror());
            return COLLIE_EBACKEND;
        }
    int n = 0, e = cu->GetDeviceCount(&n);
    if (e) return bench_cuda_failed(b, "cudaGetDeviceCount", e);
    if (n <= 0) {
        fprintf(stderr, "collie-bench: rank %d: no CUDA device\n", b->rank);
        return COLLIE_EBACKEND;
    }
    int dev = b->o->device >= 0 ? b->o->device : b->rank % n;
    if ((e = cu->SetDevice(dev))) return bench_cuda_failed(b, "cudaSetDevice", e);
    if ((e = cu->StreamCreate(&cu->stream))) return bench_cuda_failed(b, "cudaStreamCreate", e);
    void *s = NULL, *r = NULL;
    if ((e = cu->Malloc(&s, send_bytes)) || (cu->send = s, e = cu->Malloc(&r, b->arena_bytes)))
        return bench_cuda_failed(b, "cudaMalloc", e);
    cu->arena = r;
    if ((e = cu->Memcpy(cu->send, b->sendbuf, send_bytes, BENCH_CUDA_TO_DEVICE)) ||
        (e = cu->Memcpy(cu->arena, b->arena, b->arena_bytes, BENCH_CUDA_TO_DEVICE)))
        return bench_cuda_failed(b, "cudaMemcpy", e);
    return COLLIE_OK;
}

/* ---- ranks of one process ------------------------------------------------------- */

/* Publish thread t's comm (NULL: withdraw it, before destroying it). A comm
 * published after a sibling failed is aborted at once. */
static void bench_proc_publish(bench *b, collie_comm *c) {
    bench_proc *p = b->proc;
    pthread_mutex_lock(&p->mu);
    p->comms[b->thread] = c;
    if (c && p->failed_rank >= 0) collie_comm_abort(c, p->why);
    pthread_mutex_unlock(&p->mu);
}

/* `rank` failed: abort the comms of the other ranks of this process, as the
 * launcher stops the other processes when one fails; nobody waits out a
 * deadline for a rank that quit. collie_comm_abort never blocks and calls
 * nothing of ours, and holding mu keeps each comm alive while it runs. */
static void bench_proc_stop(bench_proc *p, int rank) {
    int self = rank - p->prank * p->o->threads;
    pthread_mutex_lock(&p->mu);
    if (p->failed_rank < 0) {
        p->failed_rank = rank;
        snprintf(p->why, sizeof p->why, "collie-bench: rank %d of this process failed", rank);
        for (int t = 0; t < p->o->threads; t++)
            if (t != self && p->comms[t]) collie_comm_abort(p->comms[t], p->why);
    }
    pthread_mutex_unlock(&p->mu);
}

/* Read where this process sits in the world (collie-run sets it). */
static int bench_proc_init(bench_proc *p, const bench_opts *o) {
    const char *r = getenv("COLLIE_RANK"), *n = getenv("COLLIE_WORLD_SIZE");
    *p = (bench_proc){.o = o, .store_addr = getenv("COLLIE_STORE_ADDR"), .failed_rank = -1};
    if (!r || !*r || !n || !*n || !p->store_addr || !*p->store_addr) {
        fprintf(stderr, "collie-bench: COLLIE_RANK, COLLIE_WORLD_SIZE and COLLIE_STORE_ADDR must "
                        "be set: run it under the launcher, collie-run -n N -- collie-bench ...\n");
        return BENCH_EXIT_ERROR;
    }
    if (!bench_parse_int(n, 1, INT_MAX / o->threads, &p->nprocs) ||
        !bench_parse_int(r, 0, p->nprocs - 1, &p->prank)) {
        fprintf(stderr,
                "collie-bench: COLLIE_RANK '%s' and COLLIE_WORLD_SIZE '%s' are not a rank of a "
                "world of at most %d processes of %d threads (collie-run sets them)\n",
                r, n, INT_MAX / o->threads, o->threads);
        return BENCH_EXIT_ERROR;
    }
    if (!(p->comms = calloc((size_t)o->threads, sizeof *p->comms))) {
        fprintf(stderr, "collie-bench: out of memory\n");
        return BENCH_EXIT_ERROR;
    }
    pthread_mutex_init(&p->mu, NULL);
    return BENCH_EXIT_OK;
}

static void bench_proc_fini(bench_proc *p) {
    pthread_mutex_destroy(&p->mu);
    free(p->comms);
}

/* ---- one rank ---------------------------------------------------------------- */

/* Create the comm of rank b->rank of b->size over the store. Posted, so the
 * comm is published (and a failing sibling can abort it) while the
 * rendezvous waits for every rank to start. */
static int bench_comm_create(bench *b) {
    const bench_opts *o = b->o;
    collie_comm_opts co = COLLIE_COMM_OPTS_INIT;
    co.name = "bench";
    co.backend = o->spec;
    co.device = o->device;
    co.timeout_ms = o->timeout_ms;
    /* the rendezvous waits for every rank to start: not an op's deadline */
    co.create_timeout_ms =
        o->timeout_ms > BENCH_CREATE_TMO_MS ? o->timeout_ms : BENCH_CREATE_TMO_MS;
    collie_comm *c = NULL;
    collie_work *w = NULL;
    const char *why = "";
    int res = collie_store_connect(b->engine, b->proc->store_addr, NULL, &b->store);
    if (res == COLLIE_OK)
        res = collie_comm_create_post(b->engine, b->store, b->rank, b->size, &co, &c, &w);
    if (res != COLLIE_OK) {
        why = collie_last_error();
    } else {
        bench_proc_publish(b, c);
        b->comm = c; /* bench_teardown withdraws and destroys it, also after a failure */
        res = collie_work_wait(w, co.create_timeout_ms + BENCH_WAIT_SLACK_MS);
        if (res == COLLIE_INPROGRESS) {
            res = COLLIE_ETIMEDOUT;
            why = "the rendezvous did not complete in time";
        } else if (res != COLLIE_OK) {
            why = collie_work_error_message(w);
        }
    }
    if (res != COLLIE_OK) {
        const char *as = o->spec != o->backend ? o->spec : NULL;
        fprintf(stderr,
                "collie-bench: rank %d: cannot create a communicator with backend '%s'%s%s%s: %s "
                "(%s)\n",
                b->rank, o->backend, as ? " (as '" : "", as ? as : "", as ? "')" : "",
                *why ? why : collie_strerror(res), collie_status_name(res));
    }
    collie_work_release(w);
    return res;
}

static int bench_setup(bench *b) {
    const bench_opts *o = b->o;
    b->rank = b->proc->prank * o->threads + b->thread;
    b->size = b->proc->nprocs * o->threads;
    collie_engine_opts eo = COLLIE_ENGINE_OPTS_INIT;
    eo.name = "collie-bench";
    int res = collie_engine_create(&eo, &b->engine);
    if (res != COLLIE_OK) {
        fprintf(stderr, "collie-bench: rank %d: cannot start the engine: %s (%s)\n", b->rank,
                collie_last_error(), collie_strerror(res));
        return res;
    }
    if ((res = bench_comm_create(b)) != COLLIE_OK) return res;
    b->es = collie_dtype_size(o->dt);

    /* the send buffer holds the largest size; the receive arena a slot of
     * it for each work in flight, within BENCH_ARENA_BYTES */
    size_t max_bytes = BENCH_SLOT_ALIGN, depth = (size_t)o->iters;
    for (size_t i = 0; i < o->nsizes; i++)
        if (o->sizes[i] > max_bytes) max_bytes = o->sizes[i];
    max_bytes = (max_bytes + BENCH_SLOT_ALIGN - 1) / BENCH_SLOT_ALIGN * BENCH_SLOT_ALIGN;
    if ((size_t)o->warmup > depth) depth = (size_t)o->warmup;
    b->nworks = depth;
    if (depth > BENCH_ARENA_BYTES / max_bytes) depth = BENCH_ARENA_BYTES / max_bytes;
    if (depth == 0) depth = 1;
    b->arena_bytes = depth * max_bytes;
    void *s = NULL, *r = NULL;
    if (posix_memalign(&s, 4096, max_bytes) || posix_memalign(&r, 4096, b->arena_bytes) ||
        !(b->works = calloc(b->nworks, sizeof *b->works)) ||
        !(b->lat = calloc((size_t)o->iters + 2, sizeof *b->lat))) {
        free(s);
        free(r);
        fprintf(stderr,
                "collie-bench: rank %d: cannot allocate a %zu-byte send buffer and %zu bytes of "
                "receive slots\n",
                b->rank, max_bytes, b->arena_bytes);
        return COLLIE_ENOMEM;
    }
    b->sendbuf = s;
    b->arena = r;
    memset(b->sendbuf, 0, max_bytes); /* fault the pages in before timing */
    memset(b->arena, 0, b->arena_bytes);
    b->po = (collie_post_opts)COLLIE_POST_OPTS_INIT;
    b->po.timeout_ms = o->timeout_ms;
    return o->cuda ? bench_cuda_setup(b, max_bytes) : COLLIE_OK;
}

static void bench_teardown(bench *b, bool failed) {
    if (b->comm && failed) collie_comm_abort(b->comm, "collie-bench stopped after an error");
    for (size_t i = 0; b->works && i < b->nworks; i++)
        collie_work_release(b->works[i]);
    if (b->comm) {
        bench_proc_publish(b, NULL);
        collie_comm_destroy(b->comm);
    }
    /* the comm is gone: no GPU work of ours is left to use the buffers */
    if (b->cu.stream) b->cu.StreamSynchronize(b->cu.stream);
    if (b->cu.send) b->cu.Free(b->cu.send);
    if (b->cu.arena) b->cu.Free(b->cu.arena);
    if (b->cu.stream) b->cu.StreamDestroy(b->cu.stream);
    collie_store_destroy(b->store); /* after the comm, which uses it */
    if (b->engine) collie_engine_destroy(b->engine);
    free(b->works);
    free(b->lat);
    free(b->sendbuf);
    free(b->arena);
    if (b->cu.lib) dlclose(b->cu.lib);
}

/* Run one rank from setup to teardown; its outcome goes to b->res. The
 * thread function of --threads (thread 0 runs on the main thread). */
static void *bench_rank_main(void *arg) {
    bench *b = arg;
    const bench_opts *o = b->o;
    int res = bench_setup(b);
    if (res == COLLIE_OK) res = bench_sync(b); /* also: can this comm run CPU collectives? */
    if (res == COLLIE_OK && b->rank == 0) bench_print_header(b);
    for (int op = 0; op < BENCH_NUM_OPS && res == COLLIE_OK; op++) {
        if (!o->ops[op]) continue;
        size_t n = op == BENCH_BARRIER ? 1 : o->nsizes;
        for (size_t i = 0; i < n && res == COLLIE_OK; i++)
            res = bench_size(b, (bench_op)op, op == BENCH_BARRIER ? 0 : o->sizes[i], i);
    }
    if (res == COLLIE_OK && b->rank == 0 && !o->csv && b->busbw_rows)
        printf("# avg busbw: %.3f GB/s over %d rows\n", b->busbw_sum / b->busbw_rows,
               b->busbw_rows);
    fflush(stdout);
    /* after a failed check every rank stops here together: leave in order */
    bool failed = res != COLLIE_OK && res != BENCH_CHECK_FAILED;
    if (failed) bench_proc_stop(b->proc, b->rank);
    bench_teardown(b, failed);
    b->res = res;
    return NULL;
}

int main(int argc, char **argv) {
    bench_opts o;
    int rc = bench_parse_args(argc, argv, &o);
    if (rc != BENCH_EXIT_OK) return rc < 0 ? BENCH_EXIT_OK : rc;
    bench_proc p;
    if ((rc = bench_proc_init(&p, &o)) != BENCH_EXIT_OK) return rc;

    int T = o.threads, started = 1;
    bench *ranks = calloc((size_t)T, sizeof *ranks);
    pthread_t *tids = calloc((size_t)T, sizeof *tids);
    if (!ranks || !tids) {
        fprintf(stderr, "collie-bench: out of memory\n");
        free(ranks);
        free(tids);
        bench_proc_fini(&p);
        return BENCH_EXIT_ERROR;
    }
    for (int t = 0; t < T; t++)
        ranks[t] = (bench){.o = &o, .proc = &p, .thread = t};
    for (; started < T; started++) {
        int e = pthread_create(&tids[started], NULL, bench_rank_main, &ranks[started]);
        if (e) {
            fprintf(stderr, "collie-bench: cannot start the thread of rank %d: %s\n",
                    p.prank * T + started, strerror(e));
            bench_proc_stop(&p, p.prank * T + started);
            ranks[0].res = COLLIE_ENOMEM; /* rank 0 does not start */
            break;
        }
    }
    if (started == T) bench_rank_main(&ranks[0]);
    rc = ranks[0].res == COLLIE_OK ? BENCH_EXIT_OK : BENCH_EXIT_ERROR;
    for (int t = 1; t < started; t++) {
        pthread_join(tids[t], NULL);
        if (ranks[t].res != COLLIE_OK) rc = BENCH_EXIT_ERROR;
    }
    free(ranks);
    free(tids);
    bench_proc_fini(&p);
    return rc;
}
