/*
 * double.h — the CPU test double of the CUDA runtime and NCCL (tests only,
 * never installed): what libnccl.so.2 (nccl.c) uses of libcudart.so.13
 * (cudart.c) besides the CUDA API.
 *
 * Switches (environment, read once at load):
 *   CLTEST_CUDA_NO_DEVICE=1          cudaGetDeviceCount fails with
 *                                    cudaErrorInsufficientDriver (as on a
 *                                    machine without a GPU)
 *   CLTEST_CUDA_DEVICES=N            devices reported (default 4)
 *   CLTEST_CUDA_HANG=SPEC            the matching NCCL ops never finish (until
 *                                    ncclCommAbort)
 *   CLTEST_CUDA_ASYNC_ERROR=SPEC     the matching NCCL ops set the comm's async
 *                                    error and then hang (until ncclCommAbort)
 *   CLTEST_CUDA_ASYNC_ERROR_CODE=C   system (default), internal, remote, cuda
 *   CLTEST_CUDA_SLOW_MS=N            every NCCL op takes N ms longer
 *   CLTEST_CUDA_CRASH=SPEC           the matching NCCL ops SIGKILL their own
 *                                    process when they start to run (a rank
 *                                    process dying mid-op)
 *   CLTEST_NCCL_INPROGRESS_MS=N      every NCCL call returns ncclInProgress and
 *                                    is enqueued N ms later (on the first
 *                                    ncclCommGetAsyncError after that)
 *   CLTEST_NCCL_INIT_HANG=1          ncclCommInitRankConfig never completes
 *   CLTEST_NCCL_ABORT_SLOW_MS=N      ncclCommAbort takes N ms longer (and so
 *                                    does ncclCommRevoke's quiesce)
 *   CLTEST_NCCL_REVOKE_FAIL=R        ncclCommRevoke fails (ncclInternalError)
 *                                    on rank R
 *   CLTEST_NCCL_LENIENT=1            as the real NCCL does, ranks whose
 *                                    reduction differs run without an error
 *                                    (rank 0's reduction is applied), and so
 *                                    does a receive whose send has another
 *                                    size (the smaller is copied)
 * SPEC: comma-separated OP[#N][@R]: OP is allreduce, broadcast, reduce,
 * allgather, reduce_scatter, p2p (a send/recv group: alltoall, gather,
 * scatter, send, recv) or *; #N the N-th such op of the rank (1-based; every
 * one if absent); @R only on rank R.
 *
 * Ranks of one ncclUniqueId may live in different processes: the process
 * that made the id hosts them all (a hub on an abstract Unix socket, see
 * nccl_proc.c); the switches act in the process where the call is made.
 */
#ifndef CLTEST_CUDA_DOUBLE_H
#define CLTEST_CUDA_DOUBLE_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>

#define CLTEST_API __attribute__((visibility("default")))

/* cltest_stream_enqueue: run fn(arg) on the stream's worker thread, in
 * stream order. */
CLTEST_API cudaError_t cltest_stream_enqueue(cudaStream_t s, void (*fn)(void *), void *arg);

/* cltest_current_device: the calling thread's current device. */
CLTEST_API int cltest_current_device(void);

/* cltest_now_ns: CLOCK_MONOTONIC nanoseconds. */
CLTEST_API int64_t cltest_now_ns(void);

/* cltest_env_int: an integer switch (dflt when unset or invalid). */
CLTEST_API long cltest_env_int(const char *name, long dflt);

#endif
