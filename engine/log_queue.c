/*
 * log_queue.c — log lines kept for a reader on a thread of its own
 * (collie_log_queue): for a runtime that must not run its code on collie's
 * threads, such as Python, whose log handler would need the GIL there.
 *
 * Design notes
 *  - A ring of `capacity` fixed slots under one mutex. The handler
 *    (collie_log_queue_handler, any thread, several at once) copies the
 *    record into the next free slot and signals a condition variable; it
 *    never blocks beyond that short critical section and never allocates.
 *    A full ring drops the new line and counts it (collie_log_queue_dropped):
 *    a slow reader never holds up a progress thread.
 *  - Strings are truncated to their slot's fields (module 31, comm 127,
 *    message 1023 bytes: cl_vlog_comm formats at most 1023 anyway).
 *  - Pop copies the oldest slot into the queue's reader slot and points the
 *    record's strings there: valid until the next pop; one reader at a time.
 *    The wait uses CLOCK_MONOTONIC and is bounded by the caller's timeout.
 *  - The program detaches the handler (collie_set_log_handler(NULL), which
 *    returns only once no handler call is running) before it destroys the
 *    queue; destroy does not wait for readers.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collie.h"
#include "engine/common.h"

typedef struct log_slot {
    collie_log_level level;
    int rank;
    int64_t time_ns;
    bool has_comm;
    char module[32];
    char comm[128];
    char message[1024];
} log_slot;

struct collie_log_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t cap, head, n; /* slots[head] is the oldest of n */
    uint64_t dropped;
    log_slot reader; /* the popped line the reader's record points into */
    log_slot slots[];
};

#define LOG_QUEUE_MAX (1u << 20)

int collie_log_queue_create(size_t capacity, collie_log_queue **out) {
    if (!out) return COLLIE_EINVAL;
    *out = NULL;
    if (capacity == 0 || capacity > LOG_QUEUE_MAX)
        return cl_set_last_error(COLLIE_EINVAL,
                                 "collie_log_queue_create: capacity %zu (1 to %u lines)", capacity,
                                 LOG_QUEUE_MAX);
    collie_log_queue *q = calloc(1, sizeof *q + capacity * sizeof(log_slot));
    if (!q) return COLLIE_ENOMEM;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&q->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&q->mu, NULL);
    q->cap = capacity;
    *out = q;
    return COLLIE_OK;
}

static void log_queue_copy(char *dst, size_t len, const char *src) {
    size_t n = src ? strnlen(src, len - 1) : 0;
    if (n) memcpy(dst, src, n);
    dst[n] = '\0';
}

void collie_log_queue_handler(const collie_log_record *r, void *queue) {
    collie_log_queue *q = queue;
    if (!q || !r) return;
    pthread_mutex_lock(&q->mu);
    if (q->n == q->cap) {
        q->dropped++;
        pthread_mutex_unlock(&q->mu);
        return;
    }
    log_slot *s = &q->slots[(q->head + q->n) % q->cap];
    s->level = r->level;
    s->rank = r->rank;
    s->time_ns = r->time_ns;
    s->has_comm = r->comm != NULL;
    log_queue_copy(s->module, sizeof s->module, r->module);
    log_queue_copy(s->comm, sizeof s->comm, r->comm);
    log_queue_copy(s->message, sizeof s->message, r->message);
    q->n++;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

int collie_log_queue_pop(collie_log_queue *q, int32_t timeout_ms, collie_log_record *out) {
    if (!q || !out || out->size < sizeof *out || timeout_ms < COLLIE_TIMEOUT_INFINITE)
        return cl_set_last_error(COLLIE_EINVAL,
                                 "collie_log_queue_pop: a queue, a record with size set and a "
                                 "timeout >= -1 ms are required");
    int64_t until = cl_deadline_ns(cl_now_ns(), timeout_ms);
    struct timespec ts = {until / (1000 * CL_NS_PER_MS), until % (1000 * CL_NS_PER_MS)};
    pthread_mutex_lock(&q->mu);
    while (q->n == 0) {
        if (until != INT64_MAX && cl_now_ns() >= until) break;
        int rc = until == INT64_MAX ? pthread_cond_wait(&q->cv, &q->mu)
                                    : pthread_cond_timedwait(&q->cv, &q->mu, &ts);
        if (rc == ETIMEDOUT) break;
    }
    if (q->n == 0) {
        pthread_mutex_unlock(&q->mu);
        return COLLIE_INPROGRESS;
    }
    q->reader = q->slots[q->head];
    q->head = (q->head + 1) % q->cap;
    q->n--;
    pthread_mutex_unlock(&q->mu);
    const log_slot *s = &q->reader;
    *out = (collie_log_record){.size = sizeof *out,
                               .level = s->level,
                               .module = s->module,
                               .comm = s->has_comm ? s->comm : NULL,
                               .rank = s->rank,
                               .message = s->message,
                               .time_ns = s->time_ns};
    return COLLIE_OK;
}

uint64_t collie_log_queue_dropped(collie_log_queue *q) {
    if (!q) return 0;
    pthread_mutex_lock(&q->mu);
    uint64_t d = q->dropped;
    pthread_mutex_unlock(&q->mu);
    return d;
}

void collie_log_queue_destroy(collie_log_queue *q) {
    if (!q) return;
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q);
}
