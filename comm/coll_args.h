/*
 * coll_args.h — one builder per collective: the collie_coll_args of a call,
 * shared by the CPU posts (coll.c) and the CUDA posts (coll_cuda.c).
 */
#ifndef CL_COLL_ARGS_H
#define CL_COLL_ARGS_H

#include "collie_backend.h"

static inline collie_coll_args cl_args_allreduce(const void *sendbuf, void *recvbuf, size_t count,
                                                 collie_dtype dt, collie_redop op) {
    return (collie_coll_args){.kind = COLLIE_COLL_ALLREDUCE,
                              .sendbuf = sendbuf,
                              .recvbuf = recvbuf,
                              .count = count,
                              .dtype = dt,
                              .op = op};
}

static inline collie_coll_args cl_args_broadcast(void *buf, size_t count, collie_dtype dt,
                                                 int root) {
    return (collie_coll_args){.kind = COLLIE_COLL_BROADCAST,
                              .sendbuf = buf,
                              .recvbuf = buf,
                              .count = count,
                              .dtype = dt,
                              .root = root};
}

static inline collie_coll_args cl_args_reduce(const void *sendbuf, void *recvbuf, size_t count,
                                              collie_dtype dt, collie_redop op, int root) {
    return (collie_coll_args){.kind = COLLIE_COLL_REDUCE,
                              .sendbuf = sendbuf,
                              .recvbuf = recvbuf,
                              .count = count,
                              .dtype = dt,
                              .op = op,
                              .root = root};
}

/* allgather, alltoall, gather, scatter: the same fields, another kind */
static inline collie_coll_args cl_args_blocks(collie_coll_kind kind, const void *sendbuf,
                                              void *recvbuf, size_t count, collie_dtype dt,
                                              int root) {
    return (collie_coll_args){.kind = kind,
                              .sendbuf = sendbuf,
                              .recvbuf = recvbuf,
                              .count = count,
                              .dtype = dt,
                              .root = root};
}

static inline collie_coll_args cl_args_reduce_scatter(const void *sendbuf, void *recvbuf,
                                                      size_t recvcount, collie_dtype dt,
                                                      collie_redop op) {
    return (collie_coll_args){.kind = COLLIE_COLL_REDUCE_SCATTER,
                              .sendbuf = sendbuf,
                              .recvbuf = recvbuf,
                              .count = recvcount,
                              .dtype = dt,
                              .op = op};
}

static inline collie_coll_args cl_args_barrier(void) {
    return (collie_coll_args){.kind = COLLIE_COLL_BARRIER, .dtype = COLLIE_UINT8};
}

static inline collie_coll_args cl_args_p2p(collie_coll_kind kind, const void *sendbuf,
                                           void *recvbuf, size_t count, collie_dtype dt, int peer,
                                           uint64_t tag) {
    return (collie_coll_args){.kind = kind,
                              .sendbuf = sendbuf,
                              .recvbuf = recvbuf,
                              .count = count,
                              .dtype = dt,
                              .peer = peer,
                              .tag = tag};
}

/* allgatherv, alltoallv: the user's arrays, which cl_coll_post checks and
 * copies into the work before anything else reads them. */
static inline collie_coll_args cl_args_allgatherv(const void *sendbuf, void *recvbuf,
                                                  const size_t *recvcounts, const size_t *displs,
                                                  collie_dtype dt) {
    return (collie_coll_args){.kind = COLLIE_COLL_ALLGATHERV,
                              .sendbuf = sendbuf,
                              .recvbuf = recvbuf,
                              .dtype = dt,
                              .recvcounts = recvcounts,
                              .rdispls = displs};
}

static inline collie_coll_args cl_args_alltoallv(const void *sendbuf, const size_t *sendcounts,
                                                 const size_t *sdispls, void *recvbuf,
                                                 const size_t *recvcounts, const size_t *rdispls,
                                                 collie_dtype dt) {
    return (collie_coll_args){.kind = COLLIE_COLL_ALLTOALLV,
                              .sendbuf = sendbuf,
                              .recvbuf = recvbuf,
                              .dtype = dt,
                              .sendcounts = sendcounts,
                              .sdispls = sdispls,
                              .recvcounts = recvcounts,
                              .rdispls = rdispls};
}

#endif
