/*
 * harness.c — see harness.h.
 */
#include "harness.h"

#include <dirent.h>
#include <ftw.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>

#include "engine/common.h"

static void manual_start(collie_work *w) {
    manual_work *m = (manual_work *)w;
    atomic_fetch_add(&m->started, 1);
    if (m->auto_finish) cl_work_finish(w, m->auto_status, m->auto_status ? "auto failure" : NULL);
}

static void manual_detach(collie_work *w) { atomic_fetch_add(&((manual_work *)w)->detached, 1); }

static void manual_free(collie_work *w) {
    manual_work *m = (manual_work *)w;
    if (m->freed_counter) atomic_fetch_add(m->freed_counter, 1);
    free(m);
}

static const cl_work_ops manual_ops = {
    .name = "test.manual", .start = manual_start, .detach = manual_detach, .free = manual_free};

int manual_post(collie_engine *e, const collie_post_opts *o, bool auto_finish, int auto_status,
                _Atomic int *freed_counter, manual_work **out) {
    *out = NULL;
    manual_work *m = calloc(1, sizeof *m);
    if (!m) return COLLIE_ENOMEM;
    int r = cl_work_init(&m->base, e, &manual_ops, o, 60000);
    if (r != COLLIE_OK) {
        free(m);
        return r;
    }
    static _Atomic uint64_t seq;
    m->base.seq = atomic_fetch_add(&seq, 1) + 1;
    m->auto_finish = auto_finish;
    m->auto_status = auto_status;
    m->freed_counter = freed_counter;
    r = cl_work_post(&m->base);
    if (r != COLLIE_OK) {
        free(m);
        return r;
    }
    *out = m;
    return COLLIE_OK;
}

static int count_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

int count_open_fds(void) { return count_dir("/proc/self/fd"); }
int count_threads(void) { return count_dir("/proc/self/task"); }

static int count_settled(int (*count)(void), int want) {
    int64_t until = cl_now_ns() + 2000 * CL_NS_PER_MS;
    int n;
    while ((n = count()) != want && cl_now_ns() < until) {
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return n;
}

int count_threads_settled(int want) { return count_settled(count_threads, want); }

int count_threads_stable(void) {
    int64_t until = cl_now_ns() + 2000 * CL_NS_PER_MS, since = cl_now_ns();
    int n = count_threads();
    while (cl_now_ns() < until && cl_now_ns() - since < 100 * CL_NS_PER_MS) {
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
        int m = count_threads();
        if (m != n) {
            n = m;
            since = cl_now_ns();
        }
    }
    return n;
}
int count_open_fds_settled(int want) { return count_settled(count_open_fds, want); }

static void sync_noop(void *arg) { (void)arg; }

typedef struct tracked_probe {
    collie_engine *e;
    size_t n;
} tracked_probe;

static void tracked_read(void *arg) {
    tracked_probe *p = arg;
    p->n = cl_works_tracked(p->e);
}

size_t engine_tracked(collie_engine *e) {
    tracked_probe p = {e, 0};
    assert_int_equal(cl_engine_call(e, tracked_read, &p, 10000), COLLIE_OK);
    return p.n;
}

void engine_sync(collie_engine *e) {
    assert_int_equal(cl_engine_call(e, sync_noop, NULL, 10000), COLLIE_OK);
}

int64_t now_ms(void) { return cl_now_ns() / 1000000; }

void test_tmpdir_make(char *buf, size_t len, const char *prefix) {
    snprintf(buf, len, "/tmp/%s-XXXXXX", prefix);
    assert_non_null(mkdtemp(buf));
}

static int tmpdir_rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void test_tmpdir_remove(const char *dir) {
    if (dir && dir[0]) nftw(dir, tmpdir_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}
