/*
 * bench.h — what the parts of collie-bench share: the options, the ops and
 * dtypes it knows, one rank's state, and the calls between its files.
 *
 *   tools/collie_bench.c       the ranks of a process (main)
 *   tools/bench/bench_args.c   the command line (collie's and nccl-tests' flags)
 *   tools/bench/bench_data.c   input values, references, fill and verify, a call's buffers
 *   tools/bench/bench_row.c    the rows and their timings, rings in flight, buffers, a run
 *   tools/bench/bench_table.c  the header, the rows, the footer (rank 0), or --csv
 *   tools/bench/bench_post.c   posting and waiting on collie: one op, sync, combine
 *   tools/bench/bench_rank.c   a rank's setup and teardown; what a process's ranks share
 *
 * bench/mpi_bench.c (bench/peers.sh's MPI peer) is the same program on MPI:
 * it links bench_args, bench_data, bench_row and bench_table, and supplies
 * the five calls of "what a program supplies" below on MPI where
 * collie-bench has bench_post.c's, so both parse the same flags, run the
 * same rows, fill and check the same data and print the same table.
 */
#ifndef COLLIE_BENCH_H
#define COLLIE_BENCH_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "collie.h"
#include "collie_cuda.h"

#define BENCH_EXIT_OK        0
#define BENCH_EXIT_ERROR     1
#define BENCH_EXIT_USAGE     2
#define BENCH_MAX_SIZES      1024
#define BENCH_MAX_BYTES      ((size_t)1 << 40) /* per buffer */
#define BENCH_MAX_ITERS      1000000
#define BENCH_MAX_INFLIGHT   (1 << 20)
#define BENCH_MAX_THREADS    256 /* --threads: ranks per process */
#define BENCH_ALL_ROOTS      (-1)
#define BENCH_SLOT_ALIGN     64                 /* receive slots start on cache lines */
#define BENCH_ARENA_BYTES    ((size_t)64 << 20) /* receive slots, unless one size needs more */
#define BENCH_DEFAULT_SIZES  "4,4096,1048576,16777216"
#define BENCH_DEFAULT_ITERS  20
#define BENCH_DEFAULT_WARMUP 5
#define BENCH_DEFAULT_TMO_MS 60000
#define BENCH_CHECK_FAILED   1000  /* a rank's result: some check failed (every rank knows) */
#define BENCH_BAD_ROOT       1001  /* a rank's result: -r names no rank of the world */
#define BENCH_WAIT_SLACK_MS  5000  /* wait bound beyond the op deadline */
#define BENCH_CREATE_TMO_MS  60000 /* comm creation: at least this */
#define BENCH_CUDA_TO_DEVICE 1     /* cudaMemcpy's kinds */
#define BENCH_CUDA_TO_HOST   2

typedef enum bench_op {
    BENCH_ALLREDUCE,
    BENCH_BROADCAST,
    BENCH_REDUCE,
    BENCH_ALLGATHER,
    BENCH_REDUCE_SCATTER,
    BENCH_ALLTOALL,
    BENCH_GATHER,
    BENCH_SCATTER,
    BENCH_ALLGATHERV,
    BENCH_ALLTOALLV,
    BENCH_BARRIER,
    BENCH_NUM_OPS
} bench_op;

extern const char *const bench_op_names[BENCH_NUM_OPS];
/* The program's name in messages ("collie-bench"; "mpi_bench"). */
extern const char *bench_prog;
extern const char *const bench_redops[COLLIE_NUM_REDOPS];

/* The dtypes collie-bench knows: collie's short name, NCCL's (the table's
 * type column, as nccl-tests prints it) and the other names -d accepts. */
#define BENCH_NUM_DTYPES 8
typedef struct bench_dtype_info {
    const char *name, *nccl, *alias[3];
    collie_dtype dt;
} bench_dtype_info;
extern const bench_dtype_info bench_dtypes[BENCH_NUM_DTYPES];

const char *bench_dtype_name(collie_dtype dt);      /* "f32" */
const char *bench_dtype_nccl_name(collie_dtype dt); /* "float" */
bool bench_op_reduces(bench_op op);
bool bench_op_rooted(bench_op op);
/* collie.h has an in-place form of op (broadcast: its only form). */
bool bench_has_inplace(bench_op op);

typedef struct bench_opts {
    const char *backend; /* as given */
    const char *spec;    /* of the comm: backend, with cpu:auto added when it has no cpu backend */
    char spec_buf[256];
    bool cuda;  /* the spec has a cuda backend: the timed ops run on CUDA buffers */
    int device; /* --device, or -1 */
    bool ops[BENCH_NUM_OPS];
    /* the ops timed in place too: bench_has_inplace's, unless the program
     * lacks an op's in-place form (the table says N/A) */
    bool inplace[BENCH_NUM_OPS];
    size_t sizes[BENCH_MAX_SIZES];
    size_t nsizes;
    const char *sizes_from; /* "--sizes" or the nccl-tests flags, for the header */
    bool dtypes[BENCH_NUM_DTYPES];
    bool redops[COLLIE_NUM_REDOPS];
    int root;                    /* a rank, or BENCH_ALL_ROOTS (-r all) */
    int iters, warmup, inflight; /* inflight 0: off */
    bool check, csv;
    int32_t timeout_ms;
    int corrupt_rank; /* -1, or the rank that spoils its first checked result */
    int threads;      /* ranks per process, one thread each */
} bench_opts;

/* Parse the command line. BENCH_EXIT_OK, BENCH_EXIT_USAGE (said), or -1
 * after --help. */
int bench_parse_args(int argc, char **argv, bench_opts *o);
bool bench_parse_int(const char *s, long long lo, long long hi, int *out);
/* A usage error, said once (by rank 0): returns BENCH_EXIT_USAGE. */
int bench_usage_error(const char *fmt, const char *arg);
/* This process is not rank 0 of the launcher's world. */
bool bench_quiet_rank(void);

/* What one op is called with for one requested size (nccl-tests). */
typedef struct bench_counts {
    size_t param;      /* the count argument of the call */
    size_t send, recv; /* elements of the send and receive buffers */
    size_t bytes;      /* nccl-tests' size: the larger buffer, in bytes */
} bench_counts;

bench_counts bench_counts_for(bench_op op, size_t S, size_t es, int nranks);
/* allgatherv and alltoallv: `total` elements (the count column) split
 * unevenly, block p of n weighing p+1 (the last takes the rest);
 * alltoallv's rank `from` sends rank `to` block (from + to) % n, so every
 * rank sends and receives `total`. bench_v_count: elements from -> to
 * (allgatherv: from's block, to any); bench_v_offset: where the block
 * from -> to starts in from's packed send buffer (alltoallv) or in the
 * packed result (allgatherv, to ignored). */
size_t bench_v_count(bench_op op, size_t total, int n, int from, int to);
size_t bench_v_offset(bench_op op, size_t total, int n, int from, int to);

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
    int rank, size; /* global: prank * threads + thread, nprocs * threads */
    /* the row being run: dtype, reduction, root */
    collie_dtype dt;
    collie_redop redop;
    int root;
    size_t es;              /* bytes per element of dt */
    unsigned char *sendbuf; /* sized for the largest size; only read by the ops */
    unsigned char *arena;   /* receive slots, one per work in flight */
    size_t arena_bytes;
    size_t slot_bytes, nslots; /* of the current size and placement */
    collie_work **works;       /* outstanding works; NULL entries are free */
    size_t nworks;
    double *lat;           /* iters per-op seconds, then the inflight elapsed time */
    double avg[2];         /* out-of-place and in-place per-op seconds, averaged over ranks */
    int64_t wrong[2];      /* wrong elements of the row, out-of-place and in-place */
    size_t *vsend, *vrecv; /* allgatherv/alltoallv counts of the row, size entries each */
    bool said_wrong;       /* this rank reported a wrong result of the row */
    collie_post_opts po;
    int64_t wrong_total; /* over the ranks and rows so far */
    double busbw_sum;
    int busbw_rows;
} bench;

static inline unsigned char *bench_slot(const bench *b, size_t slot) {
    return b->arena + slot * b->slot_bytes;
}

/* Fill the inputs of op (in place: into receive slot 0, where the call
 * reads them) and poison the result in slot 0; a broadcast root fills its
 * first `slots` slots. */
void bench_fill(bench *b, bench_op op, const bench_counts *k, uint32_t seed, size_t slots,
                bool inplace);
/* Count the wrong elements of op's result in `slot` (in place: where the
 * call put it); the first wrong result of a row is reported on stderr.
 * `when` names the moment ("after the first op"). */
size_t bench_verify(bench *b, bench_op op, const bench_counts *k, uint32_t seed, size_t slot,
                    bool inplace, const char *when);

/* The buffers of op's call receiving into `slot` of `arena` (host or
 * device): out of place `send`; in place as collie.h's in-place forms
 * (allgather, gather: the input at rank*count of the slot; reduce_scatter:
 * the result there). */
void bench_call_bufs(const bench *b, bench_op op, const bench_counts *k, unsigned char *send,
                     unsigned char *arena, size_t slot, bool inplace, void **s, void **r);

/* ---- what a program supplies: collie's in bench_post.c, MPI's in ----------
 * ---- bench/mpi_bench.c; each reports its own failure ----------------------- */

/* Post op receiving into `slot` as outstanding work i (i < b->nworks). */
int bench_post(bench *b, bench_op op, const bench_counts *k, size_t slot, bool inplace, size_t i);
/* Wait for outstanding work i (bounded) and release it. */
int bench_wait(bench *b, size_t i, bench_op op, const bench_counts *k);
/* A barrier on the cpu backend, also with CUDA buffers. */
int bench_sync(bench *b);
/* An allreduce of `n` values of the statistics (host buffers, cpu backend):
 * FP64 MAX or AVG, INT64 SUM. */
int bench_combine(bench *b, void *buf, size_t n, collie_dtype dt, collie_redop op);
/* Copy the send buffer's first `send` bytes and the first `slots` receive
 * slots between host and device (kind: BENCH_CUDA_TO_*). */
int bench_cuda_copy(bench *b, int kind, size_t send, size_t slots);

/* ---- collie's posting (bench_post.c) ------------------------------------- */

/* Say that posting op failed with res. */
void bench_post_failed(bench *b, bench_op op, const bench_counts *k, int res);
/* Say that CUDA call `call` failed with e: COLLIE_EBACKEND. */
int bench_cuda_failed(const bench *b, const char *call, int e);

/* ---- the rows (bench_row.c) ---------------------------------------------- */

/* Run `total` ops with up to `depth` in flight, work i receiving into slot
 * i % depth; *elapsed (if not NULL) gets the seconds taken. */
int bench_ring(bench *b, bench_op op, const bench_counts *k, size_t total, size_t depth,
               bool inplace, double *elapsed);
/* One op, posted and waited, receiving into slot 0. */
int bench_one(bench *b, bench_op op, const bench_counts *k, bool inplace);
/* The host buffers for the largest size (b->rank, b->size set): the send
 * buffer (*send_bytes), the receive arena, the v counts, the latencies;
 * b->nworks is the deepest loop's depth. COLLIE_OK or COLLIE_ENOMEM, said.
 * bench_buffers_free frees whatever is there. */
int bench_buffers_alloc(bench *b, size_t *send_bytes);
void bench_buffers_free(bench *b);
/* Every row of every chosen op, between a first and a last barrier; rank 0
 * prints the table. COLLIE_OK, BENCH_CHECK_FAILED (wrong results, every
 * rank knows), BENCH_BAD_ROOT (said) or an error (said). */
int bench_run(bench *b);

/* ---- the table (bench_table.c), printed by rank 0 ------------------------ */

void bench_print_header(bench *b);
void bench_print_heads(bench_op op); /* before each collective's rows */
/* One row from b->avg and b->wrong, its median latency and ops/s. */
void bench_print_row(bench *b, bench_op op, const bench_counts *k, double lat_s, double ops_s);
void bench_print_footer(bench *b);

/* ---- a rank and its process (bench_rank.c) -------------------------------- */

/* Where this process sits in the world (collie-run's variables):
 * BENCH_EXIT_OK or BENCH_EXIT_ERROR after saying why. */
int bench_proc_init(bench_proc *p, const bench_opts *o);
void bench_proc_fini(bench_proc *p);
/* `rank` failed: abort the comms of the other ranks of this process. */
void bench_proc_stop(bench_proc *p, int rank);
/* A rank's engine, comm and buffers (CUDA ones too); COLLIE_OK or the
 * error, said. bench_teardown undoes whatever it did (abort first when
 * `failed`). */
int bench_setup(bench *b);
void bench_teardown(bench *b, bool failed);

static inline size_t bench_min(size_t a, size_t b) { return a < b ? a : b; }

static inline int64_t bench_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#endif
