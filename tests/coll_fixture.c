/*
 * coll_fixture.c — see coll_fixture.h.
 */
#include "coll_fixture.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/common.h"
#include "transports/reduce.h"

static void world_make(world *w, int n, const char *name, const collie_comm_opts *o, bool apart) {
    memset(w, 0, sizeof *w);
    w->n = n;
    w->apart = apart;
    for (int r = 0; r < n; r++) {
        if (r == 0 || apart)
            assert_int_equal(collie_engine_create(NULL, &w->re[r]), COLLIE_OK);
        else
            w->re[r] = w->re[0];
    }
    w->e = w->re[0];
    assert_int_equal(collie_store_server_create(w->e, "127.0.0.1", 0, NULL, &w->srv), COLLIE_OK);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", collie_store_server_port(w->srv));
    collie_comm_opts dflt = COLLIE_COMM_OPTS_INIT;
    dflt.name = name;
    dflt.timeout_ms = 30000;
    if (!o) o = &dflt;
    collie_work *cw[WORLD_MAX];
    for (int r = 0; r < n; r++) {
        assert_int_equal(collie_store_connect(w->re[r], addr, NULL, &w->st[r]), COLLIE_OK);
        int rc = collie_comm_create_post(w->re[r], w->st[r], r, n, o, &w->c[r], &cw[r]);
        if (rc != COLLIE_OK) fail_msg("create rank %d: %s", r, collie_last_error());
    }
    for (int r = 0; r < n; r++) {
        int rc = collie_work_wait(cw[r], 30000);
        if (rc != COLLIE_OK) fail_msg("create rank %d: %s", r, collie_work_error_message(cw[r]));
        collie_work_release(cw[r]);
    }
}

void world_create(world *w, int n, const char *name, const collie_comm_opts *o) {
    world_make(w, n, name, o, false);
}

void world_create_apart(world *w, int n, const char *name, const collie_comm_opts *o) {
    world_make(w, n, name, o, true);
}

void world_link(world *w) {
    int32_t x[WORLD_MAX];
    collie_work *wk[WORLD_MAX];
    for (int r = 0; r < w->n; r++) {
        x[r] = r + 1;
        assert_int_equal(
            collie_allreduce(w->c[r], &x[r], &x[r], 1, COLLIE_INT32, COLLIE_SUM, NULL, &wk[r]),
            COLLIE_OK);
    }
    for (int r = 0; r < w->n; r++) {
        assert_int_equal(collie_work_wait(wk[r], 20000), COLLIE_OK);
        assert_int_equal(x[r], w->n * (w->n + 1) / 2);
        collie_work_release(wk[r]);
    }
}

void world_destroy(world *w) {
    for (int r = 0; r < w->n; r++) {
        assert_int_equal(collie_comm_destroy(w->c[r]), COLLIE_OK);
        collie_store_destroy(w->st[r]);
    }
    collie_store_server_destroy(w->srv);
    for (int r = w->n - 1; r >= 0; r--)
        if (r == 0 || w->apart) assert_int_equal(collie_engine_destroy(w->re[r]), COLLIE_OK);
}

void world_create_one_left(world *w, int n, const char *name) {
    world_create(w, n, name, NULL);
    world_link(w);
    assert_int_equal(collie_comm_destroy(w->c[n - 1]), COLLIE_OK);
    w->c[n - 1] = NULL;
    for (int r = 0; r < n - 1; r++) {
        collie_peer_health h[WORLD_MAX];
        int64_t until = cl_now_ns() + 5000 * CL_NS_PER_MS;
        while (collie_comm_health(w->c[r], h, n) == n && h[n - 1].state != COLLIE_PEER_LEFT &&
               cl_now_ns() < until)
            usleep(1000);
        assert_int_equal(h[n - 1].state, COLLIE_PEER_LEFT);
    }
}

collie_store *world_store(world *w) {
    collie_store *st;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", collie_store_server_port(w->srv));
    assert_int_equal(collie_store_connect(w->e, addr, NULL, &st), COLLIE_OK);
    return st;
}

bool pop_event_kind(collie_comm *c, int kind, int ms) {
    int64_t until = cl_now_ns() + (int64_t)ms * CL_NS_PER_MS;
    do {
        collie_comm_event ev = COLLIE_COMM_EVENT_INIT;
        while (collie_comm_event_pop(c, &ev) == COLLIE_OK)
            if (ev.kind == kind) return true;
        usleep(1000);
    } while (cl_now_ns() < until);
    return false;
}

int32_t one_allreduce(collie_comm *c, int label, int *status) {
    int32_t v = label + 1, out = -1;
    collie_work *w;
    *status = collie_allreduce(c, &v, &out, 1, COLLIE_INT32, COLLIE_SUM, NULL, &w);
    if (*status != COLLIE_OK) return -1;
    *status = collie_work_wait(w, 10000);
    collie_work_release(w);
    return out;
}

static bool dtype_signed(collie_dtype dt) { return dt != COLLIE_UINT8; }

void fill_input(void *buf, size_t count, collie_dtype dt, collie_redop op, int r, size_t salt) {
    for (size_t i = 0; i < count; i++) {
        size_t h = (size_t)r * 3 + i * 7 + salt;
        double v;
        if (op == COLLIE_PROD)
            v = 1 + (double)((r + i + salt) % 2); /* products stay exact */
        else if (dtype_signed(dt))
            v = (double)(h % 9) - 4; /* negatives: integer avg truncates toward zero */
        else
            v = (double)(h % 9);
        switch (dt) {
        case COLLIE_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
        case COLLIE_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
        case COLLIE_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
        case COLLIE_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
        case COLLIE_FP32: ((float *)buf)[i] = (float)v; break;
        case COLLIE_FP64: ((double *)buf)[i] = v; break;
        case COLLIE_FP16: {
            float f = (float)v;
            cl_float_to_fp16((uint16_t *)buf + i, &f, 1);
            break;
        }
        case COLLIE_BF16: {
            float f = (float)v;
            cl_float_to_bf16((uint16_t *)buf + i, &f, 1);
            break;
        }
        default: break;
        }
    }
}

/* The reduction of every rank's `len`-element vector. */
static void *reference_reduce(void *const *in, int n, size_t len, collie_dtype dt,
                              collie_redop op) {
    size_t es = collie_dtype_size(dt);
    void *acc = calloc(len ? len : 1, es);
    memcpy(acc, in[0], len * es);
    collie_redop rop = op == COLLIE_AVG ? COLLIE_SUM : op;
    for (int r = 1; r < n; r++)
        cl_reduce(acc, in[r], len, dt, rop);
    if (op == COLLIE_AVG) cl_reduce_finalize_avg(acc, len, dt, n);
    return acc;
}

static void expect_bytes(const void *got, const void *want, size_t bytes, const char *what, int r) {
    if (bytes && memcmp(got, want, bytes) != 0) {
        size_t i = 0;
        while (((const uint8_t *)got)[i] == ((const uint8_t *)want)[i])
            i++;
        fail_msg("%s: rank %d differs at byte %zu of %zu", what, r, i, bytes);
    }
}

void run_and_check(world *w, collie_coll_kind kind, collie_dtype dt, collie_redop op, size_t count,
                   int root, bool in_place) {
    int n = w->n;
    size_t es = collie_dtype_size(dt), blk = count * es;
    size_t send_elems = count, recv_elems = count;
    switch (kind) {
    case COLLIE_COLL_ALLGATHER:
    case COLLIE_COLL_GATHER: recv_elems = count * (size_t)n; break;
    case COLLIE_COLL_REDUCE_SCATTER:
    case COLLIE_COLL_SCATTER: send_elems = count * (size_t)n; break;
    case COLLIE_COLL_ALLTOALL: send_elems = recv_elems = count * (size_t)n; break;
    default: break;
    }
    uint8_t *sendb[WORLD_MAX], *recvb[WORLD_MAX], *mem[WORLD_MAX];
    void *input[WORLD_MAX];
    collie_work *wk[WORLD_MAX];
    char what[160];
    snprintf(what, sizeof what, "%s %s %s count %zu root %d%s n=%d",
             (const char *[]){"allreduce", "broadcast", "reduce", "allgather", "reduce_scatter",
                              "alltoall", "gather", "scatter", "barrier"}[kind],
             collie_dtype_name(dt), collie_redop_name(op), count, root, in_place ? " in-place" : "",
             n);
    for (int r = 0; r < n; r++) {
        /* one allocation per rank: in-place forms point into it */
        size_t total = (send_elems + recv_elems) * es + 64;
        mem[r] = malloc(total);
        memset(mem[r], 0xA5, total);
        sendb[r] = mem[r];
        recvb[r] = mem[r] + send_elems * es + 32;
        input[r] = malloc(send_elems * es + 1);
        fill_input(input[r], send_elems, dt, op, r, count);
        memcpy(sendb[r], input[r], send_elems * es);
        if (in_place) {
            switch (kind) {
            case COLLIE_COLL_ALLREDUCE:
            case COLLIE_COLL_BROADCAST:
            case COLLIE_COLL_REDUCE: recvb[r] = sendb[r]; break;
            case COLLIE_COLL_ALLGATHER:
                memcpy(recvb[r] + (size_t)r * blk, input[r], blk);
                sendb[r] = recvb[r] + (size_t)r * blk;
                break;
            case COLLIE_COLL_GATHER:
                if (r == root) {
                    memcpy(recvb[r] + (size_t)r * blk, input[r], blk);
                    sendb[r] = recvb[r] + (size_t)r * blk;
                }
                break;
            case COLLIE_COLL_REDUCE_SCATTER: recvb[r] = sendb[r] + (size_t)r * blk; break;
            case COLLIE_COLL_SCATTER:
                if (r == root) recvb[r] = sendb[r] + (size_t)r * blk;
                break;
            default: break;
            }
        }
    }
    for (int r = 0; r < n; r++) {
        collie_comm *c = w->c[r];
        int rc;
        switch (kind) {
        case COLLIE_COLL_ALLREDUCE:
            rc = collie_allreduce(c, sendb[r], recvb[r], count, dt, op, NULL, &wk[r]);
            break;
        case COLLIE_COLL_BROADCAST:
            rc = collie_broadcast(c, sendb[r], count, dt, root, NULL, &wk[r]);
            break;
        case COLLIE_COLL_REDUCE:
            rc = collie_reduce(c, sendb[r], recvb[r], count, dt, op, root, NULL, &wk[r]);
            break;
        case COLLIE_COLL_ALLGATHER:
            rc = collie_allgather(c, sendb[r], recvb[r], count, dt, NULL, &wk[r]);
            break;
        case COLLIE_COLL_REDUCE_SCATTER:
            rc = collie_reduce_scatter(c, sendb[r], recvb[r], count, dt, op, NULL, &wk[r]);
            break;
        case COLLIE_COLL_ALLTOALL:
            rc = collie_alltoall(c, sendb[r], recvb[r], count, dt, NULL, &wk[r]);
            break;
        case COLLIE_COLL_GATHER:
            rc = collie_gather(c, sendb[r], recvb[r], count, dt, root, NULL, &wk[r]);
            break;
        case COLLIE_COLL_SCATTER:
            rc = collie_scatter(c, sendb[r], recvb[r], count, dt, root, NULL, &wk[r]);
            break;
        default: rc = collie_barrier(c, NULL, &wk[r]); break;
        }
        if (rc != COLLIE_OK) fail_msg("%s: post on rank %d: %s", what, r, collie_last_error());
    }
    for (int r = 0; r < n; r++) {
        int rc = collie_work_wait(wk[r], 60000);
        if (rc != COLLIE_OK) fail_msg("%s: rank %d: %s", what, r, collie_work_error_message(wk[r]));
        collie_work_release(wk[r]);
    }
    /* references */
    void *red = NULL;
    if (kind == COLLIE_COLL_ALLREDUCE || kind == COLLIE_COLL_REDUCE ||
        kind == COLLIE_COLL_REDUCE_SCATTER)
        red = reference_reduce(input, n, send_elems, dt, op);
    for (int r = 0; r < n; r++) {
        switch (kind) {
        case COLLIE_COLL_ALLREDUCE: expect_bytes(recvb[r], red, blk, what, r); break;
        case COLLIE_COLL_REDUCE:
            if (r == root) expect_bytes(recvb[r], red, blk, what, r);
            break;
        case COLLIE_COLL_BROADCAST: expect_bytes(sendb[r], input[root], blk, what, r); break;
        case COLLIE_COLL_REDUCE_SCATTER:
            expect_bytes(recvb[r], (uint8_t *)red + (size_t)r * blk, blk, what, r);
            break;
        case COLLIE_COLL_ALLGATHER:
            for (int p = 0; p < n; p++)
                expect_bytes(recvb[r] + (size_t)p * blk, input[p], blk, what, r);
            break;
        case COLLIE_COLL_GATHER:
            if (r == root)
                for (int p = 0; p < n; p++)
                    expect_bytes(recvb[r] + (size_t)p * blk, input[p], blk, what, r);
            break;
        case COLLIE_COLL_SCATTER:
            expect_bytes(recvb[r], (uint8_t *)input[root] + (size_t)r * blk, blk, what, r);
            break;
        case COLLIE_COLL_ALLTOALL:
            for (int p = 0; p < n; p++)
                expect_bytes(recvb[r] + (size_t)p * blk, (uint8_t *)input[p] + (size_t)r * blk, blk,
                             what, r);
            break;
        default: break;
        }
    }
    free(red);
    for (int r = 0; r < n; r++) {
        free(input[r]);
        free(mem[r]);
    }
}

collie_comm_stats comm_stats(collie_comm *c) {
    collie_comm_stats st = {.size = sizeof st};
    assert_int_equal(collie_comm_get_stats(c, &st), COLLIE_OK);
    return st;
}
