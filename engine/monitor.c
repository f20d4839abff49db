/*
 * monitor.c — the engine-stall monitor thread.
 *
 * Design notes: the progress thread refreshes `heartbeat_ns` from a
 * periodic timer (period = stall threshold / 4, clamped to 5..1000 ms) and
 * on every turn while it spins; a helper thread never does (engine/assist.c),
 * so the heartbeat ages only when the progress thread is stuck inside a
 * callback. The monitor wakes every period, and when the heartbeat is older
 * than the threshold it reports the stall once — with the loop's current
 * `activity` string — to the log and to the engine's on_stall callback;
 * when the loop resumes it logs that (the callback is not called again).
 * It never touches the event base.
 */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "engine/common.h"
#include "engine/engine_impl.h"
#include "engine/log.h"

int32_t cl_monitor_period_ms(int32_t stall_ms) {
    int32_t p = stall_ms / 4;
    if (p < 5) p = 5;
    if (p > 1000) p = 1000;
    return p;
}

static void *monitor_main(void *arg) {
    collie_engine *e = arg;
    cl_monitor *m = &e->mon;
    cl_block_async_signals();
    pthread_setname_np(pthread_self(), "cl-monitor");
    int32_t period = cl_monitor_period_ms(m->stall_ms);
    int64_t reported_hb = -1; /* heartbeat value of the stall last reported */
    pthread_mutex_lock(&m->mu);
    while (!m->stop) {
        int64_t until = cl_now_ns() + (int64_t)period * CL_NS_PER_MS;
        struct timespec ts = {.tv_sec = until / 1000000000LL, .tv_nsec = until % 1000000000LL};
        pthread_cond_timedwait(&m->cv, &m->mu, &ts);
        if (m->stop) break;
        int64_t hb = atomic_load_explicit(&e->heartbeat_ns, memory_order_acquire);
        int64_t stalled_ms = (cl_now_ns() - hb) / CL_NS_PER_MS;
        if (stalled_ms >= m->stall_ms && hb != reported_hb) {
            reported_hb = hb;
            const char *what = atomic_load_explicit(&e->activity, memory_order_relaxed);
            atomic_fetch_add(&e->stalls, 1);
            CL_WARN("monitor", "%s: progress loop stalled for %lld ms in: %s", e->name,
                    (long long)stalled_ms, what);
            if (m->cb) {
                pthread_mutex_unlock(&m->mu); /* never call out under a lock */
                m->cb(e, stalled_ms, what, m->cb_arg);
                pthread_mutex_lock(&m->mu);
            }
        } else if (reported_hb != -1 && hb != reported_hb) {
            CL_WARN("monitor", "%s: progress loop running again", e->name);
            reported_hb = -1;
        }
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

int cl_monitor_start(collie_engine *e, int32_t stall_ms, collie_stall_cb cb, void *arg) {
    cl_monitor *m = &e->mon;
    m->stall_ms = stall_ms;
    m->cb = cb;
    m->cb_arg = arg;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&m->mu, NULL);
    int r = pthread_create(&m->thread, NULL, monitor_main, e);
    if (r != 0) return cl_set_last_error(COLLIE_ESYSTEM, "monitor pthread_create failed: %d", r);
    m->started = true;
    return COLLIE_OK;
}

void cl_monitor_stop(collie_engine *e) {
    cl_monitor *m = &e->mon;
    if (!m->started) return;
    pthread_mutex_lock(&m->mu);
    m->stop = true;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->thread, NULL);
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    m->started = false;
}
