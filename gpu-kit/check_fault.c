/*
 * check_fault.c — faults on a GPU: a stream blocked before a collective (the
 * deadline fires, the comm aborts within its bound, a new comm runs), destroy
 * while works wait behind a blocked stream, and a post during graph capture.
 *
 * Design notes
 *  - A stream is blocked with a gate (SKIP without one), which is always
 *    opened before the check returns; leaks are counted in threads,
 *    descriptors and free GPU memory.
 *  - The comms' abort bound is ABORT_BOUND_MS (main sets
 *    COLLIE_NCCL_ABORT_TIMEOUT_MS unless the caller did).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "gpu_check.h"

/* A stream blocked before a collective: the deadline fires, the comm
 * aborts within its bound, a waiter past the bound gets INPROGRESS or the
 * overrun error; once the stream is released the process runs a new comm. */
void kit_check_hang(void) {
    char why[256];
    kit_gate g;
    if (!kit_gate_make(&g, why, sizeof why)) {
        kit_result("SKIP", "hang_deadline_abort", "", "%s", why);
        return;
    }
    int threads0 = kit_count_dir("/proc/self/task");
    kit_world w;
    if (!kit_check_world(&w, "hang_deadline_abort", "kit-hang", WAIT_MS, &g)) return;
    void *d = NULL;
    kit_cu.Malloc(&d, 4096);
    kit_gate_shut(&g, w.s);
    collie_work *wk = NULL;
    int64_t t0 = kit_now_ns();
    collie_post_opts po = COLLIE_POST_OPTS_INIT;
    po.timeout_ms = 500;
    int r = collie_cuda_allreduce(w.c, d, d, 1024, COLLIE_FP32, COLLIE_SUM, w.s, &po, &wk);
    int st = COLLIE_OK;
    const char *msg = "";
    int64_t until = kit_now_ns() + 5000000000LL;
    while (r == COLLIE_OK && kit_now_ns() < until) {
        collie_comm_error(w.c, &st, &msg);
        if (st != COLLIE_OK) break;
        kit_sleep_ms(5);
    }
    int64_t fault_ms = (kit_now_ns() - t0) / 1000000;
    int wr = r == COLLIE_OK ? collie_work_wait(wk, 1000) : r;
    kit_gate_open(&g); /* release the stream */
    int wr2 = r == COLLIE_OK ? collie_work_wait(wk, WAIT_MS) : r;
    if (wk) collie_work_release(wk);
    kit_cu.StreamSynchronize(w.s);
    kit_cu.Free(d);
    kit_world_close(&w);
    kit_gate_free(&g);
    /* a new comm in the same process works */
    kit_world w2;
    int again = kit_world_open(&w2, "cuda:nccl", "kit-hang-after", WAIT_MS, why, sizeof why)
                    ? -1
                    : kit_one_rank_coll(&w2, COLLIE_COLL_ALLREDUCE, COLLIE_FP32, 1000, false, why,
                                        sizeof why);
    kit_world_close(&w2);
    int threads1 = kit_count_dir("/proc/self/task");
    char fig[256];
    snprintf(fig, sizeof fig,
             "fault_ms=%" PRId64 " wait_1s_while_blocked=%s threads_before=%d threads_after=%d",
             fault_ms, collie_status_name(wr), threads0, threads1);
    if (r != COLLIE_OK || st == COLLIE_OK)
        kit_result("FAIL", "hang_deadline_abort", fig, "the comm did not fault within 5 s (%s)",
                   r != COLLIE_OK ? collie_last_error() : "no error");
    else if (wr == COLLIE_OK || wr2 == COLLIE_OK || wr2 == COLLIE_INPROGRESS)
        kit_result("FAIL", "hang_deadline_abort", fig, "the hung work ended %s (first wait %s)",
                   collie_status_name(wr2), collie_status_name(wr));
    else if (again)
        kit_result("FAIL", "hang_deadline_abort", fig, "a new comm afterwards failed: %s", why);
    else if (threads1 > threads0)
        kit_result("FAIL", "hang_deadline_abort", fig, "threads were left behind");
    else
        kit_result("PASS", "hang_deadline_abort", fig,
                   "deadline 500 ms: comm faulted (%s), the work ended %s once the stream was "
                   "released, a new comm then ran correctly",
                   collie_status_name(st), collie_status_name(wr2));
}

/* destroy while works wait behind a shut gate, 50 times: bounded, no leak. */
void kit_check_destroy_cycles(int cycles) {
    char why[256];
    kit_gate g;
    if (!kit_gate_make(&g, why, sizeof why)) {
        kit_result("SKIP", "destroy_blocked_cycles", "", "%s", why);
        return;
    }
    size_t free0 = 0, free1 = 0, total = 0;
    if (kit_cu.MemGetInfo) kit_cu.MemGetInfo(&free0, &total);
    int fds0 = kit_count_dir("/proc/self/fd"), threads0 = kit_count_dir("/proc/self/task");
    int64_t worst = 0;
    for (int c = 0; c < cycles; c++) {
        kit_world w;
        /* op deadline 1 s: a graceful destroy waits that long for the
         * queued works, then aborts (quiesce bound: ABORT_BOUND_MS) */
        if (kit_world_open(&w, "cuda:nccl", "kit-destroy", 1000, why, sizeof why)) {
            kit_result("FAIL", "destroy_blocked_cycles", "", "cycle %d: %s", c, why);
            kit_world_close(&w);
            kit_gate_free(&g);
            return;
        }
        void *d = NULL;
        kit_cu.Malloc(&d, 4096);
        kit_gate_shut(&g, w.s);
        collie_work *wk[4] = {0};
        for (int i = 0; i < 4; i++)
            collie_cuda_allreduce(w.c, d, d, 1024, COLLIE_FP32, COLLIE_SUM, w.s, NULL, &wk[i]);
        int64_t t0 = kit_now_ns();
        collie_comm_destroy(w.c);
        w.c = NULL;
        int64_t took = kit_now_ns() - t0;
        if (took > worst) worst = took;
        kit_gate_open(&g);
        kit_cu.StreamSynchronize(w.s);
        for (int i = 0; i < 4; i++)
            if (wk[i]) {
                collie_work_wait(wk[i], WAIT_MS);
                collie_work_release(wk[i]);
            }
        kit_cu.Free(d);
        kit_world_close(&w);
    }
    kit_gate_free(&g);
    if (kit_cu.MemGetInfo) kit_cu.MemGetInfo(&free1, &total);
    kit_sleep_ms(200);
    int fds1 = kit_count_dir("/proc/self/fd"), threads1 = kit_count_dir("/proc/self/task");
    char fig[200];
    snprintf(fig, sizeof fig,
             "cycles=%d worst_destroy_ms=%.1f gpu_free_delta_mib=%.1f fds=%d->%d threads=%d->%d",
             cycles, (double)worst / 1e6, ((double)free0 - (double)free1) / (1 << 20), fds0, fds1,
             threads0, threads1);
    bool leak = fds1 > fds0 || threads1 > threads0 ||
                (free0 > free1 && free0 - free1 > (64u << 20)); /* allocator slack */
    if (worst > (1000 + ABORT_BOUND_MS + 3000) * 1000000LL)
        kit_result(
            "FAIL", "destroy_blocked_cycles", fig,
            "a destroy took longer than the op deadline (1 s) + the abort bound (%d ms) + 3 s",
            ABORT_BOUND_MS);
    else if (leak)
        kit_result("FAIL", "destroy_blocked_cycles", fig, "resources leaked");
    else
        kit_result("PASS", "destroy_blocked_cycles", fig,
                   "destroy with 4 works queued behind a blocked stream: bounded, nothing leaked");
}

void kit_check_graph_capture(void) {
    kit_world w;
    char why[256];
    if (!kit_check_world(&w, "graph_capture_refused", "kit-capture", WAIT_MS, NULL)) return;
    void *d = NULL;
    kit_cu.Malloc(&d, 64);
    int e = kit_cu.StreamBeginCapture(w.s, STREAM_CAPTURE_GLOBAL);
    collie_work *wk = NULL;
    int r = e ? COLLIE_OK
              : collie_cuda_allreduce(w.c, d, d, 4, COLLIE_FP32, COLLIE_SUM, w.s, NULL, &wk);
    char err[256];
    snprintf(err, sizeof err, "%s", collie_last_error());
    void *graph = NULL;
    int e2 = e ? 0 : kit_cu.StreamEndCapture(w.s, &graph);
    if (graph && kit_cu.GraphDestroy) kit_cu.GraphDestroy(graph);
    int after =
        kit_one_rank_coll(&w, COLLIE_COLL_ALLREDUCE, COLLIE_FP32, 100, false, why, sizeof why);
    if (e)
        kit_result("FAIL", "graph_capture_refused", "", "cudaStreamBeginCapture: %s", kit_cuerr(e));
    else if (r != COLLIE_ENOTSUP || wk || !strstr(err, "graph capture"))
        kit_result("FAIL", "graph_capture_refused", "", "post during capture gave %s (%s)",
                   collie_status_name(r), err);
    else if (e2)
        kit_result("FAIL", "graph_capture_refused", "", "the capture was broken: %s",
                   kit_cuerr(e2));
    else if (after)
        kit_result("FAIL", "graph_capture_refused", "", "the comm failed afterwards: %s", why);
    else
        kit_result("PASS", "graph_capture_refused", "",
                   "a post inside a capture is refused (COLLIE_ENOTSUP), the capture stays valid");
    if (wk) collie_work_release(wk);
    kit_cu.Free(d);
    kit_world_close(&w);
}
