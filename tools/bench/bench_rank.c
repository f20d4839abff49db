/*
 * bench_rank.c — a rank of collie-bench from setup to teardown: where the
 * process sits in the world, its engine, store and comm, its buffers (host
 * and CUDA), and what the ranks of one process share.
 *
 * Design notes
 *  - --threads T (nccl-tests' -t): a process runs T ranks, one thread each
 *    (thread 0 on the main thread); rank = process rank * T + thread, world
 *    size = processes * T. A rank in a thread is a rank in a process minus
 *    the address space: its own engine (progress thread), store connection,
 *    comm, buffers, work array, CUDA stream and device (--device, else
 *    rank % devices), so -n 4 and -n 2 -t 2 time the same thing, and memory
 *    per process grows T times. Only the parsed options and where the
 *    process sits in the world (bench_proc) are shared, read-only. Ranks in
 *    threads are what lets the CPU double of CUDA and NCCL, whose ranks
 *    meet only inside one process, run a multi-rank --backend nccl.
 *  - Errors: a failed post prints collie_last_error(), a failed work its
 *    collie_work_error_message(); the comm is aborted and the rank exits 1
 *    (a process of several ranks exits 1 if any of them failed). A rank that
 *    fails also aborts the comms of the other ranks of its process, as
 *    collie-run stops the other processes, so none of them waits out a
 *    deadline for it; comms are created with collie_comm_create_post and
 *    published at once, so one still in its rendezvous can be aborted too.
 *    Wrong results are not such a failure: every rank learns them together.
 *    Every op carries --timeout-ms as its deadline (post options and comm
 *    default), and every wait is additionally bounded by that plus a slack.
 *    Creating the comm waits for every rank to start, so its bound is
 *    --timeout-ms but at least BENCH_CREATE_TMO_MS (plus the slack).
 *  - A spec with a cuda backend ("nccl", "cuda:X"): the timed ops run on
 *    CUDA buffers through collie_cuda.h on the bench's own stream, waited
 *    with collie_work_wait; libcudart.so.13 is dlopen'ed (no CUDA headers or
 *    link dependency) after the comm exists, so a missing plugin or device
 *    is the comm's error. Host buffers stay as staging for --check
 *    (cudaMemcpy up before, down after). Barriers between timings and the
 *    statistics allreduces run on the cpu backend: a spec without one gets
 *    "cpu:auto," in front.
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

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
void bench_proc_stop(bench_proc *p, int rank) {
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
int bench_proc_init(bench_proc *p, const bench_opts *o) {
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

void bench_proc_fini(bench_proc *p) {
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

int bench_setup(bench *b) {
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

    size_t max_bytes;
    if ((res = bench_buffers_alloc(b, &max_bytes)) != COLLIE_OK) return res;
    if (!(b->works = calloc(b->nworks, sizeof *b->works))) {
        fprintf(stderr, "collie-bench: rank %d: out of memory\n", b->rank);
        return COLLIE_ENOMEM;
    }
    b->po = (collie_post_opts)COLLIE_POST_OPTS_INIT;
    b->po.timeout_ms = o->timeout_ms;
    return o->cuda ? bench_cuda_setup(b, max_bytes) : COLLIE_OK;
}

void bench_teardown(bench *b, bool failed) {
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
    bench_buffers_free(b);
    if (b->cu.lib) dlclose(b->cu.lib);
}
