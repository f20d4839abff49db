/*
 * gpu_check.h — what the parts of collie-gpucheck share: the CUDA runtime,
 * driver and NCCL entry points (opened at run time), the report, the 1-rank
 * world and the stream gate the checks use, and the checks themselves.
 *
 *   gpu-kit/gpu_check.c           main: the command line, the environment, the checks in order
 *   gpu-kit/kit_cuda.c            dlopen of libcudart.so.13, libcuda.so.1, libnccl.so.2
 *   gpu-kit/kit_report.c          the result lines, report.txt and report.json
 *   gpu-kit/kit_world.c           timing helpers, the 1-rank world, the stream gate
 *   gpu-kit/check_coll.c          every collective, CPU and CUDA interleaved, stream order, waits
 *   gpu-kit/check_perf.c          completion latency, post overhead, time against raw NCCL
 *   gpu-kit/check_fault.c         a hung stream's deadline and abort, destroy cycles, capture
 *   gpu-kit/check_multi.c         more than one GPU: collie-run, a killed rank, comm split
 */
#ifndef COLLIE_GPU_CHECK_H
#define COLLIE_GPU_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "collie.h"
#include "collie_backend.h" /* collie_coll_kind */
#include "collie_cuda.h"

#define WAIT_MS 30000
/* COLLIE_NCCL_ABORT_TIMEOUT_MS for the kit's comms (unless the caller set
 * one): how long an abort waits for a blocked stream before it fails the
 * works anyway (10 s by default) */
#define ABORT_BOUND_MS 1000

/* ---- the CUDA runtime, the driver's stream memory ops, NCCL (dlopen) ------------ */

typedef collie_cuda_stream_t stream_t;
typedef void *event_t;
enum { MEMCPY_DEFAULT = 4, HOST_ALLOC_MAPPED = 2, STREAM_CAPTURE_GLOBAL = 0 };

typedef struct kit_cuda {
    int (*GetDeviceCount)(int *);
    int (*SetDevice)(int);
    int (*Malloc)(void **, size_t);
    int (*Free)(void *);
    int (*Memcpy)(void *, const void *, size_t, int);
    int (*StreamCreate)(stream_t *);
    int (*StreamDestroy)(stream_t);
    int (*StreamSynchronize)(stream_t);
    int (*EventCreate)(event_t *);
    int (*EventDestroy)(event_t);
    int (*EventRecord)(event_t, stream_t);
    int (*EventQuery)(event_t);
    int (*StreamBeginCapture)(stream_t, int);
    int (*StreamEndCapture)(stream_t, void **);
    const char *(*GetErrorString)(int);
    /* optional */
    int (*MemcpyAsync)(void *, const void *, size_t, int, stream_t);
    int (*GetDeviceProperties)(void *, int);
    int (*DriverGetVersion)(int *);
    int (*RuntimeGetVersion)(int *);
    int (*MemGetInfo)(size_t *, size_t *);
    int (*HostAlloc)(void **, size_t, unsigned);
    int (*HostGetDevicePointer)(void **, void *, unsigned);
    int (*FreeHost)(void *);
    int (*GraphDestroy)(void *);
    bool double_; /* the CPU test double */
} kit_cuda;

typedef struct kit_driver {
    int (*WaitValue32)(stream_t, uint64_t addr, uint32_t value, unsigned flags);
    char why[256]; /* why the gate is unavailable */
} kit_driver;

typedef struct {
    char internal[128];
} kit_nccl_id;

typedef struct kit_nccl_lib {
    int (*GetVersion)(int *);
    int (*GetUniqueId)(kit_nccl_id *);
    int (*CommInitRank)(void **, int, kit_nccl_id, int);
    int (*AllReduce)(const void *, void *, size_t, int, int, void *, stream_t);
    int (*CommDestroy)(void *);
    char path[512];
} kit_nccl_lib;

extern kit_cuda kit_cu;
extern kit_driver kit_drv;
extern kit_nccl_lib kit_nccl;

/* Open the runtime and NCCL (and the driver, for the gate); why is "" or
 * why not. */
void kit_cuda_open(char *why, size_t len);
const char *kit_cuerr(int e);

/* ---- the report ------------------------------------------------------------------ */

/* Open DIR/report.txt and DIR/report.json (making DIR): 0, or 2 after
 * saying why. */
int kit_report_open(const char *dir);
/* One result: status "PASS"/"FAIL"/"SKIP", a sentence, and figures as
 * "name=value" pairs separated by spaces ("" for none). */
void kit_result(const char *status, const char *name, const char *figures, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Close the report with the counts, print them; returns the FAILs. */
int kit_report_close(void);

/* ---- helpers, the 1-rank world, the gate --------------------------------------- */

int64_t kit_now_ns(void);
void kit_sleep_ms(int ms);
int64_t kit_pct(int64_t *v, size_t n, int p); /* sorts v */
int kit_count_dir(const char *path);          /* entries of a folder (/proc/self/fd), or -1 */

/* A 1-rank world: engine, store server, store, comm (backend `spec`). */
typedef struct kit_world {
    collie_engine *e;
    collie_store_server *srv;
    collie_store *st;
    collie_comm *c;
    stream_t s;
} kit_world;

int kit_world_open(kit_world *w, const char *spec, const char *name, int32_t timeout_ms, char *why,
                   size_t len);
void kit_world_close(kit_world *w);

/* A gate: the stream waits until the host writes 1 into a mapped flag. */
typedef struct kit_gate {
    volatile uint32_t *host;
    void *dev;
} kit_gate;

bool kit_gate_make(kit_gate *g, char *why, size_t len);
int kit_gate_shut(kit_gate *g, stream_t s);
void kit_gate_open(kit_gate *g);
void kit_gate_free(kit_gate *g);

/* Open a 1-rank cuda:nccl world for check `name`; when that fails, report
 * the check FAIL, release `g` (if given) and return false. */
bool kit_check_world(kit_world *w, const char *name, const char *comm, int32_t timeout_ms,
                     kit_gate *g);

/* ---- the checks (each reports its own lines) ------------------------------------ */

/* Small exact values of dtype dt. */
void kit_fill(void *buf, size_t count, collie_dtype dt, unsigned salt);
/* Post collective `k` on one rank; with one rank every output equals the
 * input. Returns 0, or -1 with why. */
int kit_one_rank_coll(kit_world *w, collie_coll_kind k, collie_dtype dt, size_t count,
                      bool in_place, char *why, size_t len);

void kit_check_collectives(void);
void kit_check_mixed(void);
void kit_check_stream_order(void);
void kit_check_wait_semantics(void);
void kit_check_completion_latency(int iters);
void kit_check_overhead(size_t max_bytes, int iters);
void kit_check_hang(void);
void kit_check_destroy_cycles(int cycles);
void kit_check_graph_capture(void);

/* the folder of this program (collie-run, collie-bench), set by main */
extern char kit_bin[1024];
void kit_check_multi_collectives(int n);
void kit_check_multi_killed(int n);
void kit_check_multi_split(void);

#endif
