/*
 * check_coll.c — the checks of collie's semantics on one GPU: every
 * collective and dtype, CPU and CUDA work interleaved on one comm, stream
 * order, and what collie_work_wait and collie_work_wait_stream promise.
 *
 * Design notes
 *  - One rank: every output equals the input, so each result is checked
 *    exactly without a reference.
 *  - The stream-order and wait checks hold the stream with a gate (SKIP
 *    without one) and always open it before they return.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_check.h"

static const collie_dtype all_dtypes[] = {COLLIE_INT8, COLLIE_UINT8, COLLIE_INT32, COLLIE_INT64,
                                          COLLIE_FP16, COLLIE_BF16,  COLLIE_FP32,  COLLIE_FP64};

/* Small exact values of dtype dt. */
void kit_fill(void *buf, size_t count, collie_dtype dt, unsigned salt) {
    for (size_t i = 0; i < count; i++) {
        unsigned v = (unsigned)((i + salt) % 7) + 1;
        switch (dt) {
        case COLLIE_INT8:
        case COLLIE_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
        case COLLIE_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
        case COLLIE_INT64: ((int64_t *)buf)[i] = v; break;
        case COLLIE_FP16: ((uint16_t *)buf)[i] = v % 2 ? 0x3C00 : 0x4000; break; /* 1, 2 */
        case COLLIE_BF16: ((uint16_t *)buf)[i] = v % 2 ? 0x3F80 : 0x4000; break; /* 1, 2 */
        case COLLIE_FP32: ((float *)buf)[i] = (float)v; break;
        case COLLIE_FP64: ((double *)buf)[i] = v; break;
        default: break;
        }
    }
}

/* Post collective `k` on one rank; with one rank every output equals the
 * input. Returns 0, or -1 with why. */
int kit_one_rank_coll(kit_world *w, collie_coll_kind k, collie_dtype dt, size_t count,
                      bool in_place, char *why, size_t len) {
    size_t bytes = count * collie_dtype_size(dt);
    uint8_t *in = malloc(bytes), *out = malloc(bytes);
    void *dsend = NULL, *drecv = NULL;
    int rc = -1;
    if (!in || !out || kit_cu.Malloc(&dsend, bytes) || kit_cu.Malloc(&drecv, bytes)) {
        snprintf(why, len, "no memory for %zu bytes", bytes);
        goto done;
    }
    kit_fill(in, count, dt, (unsigned)k);
    kit_cu.Memcpy(dsend, in, bytes, MEMCPY_DEFAULT);
    kit_cu.Memcpy(drecv, in, bytes, MEMCPY_DEFAULT);
    void *src = in_place ? drecv : dsend;
    collie_work *wk = NULL;
    int r;
    switch (k) {
    case COLLIE_COLL_ALLREDUCE:
        r = collie_cuda_allreduce(w->c, src, drecv, count, dt, COLLIE_SUM, w->s, NULL, &wk);
        break;
    case COLLIE_COLL_BROADCAST:
        r = collie_cuda_broadcast(w->c, drecv, count, dt, 0, w->s, NULL, &wk);
        break;
    case COLLIE_COLL_REDUCE:
        r = collie_cuda_reduce(w->c, src, drecv, count, dt, COLLIE_SUM, 0, w->s, NULL, &wk);
        break;
    case COLLIE_COLL_ALLGATHER:
        r = collie_cuda_allgather(w->c, src, drecv, count, dt, w->s, NULL, &wk);
        break;
    case COLLIE_COLL_REDUCE_SCATTER:
        r = collie_cuda_reduce_scatter(w->c, src, drecv, count, dt, COLLIE_SUM, w->s, NULL, &wk);
        break;
    case COLLIE_COLL_ALLTOALL:
        r = collie_cuda_alltoall(w->c, src, drecv, count, dt, w->s, NULL, &wk);
        break;
    case COLLIE_COLL_GATHER:
        r = collie_cuda_gather(w->c, src, drecv, count, dt, 0, w->s, NULL, &wk);
        break;
    case COLLIE_COLL_SCATTER:
        r = collie_cuda_scatter(w->c, src, drecv, count, dt, 0, w->s, NULL, &wk);
        break;
    default: r = collie_cuda_barrier(w->c, w->s, NULL, &wk); break;
    }
    if (r != COLLIE_OK) {
        snprintf(why, len, "post: %s", collie_last_error());
        goto done;
    }
    r = collie_work_wait(wk, WAIT_MS);
    if (r != COLLIE_OK) {
        snprintf(why, len, "wait: %s (%s)", collie_status_name(r), collie_work_error_message(wk));
        collie_work_release(wk);
        goto done;
    }
    collie_work_release(wk);
    kit_cu.Memcpy(out, drecv, bytes, MEMCPY_DEFAULT);
    if (k != COLLIE_COLL_BARRIER && memcmp(in, out, bytes) != 0) {
        snprintf(why, len, "result differs from the input");
        goto done;
    }
    rc = 0;
done:
    if (dsend) kit_cu.Free(dsend);
    if (drecv) kit_cu.Free(drecv);
    free(in);
    free(out);
    return rc;
}

void kit_check_collectives(void) {
    kit_world w;
    char why[512] = "";
    if (!kit_check_world(&w, "collectives_1gpu", "kit-colls", WAIT_MS, NULL)) return;
    int runs = 0;
    for (int k = COLLIE_COLL_ALLREDUCE; k <= COLLIE_COLL_BARRIER; k++)
        for (size_t d = 0; d < sizeof all_dtypes / sizeof all_dtypes[0]; d++)
            for (int ip = 0; ip < 2; ip++) {
                if (k == COLLIE_COLL_BARRIER && (d > 0 || ip)) continue;
                if (k == COLLIE_COLL_BROADCAST && ip) continue; /* one buffer */
                if (kit_one_rank_coll(&w, (collie_coll_kind)k, all_dtypes[d], 1000, ip, why,
                                      sizeof why)) {
                    kit_result("FAIL", "collectives_1gpu", "", "%s %s %s: %s",
                               collie_coll_kind_name((collie_coll_kind)k),
                               collie_dtype_name(all_dtypes[d]), ip ? "in place" : "out of place",
                               why);
                    kit_world_close(&w);
                    return;
                }
                runs++;
            }
    char fig[64];
    snprintf(fig, sizeof fig, "cases=%d", runs);
    kit_result("PASS", "collectives_1gpu", fig,
               "every collective x dtype, in place and out of place, on a 1-rank comm");
    kit_world_close(&w);
}

void kit_check_mixed(void) {
    kit_world w;
    char why[512] = "";
    if (kit_world_open(&w, "cpu:tcp,cuda:nccl", "kit-mixed", WAIT_MS, why, sizeof why)) {
        kit_result("FAIL", "cpu_and_cuda_interleaved", "", "%s", why);
        kit_world_close(&w);
        return;
    }
    enum { N = 256, ROUNDS = 20 };
    float host_in[N], host_out[N];
    for (int r = 0; r < ROUNDS; r++) {
        kit_fill(host_in, N, COLLIE_FP32, (unsigned)r);
        collie_work *cw = NULL;
        int e = collie_allreduce(w.c, host_in, host_out, N, COLLIE_FP32, COLLIE_SUM, NULL, &cw);
        int g =
            kit_one_rank_coll(&w, COLLIE_COLL_ALLREDUCE, COLLIE_FP32, N, r % 2, why, sizeof why);
        if (e != COLLIE_OK || collie_work_wait(cw, WAIT_MS) != COLLIE_OK || g ||
            memcmp(host_in, host_out, sizeof host_in)) {
            kit_result("FAIL", "cpu_and_cuda_interleaved", "", "round %d: %s", r,
                       g    ? why
                       : cw ? collie_work_error_message(cw)
                            : collie_last_error());
            if (cw) collie_work_release(cw);
            kit_world_close(&w);
            return;
        }
        collie_work_release(cw);
    }
    kit_result("PASS", "cpu_and_cuda_interleaved", "rounds=20",
               "a cpu:tcp,cuda:nccl comm: CPU and CUDA allreduces interleaved, results checked");
    kit_world_close(&w);
}

/* Stream order: a copy enqueued before the post (behind a shut gate) is
 * seen by the collective. */
void kit_check_stream_order(void) {
    char why[256];
    kit_gate g;
    if (!kit_cu.MemcpyAsync) {
        kit_result("SKIP", "stream_order", "", "libcudart.so.13 lacks cudaMemcpyAsync");
        return;
    }
    if (!kit_gate_make(&g, why, sizeof why)) {
        kit_result("SKIP", "stream_order", "", "%s", why);
        return;
    }
    kit_world w;
    if (!kit_check_world(&w, "stream_order", "kit-order", WAIT_MS, &g)) return;
    enum { N = 1 << 20 };
    float *h = NULL, *out = malloc(N * sizeof *out);
    void *d = NULL;
    kit_cu.HostAlloc((void **)&h, N * sizeof *h, 0);
    kit_cu.Malloc(&d, N * sizeof(float));
    for (int i = 0; i < N; i++)
        h[i] = 0;
    kit_cu.Memcpy(d, h, N * sizeof *h, MEMCPY_DEFAULT);
    for (int i = 0; i < N; i++)
        h[i] = (float)(i % 13);
    collie_work *wk = NULL;
    int e = kit_gate_shut(&g, w.s);
    if (!e) e = kit_cu.MemcpyAsync(d, h, N * sizeof *h, MEMCPY_DEFAULT, w.s);
    int r = e ? -1 : collie_cuda_allreduce(w.c, d, d, N, COLLIE_FP32, COLLIE_SUM, w.s, NULL, &wk);
    kit_sleep_ms(20); /* the copy is held back by the gate */
    kit_gate_open(&g);
    if (r == COLLIE_OK) r = collie_work_wait(wk, WAIT_MS);
    kit_cu.Memcpy(out, d, N * sizeof *out, MEMCPY_DEFAULT);
    bool ok = r == COLLIE_OK && memcmp(out, h, N * sizeof *out) == 0;
    if (ok)
        kit_result("PASS", "stream_order", "", "a copy enqueued before the post was seen by it");
    else
        kit_result("FAIL", "stream_order", "", "%s",
                   e   ? kit_cuerr(e)
                   : r ? collie_status_name(r)
                       : "the collective missed the copy");
    if (wk) collie_work_release(wk);
    kit_cu.Free(d);
    kit_cu.FreeHost(h);
    free(out);
    kit_world_close(&w);
    kit_gate_free(&g);
}

/* collie_work_wait returns only once the GPU is done (an event recorded
 * after the post has completed), and wait_stream does not block the host. */
void kit_check_wait_semantics(void) {
    char why[256];
    kit_gate g;
    if (!kit_gate_make(&g, why, sizeof why)) {
        kit_result("SKIP", "wait_after_gpu_done", "", "%s", why);
        kit_result("SKIP", "wait_stream_nonblocking", "", "%s", why);
        return;
    }
    kit_world w;
    if (!kit_check_world(&w, "wait_after_gpu_done", "kit-wait", WAIT_MS, &g)) return;
    void *d = NULL;
    kit_cu.Malloc(&d, 4096);
    event_t ev = NULL;
    kit_cu.EventCreate(&ev);
    collie_work *wk = NULL;
    kit_gate_shut(&g, w.s);
    int r = collie_cuda_allreduce(w.c, d, d, 1024, COLLIE_FP32, COLLIE_SUM, w.s, NULL, &wk);
    kit_cu.EventRecord(ev, w.s);
    /* wait_stream on a second stream, while the gate is shut: must not block */
    stream_t s2 = NULL;
    kit_cu.StreamCreate(&s2);
    int64_t t0 = kit_now_ns();
    int ws = r == COLLIE_OK ? collie_work_wait_stream(wk, s2) : r;
    int64_t ws_us = (kit_now_ns() - t0) / 1000;
    bool s2_blocked = kit_cu.EventQuery(ev) != 0; /* the gate still holds everything */
    int64_t t1 = kit_now_ns();
    int wr = COLLIE_INPROGRESS;
    if (r == COLLIE_OK) {
        /* not done while the gate is shut */
        wr = collie_work_wait(wk, 100);
        kit_gate_open(&g);
        if (wr == COLLIE_INPROGRESS) wr = collie_work_wait(wk, WAIT_MS);
    }
    int64_t waited_ms = (kit_now_ns() - t1) / 1000000;
    bool gpu_done = kit_cu.EventQuery(ev) == 0;
    char fig[128];
    snprintf(fig, sizeof fig, "waited_ms=%" PRId64, waited_ms);
    if (r != COLLIE_OK || wr != COLLIE_OK)
        kit_result("FAIL", "wait_after_gpu_done", fig, "post/wait: %s",
                   collie_status_name(r != COLLIE_OK ? r : wr));
    else if (!gpu_done || waited_ms < 100)
        kit_result("FAIL", "wait_after_gpu_done", fig,
                   "collie_work_wait returned before the GPU finished");
    else
        kit_result("PASS", "wait_after_gpu_done", fig,
                   "collie_work_wait returned after the gated collective finished on the GPU");
    snprintf(fig, sizeof fig, "call_us=%" PRId64, ws_us);
    if (ws != COLLIE_OK)
        kit_result("FAIL", "wait_stream_nonblocking", fig, "collie_work_wait_stream: %s",
                   collie_status_name(ws));
    else if (!s2_blocked || ws_us > 10000)
        kit_result("FAIL", "wait_stream_nonblocking", fig, "the call blocked the host");
    else if (kit_cu.StreamSynchronize(s2) != 0)
        kit_result("FAIL", "wait_stream_nonblocking", fig, "the second stream failed");
    else
        kit_result("PASS", "wait_stream_nonblocking", fig,
                   "a second stream waited on the work without blocking the host");
    if (wk) collie_work_release(wk);
    kit_cu.StreamDestroy(s2);
    kit_cu.EventDestroy(ev);
    kit_cu.Free(d);
    kit_world_close(&w);
    kit_gate_free(&g);
}
