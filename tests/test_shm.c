/*
 * test_shm.c — the same-host shared-memory link of the CPU backend:
 * which link the backends choose (auto, tcp, shm, COLLIE_CPU_TRANSPORT),
 * forcing shm towards a peer that offers none, what the dialer refuses in
 * the memory it is handed (another comm or generation, other ranks, an
 * unsealed file), garbage on the same-host sockets, and nothing of collie's
 * left in /dev/shm. The collective matrix, faults and sanitizer suites run
 * on this link by default (the Makefile runs the collective suites again
 * forced onto TCP).
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "coll_fixture.h"
#include "harness.h"
#include "runner.h"
#include "transports/cpu/shm/link.h"

/* One int32 sum allreduce on every rank of w, checked. */
static void allreduce_check(world *w) {
    int32_t v[WORLD_MAX];
    collie_work *ws[WORLD_MAX];
    for (int r = 0; r < w->n; r++) {
        v[r] = r + 1;
        assert_int_equal(
            collie_allreduce(w->c[r], &v[r], &v[r], 1, COLLIE_INT32, COLLIE_SUM, NULL, &ws[r]),
            COLLIE_OK);
    }
    for (int r = 0; r < w->n; r++) {
        int rc = collie_work_wait(ws[r], 20000);
        if (rc != COLLIE_OK) fail_msg("rank %d: %s", r, collie_work_error_message(ws[r]));
        collie_work_release(ws[r]);
        assert_int_equal(v[r], w->n * (w->n + 1) / 2);
    }
}

static void test_default_backend_uses_shm(void **state) {
    (void)state;
    world w;
    world_create(&w, 3, "shm-auto", NULL);
    allreduce_check(&w);
    for (int r = 0; r < 3; r++) {
        collie_comm_stats st = comm_stats(w.c[r]);
        assert_true(st.connections >= 1);
        assert_int_equal(st.shm_connections, st.connections); /* every peer is on this host */
    }
    world_destroy(&w);
}

static void with_setting(const char *value) { setting_set("COLLIE_CPU_TRANSPORT", value); }

static void test_tcp_when_asked(void **state) {
    (void)state;
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = "shm-spec-tcp";
    o.backend = "cpu:tcp";
    o.timeout_ms = 20000;
    world w;
    world_create(&w, 2, o.name, &o);
    allreduce_check(&w);
    assert_int_equal(comm_stats(w.c[0]).connections, 1);
    assert_int_equal(comm_stats(w.c[0]).shm_connections, 0);
    world_destroy(&w);
    /* the setting steers the default backend */
    with_setting("tcp");
    world_create(&w, 2, "shm-setting-tcp", NULL);
    allreduce_check(&w);
    assert_int_equal(comm_stats(w.c[1]).connections, 1);
    assert_int_equal(comm_stats(w.c[1]).shm_connections, 0);
    world_destroy(&w);
    with_setting("shm");
    world_create(&w, 2, "shm-setting-shm", NULL);
    allreduce_check(&w);
    assert_int_equal(comm_stats(w.c[1]).shm_connections, 1);
    world_destroy(&w);
    with_setting(NULL);
}

static void test_invalid_setting_is_named(void **state) {
    (void)state;
    with_setting("udp");
    collie_engine *e;
    collie_store_server *srv;
    collie_store *st;
    assert_int_equal(collie_engine_create(NULL, &e), COLLIE_OK);
    assert_int_equal(collie_store_server_create(e, "127.0.0.1", 0, NULL, &srv), COLLIE_OK);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", collie_store_server_port(srv));
    assert_int_equal(collie_store_connect(e, addr, NULL, &st), COLLIE_OK);
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = "shm-bad-setting";
    collie_comm *c = NULL;
    collie_work *cw = NULL;
    int rc = collie_comm_create_post(e, st, 0, 1, &o, &c, &cw);
    const char *msg = rc == COLLIE_OK ? NULL : collie_last_error();
    if (rc == COLLIE_OK) { /* or the creation work says it */
        rc = collie_work_wait(cw, 10000);
        msg = collie_work_error_message(cw);
    }
    print_message("%s\n", msg);
    assert_int_equal(rc, COLLIE_EINVAL);
    assert_non_null(strstr(msg, "COLLIE_CPU_TRANSPORT='udp'"));
    if (cw) collie_work_release(cw);
    if (c) collie_comm_destroy(c);
    collie_store_destroy(st);
    collie_store_server_destroy(srv);
    assert_int_equal(collie_engine_destroy(e), COLLIE_OK);
    with_setting(NULL);
}

/* Rank 0 insists on shared memory, rank 1 offers only TCP: rank 0's first
 * collective fails with EINVAL naming rank 1 and why; nothing hangs. */
static void test_forced_shm_towards_a_tcp_peer(void **state) {
    (void)state;
    collie_engine *e;
    collie_store_server *srv;
    assert_int_equal(collie_engine_create(NULL, &e), COLLIE_OK);
    assert_int_equal(collie_store_server_create(e, "127.0.0.1", 0, NULL, &srv), COLLIE_OK);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", collie_store_server_port(srv));
    collie_store *st[2];
    collie_comm *c[2];
    collie_work *cw[2];
    const char *spec[2] = {"shm", "tcp"};
    for (int r = 0; r < 2; r++) {
        collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
        o.name = "shm-mixed";
        o.backend = spec[r];
        o.timeout_ms = 10000;
        assert_int_equal(collie_store_connect(e, addr, NULL, &st[r]), COLLIE_OK);
        assert_int_equal(collie_comm_create_post(e, st[r], r, 2, &o, &c[r], &cw[r]), COLLIE_OK);
    }
    for (int r = 0; r < 2; r++) {
        assert_int_equal(collie_work_wait(cw[r], 20000), COLLIE_OK);
        collie_work_release(cw[r]);
    }
    int32_t v[2] = {1, 2};
    collie_work *ws[2];
    for (int r = 0; r < 2; r++)
        assert_int_equal(
            collie_allreduce(c[r], &v[r], &v[r], 1, COLLIE_INT32, COLLIE_SUM, NULL, &ws[r]),
            COLLIE_OK);
    assert_int_equal(collie_work_wait(ws[0], 15000), COLLIE_EINVAL);
    const char *msg = collie_work_error_message(ws[0]);
    print_message("rank 0: %s\n", msg);
    assert_non_null(strstr(msg, "rank 1 cannot be reached over shared memory"));
    int rc1 = collie_work_wait(ws[1], 15000); /* told by the abort notice */
    assert_true(rc1 != COLLIE_OK && rc1 != COLLIE_INPROGRESS);
    for (int r = 0; r < 2; r++) {
        collie_work_release(ws[r]);
        collie_comm_destroy(c[r]);
        collie_store_destroy(st[r]);
    }
    collie_store_server_destroy(srv);
    assert_int_equal(collie_engine_destroy(e), COLLIE_OK);
}

/* ---- the link's memory, as the dialer checks it ---------------------------------------- */

static int attach_copy(const cl_shm_link *made, const cl_shm_link_id *id, cl_shm_link *out,
                       char *why, size_t len) {
    cl_shm_link_init(out);
    out->fd = fcntl(made->fd, F_DUPFD_CLOEXEC, 0);
    assert_true(out->fd >= 0);
    return cl_shm_link_attach(out, id, why, len);
}

static void test_link_refuses_foreign_memory(void **state) {
    (void)state;
    const cl_shm_link_id id = {.comm_id = 77, .generation = 3, .creator = 1, .dialer = 0};
    cl_shm_link made, got;
    char why[200];
    cl_shm_link_init(&made);
    assert_int_equal(cl_shm_link_create(&made, &id, 8192, why, sizeof why), COLLIE_OK);
    cl_shm_link_id other = id;
    other.generation = 2; /* a stale incarnation's view */
    assert_int_equal(attach_copy(&made, &other, &got, why, sizeof why), COLLIE_EPROTO);
    assert_non_null(strstr(why, "another comm or generation"));
    other = id;
    other.comm_id = 78;
    assert_int_equal(attach_copy(&made, &other, &got, why, sizeof why), COLLIE_EPROTO);
    other = id;
    other.dialer = 2;
    assert_int_equal(attach_copy(&made, &other, &got, why, sizeof why), COLLIE_EPROTO);
    assert_non_null(strstr(why, "other ranks"));
    /* the right one works, both ways, and moves bytes */
    assert_int_equal(attach_copy(&made, &id, &got, why, sizeof why), COLLIE_OK);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    char out[] = "hello over shared memory", in[64] = "";
    struct iovec iov = {out, sizeof out};
    assert_int_equal(cl_shm_link_writev(&got, sv[0], &iov, 1), (ssize_t)sizeof out);
    assert_int_equal(cl_shm_link_recv(&made, sv[1], in, sizeof in, true), (ssize_t)sizeof out);
    assert_string_equal(in, out);
    assert_int_equal(cl_shm_link_recv(&made, sv[1], in, sizeof in, true), -1); /* empty: parked */
    assert_int_equal(errno, EAGAIN);
    iov.iov_len = 3;
    assert_int_equal(cl_shm_link_writev(&got, sv[0], &iov, 1), 3); /* rings the parked side */
    char bell;
    assert_int_equal(recv(sv[1], &bell, 1, MSG_DONTWAIT), 1);
    /* the peer's end: what it wrote is read first, then 0 */
    close(sv[0]);
    cl_shm_link_drain_doorbell(&made, sv[1]);
    assert_true(made.eof);
    assert_int_equal(cl_shm_link_recv(&made, sv[1], in, sizeof in, true), 3);
    assert_int_equal(cl_shm_link_recv(&made, sv[1], in, sizeof in, true), 0);
    close(sv[1]);
    cl_shm_link_close(&got);
    /* an unsealed file of the right size is refused */
    int fd = memfd_create("not-collie", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)made.map_len), 0);
    cl_shm_link_init(&got);
    got.fd = fd;
    assert_int_equal(cl_shm_link_attach(&got, &id, why, sizeof why), COLLIE_EPROTO);
    assert_non_null(strstr(why, "sealed"));
    assert_int_equal(got.fd, -1); /* closed by attach */
    /* no fd at all */
    assert_int_equal(cl_shm_link_attach(&got, &id, why, sizeof why), COLLIE_EPROTO);
    /* the right memory handed over read-only (it cannot be mapped for
     * writing): the peer's error, not this side's lack of memory */
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", made.fd);
    cl_shm_link_init(&got);
    got.fd = open(path, O_RDONLY | O_CLOEXEC);
    assert_true(got.fd >= 0);
    assert_int_equal(cl_shm_link_attach(&got, &id, why, sizeof why), COLLIE_EPROTO);
    assert_non_null(strstr(why, "mapped"));
    assert_int_equal(got.fd, -1);
    cl_shm_link_close(&made);
}

/* ---- the same-host sockets under attack ------------------------------------------------- */

/* The abstract names of this process's collie listeners (from /proc/net/unix). */
static int collie_listeners(char names[][108], int max) {
    FILE *f = fopen("/proc/net/unix", "r");
    assert_non_null(f);
    char line[512];
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        char *at = strstr(line, " @collie/");
        if (!at) continue;
        snprintf(names[n], 108, "%s", at + 2);
        names[n][strcspn(names[n], "\n")] = '\0';
        n++;
    }
    fclose(f);
    return n;
}

static int dial_abstract(const char *name) {
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    size_t n = strlen(name);
    memcpy(sun.sun_path + 1, name, n);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    if (connect(fd, (struct sockaddr *)&sun,
                (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void test_garbage_on_the_local_sockets(void **state) {
    (void)state;
    world w;
    world_create(&w, 2, "shm-garbage", NULL);
    allreduce_check(&w);
    char names[16][108];
    int n = collie_listeners(names, 16);
    print_message("%d collie listener(s)\n", n);
    assert_true(n >= 2);
    unsigned seed = 12345;
    for (int i = 0; i < n; i++) {
        for (int round = 0; round < 3; round++) {
            int fd = dial_abstract(names[i]);
            if (fd < 0) continue; /* another test process's, gone meanwhile */
            uint8_t junk[700];
            for (size_t k = 0; k < sizeof junk; k++)
                junk[k] = (uint8_t)rand_r(&seed);
            if (round == 1) memcpy(junk, "CLTH", 4); /* a handshake magic, then nonsense */
            ssize_t wr = round == 2 ? 0 : send(fd, junk, sizeof junk, MSG_NOSIGNAL);
            (void)wr;
            close(fd);
        }
    }
    /* the comm did not notice, and still works */
    allreduce_check(&w);
    for (int r = 0; r < 2; r++)
        assert_int_equal(comm_stats(w.c[r]).status, COLLIE_OK);
    world_destroy(&w);
}

/* Same user means the same effective uid on both sides: SO_PEERCRED
 * reports the peer's effective uid, so the listener compares it with its
 * own effective uid (it compared it with its real one, and refused its own
 * process when the two differ, as in a setuid program). Here both ranks
 * run with real uid 65534 and effective uid 0: they link over shared
 * memory. This test process is the runner's child, so changing its ids is
 * harmless. */
static void test_same_user_by_effective_uid(void **state) {
    (void)state;
    if (geteuid() != 0) skip_because("needs root to run with another real uid");
    assert_int_equal(setresuid(65534, 0, 0), 0);
    assert_int_equal(getuid(), 65534);
    world w;
    world_create(&w, 2, "shm-euid", NULL);
    allreduce_check(&w);
    for (int r = 0; r < 2; r++) {
        collie_comm_stats st = comm_stats(w.c[r]);
        assert_int_equal(st.connections, 1);
        assert_int_equal(st.shm_connections, 1);
    }
    world_destroy(&w);
}

/* This binary's getsockopt (it links libcollie statically): SO_PEERCRED
 * fails with EACCES while fail_peercred is set. */
static _Atomic bool fail_peercred;

int getsockopt(int fd, int level, int name, void *val, socklen_t *len) {
    typedef int (*getsockopt_fn)(int, int, int, void *, socklen_t *);
    static getsockopt_fn real;
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "getsockopt");
    if (atomic_load(&fail_peercred) && level == SOL_SOCKET && name == SO_PEERCRED) {
        errno = EACCES;
        return -1;
    }
    return real(fd, level, name, val, len);
}

typedef struct peercred_log {
    pthread_mutex_t mu;
    char line[512];
} peercred_log;

static void peercred_capture(const collie_log_record *r, void *ctx) {
    peercred_log *pl = ctx;
    pthread_mutex_lock(&pl->mu);
    if (strstr(r->message, "refused a same-host connection"))
        snprintf(pl->line, sizeof pl->line, "%s", r->message);
    pthread_mutex_unlock(&pl->mu);
}

/* A same-host connection whose credentials cannot be read is refused, and
 * the log says so (it named the pid of an uninitialised struct ucred). */
static void test_unreadable_peer_credentials_are_refused(void **state) {
    (void)state;
    static peercred_log pl = {.mu = PTHREAD_MUTEX_INITIALIZER};
    world w;
    world_create(&w, 2, "shm-peercred", NULL);
    allreduce_check(&w);
    collie_set_log_handler(peercred_capture, &pl);
    atomic_store(&fail_peercred, true);
    char names[16][108];
    int n = collie_listeners(names, 16);
    assert_true(n >= 1);
    int fds[16], nfd = 0;
    for (int i = 0; i < n; i++)
        if ((fds[nfd] = dial_abstract(names[i])) >= 0) nfd++;
    char got[512] = "";
    for (int64_t until = now_ms() + 5000; !got[0] && now_ms() < until;) {
        usleep(5000);
        pthread_mutex_lock(&pl.mu);
        snprintf(got, sizeof got, "%s", pl.line);
        pthread_mutex_unlock(&pl.mu);
    }
    atomic_store(&fail_peercred, false);
    collie_set_log_handler(NULL, NULL);
    for (int i = 0; i < nfd; i++)
        close(fds[i]);
    print_message("%s\n", got);
    assert_string_equal(got, "refused a same-host connection: its credentials could not be read "
                             "(SO_PEERCRED: Permission denied)");
    allreduce_check(&w); /* the comm did not notice */
    world_destroy(&w);
}

/* ---- a same-host peer that corrupts the shared memory ------------------------------------ */

/* Every mapping of a collie link in this process (both ranks of a world
 * map each link): its start, or 0 when there are no more. */
static int link_mappings(uint8_t *maps[], int max) {
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[512];
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        if (!strstr(line, "/memfd:collie")) continue;
        unsigned long long start;
        if (sscanf(line, "%llx-", &start) == 1) maps[n++] = (uint8_t *)(uintptr_t)start;
    }
    fclose(f);
    return n;
}

/* A peer that writes nonsense into the counters of its link's rings (head
 * more than the capacity ahead of tail) breaks the protocol: the ranks'
 * next collective fails at once with COLLIE_EPROTO naming the ring, rather
 * than both sides finding the ring "empty" and waiting out the deadline. */
static void test_corrupt_ring_counters_are_a_protocol_error(void **state) {
    (void)state;
    world w;
    world_create(&w, 2, "shm-corrupt-ring", NULL);
    world_link(&w);
    assert_true(comm_stats(w.c[0]).shm_connections > 0);
    uint8_t *maps[4];
    int nm = link_mappings(maps, 4);
    assert_true(nm >= 1);
    /* the header page (link.c): magic, ..., ring_cap at 32, ring_off[2] at 40 */
    uint8_t *map = maps[0];
    uint32_t magic;
    uint64_t cap, off[2];
    memcpy(&magic, map, sizeof magic);
    assert_int_equal(magic, 0x4c534c43u);
    memcpy(&cap, map + 32, sizeof cap);
    memcpy(off, map + 40, sizeof off);
    for (int i = 0; i < 2; i++) { /* head is the ring's first word */
        _Atomic uint64_t *head = (_Atomic uint64_t *)(map + off[i]);
        atomic_fetch_add(head, 3 * cap);
    }
    collie_post_opts po = COLLIE_POST_OPTS_INIT;
    po.timeout_ms = 15000;
    int32_t v[2] = {1, 2};
    collie_work *wk[2] = {NULL, NULL};
    int64_t t0 = now_ms();
    int rc[2];
    for (int r = 0; r < 2; r++) /* refused at once if the comm failed already */
        rc[r] = collie_allreduce(w.c[r], &v[r], &v[r], 1, COLLIE_INT32, COLLIE_SUM, &po, &wk[r]);
    int eproto = 0;
    for (int r = 0; r < 2; r++) {
        if (rc[r] == COLLIE_OK) {
            rc[r] = collie_work_wait(wk[r], 30000);
            const char *msg = collie_work_error_message(wk[r]);
            print_message("rank %d: %s: %s\n", r, collie_strerror(rc[r]), msg ? msg : "");
            /* EPROTO, or EABORTED naming it (the other rank's connection saw it first) */
            assert_true(rc[r] == COLLIE_EPROTO || rc[r] == COLLIE_EABORTED);
            assert_non_null(msg);
            assert_non_null(strstr(msg, "corrupted the ring of its same-host link"));
            collie_work_release(wk[r]);
        } else {
            assert_true(rc[r] == COLLIE_EPROTO || rc[r] == COLLIE_EABORTED);
        }
        int st = COLLIE_OK;
        const char *why = NULL;
        collie_comm_error(w.c[r], &st, &why);
        if (st == COLLIE_EPROTO && why && strstr(why, "corrupted the ring")) eproto++;
    }
    assert_true(eproto >= 1);           /* the root cause */
    assert_true(now_ms() - t0 < 10000); /* not the deadline */
    world_destroy(&w);
}

/* Nothing of collie's in /dev/shm, while linked and after. */
static void test_nothing_in_dev_shm(void **state) {
    (void)state;
    int before = dev_shm_collie_files();
    world w;
    world_create(&w, 4, "shm-devshm", NULL);
    allreduce_check(&w);
    assert_true(comm_stats(w.c[0]).shm_connections > 0);
    assert_int_equal(dev_shm_collie_files(), before);
    world_destroy(&w);
    assert_int_equal(dev_shm_collie_files(), before);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_backend_uses_shm),
        cmocka_unit_test(test_tcp_when_asked),
        cmocka_unit_test(test_invalid_setting_is_named),
        cmocka_unit_test(test_forced_shm_towards_a_tcp_peer),
        cmocka_unit_test(test_link_refuses_foreign_memory),
        cmocka_unit_test(test_garbage_on_the_local_sockets),
        cmocka_unit_test(test_same_user_by_effective_uid),
        cmocka_unit_test(test_unreadable_peer_credentials_are_refused),
        cmocka_unit_test(test_nothing_in_dev_shm),
        cmocka_unit_test(test_corrupt_ring_counters_are_a_protocol_error),
    };
    return cltest_main(tests, NULL, NULL);
}
