/*
 * cudart.c — the CPU double of the CUDA runtime calls collie's NCCL plugin
 * and its tests make (tests only; built as libcudart.so.13 with the real
 * library's symbol version, see cudart.map).
 *
 * Design notes
 *  - Device memory is host memory; "devices" are numbers (CLTEST_CUDA_DEVICES)
 *    and the current device is thread-local.
 *  - A stream is a FIFO of operations run by its own worker thread: host
 *    functions (NCCL ops, cudaLaunchHostFunc), event records and event waits.
 *    The null, legacy and per-thread handles share one default stream.
 *  - Events count records: a record takes generation g (recorded = g) and
 *    completes it when the stream reaches it (completed = g). A wait captures
 *    the generation recorded at the time of the call, as CUDA does; an event
 *    never recorded is complete. Operations hold a reference to the events
 *    they name, so destroying an event with pending work is safe.
 *  - One mutex and one condition variable for everything: a double needs to
 *    be obviously right, not fast.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/cuda_double/double.h"

enum dbl_op_kind { OP_FN, OP_RECORD, OP_WAIT };

typedef struct dbl_op {
    struct dbl_op *next;
    int kind;
    void (*fn)(void *);
    void *arg;
    cudaEvent_t ev;
    uint64_t gen;
} dbl_op;

struct CUstream_st {
    dbl_op *head, *tail; /* head runs; it is popped once done */
    bool destroyed, capturing;
    unsigned flags;
};

struct CUevent_st {
    uint64_t recorded, completed;
    int refs; /* the user's + one per operation naming it */
    unsigned flags;
};

static pthread_mutex_t dbl_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t dbl_cv = PTHREAD_COND_INITIALIZER;
static struct CUstream_st *dbl_default;
static _Thread_local int dbl_device;
static _Thread_local cudaError_t dbl_last_error;

CLTEST_API int cltest_cuda_double = 1; /* lets a test tell the double from the real thing */

CLTEST_API int64_t cltest_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

CLTEST_API long cltest_env_int(const char *name, long dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    long x = strtol(v, &end, 10);
    return *end ? dflt : x;
}

CLTEST_API int cltest_current_device(void) { return dbl_device; }

static cudaError_t dbl_ret(cudaError_t e) {
    if (e != cudaSuccess) dbl_last_error = e;
    return e;
}

/* ---- streams ------------------------------------------------------------------- */

static void dbl_event_unref_locked(cudaEvent_t ev) {
    if (--ev->refs == 0) free(ev);
}

static void *dbl_stream_main(void *arg) {
    struct CUstream_st *s = arg;
    pthread_mutex_lock(&dbl_mu);
    for (;;) {
        while (!s->head && !s->destroyed)
            pthread_cond_wait(&dbl_cv, &dbl_mu);
        if (!s->head) break;
        dbl_op *op = s->head;
        switch (op->kind) {
        case OP_RECORD:
            if (op->ev->completed < op->gen) op->ev->completed = op->gen;
            break;
        case OP_WAIT:
            while (op->ev->completed < op->gen)
                pthread_cond_wait(&dbl_cv, &dbl_mu);
            break;
        default:
            pthread_mutex_unlock(&dbl_mu);
            op->fn(op->arg);
            pthread_mutex_lock(&dbl_mu);
            break;
        }
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        if (op->ev) dbl_event_unref_locked(op->ev);
        free(op);
        pthread_cond_broadcast(&dbl_cv);
    }
    pthread_mutex_unlock(&dbl_mu);
    free(s);
    return NULL;
}

static cudaError_t dbl_stream_new(struct CUstream_st **out, unsigned flags) {
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s) return cudaErrorMemoryAllocation;
    s->flags = flags;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    int e = pthread_create(&t, &at, dbl_stream_main, s);
    pthread_attr_destroy(&at);
    if (e != 0) {
        free(s);
        return cudaErrorMemoryAllocation;
    }
    *out = s;
    return cudaSuccess;
}

/* The stream a handle names (mu). NULL, legacy and per-thread: the default. */
static struct CUstream_st *dbl_stream_locked(cudaStream_t s) {
    if (s && s != cudaStreamLegacy && s != cudaStreamPerThread) return s;
    if (!dbl_default && dbl_stream_new(&dbl_default, 0) != cudaSuccess) return NULL;
    return dbl_default;
}

static cudaError_t dbl_enqueue_locked(struct CUstream_st *s, dbl_op *op) {
    if (!s) {
        free(op);
        return cudaErrorInvalidResourceHandle;
    }
    if (op->ev) op->ev->refs++;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    pthread_cond_broadcast(&dbl_cv);
    return cudaSuccess;
}

CLTEST_API cudaError_t cltest_stream_enqueue(cudaStream_t s, void (*fn)(void *), void *arg) {
    dbl_op *op = calloc(1, sizeof *op);
    if (!op) return cudaErrorMemoryAllocation;
    op->kind = OP_FN;
    op->fn = fn;
    op->arg = arg;
    pthread_mutex_lock(&dbl_mu);
    cudaError_t e = dbl_enqueue_locked(dbl_stream_locked(s), op);
    pthread_mutex_unlock(&dbl_mu);
    return e;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
    if (!s) return dbl_ret(cudaErrorInvalidValue);
    return dbl_ret(dbl_stream_new(s, flags));
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread)
        return dbl_ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&dbl_mu);
    s->destroyed = true; /* the worker drains the queue, then frees it */
    pthread_cond_broadcast(&dbl_cv);
    pthread_mutex_unlock(&dbl_mu);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t h) {
    pthread_mutex_lock(&dbl_mu);
    struct CUstream_st *s = dbl_stream_locked(h);
    while (s && s->head)
        pthread_cond_wait(&dbl_cv, &dbl_mu);
    pthread_mutex_unlock(&dbl_mu);
    return s ? cudaSuccess : dbl_ret(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaStreamQuery(cudaStream_t h) {
    pthread_mutex_lock(&dbl_mu);
    struct CUstream_st *s = dbl_stream_locked(h);
    bool busy = s && s->head;
    pthread_mutex_unlock(&dbl_mu);
    if (!s) return dbl_ret(cudaErrorInvalidResourceHandle);
    return busy ? cudaErrorNotReady : cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t h, cudaEvent_t ev, unsigned int flags) {
    (void)flags;
    if (!ev) return dbl_ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&dbl_mu);
    cudaError_t e = cudaSuccess;
    if (ev->recorded > ev->completed) { /* else there is nothing to wait for */
        dbl_op *op = calloc(1, sizeof *op);
        if (op) {
            op->kind = OP_WAIT;
            op->ev = ev;
            op->gen = ev->recorded;
            e = dbl_enqueue_locked(dbl_stream_locked(h), op);
        } else {
            e = cudaErrorMemoryAllocation;
        }
    }
    pthread_mutex_unlock(&dbl_mu);
    return dbl_ret(e);
}

cudaError_t cudaLaunchHostFunc(cudaStream_t h, cudaHostFn_t fn, void *data) {
    return dbl_ret(cltest_stream_enqueue(h, fn, data));
}

cudaError_t cudaStreamBeginCapture(cudaStream_t h, enum cudaStreamCaptureMode mode) {
    (void)mode;
    pthread_mutex_lock(&dbl_mu);
    struct CUstream_st *s = dbl_stream_locked(h);
    if (s) s->capturing = true;
    pthread_mutex_unlock(&dbl_mu);
    return s ? cudaSuccess : dbl_ret(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaStreamEndCapture(cudaStream_t h, cudaGraph_t *graph) {
    pthread_mutex_lock(&dbl_mu);
    struct CUstream_st *s = dbl_stream_locked(h);
    if (s) s->capturing = false;
    pthread_mutex_unlock(&dbl_mu);
    if (graph) *graph = NULL; /* the double records no graph */
    return s ? cudaSuccess : dbl_ret(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaStreamIsCapturing(cudaStream_t h, enum cudaStreamCaptureStatus *status) {
    pthread_mutex_lock(&dbl_mu);
    struct CUstream_st *s = dbl_stream_locked(h);
    *status = s && s->capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    pthread_mutex_unlock(&dbl_mu);
    return s ? cudaSuccess : dbl_ret(cudaErrorInvalidResourceHandle);
}

/* ---- events ------------------------------------------------------------------------ */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned int flags) {
    if (!ev) return dbl_ret(cudaErrorInvalidValue);
    *ev = calloc(1, sizeof **ev);
    if (!*ev) return dbl_ret(cudaErrorMemoryAllocation);
    (*ev)->refs = 1;
    (*ev)->flags = flags;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *ev) { return cudaEventCreateWithFlags(ev, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t ev) {
    if (!ev) return dbl_ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&dbl_mu);
    dbl_event_unref_locked(ev);
    pthread_mutex_unlock(&dbl_mu);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t h) {
    if (!ev) return dbl_ret(cudaErrorInvalidResourceHandle);
    dbl_op *op = calloc(1, sizeof *op);
    if (!op) return dbl_ret(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&dbl_mu);
    struct CUstream_st *s = dbl_stream_locked(h);
    cudaError_t e;
    if (s && s->capturing) { /* would become a graph node: the plugin must not do it */
        free(op);
        e = cudaErrorStreamCaptureUnsupported;
    } else {
        op->kind = OP_RECORD;
        op->ev = ev;
        op->gen = ++ev->recorded;
        e = dbl_enqueue_locked(s, op);
    }
    pthread_mutex_unlock(&dbl_mu);
    return dbl_ret(e);
}

cudaError_t cudaEventQuery(cudaEvent_t ev) {
    if (!ev) return dbl_ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&dbl_mu);
    bool done = ev->completed >= ev->recorded;
    pthread_mutex_unlock(&dbl_mu);
    return done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
    if (!ev) return dbl_ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&dbl_mu);
    uint64_t gen = ev->recorded;
    while (ev->completed < gen)
        pthread_cond_wait(&dbl_cv, &dbl_mu);
    pthread_mutex_unlock(&dbl_mu);
    return cudaSuccess;
}

/* ---- devices and memory -------------------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int *count) {
    *count = 0;
    if (cltest_env_int("CLTEST_CUDA_NO_DEVICE", 0)) return dbl_ret(cudaErrorInsufficientDriver);
    *count = (int)cltest_env_int("CLTEST_CUDA_DEVICES", 4);
    return *count > 0 ? cudaSuccess : dbl_ret(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int dev) {
    int n;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return e;
    if (dev < 0 || dev >= n) return dbl_ret(cudaErrorInvalidDevice);
    dbl_device = dev;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *dev) {
    *dev = dbl_device;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t size) {
    if (!p) return dbl_ret(cudaErrorInvalidValue);
    if (posix_memalign(p, 256, size ? size : 1) != 0) {
        *p = NULL;
        return dbl_ret(cudaErrorMemoryAllocation);
    }
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    (void)kind;
    if (n) memmove(dst, src, n);
    return cudaSuccess;
}

/* An asynchronous copy: a host function on the stream. */
typedef struct dbl_copy {
    void *dst;
    const void *src;
    size_t n;
} dbl_copy;

static void dbl_copy_run(void *arg) {
    dbl_copy *c = arg;
    if (c->n) memmove(c->dst, c->src, c->n);
    free(c);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t h) {
    (void)kind;
    dbl_copy *c = malloc(sizeof *c);
    if (!c) return dbl_ret(cudaErrorMemoryAllocation);
    *c = (dbl_copy){dst, src, n};
    cudaError_t e = cltest_stream_enqueue(h, dbl_copy_run, c);
    if (e != cudaSuccess) free(c);
    return dbl_ret(e);
}

/* Pinned, mapped host memory: host memory, its device pointer itself. */
cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags) {
    (void)flags;
    return cudaMalloc(p, size);
}

cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned int flags) {
    (void)flags;
    if (!dev || !host) return dbl_ret(cudaErrorInvalidValue);
    *dev = host;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int v, size_t n) {
    memset(p, v, n);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return cudaStreamSynchronize(NULL); }

/* ---- errors ------------------------------------------------------------------------ */

static const struct {
    cudaError_t e;
    const char *name, *text;
} dbl_errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
};

const char *cudaGetErrorString(cudaError_t e) {
    for (size_t i = 0; i < sizeof dbl_errors / sizeof dbl_errors[0]; i++)
        if (dbl_errors[i].e == e) return dbl_errors[i].text;
    return "unrecognized error code";
}

const char *cudaGetErrorName(cudaError_t e) {
    for (size_t i = 0; i < sizeof dbl_errors / sizeof dbl_errors[0]; i++)
        if (dbl_errors[i].e == e) return dbl_errors[i].name;
    return "cudaErrorUnknown";
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = dbl_last_error;
    dbl_last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return dbl_last_error; }
