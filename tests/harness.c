/*
 * harness.c — see harness.h.
 */
#include "harness.h"

#include <dirent.h>
#include <event2/event.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <sys/wait.h>
#include <signal.h>
#include <ftw.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common.h"
#include "engine/config.h"

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

#define PROBE_PASSES (1 << 22)

struct loop_probe {
    collie_engine *e;
    _Atomic long *counter;
    long last, max_batch;
    int64_t *pass_ns; /* when each pass ran (the first PROBE_PASSES) */
    size_t npass;
    int fd;
    struct event *ev;
};

static void probe_on_pass(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    loop_probe *p = arg;
    if (p->npass < PROBE_PASSES) p->pass_ns[p->npass++] = cl_now_ns();
    if (!p->counter) return;
    long now = atomic_load(p->counter);
    if (now - p->last > p->max_batch) p->max_batch = now - p->last;
    p->last = now;
}

static void probe_add(void *arg) {
    loop_probe *p = arg;
    p->ev = event_new(cl_engine_base(p->e), p->fd, EV_READ | EV_PERSIST, probe_on_pass, p);
    assert_non_null(p->ev);
    event_add(p->ev, NULL);
}

static void probe_remove(void *arg) {
    loop_probe *p = arg;
    event_free(p->ev);
}

loop_probe *loop_probe_start(collie_engine *e, _Atomic long *counter) {
    loop_probe *p = calloc(1, sizeof *p);
    assert_non_null(p);
    p->e = e;
    p->counter = counter;
    p->last = counter ? atomic_load(counter) : 0;
    p->pass_ns = malloc(PROBE_PASSES * sizeof *p->pass_ns);
    assert_non_null(p->pass_ns);
    p->fd = eventfd(1, EFD_CLOEXEC | EFD_NONBLOCK); /* readable until read: never read */
    assert_true(p->fd >= 0);
    assert_int_equal(cl_engine_call(e, probe_add, p, 10000), COLLIE_OK);
    return p;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

long loop_probe_stop(loop_probe *p, const int64_t *stamps, size_t n) {
    assert_int_equal(cl_engine_call(p->e, probe_remove, p, 10000), COLLIE_OK);
    long m = p->max_batch;
    if (stamps) { /* sweep the sorted stamps against the passes */
        int64_t *t = malloc((n ? n : 1) * sizeof *t);
        assert_non_null(t);
        memcpy(t, stamps, n * sizeof *t);
        qsort(t, n, sizeof *t, cmp_i64);
        size_t i = 0, k = 0;
        m = 0;
        for (; k <= p->npass; k++) { /* stamps before pass k (and after pass k-1) */
            long here = 0;
            while (i < n && (k == p->npass || t[i] < p->pass_ns[k])) {
                i++;
                here++;
            }
            if (here > m) m = here;
        }
        free(t);
    }
    close(p->fd);
    free(p->pass_ns);
    free(p);
    return m;
}

int64_t now_ms(void) { return cl_now_ns() / 1000000; }

int reap_bounded(pid_t pid, int timeout_ms) {
    int status = 0;
    int64_t end = now_ms() + timeout_ms;
    while (now_ms() < end) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return status;
        if (r < 0) return -1;
        usleep(1000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0); /* SIGKILL cannot be ignored: returns at once */
    return -1;
}

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

int dev_shm_collie_files(void) {
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += strstr(de->d_name, "collie") != NULL;
    closedir(d);
    return n;
}

void setting_set(const char *name, const char *value) {
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    cl_config_reload();
}

static void loop_block_fn(void *arg) {
    loop_block *b = arg;
    atomic_store(&b->in, true);
    int64_t until = now_ms() + 10000;
    while (!atomic_load(&b->go) && now_ms() < until)
        usleep(1000);
}

static void *loop_block_thread(void *arg) {
    loop_block *b = arg;
    (void)cl_engine_call(b->e, loop_block_fn, b, 20000);
    return NULL;
}

void loop_block_start(loop_block *b, collie_engine *e) {
    memset(b, 0, sizeof *b);
    b->e = e;
    assert_int_equal(pthread_create(&b->th, NULL, loop_block_thread, b), 0);
    int64_t until = now_ms() + 10000;
    while (!atomic_load(&b->in) && now_ms() < until)
        usleep(1000);
    assert_true(atomic_load(&b->in));
}

void loop_unblock(loop_block *b) {
    atomic_store(&b->go, true);
    pthread_join(b->th, NULL);
}

int rank_join_env(const char *name, int32_t timeout_ms, int *rank, collie_engine **e,
                  collie_store **st, collie_comm **c) {
    const char *rs = getenv("COLLIE_RANK"), *ns = getenv("COLLIE_WORLD_SIZE");
    if (!rs || !ns) return 2;
    *rank = atoi(rs);
    if (collie_engine_create(NULL, e) != COLLIE_OK ||
        collie_store_connect(*e, NULL, NULL, st) != COLLIE_OK)
        return 3;
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = name;
    o.timeout_ms = timeout_ms;
    int rc = collie_comm_create(*e, *st, *rank, atoi(ns), &o, c);
    if (rc != COLLIE_OK) {
        printf("CREATE %s: %s\n", collie_status_name(rc), collie_last_error());
        return 4;
    }
    return 0;
}
