/*
 * test_cq.c — completion queues: fd readiness (poll and epoll), ordering,
 * hand-over of references, destroy with queued and still-pending works.
 */
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "engine/common.h"
#include "harness.h"
#include "runner.h"

static int setup_engine(void **state) {
    collie_engine *e;
    if (collie_engine_create(NULL, &e) != COLLIE_OK) return -1;
    *state = e;
    return 0;
}

static int teardown_engine(void **state) {
    return collie_engine_destroy(*state) == COLLIE_OK ? 0 : -1;
}

static bool fd_readable(int fd, int timeout_ms) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

static void test_fd_readable_exactly_while_not_empty(void **state) {
    collie_engine *e = *state;
    collie_cq *cq;
    assert_int_equal(collie_cq_create(&cq), COLLIE_OK);
    int fd = collie_cq_fd(cq);
    assert_true(fd >= 0);
    assert_false(fd_readable(fd, 0));

    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.cq = cq;
    manual_work *m[3];
    for (int i = 0; i < 3; i++) {
        o.tag = (uint64_t)i;
        assert_int_equal(manual_post(e, &o, false, 0, NULL, &m[i]), COLLIE_OK);
    }
    engine_sync(e);
    assert_false(fd_readable(fd, 20)); /* nothing finished yet */
    /* finish in the order 2, 0, 1: the queue delivers completion order */
    cl_work_finish(&m[2]->base, COLLIE_OK, NULL);
    assert_true(fd_readable(fd, 5000));
    cl_work_finish(&m[0]->base, COLLIE_EPEER, "gone");
    cl_work_finish(&m[1]->base, COLLIE_OK, NULL);
    engine_sync(e);
    assert_int_equal(collie_cq_size(cq), 3);
    for (int i = 0; i < 3; i++)
        collie_work_release(&m[i]->base); /* the queue holds them */

    uint64_t want[] = {2, 0, 1};
    for (int i = 0; i < 3; i++) {
        assert_true(fd_readable(fd, 0)); /* level-triggered: still readable */
        collie_work *w;
        assert_int_equal(collie_cq_pop(cq, 0, &w), COLLIE_OK);
        assert_int_equal(collie_work_tag(w), want[i]);
        assert_true(collie_work_test(w));
        collie_work_release(w);
    }
    assert_false(fd_readable(fd, 0));
    collie_work *w = (collie_work *)0x1;
    assert_int_equal(collie_cq_pop(cq, 0, &w), COLLIE_INPROGRESS);
    assert_null(w);
    int64_t t0 = now_ms();
    assert_int_equal(collie_cq_pop(cq, 80, &w), COLLIE_INPROGRESS);
    assert_true(now_ms() - t0 >= 80);
    collie_cq_destroy(cq);
}

typedef struct epoll_consumer {
    collie_cq *cq;
    int want, got;
} epoll_consumer;

/* An application thread with its own epoll loop draining the queue. */
static void *epoll_consumer_main(void *p) {
    epoll_consumer *c = p;
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN};
    epoll_ctl(ep, EPOLL_CTL_ADD, collie_cq_fd(c->cq), &ev);
    int64_t until = now_ms() + 10000;
    while (c->got < c->want && now_ms() < until) {
        struct epoll_event out;
        if (epoll_wait(ep, &out, 1, 100) != 1) continue;
        collie_work *w;
        while (collie_cq_pop(c->cq, 0, &w) == COLLIE_OK) {
            c->got++;
            collie_work_release(w);
        }
    }
    close(ep);
    return NULL;
}

static void test_epoll_consumer_thread_gets_every_work(void **state) {
    collie_engine *e = *state;
    collie_cq *cq;
    assert_int_equal(collie_cq_create(&cq), COLLIE_OK);
    enum { N = 2000 };
    epoll_consumer c = {cq, N, 0};
    pthread_t th;
    pthread_create(&th, NULL, epoll_consumer_main, &c);
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.cq = cq;
    for (int i = 0; i < N; i++) {
        manual_work *m;
        assert_int_equal(manual_post(e, &o, true, COLLIE_OK, NULL, &m), COLLIE_OK);
        collie_work_release(&m->base); /* releasing never cancels */
    }
    pthread_join(th, NULL);
    assert_int_equal(c.got, N);
    assert_int_equal(collie_cq_size(cq), 0);
    collie_cq_destroy(cq);
}

static void test_destroy_with_queued_and_pending_works(void **state) {
    collie_engine *e = *state;
    _Atomic int freed = 0;
    collie_cq *cq;
    assert_int_equal(collie_cq_create(&cq), COLLIE_OK);
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.cq = cq;
    manual_work *done, *pending;
    assert_int_equal(manual_post(e, &o, true, COLLIE_OK, &freed, &done), COLLIE_OK);
    assert_int_equal(manual_post(e, &o, false, 0, &freed, &pending), COLLIE_OK);
    collie_work_release(&done->base);
    assert_int_equal(collie_work_wait(&pending->base, 0), COLLIE_INPROGRESS);
    engine_sync(e);
    assert_int_equal(collie_cq_size(cq), 1);
    collie_cq_destroy(cq); /* releases `done`; `pending` keeps the queue alive */
    assert_int_equal(atomic_load(&freed), 1);
    cl_work_finish(&pending->base, COLLIE_OK, NULL);
    engine_sync(e); /* retired: pushed to a closed queue, i.e. not held */
    collie_work_release(&pending->base);
    assert_int_equal(atomic_load(&freed), 2);
}

static void test_bad_arguments(void **state) {
    (void)state;
    assert_int_equal(collie_cq_create(NULL), COLLIE_EINVAL);
    assert_int_equal(collie_cq_fd(NULL), -1);
    collie_work *w;
    assert_int_equal(collie_cq_pop(NULL, 0, &w), COLLIE_EINVAL);
    collie_cq_destroy(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fd_readable_exactly_while_not_empty),
        cmocka_unit_test(test_epoll_consumer_thread_gets_every_work),
        cmocka_unit_test(test_destroy_with_queued_and_pending_works),
        cmocka_unit_test(test_bad_arguments),
    };
    return cltest_main(tests, setup_engine, teardown_engine);
}
