/*
 * collie_cuda.h — collectives on CUDA device buffers, ordered on a CUDA
 * stream, run by the communicator's cuda backend (the NCCL plugin).
 *
 * The stream parameter is a cudaStream_t (declared here as the type it is,
 * `struct CUstream_st *`, so this header needs no CUDA headers).
 *
 * A post is made on the caller's thread (as NCCL requires for stream order
 * and CUDA graph capture): the collective is enqueued on `stream` and the
 * call returns a work that completes when the GPU has finished it (the
 * engine polls the backend while GPU works are pending). Every work has a
 * deadline like any other; on a fault the comm's error policy applies, and
 * an error completion is published only once the GPU work has been
 * quiesced (the buffers may then be freed).
 *
 * Errors of every post: EINVAL (arguments), ENOTSUP (the comm has no cuda
 * backend), ESTATE (the comm is still being created: wait for its create
 * work first), EABORTED (the comm has failed), EBACKEND (CUDA/NCCL refused
 * it; collie_last_error says why).
 */
#ifndef COLLIE_CUDA_H
#define COLLIE_CUDA_H

#include "collie.h"

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st;
typedef struct CUstream_st *collie_cuda_stream_t; /* == cudaStream_t */

COLLIE_API int collie_cuda_allreduce(collie_comm *c, const void *sendbuf, void *recvbuf,
                                     size_t count, collie_dtype dt, collie_redop op,
                                     collie_cuda_stream_t stream, const collie_post_opts *o,
                                     collie_work **out);
COLLIE_API int collie_cuda_broadcast(collie_comm *c, void *buf, size_t count, collie_dtype dt,
                                     int root, collie_cuda_stream_t stream,
                                     const collie_post_opts *o, collie_work **out);
COLLIE_API int collie_cuda_reduce(collie_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                                  collie_dtype dt, collie_redop op, int root,
                                  collie_cuda_stream_t stream, const collie_post_opts *o,
                                  collie_work **out);
COLLIE_API int collie_cuda_allgather(collie_comm *c, const void *sendbuf, void *recvbuf,
                                     size_t count, collie_dtype dt, collie_cuda_stream_t stream,
                                     const collie_post_opts *o, collie_work **out);
COLLIE_API int collie_cuda_reduce_scatter(collie_comm *c, const void *sendbuf, void *recvbuf,
                                          size_t recvcount, collie_dtype dt, collie_redop op,
                                          collie_cuda_stream_t stream, const collie_post_opts *o,
                                          collie_work **out);
COLLIE_API int collie_cuda_alltoall(collie_comm *c, const void *sendbuf, void *recvbuf,
                                    size_t count, collie_dtype dt, collie_cuda_stream_t stream,
                                    const collie_post_opts *o, collie_work **out);
COLLIE_API int collie_cuda_gather(collie_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                                  collie_dtype dt, int root, collie_cuda_stream_t stream,
                                  const collie_post_opts *o, collie_work **out);
COLLIE_API int collie_cuda_scatter(collie_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                                   collie_dtype dt, int root, collie_cuda_stream_t stream,
                                   const collie_post_opts *o, collie_work **out);
COLLIE_API int collie_cuda_barrier(collie_comm *c, collie_cuda_stream_t stream,
                                   const collie_post_opts *o, collie_work **out);
/* As collie_allgatherv / collie_alltoallv (collie.h), on the stream. */
COLLIE_API int collie_cuda_allgatherv(collie_comm *c, const void *sendbuf, void *recvbuf,
                                      const size_t *recvcounts, const size_t *displs,
                                      collie_dtype dt, collie_cuda_stream_t stream,
                                      const collie_post_opts *o, collie_work **out);
COLLIE_API int collie_cuda_alltoallv(collie_comm *c, const void *sendbuf, const size_t *sendcounts,
                                     const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                     const size_t *rdispls, collie_dtype dt,
                                     collie_cuda_stream_t stream, const collie_post_opts *o,
                                     collie_work **out);
COLLIE_API int collie_cuda_send(collie_comm *c, const void *buf, size_t count, collie_dtype dt,
                                int peer, uint64_t tag, collie_cuda_stream_t stream,
                                const collie_post_opts *o, collie_work **out);
COLLIE_API int collie_cuda_recv(collie_comm *c, void *buf, size_t count, collie_dtype dt, int peer,
                                uint64_t tag, collie_cuda_stream_t stream,
                                const collie_post_opts *o, collie_work **out);

/* collie_work_wait_stream: make `stream` wait for the work's GPU completion
 * without blocking the host. Errors: EINVAL (not a CUDA work), the
 * backend's error. (collie_work_wait on a CUDA work blocks the host until
 * the GPU is done, bounded like every wait.) */
COLLIE_API int collie_work_wait_stream(collie_work *w, collie_cuda_stream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* COLLIE_CUDA_H */
