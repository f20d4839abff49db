/*
 * coll_cuda.c — the collie_cuda.h calls: the same collectives, routed to
 * the comm's cuda backend with the caller's stream. The core never calls
 * CUDA itself; the stream is an opaque pointer handed to the backend.
 */
#include "collie_cuda.h"

#include "comm/coll_args.h"
#include "comm/comm.h"
#include "engine/engine.h"

static int cuda_post(collie_comm *c, collie_coll_args *a, collie_cuda_stream_t stream,
                     const collie_post_opts *o, collie_work **out) {
    a->stream = stream;
    return cl_coll_post(c, a, CL_DEV_CUDA, o, out);
}

int collie_cuda_allreduce(collie_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                          collie_dtype dt, collie_redop op, collie_cuda_stream_t stream,
                          const collie_post_opts *o, collie_work **out) {
    collie_coll_args a = cl_args_allreduce(sendbuf, recvbuf, count, dt, op);
    return cuda_post(c, &a, stream, o, out);
}

int collie_cuda_broadcast(collie_comm *c, void *buf, size_t count, collie_dtype dt, int root,
                          collie_cuda_stream_t stream, const collie_post_opts *o,
                          collie_work **out) {
    collie_coll_args a = cl_args_broadcast(buf, count, dt, root);
    return cuda_post(c, &a, stream, o, out);
}

int collie_cuda_reduce(collie_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                       collie_dtype dt, collie_redop op, int root, collie_cuda_stream_t stream,
                       const collie_post_opts *o, collie_work **out) {
    collie_coll_args a = cl_args_reduce(sendbuf, recvbuf, count, dt, op, root);
    return cuda_post(c, &a, stream, o, out);
}

int collie_cuda_allgather(collie_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                          collie_dtype dt, collie_cuda_stream_t stream, const collie_post_opts *o,
                          collie_work **out) {
    collie_coll_args a = cl_args_blocks(COLLIE_COLL_ALLGATHER, sendbuf, recvbuf, count, dt, 0);
    return cuda_post(c, &a, stream, o, out);
}

int collie_cuda_reduce_scatter(collie_comm *c, const void *sendbuf, void *recvbuf, size_t recvcount,
                               collie_dtype dt, collie_redop op, collie_cuda_stream_t stream,
                               const collie_post_opts *o, collie_work **out) {
    collie_coll_args a = cl_args_reduce_scatter(sendbuf, recvbuf, recvcount, dt, op);
    return cuda_post(c, &a, stream, o, out);
}

int collie_cuda_alltoall(collie_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                         collie_dtype dt, collie_cuda_stream_t stream, const collie_post_opts *o,
                         collie_work **out) {
    collie_coll_args a = cl_args_blocks(COLLIE_COLL_ALLTOALL, sendbuf, recvbuf, count, dt, 0);
    return cuda_post(c, &a, stream, o, out);
}

int collie_cuda_gather(collie_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                       collie_dtype dt, int root, collie_cuda_stream_t stream,
                       const collie_post_opts *o, collie_work **out) {
    collie_coll_args a = cl_args_blocks(COLLIE_COLL_GATHER, sendbuf, recvbuf, count, dt, root);
    return cuda_post(c, &a, stream, o, out);
}

int collie_cuda_scatter(collie_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                        collie_dtype dt, int root, collie_cuda_stream_t stream,
                        const collie_post_opts *o, collie_work **out) {
    collie_coll_args a = cl_args_blocks(COLLIE_COLL_SCATTER, sendbuf, recvbuf, count, dt, root);
    return cuda_post(c, &a, stream, o, out);
}

int collie_cuda_barrier(collie_comm *c, collie_cuda_stream_t stream, const collie_post_opts *o,
                        collie_work **out) {
    collie_coll_args a = cl_args_barrier();
    return cuda_post(c, &a, stream, o, out);
}

int collie_cuda_send(collie_comm *c, const void *buf, size_t count, collie_dtype dt, int peer,
                     uint64_t tag, collie_cuda_stream_t stream, const collie_post_opts *o,
                     collie_work **out) {
    collie_coll_args a = cl_args_p2p(COLLIE_COLL_SEND, buf, NULL, count, dt, peer, tag);
    return cuda_post(c, &a, stream, o, out);
}

int collie_cuda_recv(collie_comm *c, void *buf, size_t count, collie_dtype dt, int peer,
                     uint64_t tag, collie_cuda_stream_t stream, const collie_post_opts *o,
                     collie_work **out) {
    collie_coll_args a = cl_args_p2p(COLLIE_COLL_RECV, NULL, buf, count, dt, peer, tag);
    return cuda_post(c, &a, stream, o, out);
}

int collie_work_wait_stream(collie_work *w, collie_cuda_stream_t stream) {
    if (!cl_coll_is_work(w))
        return cl_set_last_error(COLLIE_EINVAL, "collie_work_wait_stream: not a collective work");
    cl_coll_work *cw = (cl_coll_work *)w;
    if (!cw->args.stream || !cw->bc->ops->wait_stream)
        return cl_set_last_error(COLLIE_EINVAL,
                                 "collie_work_wait_stream: %s seq %llu is not a CUDA work",
                                 w->ops->name, (unsigned long long)w->seq);
    void *state = cw->bc->state;
    if (!state) { /* the backend was destroyed: the work ended long ago */
        int st = collie_work_result(w);
        return st == COLLIE_INPROGRESS ? COLLIE_ESTATE : st;
    }
    return cw->bc->ops->wait_stream(state, w, stream);
}

int collie_cuda_allgatherv(collie_comm *c, const void *sendbuf, void *recvbuf,
                           const size_t *recvcounts, const size_t *displs, collie_dtype dt,
                           collie_cuda_stream_t stream, const collie_post_opts *o,
                           collie_work **out) {
    collie_coll_args a = cl_args_allgatherv(sendbuf, recvbuf, recvcounts, displs, dt);
    return cuda_post(c, &a, stream, o, out);
}

int collie_cuda_alltoallv(collie_comm *c, const void *sendbuf, const size_t *sendcounts,
                          const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                          const size_t *rdispls, collie_dtype dt, collie_cuda_stream_t stream,
                          const collie_post_opts *o, collie_work **out) {
    collie_coll_args a =
        cl_args_alltoallv(sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, dt);
    return cuda_post(c, &a, stream, o, out);
}
