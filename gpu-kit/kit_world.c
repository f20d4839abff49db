/*
 * kit_world.c — what the checks are built from: clocks, a 1-rank world
 * (engine, store server, store, comm) and the stream gate.
 *
 * Design notes
 *  - A gate is a host-mapped flag the stream waits on (cuStreamWaitValue32):
 *    shut, the stream holds everything enqueued after it; the host opens it
 *    by writing 1. kit_gate_free opens it first, so a gate is never left
 *    shut.
 *  - kit_world_close takes a world opened in part (after a failed open).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_check.h"

int64_t kit_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void kit_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

int64_t kit_pct(int64_t *v, size_t n, int p) {
    qsort(v, n, sizeof *v, cmp_i64);
    size_t i = (n * (size_t)p) / 100;
    return v[i < n ? i : n - 1];
}

int kit_count_dir(const char *path) {
    char cmd[64];
    snprintf(cmd, sizeof cmd, "ls %s | wc -l", path);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p) {
        if (fscanf(p, "%d", &n) != 1) n = -1;
        pclose(p);
    }
    return n;
}

int kit_world_open(kit_world *w, const char *spec, const char *name, int32_t timeout_ms, char *why,
                   size_t len) {
    memset(w, 0, sizeof *w);
    if (collie_engine_create(NULL, &w->e) != COLLIE_OK ||
        collie_store_server_create(w->e, "127.0.0.1", 0, NULL, &w->srv) != COLLIE_OK) {
        snprintf(why, len, "engine/store: %s", collie_last_error());
        return -1;
    }
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", collie_store_server_port(w->srv));
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = name;
    o.backend = spec;
    o.timeout_ms = timeout_ms;
    o.device = 0;
    if (collie_store_connect(w->e, addr, NULL, &w->st) != COLLIE_OK ||
        collie_comm_create(w->e, w->st, 0, 1, &o, &w->c) != COLLIE_OK) {
        snprintf(why, len, "comm '%s' (%s): %s", name, spec, collie_last_error());
        return -1;
    }
    int e = kit_cu.StreamCreate(&w->s);
    if (e) {
        snprintf(why, len, "cudaStreamCreate: %s", kit_cuerr(e));
        return -1;
    }
    return 0;
}

void kit_world_close(kit_world *w) {
    if (w->c) collie_comm_destroy(w->c);
    if (w->s) kit_cu.StreamDestroy(w->s);
    if (w->st) collie_store_destroy(w->st);
    if (w->srv) collie_store_server_destroy(w->srv);
    if (w->e) collie_engine_destroy(w->e);
    memset(w, 0, sizeof *w);
}

bool kit_gate_make(kit_gate *g, char *why, size_t len) {
    memset(g, 0, sizeof *g);
    if (!kit_drv.WaitValue32 || kit_drv.why[0]) {
        snprintf(why, len, "needs a stream gate: %.200s",
                 kit_drv.why[0] ? kit_drv.why : "no driver API");
        return false;
    }
    void *h = NULL;
    int e = kit_cu.HostAlloc(&h, 64, HOST_ALLOC_MAPPED);
    if (e || kit_cu.HostGetDevicePointer(&g->dev, h, 0)) {
        snprintf(why, len, "cudaHostAlloc (mapped): %s", kit_cuerr(e));
        return false;
    }
    g->host = h;
    *g->host = 0;
    return true;
}

int kit_gate_shut(kit_gate *g, stream_t s) {
    __atomic_store_n(g->host, 0, __ATOMIC_SEQ_CST);
    return kit_drv.WaitValue32(s, (uint64_t)(uintptr_t)g->dev, 1, 0 /* GEQ */);
}

void kit_gate_open(kit_gate *g) { __atomic_store_n(g->host, 1, __ATOMIC_SEQ_CST); }

void kit_gate_free(kit_gate *g) {
    if (g->host) {
        kit_gate_open(g);
        kit_cu.FreeHost((void *)g->host);
    }
    g->host = NULL;
}

/* Open a 1-rank cuda:nccl world for check `name`; when that fails, report
 * the check FAIL, release `g` (if given) and return false. */
bool kit_check_world(kit_world *w, const char *name, const char *comm, int32_t timeout_ms,
                     kit_gate *g) {
    char why[256];
    if (kit_world_open(w, "cuda:nccl", comm, timeout_ms, why, sizeof why) == 0) return true;
    kit_result("FAIL", name, "", "%s", why);
    kit_world_close(w);
    if (g) kit_gate_free(g);
    return false;
}
