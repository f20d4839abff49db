/*
 * mpi_bench.c — collie-bench on MPI, the MPI peer of bench/peers.sh: the
 * same rows, timings, --check data and table (or --csv) as collie-bench,
 * posting MPI's non-blocking collectives and finding their completion by
 * polling MPI_Test. Built against Open MPI and against MPICH, whichever
 * mpicc is installed (make bench-mpi: build/bench/mpi_bench_openmpi,
 * build/bench/mpi_bench_mpich):
 *
 *   mpirun -np N mpi_bench [collie-bench's options]
 *
 * Design notes
 *  - Everything but the posting is collie-bench's (tools/bench/: the command
 *    line, the data of --check, the rows and their timings, the table;
 *    bench.h's "what a program supplies"): this file gives those rows
 *    bench_post, bench_wait, bench_sync, bench_combine and bench_cuda_copy
 *    on MPI. The flags mean what they mean there; those MPI has no use for
 *    (--backend, --device, --threads, --timeout-ms) are refused by name, as
 *    are the dtypes (f16, bf16) and the reduction (avg) MPI has no
 *    standard form of.
 *  - In place as collie.h's forms, through MPI_IN_PLACE: allreduce,
 *    allgather, allgatherv at every rank; reduce and gather at the root
 *    (the others send from where collie's in-place call reads). MPI's
 *    in-place reduce_scatter leaves the result at the start of the buffer,
 *    collie's at block rank: its in-place columns say N/A here.
 *  - Completion is always found by polling MPI_Test (never MPI_Wait), the
 *    way a server polls collie's work handles from its own loop. MPI
 *    errors abort the job (MPI_ERRORS_ARE_FATAL); the caller bounds the run
 *    with timeout(1). Counts are ints: a size whose count does not fit is
 *    refused.
 *  - allgatherv and alltoallv: collie-bench's uneven blocks (bench_v_count),
 *    packed, as int counts and displacements made once per row.
 */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/bench/bench.h"

/* The MPI side of the one rank of this process. */
static struct mb {
    MPI_Request *reqs;            /* b->nworks */
    int *vcounts[2], *vdispls[2]; /* send, receive: the v ops' blocks of the row */
    bench_op v_op;
    size_t v_total; /* the row the v arrays were made for */
} mb;

static MPI_Datatype mb_type(collie_dtype dt) {
    switch (dt) {
    case COLLIE_FP32: return MPI_FLOAT;
    case COLLIE_FP64: return MPI_DOUBLE;
    case COLLIE_INT8: return MPI_INT8_T;
    case COLLIE_UINT8: return MPI_UINT8_T;
    case COLLIE_INT32: return MPI_INT32_T;
    case COLLIE_INT64: return MPI_INT64_T;
    default: return MPI_DATATYPE_NULL; /* refused by mb_check_opts */
    }
}

static MPI_Op mb_redop(collie_redop op) {
    switch (op) {
    case COLLIE_PROD: return MPI_PROD;
    case COLLIE_MIN: return MPI_MIN;
    case COLLIE_MAX: return MPI_MAX;
    default: return MPI_SUM;
    }
}

/* The v ops' int counts and packed displacements for the row (b->vsend and
 * b->vrecv hold its counts). */
static void mb_v_arrays(const bench *b, bench_op op, size_t total) {
    if (mb.v_op == op && mb.v_total == total) return;
    mb.v_op = op;
    mb.v_total = total;
    int at[2] = {0, 0};
    for (int p = 0; p < b->size; p++) {
        mb.vcounts[0][p] = (int)b->vsend[p];
        mb.vcounts[1][p] = (int)b->vrecv[p];
        for (int d = 0; d < 2; d++) {
            mb.vdispls[d][p] = at[d];
            at[d] += mb.vcounts[d][p];
        }
    }
}

/* Start op on the buffers of collie's call (s, r) as request q. */
static int mb_start(bench *b, bench_op op, const bench_counts *k, void *s, void *r, bool inplace,
                    MPI_Request *q) {
    MPI_Datatype t = mb_type(b->dt);
    MPI_Op rop = mb_redop(b->redop);
    MPI_Comm w = MPI_COMM_WORLD;
    int n = (int)k->param, root = b->root;
    bool at_root = b->rank == root;
    void *in = inplace ? MPI_IN_PLACE : s; /* collie's in-place call reads at s */
    void *rr = at_root ? r : NULL;         /* reduce, gather: not read off the root */
    switch (op) {
    case BENCH_ALLREDUCE: return MPI_Iallreduce(in, r, n, t, rop, w, q);
    case BENCH_BROADCAST: return MPI_Ibcast(r, n, t, root, w, q);
    case BENCH_REDUCE: return MPI_Ireduce(at_root ? in : s, rr, n, t, rop, root, w, q);
    case BENCH_ALLGATHER: return MPI_Iallgather(in, n, t, r, n, t, w, q);
    case BENCH_REDUCE_SCATTER: return MPI_Ireduce_scatter_block(s, r, n, t, rop, w, q);
    case BENCH_ALLTOALL: return MPI_Ialltoall(s, n, t, r, n, t, w, q);
    case BENCH_GATHER: return MPI_Igather(at_root ? in : s, n, t, rr, n, t, root, w, q);
    case BENCH_SCATTER: return MPI_Iscatter(s, n, t, r, n, t, root, w, q);
    case BENCH_ALLGATHERV:
        mb_v_arrays(b, op, k->param);
        return MPI_Iallgatherv(in, mb.vcounts[0][0], t, r, mb.vcounts[1], mb.vdispls[1], t, w, q);
    case BENCH_ALLTOALLV:
        mb_v_arrays(b, op, k->param);
        return MPI_Ialltoallv(s, mb.vcounts[0], mb.vdispls[0], t, r, mb.vcounts[1], mb.vdispls[1],
                              t, w, q);
    default: return MPI_Ibarrier(w, q);
    }
}

int bench_post(bench *b, bench_op op, const bench_counts *k, size_t slot, bool inplace, size_t i) {
    void *s, *r;
    bench_call_bufs(b, op, k, b->sendbuf, b->arena, slot, inplace, &s, &r);
    if (mb_start(b, op, k, s, r, inplace, &mb.reqs[i]) != MPI_SUCCESS) {
        fprintf(stderr, "mpi_bench: rank %d: %s of %zu bytes: post failed\n", b->rank,
                bench_op_names[op], k->bytes);
        return COLLIE_EBACKEND;
    }
    return COLLIE_OK;
}

int bench_wait(bench *b, size_t i, bench_op op, const bench_counts *k) {
    (void)b, (void)op, (void)k;
    int done = 0;
    while (!done) /* bounded by the caller's timeout(1): MPI has no deadline */
        MPI_Test(&mb.reqs[i], &done, MPI_STATUS_IGNORE);
    return COLLIE_OK;
}

int bench_sync(bench *b) {
    (void)b;
    MPI_Barrier(MPI_COMM_WORLD);
    return COLLIE_OK;
}

/* FP64 MAX or AVG, INT64 SUM (bench_row.c's statistics). */
int bench_combine(bench *b, void *buf, size_t n, collie_dtype dt, collie_redop op) {
    bool fp = dt == COLLIE_FP64;
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, fp ? MPI_DOUBLE : MPI_INT64_T,
                  op == COLLIE_MAX ? MPI_MAX : MPI_SUM, MPI_COMM_WORLD);
    for (size_t i = 0; fp && op == COLLIE_AVG && i < n; i++)
        ((double *)buf)[i] /= b->size;
    return COLLIE_OK;
}

int bench_cuda_copy(bench *b, int kind, size_t send, size_t slots) {
    (void)b, (void)kind, (void)send, (void)slots;
    return COLLIE_ENOTSUP; /* no CUDA buffers: --backend is refused */
}

/* ---- options ----------------------------------------------------------------- */

static void mb_usage(void) {
    printf("usage: mpirun -np N mpi_bench [options]\n"
           "\n"
           "collie-bench on MPI (bench/peers.sh's MPI peer): the same rows, timings,\n"
           "--check data and table, and the same options (collie-bench --help) but for\n"
           "--backend, --device, --threads and --timeout-ms; dtypes f32 f64 i8 u8 i32 i64,\n"
           "reductions sum prod min max. Exit status: 0 ok, 1 error or wrong results, 2\n"
           "usage error.\n");
}

/* What MPI cannot do of the options collie-bench took. */
static int mb_check_opts(const bench_opts *o) {
    if (strcmp(o->backend, "auto") != 0)
        return bench_usage_error("--backend '%s': mpi_bench runs on MPI (no collie backend)",
                                 o->backend);
    if (o->threads != 1)
        return bench_usage_error("--threads: one rank per MPI process (mpirun -np N)%s", "");
    if (o->timeout_ms != BENCH_DEFAULT_TMO_MS)
        return bench_usage_error("--timeout-ms: MPI ops have no deadline (bound the run with "
                                 "timeout(1))%s",
                                 "");
    for (int d = 0; d < BENCH_NUM_DTYPES; d++)
        if (o->dtypes[d] && mb_type(bench_dtypes[d].dt) == MPI_DATATYPE_NULL)
            return bench_usage_error("--dtype %s: MPI has no standard type for it",
                                     bench_dtypes[d].name);
    if (o->redops[COLLIE_AVG]) return bench_usage_error("--redop avg: MPI has none%s", "");
    /* no count, block or displacement of a size S exceeds S elements */
    for (size_t i = 0; i < o->nsizes; i++)
        if (o->sizes[i] > (size_t)INT_MAX) {
            char what[96];
            snprintf(what, sizeof what, "--sizes: %zu B may be more elements than an MPI count",
                     o->sizes[i]);
            return bench_usage_error("%s (an int) holds", what);
        }
    return BENCH_EXIT_OK;
}

/* ---- main -------------------------------------------------------------------- */

static int mb_setup(bench *b) {
    size_t send_bytes, n = (size_t)b->size;
    int res = bench_buffers_alloc(b, &send_bytes);
    if (res != COLLIE_OK) return res;
    mb.reqs = calloc(b->nworks, sizeof *mb.reqs);
    for (int d = 0; d < 2; d++) {
        mb.vcounts[d] = calloc(n, sizeof(int));
        mb.vdispls[d] = calloc(n, sizeof(int));
    }
    mb.v_op = BENCH_NUM_OPS;
    if (!mb.reqs || !mb.vcounts[0] || !mb.vcounts[1] || !mb.vdispls[0] || !mb.vdispls[1]) {
        fprintf(stderr, "mpi_bench: rank %d: out of memory\n", b->rank);
        return COLLIE_ENOMEM;
    }
    return COLLIE_OK;
}

static void mb_teardown(bench *b) {
    bench_buffers_free(b);
    free(mb.reqs);
    for (int d = 0; d < 2; d++) {
        free(mb.vcounts[d]);
        free(mb.vdispls[d]);
    }
}

int main(int argc, char **argv) {
    bench_prog = "mpi_bench";
    MPI_Init(&argc, &argv);
    bench_opts o;
    bench b = {.o = &o};
    MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &b.size);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            if (b.rank == 0) mb_usage();
            MPI_Finalize();
            return BENCH_EXIT_OK;
        }
    int rc = bench_parse_args(argc, argv, &o);
    if (rc == BENCH_EXIT_OK) rc = mb_check_opts(&o);
    if (rc != BENCH_EXIT_OK) {
        MPI_Finalize();
        return rc;
    }
    o.inplace[BENCH_REDUCE_SCATTER] = false;
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    version[strcspn(version, ",\n")] = '\0'; /* its first phrase: "Open MPI v4.1.4" */
    for (char *c = version; *c; c++)
        if (*c == '\t') *c = ' ';
    o.spec = version;

    int ok = mb_setup(&b) == COLLIE_OK, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    int res = all_ok ? bench_run(&b) : COLLIE_ENOMEM;
    mb_teardown(&b);
    MPI_Finalize();
    if (res == BENCH_BAD_ROOT) return BENCH_EXIT_USAGE;
    return res == COLLIE_OK ? BENCH_EXIT_OK : BENCH_EXIT_ERROR;
}
