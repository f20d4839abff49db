/*
 * cq.c — completion queues: an fd that is readable while finished works wait.
 *
 * Design notes
 *  - A FIFO of works under a mutex plus an eventfd. The eventfd is written
 *    on the empty → non-empty edge and drained on the non-empty → empty
 *    edge, both under the mutex, so POLLIN on the fd means exactly "the
 *    queue is not empty" (level-triggered, safe for epoll and libevent).
 *  - The queue holds a reference to each queued work; pop hands it over.
 *  - The queue itself is refcounted: the user's reference plus one per
 *    attached work (taken at post, dropped when the work is freed), so a
 *    destroyed queue stays valid for works that complete later (they are
 *    then released instead of queued).
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "engine/engine.h"
#include "work/internal.h"

struct collie_cq {
    pthread_mutex_t mu;
    cl_list works; /* collie_work.cq_node, completion order */
    size_t n;
    bool closed;
    int efd;
    _Atomic int32_t refs;
};

int collie_cq_create(collie_cq **out) {
    if (!out) return COLLIE_EINVAL;
    *out = NULL;
    collie_cq *cq = calloc(1, sizeof *cq);
    if (!cq) return COLLIE_ENOMEM;
    cq->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (cq->efd < 0) {
        int err = errno;
        free(cq);
        return cl_set_last_error(cl_errno_status(err), "collie_cq_create: eventfd: %s",
                                 strerror(err));
    }
    pthread_mutex_init(&cq->mu, NULL);
    cl_list_init(&cq->works);
    atomic_init(&cq->refs, 1);
    *out = cq;
    return COLLIE_OK;
}

int collie_cq_fd(const collie_cq *cq) { return cq ? cq->efd : -1; }

size_t collie_cq_size(const collie_cq *cq) {
    if (!cq) return 0;
    pthread_mutex_lock((pthread_mutex_t *)&cq->mu);
    size_t n = cq->n;
    pthread_mutex_unlock((pthread_mutex_t *)&cq->mu);
    return n;
}

void cl_cq_hold(collie_cq *cq) { atomic_fetch_add_explicit(&cq->refs, 1, memory_order_relaxed); }

void cl_cq_release(collie_cq *cq) {
    if (atomic_fetch_sub_explicit(&cq->refs, 1, memory_order_acq_rel) != 1) return;
    close(cq->efd);
    pthread_mutex_destroy(&cq->mu);
    free(cq);
}

void cl_cq_push(collie_cq *cq, collie_work *w) {
    pthread_mutex_lock(&cq->mu);
    if (cq->closed) {
        pthread_mutex_unlock(&cq->mu);
        return;
    }
    collie_work_hold(w);
    cl_list_push_back(&cq->works, &w->cq_node);
    if (cq->n++ == 0) {
        uint64_t one = 1;
        ssize_t r = write(cq->efd, &one, sizeof one);
        CL_UNUSED(r);
    }
    pthread_mutex_unlock(&cq->mu);
}

static collie_work *cq_take(collie_cq *cq) {
    collie_work *w = cl_list_first(&cq->works, collie_work, cq_node);
    if (!w) return NULL;
    cl_list_remove(&w->cq_node);
    if (--cq->n == 0) {
        uint64_t v;
        ssize_t r = read(cq->efd, &v, sizeof v);
        CL_UNUSED(r);
    }
    return w;
}

int collie_cq_pop(collie_cq *cq, int32_t timeout_ms, collie_work **out) {
    if (out) *out = NULL;
    if (!cq || !out || timeout_ms < COLLIE_TIMEOUT_INFINITE) return COLLIE_EINVAL;
    int64_t until = cl_deadline_ns(cl_now_ns(), timeout_ms);
    for (;;) {
        pthread_mutex_lock(&cq->mu);
        bool closed = cq->closed;
        collie_work *w = closed ? NULL : cq_take(cq);
        pthread_mutex_unlock(&cq->mu);
        if (closed) return COLLIE_ECLOSED;
        if (w) {
            *out = w;
            return COLLIE_OK;
        }
        int64_t left = until - cl_now_ns();
        if (left <= 0) return COLLIE_INPROGRESS;
        int ms = until == INT64_MAX ? -1 : (int)((left + CL_NS_PER_MS - 1) / CL_NS_PER_MS);
        struct pollfd p = {.fd = cq->efd, .events = POLLIN};
        if (poll(&p, 1, ms) < 0 && errno != EINTR)
            return cl_set_last_error(COLLIE_ESYSTEM, "collie_cq_pop: poll: %s", strerror(errno));
    }
}

void collie_cq_destroy(collie_cq *cq) {
    if (!cq) return;
    pthread_mutex_lock(&cq->mu);
    cq->closed = true;
    cl_list left; /* released outside the lock: a release may free the work */
    cl_list_init(&left);
    collie_work *w;
    while ((w = cl_list_first(&cq->works, collie_work, cq_node))) {
        cl_list_remove(&w->cq_node);
        cl_list_push_back(&left, &w->cq_node);
    }
    cq->n = 0;
    pthread_mutex_unlock(&cq->mu);
    while ((w = cl_list_first(&left, collie_work, cq_node))) {
        cl_list_remove(&w->cq_node);
        collie_work_release(w);
    }
    cl_cq_release(cq);
}
