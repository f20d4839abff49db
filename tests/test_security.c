/*
 * test_security.c — the trust boundary (docs/security.md): an outsider
 * without a collie-run job's secret can neither use its store nor join its
 * comm; connections that never finish their handshake with a rank are
 * bounded in number and time, and cost nothing once gone; nothing listens
 * beyond loopback without a secret unless asked to.
 *
 * The outsiders are this binary run in a helper mode (main): under
 * collie-run, with the secret taken out of their environment.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll_fixture.h"
#include "harness.h"
#include "runner.h"
#include "spawn.h"
#include "store/server.h"
#include "transports/cpu/tcp_conn_impl.h"

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define WAIT_MS   10000
#define BCAST_LEN 64
#define SEC_COMM  "sec"
#define RUN_BOUND 30000

static char self_exe[4096];

/* ---- helpers ------------------------------------------------------------------------------ */

static int64_t ms_now(void) { return now_ms(); }

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* "ip:port[|host|name]" (a rank's published address): the TCP part. */
static bool parse_published(const char *val, size_t len, struct sockaddr_in *sin) {
    char buf[128];
    snprintf(buf, sizeof buf, "%.*s", (int)len, val);
    buf[strcspn(buf, "|")] = '\0';
    char *colon = strrchr(buf, ':');
    if (!colon) return false;
    *colon = '\0';
    memset(sin, 0, sizeof *sin);
    sin->sin_family = AF_INET;
    sin->sin_port = htons((uint16_t)atoi(colon + 1));
    return inet_pton(AF_INET, buf, &sin->sin_addr) == 1;
}

/* The TCP address rank `rank` of comm `name` (generation gen) published. */
static void rank_address(collie_store *st, const char *name, uint64_t gen, int rank,
                         struct sockaddr_in *sin) {
    char key[128];
    snprintf(key, sizeof key, "collie/%s/%llu/tcp/%d", name, (unsigned long long)gen, rank);
    void *val = NULL;
    size_t len = 0;
    assert_int_equal(collie_store_get(st, key, WAIT_MS, &val, &len), COLLIE_OK);
    assert_true(parse_published(val, len, sin));
    free(val);
}

static int dial(const struct sockaddr_in *sin) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (const struct sockaddr *)sin, sizeof *sin) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Read exactly len bytes within timeout_ms; the bytes read, 0 at EOF. */
static ssize_t read_full(int fd, uint8_t *buf, size_t len, int timeout_ms) {
    size_t got = 0;
    int64_t until = ms_now() + timeout_ms;
    while (got < len) {
        int left = (int)(until - ms_now());
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) <= 0) break;
        ssize_t n = recv(fd, buf + got, len - got, 0);
        if (n <= 0) break;
        got += (size_t)n;
    }
    return (ssize_t)got;
}

/* Raise the soft fd limit (the idle test holds both ends of 400 sockets). */
static void raise_nofile(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 4096) {
        rl.rlim_cur = rl.rlim_max < 4096 ? rl.rlim_max : 4096;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static long rss_kib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, res = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &size, &res) != 2) res = 0;
        fclose(f);
    }
    return res * (sysconf(_SC_PAGESIZE) / 1024);
}

/* A non-loopback IPv4 address of this host, if it has one. */
static bool outside_address(char *buf, size_t len) {
    struct ifaddrs *ifs, *it;
    bool found = false;
    if (getifaddrs(&ifs) != 0) return false;
    for (it = ifs; it && !found; it = it->ifa_next) {
        if (!it->ifa_addr || it->ifa_addr->sa_family != AF_INET) continue;
        struct in_addr a = ((struct sockaddr_in *)it->ifa_addr)->sin_addr;
        if ((ntohl(a.s_addr) >> 24) == 127) continue;
        found = inet_ntop(AF_INET, &a, buf, (socklen_t)len) != NULL;
    }
    freeifaddrs(ifs);
    return found;
}

/* ---- helper modes (run under collie-run) --------------------------------------------------- */

/* insider: the rank's own view of the store (with the job's secret). */
static int insider_store(const char *what) {
    collie_engine *e;
    collie_store *st;
    if (collie_engine_create(NULL, &e) != COLLIE_OK) return 1;
    int rc = collie_store_connect(e, NULL, NULL, &st);
    if (rc == COLLIE_OK && !strcmp(what, "set")) {
        rc = collie_store_set(st, "sec/insider-key", "job-data", 8, WAIT_MS);
        printf("INSIDER set=%s\n", collie_status_name(rc));
    } else if (rc == COLLIE_OK) {
        const char *keys[] = {"sec/outsider-key"};
        bool found = true;
        rc = collie_store_check(st, keys, 1, WAIT_MS, &found);
        printf("INSIDER check=%s outsider-key=%s\n", collie_status_name(rc),
               found ? "present" : "absent");
    }
    if (st) collie_store_destroy(st);
    collie_engine_destroy(e);
    fflush(stdout);
    return 0;
}

/* outsider: COLLIE_STORE_ADDR without the secret (the environment has none). */
static int outsider_store(void) {
    collie_engine *e;
    collie_store *st = NULL;
    printf("OUTSIDER token=%s\n", getenv("COLLIE_STORE_TOKEN") ? "set" : "unset");
    if (collie_engine_create(NULL, &e) != COLLIE_OK) return 1;
    collie_store_opts o = COLLIE_STORE_OPTS_INIT;
    o.timeout_ms = 3000;
    int rc = collie_store_connect(e, NULL, &o, &st);
    void *val = NULL;
    size_t len = 0;
    int get = rc == COLLIE_OK ? collie_store_get(st, "sec/insider-key", 3000, &val, &len) : rc;
    int set = rc == COLLIE_OK ? collie_store_set(st, "sec/outsider-key", "evil", 4, 3000) : rc;
    printf("OUTSIDER get=%s set=%s value=%.*s\n", collie_status_name(get), collie_status_name(set),
           get == COLLIE_OK ? (int)len : 0, val ? (char *)val : "");
    free(val);
    if (st) collie_store_destroy(st);
    collie_engine_destroy(e);
    fflush(stdout);
    return 0;
}

/* outsider: dial a rank's TCP listener claiming rank 0 (no secret: a zero
 * proof); if let in, inject a broadcast frame of 0xee bytes. */
static int outsider_tcp(const char *addr, uint64_t comm_id, uint64_t gen, uint32_t size) {
    struct sockaddr_in sin;
    if (!parse_published(addr, strlen(addr), &sin)) return 1;
    int fd = dial(&sin);
    if (fd < 0) {
        printf("OUTSIDER cannot connect: %s\n", strerror(errno));
        return 0;
    }
    uint8_t ch[HS_CHALLENGE_LEN], acc[HS_ACCEPT_LEN];
    if (read_full(fd, ch, sizeof ch, 5000) != (ssize_t)sizeof ch) {
        printf("OUTSIDER no challenge\n");
        close(fd);
        return 0;
    }
    uint8_t h[HS_HELLO_LEN] = {0};
    put32(h, TCP_HS_MAGIC);
    put32(h + 4, TCP_PROTO_VERSION);
    put64(h + 8, comm_id);
    put64(h + 16, gen);
    put32(h + 24, 0); /* "rank 0" */
    put32(h + 28, size);
    memset(h + 32, 0x5a, 16); /* nonce; the proof stays zero */
    if (send(fd, h, sizeof h, MSG_NOSIGNAL) != (ssize_t)sizeof h) {
        printf("OUTSIDER refused (closed before the hello)\n");
        close(fd);
        return 0;
    }
    ssize_t n = read_full(fd, acc, sizeof acc, 5000);
    if (n != (ssize_t)sizeof acc || get32(acc + 4) != 0) {
        printf("OUTSIDER refused (%s %u)\n", n == (ssize_t)sizeof acc ? "status" : "closed",
               n == (ssize_t)sizeof acc ? get32(acc + 4) : 0);
        close(fd);
        return 0;
    }
    uint8_t frame[TCP_FRAME_HDR + BCAST_LEN];
    tcp_comm fake = {.generation = gen};
    collie_coll_args a = {
        .kind = COLLIE_COLL_BROADCAST, .dtype = COLLIE_UINT8, .count = BCAST_LEN, .root = 0};
    cl_tcp_frame_header(frame, &fake, &a, 1, 0, BCAST_LEN);
    memset(frame + TCP_FRAME_HDR, 0xee, BCAST_LEN);
    n = send(fd, frame, sizeof frame, MSG_NOSIGNAL);
    printf("OUTSIDER accepted; injected %zd bytes\n", n);
    fflush(stdout);
    sleep_ms(3000); /* keep the connection while the victim reads */
    close(fd);
    return 0;
}

/* rank of the handshake test: rank 1 lets an outsider at its listener
 * first, then both broadcast 0xa5 bytes from rank 0. */
static int rank_bcast(void) {
    int rank;
    collie_engine *e;
    collie_store *st;
    collie_comm *c;
    int rc = rank_join_env(SEC_COMM, 10000, &rank, &e, &st, &c);
    if (rc) return rc;
    int size = collie_comm_size(c);
    uint64_t gen = collie_comm_generation(c);
    if (rank == 1) {
        char key[96], prefix[96], addr[128], ids[3][32];
        snprintf(key, sizeof key, "collie/%s/%llu/tcp/1", SEC_COMM, (unsigned long long)gen);
        void *val = NULL;
        size_t len = 0;
        rc = collie_store_get(st, key, WAIT_MS, &val, &len);
        snprintf(addr, sizeof addr, "%.*s", rc == COLLIE_OK ? (int)len : 0, (char *)val);
        free(val);
        /* the comm id: FNV-1a of the public prefix (comm_rendezvous.c, base/hash.h),
         * computed here as an outsider would, apart from the library's own */
        snprintf(prefix, sizeof prefix, "collie/%s/%llu/", SEC_COMM, (unsigned long long)gen);
        uint64_t id = 1469598103934665603ULL;
        for (const char *p = prefix; *p; p++)
            id = (id ^ (unsigned char)*p) * 1099511628211ULL;
        snprintf(ids[0], sizeof ids[0], "%llu", (unsigned long long)id);
        snprintf(ids[1], sizeof ids[1], "%llu", (unsigned long long)gen);
        snprintf(ids[2], sizeof ids[2], "%d", size);
        /* then the same claiming another comm: an outsider is told the
         * same whatever it got wrong (it learns nothing of the comm) */
        char other[32];
        snprintf(other, sizeof other, "%llu", (unsigned long long)(id ^ 1));
        for (int k = 0; k < 2; k++) {
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) {
                unsetenv("COLLIE_STORE_TOKEN");
                execl(self_exe, self_exe, "--outsider-tcp", addr, k ? other : ids[0], ids[1],
                      ids[2], (char *)NULL);
                _exit(127);
            }
            reap_bounded(pid, 15000);
        }
        collie_store_set(st, "sec/attack-done", "1", 1, WAIT_MS);
    } else {
        void *val = NULL;
        size_t len = 0;
        rc = collie_store_get(st, "sec/attack-done", 20000, &val, &len);
        free(val);
        if (rc != COLLIE_OK) printf("WAIT %s\n", collie_status_name(rc));
    }
    uint8_t buf[BCAST_LEN];
    memset(buf, rank == 0 ? 0xa5 : 0, sizeof buf);
    collie_work *w = NULL;
    rc = collie_broadcast(c, buf, BCAST_LEN, COLLIE_UINT8, 0, NULL, &w);
    if (rc == COLLIE_OK) rc = collie_work_wait(w, 15000);
    bool right = true;
    for (int i = 0; i < BCAST_LEN; i++)
        right = right && buf[i] == 0xa5;
    printf("BCAST status=%s bytes=%s %s\n", collie_status_name(rc), right ? "right" : "wrong",
           rc == COLLIE_OK || !w ? "" : collie_work_error_message(w));
    fflush(stdout);
    if (w) collie_work_release(w);
    if (rc != COLLIE_OK) collie_comm_abort(c, "test over");
    collie_comm_destroy(c);
    collie_store_destroy(st);
    collie_engine_destroy(e);
    return rc == COLLIE_OK && right ? 0 : 1;
}

/* outsider: open n connections to the store at addr (host:port) and hold
 * them, saying "HELD k" once they are open, until killed (60 s at most). */
static int outsider_flood(const char *addr, int n) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        (rlim_t)n + 32 > rl.rlim_cur)
        n = (int)rl.rlim_cur - 32;
    struct sockaddr_in sin;
    if (!parse_published(addr, strlen(addr), &sin)) return 1;
    int held = 0;
    for (int i = 0; i < n; i++)
        held += dial(&sin) >= 0; /* kept open */
    printf("HELD %d\n", held);
    fflush(stdout);
    for (int i = 0; i < 600; i++)
        sleep_ms(100);
    return 0;
}

/* rank of the flood test (2 ranks, --restarts 1): rank 0 has an outsider
 * hold many unauthenticated connections to the job's store, then tells rank
 * 1 to fail, checks that a new client still gets in, and waits for the
 * restarted rank 1. */
static int rank_flood(void) {
    const char *rs = getenv("COLLIE_RANK"), *rc_s = getenv("COLLIE_RESTART_COUNT");
    const char *addr = getenv("COLLIE_STORE_ADDR");
    if (!rs || !rc_s || !addr) return 2;
    int rank = atoi(rs), restarts = atoi(rc_s);
    collie_engine *e;
    collie_store *st;
    if (collie_engine_create(NULL, &e) != COLLIE_OK ||
        collie_store_connect(e, NULL, NULL, &st) != COLLIE_OK)
        return 3;
    int rc = COLLIE_OK;
    void *val = NULL;
    size_t len = 0;
    if (rank == 1 && restarts == 0) { /* fail once the flood is held */
        rc = collie_store_get(st, "flood/held", 20000, &val, &len);
        printf("RANK1 failing on purpose (%s)\n", collie_status_name(rc));
        fflush(stdout);
        /* the descriptors the launcher holds for it (its output pipes, its
         * store connection) are freed before the launcher sees it end: a
         * store that accepts floods takes them (before: all of them) */
        collie_store_destroy(st);
        collie_engine_destroy(e);
        close(1);
        close(2);
        sleep_ms(500);
        _exit(3);
    }
    if (rank == 1) {
        rc = collie_store_set(st, "flood/restarted", "1", 1, WAIT_MS);
        printf("RANK1 restarted: set=%s\n", collie_status_name(rc));
    } else {
        int p[2];
        if (pipe(p) != 0) return 4;
        char n[16];
        snprintf(n, sizeof n, "%d", 1500);
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            dup2(p[1], 1);
            close(p[0]);
            unsetenv("COLLIE_STORE_TOKEN");
            execl(self_exe, self_exe, "--outsider-flood", addr, n, (char *)NULL);
            _exit(127);
        }
        close(p[1]);
        char line[64] = "";
        size_t got = 0; /* "HELD k\n", within 20 s */
        for (int64_t until = ms_now() + 20000; got < sizeof line - 1 && !strchr(line, '\n');) {
            struct pollfd pf = {.fd = p[0], .events = POLLIN};
            int left = (int)(until - ms_now());
            if (left <= 0 || poll(&pf, 1, left) <= 0) break;
            ssize_t k = read(p[0], line + got, sizeof line - 1 - got);
            if (k <= 0) break;
            got += (size_t)k;
        }
        printf("FLOOD %.*s\n", (int)strcspn(line, "\n"), line);
        sleep_ms(1000); /* the store has accepted what it was going to */
        /* the launcher's descriptors: the store holds few for the flood */
        char fddir[64];
        snprintf(fddir, sizeof fddir, "/proc/%d/fd", (int)getppid());
        int nfds = 0;
        DIR *d = opendir(fddir);
        for (struct dirent *de; d && (de = readdir(d));)
            nfds += de->d_name[0] != '.';
        if (d) closedir(d);
        printf("LAUNCHER FDS %d\n", nfds);
        rc = collie_store_set(st, "flood/held", "1", 1, WAIT_MS);
        /* a new client of the job still gets in while the flood is held */
        collie_store *legit = NULL;
        collie_store_opts o = COLLIE_STORE_OPTS_INIT;
        o.timeout_ms = 5000;
        int64_t t0 = ms_now();
        int lrc = collie_store_connect(e, NULL, &o, &legit);
        if (lrc == COLLIE_OK) lrc = collie_store_set(legit, "flood/legit", "1", 1, 5000);
        printf("LEGIT set=%s in %s\n", collie_status_name(lrc),
               ms_now() - t0 < 3000 ? "time" : "over 3 s");
        if (legit) collie_store_destroy(legit);
        int wrc = collie_store_get(st, "flood/restarted", 20000, &val, &len);
        printf("RESTARTED get=%s\n", collie_status_name(wrc));
        kill(pid, SIGKILL);
        reap_bounded(pid, 5000);
        close(p[0]);
        rc = rc != COLLIE_OK ? rc : lrc != COLLIE_OK ? lrc : wrc;
    }
    fflush(stdout);
    free(val);
    collie_store_destroy(st);
    collie_engine_destroy(e);
    return rc == COLLIE_OK ? 0 : 1;
}

/* ---- an outsider and a collie-run job ------------------------------------------------------ */

/* The store of a job started by collie-run (no secret given by the user)
 * cannot be read or written by a process without the job's secret. */
static void test_outsider_cannot_use_the_store(void **state) {
    (void)state;
    char sh[3 * sizeof self_exe + 256];
    snprintf(sh, sizeof sh,
             "%s --insider-store set && env -u COLLIE_STORE_TOKEN %s --outsider-store && "
             "%s --insider-store check",
             self_exe, self_exe, self_exe);
    spawn_proc *l = spawn_start("collie-run", ARGS("-n", "1", "--", "/bin/sh", "-c", sh),
                                ARGS("COLLIE_LOG=error"), RUN_BOUND);
    spawn_finish(l);
    assert_spawn(l, l->status == 0);
    assert_spawn(l, strstr(l->text[0], "[0] INSIDER set=COLLIE_OK\n"));
    assert_spawn(l, strstr(l->text[0], "[0] OUTSIDER token=unset\n"));
    /* the outsider neither read the job's key nor wrote one */
    assert_spawn(l, strstr(l->text[0], "[0] OUTSIDER get=COLLIE_EAUTH set=COLLIE_EAUTH value=\n"));
    assert_spawn(l, strstr(l->text[0], "[0] INSIDER check=COLLIE_OK outsider-key=absent\n"));
    spawn_free(l);
}

/* An outsider holding 1,500 unauthenticated connections to a collie-run
 * job's store (started with the usual soft limit of 1,024 descriptors)
 * while a rank fails: the restart succeeds, a new client still gets in, the
 * job completes (before: the store took every descriptor, 'cannot start rank
 * 1: Too many open files', the job stopped). */
static void test_store_flood_does_not_stop_restarts(void **state) {
    (void)state;
    struct rlimit rl;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > 1024) rl.rlim_cur = 1024;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0); /* this test's own process */
    spawn_proc *l = spawn_start("collie-run",
                                ARGS("-n", "2", "--restarts", "1", "--", self_exe, "--rank-flood"),
                                ARGS("COLLIE_LOG=warn", "COLLIE_HANDSHAKE_TIMEOUT_MS=5000"), 60000);
    spawn_finish(l);
    print_message("%s\n%s", l->text[0], l->text[1]);
    assert_spawn(l, strstr(l->text[0], "[0] FLOOD HELD "));
    assert_spawn(l, strstr(l->text[0], "[0] LEGIT set=COLLIE_OK in time\n"));
    /* the store held a bounded number of the flood's connections (before:
     * every descriptor the launcher had, 1,024) */
    const char *fds = strstr(l->text[0], "[0] LAUNCHER FDS ");
    assert_spawn(l, fds && atoi(fds + 17) < 512);
    assert_spawn(l, strstr(l->text[0], "[1] RANK1 restarted: set=COLLIE_OK\n"));
    assert_spawn(l, strstr(l->text[0], "[0] RESTARTED get=COLLIE_OK\n"));
    assert_spawn(l, !strstr(l->text[1], "cannot start rank"));
    assert_spawn(l, l->status == 0);
    /* the store's refusals were rate-limited: a handful of lines, not one each */
    int lines = spawn_count(l->text[1], "connections wait for their handshake");
    if (lines > 5) fail_msg("%d log lines about the flood", lines);
    spawn_free(l);
}

/* An outsider that dials a rank of a collie-run job claiming a lower rank
 * is refused; the real rank still joins and the broadcast's bytes are
 * right. Over TCP and with the default transport (same-host peers on
 * shared memory, the TCP listener still open). */
static void outsider_handshake(const char *transport) {
    char env[64];
    snprintf(env, sizeof env, "COLLIE_CPU_TRANSPORT=%s", transport);
    spawn_proc *l = spawn_start("collie-run", ARGS("-n", "2", "--", self_exe, "--rank-bcast"),
                                ARGS("COLLIE_LOG=error", env), RUN_BOUND);
    spawn_finish(l);
    print_message("%s: %s", transport, l->text[0]);
    /* both refused with one answer: the wrong comm id is not told apart */
    const char *first = strstr(l->text[0], "[1] OUTSIDER refused");
    assert_spawn(l, first);
    assert_spawn(l, strstr(first + 1, "[1] OUTSIDER refused"));
    assert_spawn(l, !strstr(l->text[0], "OUTSIDER refused (status 1)"));
    assert_spawn(l, strstr(l->text[0], "[0] BCAST status=COLLIE_OK bytes=right"));
    assert_spawn(l, strstr(l->text[0], "[1] BCAST status=COLLIE_OK bytes=right"));
    assert_spawn(l, l->status == 0);
    spawn_free(l);
}

static void test_outsider_cannot_join_tcp(void **state) {
    (void)state;
    outsider_handshake("tcp");
}

static void test_outsider_cannot_join_auto(void **state) {
    (void)state;
    outsider_handshake("auto");
}

/* ---- idle and flooding connections to a rank ---------------------------------------------- */

/* 400 connections that never say a word: the rank holds at most the cap
 * (64) at a time and closes every one by the handshake deadline; their
 * descriptors come back; the comm still works. */
static void test_idle_connections_are_bounded(void **state) {
    (void)state;
    enum { IDLE = 400, CAP = 64 };
    raise_nofile();
    setting_set("COLLIE_HANDSHAKE_TIMEOUT_MS", "1000");
    setting_set("COLLIE_CPU_TRANSPORT", "tcp");
    world w;
    world_create(&w, 2, "idle", NULL);
    struct sockaddr_in sin;
    rank_address(w.st[0], "idle", collie_comm_generation(w.c[0]), 1, &sin);
    int base = count_open_fds();
    static int fds[IDLE];
    for (int i = 0; i < IDLE; i++) {
        fds[i] = dial(&sin);
        if (fds[i] < 0) fail_msg("connection %d: %s", i, strerror(errno));
    }
    sleep_ms(500); /* the rank accepted what it was going to */
    int held = count_open_fds() - base - IDLE;
    print_message("the rank holds %d descriptors for %d idle connections\n", held, IDLE);
    if (held > CAP + 8) fail_msg("the rank holds %d descriptors for idle connections", held);
    /* every one is closed by the deadline (1 s; bounded at 10 s here) */
    int64_t until = ms_now() + WAIT_MS;
    int open = 0;
    for (int i = 0; i < IDLE; i++) {
        uint8_t buf[64];
        bool closed = false;
        while (!closed && ms_now() < until) {
            struct pollfd p = {.fd = fds[i], .events = POLLIN};
            if (poll(&p, 1, (int)(until - ms_now())) <= 0) break;
            ssize_t n = recv(fds[i], buf, sizeof buf, 0);
            closed = n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN);
        }
        open += !closed;
        close(fds[i]);
    }
    if (open) fail_msg("%d idle connections were still open after %d ms", open, WAIT_MS);
    assert_int_equal(count_open_fds_settled(base), base);
    run_and_check(&w, COLLIE_COLL_BROADCAST, COLLIE_INT32, COLLIE_SUM, 1000, 0, false);
    world_destroy(&w);
}

/* 20,000 connect-and-close cycles (reset, so no TIME_WAIT is left on this
 * side) against a rank's listener leave its memory as it was (before: +39
 * MB). CLTEST_QUICK (the sanitizer runs): 5,000. Under ASan freed memory
 * stays in its quarantine, so RSS says nothing there: only run them. */
static void test_connect_close_cycles_free_memory(void **state) {
    (void)state;
    enum { WARM = 2000, BATCH = 250 };
    const int CYCLES = getenv("CLTEST_QUICK") ? 5000 : 20000;
#ifdef __SANITIZE_ADDRESS__
    const bool rss_means_something = false;
#else
    const bool rss_means_something = true;
#endif
    setting_set("COLLIE_CPU_TRANSPORT", "tcp");
    world w;
    world_create(&w, 2, "cycles", NULL);
    struct sockaddr_in sin;
    rank_address(w.st[0], "cycles", collie_comm_generation(w.c[0]), 1, &sin);
    long before = 0;
    int64_t t0 = ms_now();
    for (int i = 0; i < WARM + CYCLES; i++) {
        if (i == WARM) {
            sleep_ms(300);
            before = rss_kib();
        }
        int fd = dial(&sin);
        if (fd < 0) fail_msg("cycle %d: %s", i, strerror(errno));
        struct linger lg = {1, 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        close(fd);
        if (i % BATCH == BATCH - 1) sleep_ms(5); /* let the rank's loop keep up */
        if (ms_now() - t0 > 90000) fail_msg("only %d cycles in 90 s", i);
    }
    sleep_ms(500);
    long after = rss_kib();
    print_message("RSS %ld KiB before, %ld KiB after %d cycles (%lld ms)\n", before, after, CYCLES,
                  (long long)(ms_now() - t0));
    if (rss_means_something && after - before > 8 * 1024)
        fail_msg("RSS grew by %ld KiB over %d connect-and-close cycles", after - before, CYCLES);
    run_and_check(&w, COLLIE_COLL_ALLREDUCE, COLLIE_INT32, COLLIE_SUM, 1000, 0, false);
    world_destroy(&w);
}

/* ---- nothing beyond loopback without a secret ---------------------------------------------- */

static void test_store_beyond_loopback_needs_a_secret(void **state) {
    (void)state;
    setting_set("COLLIE_STORE_TOKEN", NULL);
    setting_set("COLLIE_INSECURE", NULL);
    collie_engine *e;
    collie_store_server *srv = NULL;
    assert_int_equal(collie_engine_create(NULL, &e), COLLIE_OK);
    /* tokenless on every interface: refused, saying what to do */
    int rc = collie_store_server_create(e, "0.0.0.0", 0, NULL, &srv);
    const char *msg = collie_last_error();
    if (rc != COLLIE_EINVAL || !strstr(msg, "token") || !strstr(msg, "COLLIE_INSECURE"))
        fail_msg("a tokenless store on 0.0.0.0: %s: %s", collie_status_name(rc), msg);
    assert_null(srv);
    /* with a token, or asked for insecure (option or setting): served */
    collie_store_server_opts so = COLLIE_STORE_SERVER_OPTS_INIT;
    so.token = "s3cret";
    assert_int_equal(collie_store_server_create(e, "0.0.0.0", 0, &so, &srv), COLLIE_OK);
    collie_store_server_destroy(srv);
    so.token = NULL;
    so.insecure = 1;
    assert_int_equal(collie_store_server_create(e, "0.0.0.0", 0, &so, &srv), COLLIE_OK);
    collie_store_server_destroy(srv);
    setting_set("COLLIE_INSECURE", "1");
    assert_int_equal(collie_store_server_create(e, "0.0.0.0", 0, NULL, &srv), COLLIE_OK);
    collie_store_server_destroy(srv);
    setting_set("COLLIE_INSECURE", NULL);
    /* no address: loopback */
    assert_int_equal(collie_store_server_create(e, NULL, 0, NULL, &srv), COLLIE_OK);
    if (strncmp(srv->name, "127.0.0.1:", 10) != 0)
        fail_msg("a store with no address listens on %s", srv->name);
    collie_store_server_destroy(srv);
    assert_int_equal(collie_engine_destroy(e), COLLIE_OK);
}

/* collie-store: loopback by default; a wider --bind needs --token-file or
 * --insecure. */
static void test_store_tool_beyond_loopback(void **state) {
    (void)state;
    spawn_proc *p =
        spawn_start("collie-store", ARGS("--bind", "0.0.0.0", "--port", "0"), NULL, WAIT_MS);
    spawn_finish(p);
    assert_spawn(p, p->status == 2);
    assert_spawn(p, strstr(p->text[1], "--token-file") && strstr(p->text[1], "--insecure"));
    spawn_free(p);
    p = spawn_start("collie-store", ARGS("--port", "0"), NULL, WAIT_MS);
    assert_spawn(p, spawn_wait_for(p, 0, "collie-store listening on 127.0.0.1:", 1, 5000));
    spawn_free(p);
    p = spawn_start("collie-store", ARGS("--bind", "0.0.0.0", "--port", "0", "--insecure"), NULL,
                    WAIT_MS);
    assert_spawn(p, spawn_wait_for(p, 0, "collie-store listening on 0.0.0.0:", 1, 5000));
    spawn_free(p);
}

/* collie-store --token-file: a file group or others can read or write is
 * refused, naming the file and saying why, as collie-run refuses it (and ssh
 * a key); the owner's alone, the store serves with it. */
static void test_store_tool_token_file_permissions(void **state) {
    (void)state;
    char dir[64], secret[128];
    test_tmpdir_make(dir, sizeof dir, "cltest-token");
    snprintf(secret, sizeof secret, "%s/secret", dir);
    FILE *f = fopen(secret, "w");
    assert_non_null(f);
    fputs("a store secret\n", f);
    fclose(f);
    static const mode_t loose[] = {0644, 0640, 0604, 0620, 0602};
    for (size_t i = 0; i < sizeof loose / sizeof loose[0]; i++) {
        assert_int_equal(chmod(secret, loose[i]), 0);
        spawn_proc *p = spawn_start(
            "collie-store", ARGS("--bind", "0.0.0.0", "--port", "0", "--token-file", secret), NULL,
            WAIT_MS);
        spawn_finish(p);
        assert_spawn(p, p->status == 2);
        assert_spawn(p, strstr(p->text[1], secret) && strstr(p->text[1], "group or others") &&
                            strstr(p->text[1], "owner only"));
        assert_spawn(p, !strstr(p->text[0], "listening") && !strstr(p->text[1], "a store secret"));
        spawn_free(p);
    }
    assert_int_equal(chmod(secret, 0600), 0);
    spawn_proc *p = spawn_start("collie-store",
                                ARGS("--bind", "0.0.0.0", "--port", "0", "--token-file", secret),
                                NULL, WAIT_MS);
    assert_spawn(p, spawn_wait_for(p, 0, "collie-store listening on 0.0.0.0:", 1, 5000));
    spawn_free(p);
    test_tmpdir_remove(dir);
}

/* A comm without a secret whose store, or whose own listener, is beyond
 * loopback is refused unless COLLIE_INSECURE says it is meant. */
static void test_comm_beyond_loopback_needs_a_secret(void **state) {
    (void)state;
    char ip[64], addr[96];
    if (!outside_address(ip, sizeof ip)) skip_because("this host has no non-loopback IPv4 address");
    setting_set("COLLIE_STORE_TOKEN", NULL);
    setting_set("COLLIE_INSECURE", NULL);
    setting_set("COLLIE_CPU_TRANSPORT", "tcp");
    collie_engine *e;
    collie_store_server *srv;
    assert_int_equal(collie_engine_create(NULL, &e), COLLIE_OK);
    collie_store_server_opts so = COLLIE_STORE_SERVER_OPTS_INIT;
    so.insecure = 1;
    assert_int_equal(collie_store_server_create(e, "0.0.0.0", 0, &so, &srv), COLLIE_OK);
    snprintf(addr, sizeof addr, "%s:%u", ip, collie_store_server_port(srv));
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.timeout_ms = 5000;
    o.create_timeout_ms = 5000;
    for (int round = 0; round < 2; round++) {
        collie_store *st;
        collie_comm *c = NULL;
        assert_int_equal(collie_store_connect(e, addr, NULL, &st), COLLIE_OK);
        o.name = round ? "insecure-ok" : "insecure-no";
        int rc = collie_comm_create(e, st, 0, 1, &o, &c);
        const char *msg = collie_last_error();
        if (round == 0 &&
            (rc != COLLIE_EINVAL || !strstr(msg, "COLLIE_INSECURE") || !strstr(msg, "secret")))
            fail_msg("a tokenless comm with its store at %s: %s: %s", addr, collie_status_name(rc),
                     msg);
        if (round == 1 && rc != COLLIE_OK)
            fail_msg("COLLIE_INSECURE=1: %s: %s", collie_status_name(rc), msg);
        if (c) collie_comm_destroy(c);
        collie_store_destroy(st);
        setting_set("COLLIE_INSECURE", "1");
    }
    setting_set("COLLIE_INSECURE", NULL);
    /* the rank's own listener beyond loopback, its store on loopback */
    setting_set("COLLIE_SOCKET_ADDR", ip);
    collie_store *st;
    collie_comm *c = NULL;
    snprintf(addr, sizeof addr, "127.0.0.1:%u", collie_store_server_port(srv));
    assert_int_equal(collie_store_connect(e, addr, NULL, &st), COLLIE_OK);
    o.name = "listen-no";
    int rc = collie_comm_create(e, st, 0, 1, &o, &c);
    const char *msg = collie_last_error();
    if (rc == COLLIE_OK || !strstr(msg, "COLLIE_SOCKET_ADDR") || !strstr(msg, "COLLIE_INSECURE"))
        fail_msg("a tokenless comm listening on %s: %s: %s", ip, collie_status_name(rc), msg);
    if (c) collie_comm_destroy(c);
    collie_store_destroy(st);
    setting_set("COLLIE_SOCKET_ADDR", NULL);
    collie_store_server_destroy(srv);
    assert_int_equal(collie_engine_destroy(e), COLLIE_OK);
}

int main(int argc, char **argv) {
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    if (n > 0) self_exe[n] = '\0';
    if (argc >= 3 && !strcmp(argv[1], "--insider-store")) return insider_store(argv[2]);
    if (argc >= 2 && !strcmp(argv[1], "--outsider-store")) return outsider_store();
    if (argc >= 2 && !strcmp(argv[1], "--rank-bcast")) return rank_bcast();
    if (argc >= 2 && !strcmp(argv[1], "--rank-flood")) return rank_flood();
    if (argc >= 4 && !strcmp(argv[1], "--outsider-flood"))
        return outsider_flood(argv[2], atoi(argv[3]));
    if (argc >= 6 && !strcmp(argv[1], "--outsider-tcp"))
        return outsider_tcp(argv[2], strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10),
                            (uint32_t)atoi(argv[5]));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_outsider_cannot_use_the_store, spawn_teardown),
        cmocka_unit_test_teardown(test_outsider_cannot_join_tcp, spawn_teardown),
        cmocka_unit_test_teardown(test_store_flood_does_not_stop_restarts, spawn_teardown),
        cmocka_unit_test_teardown(test_outsider_cannot_join_auto, spawn_teardown),
        cmocka_unit_test(test_idle_connections_are_bounded),
        cmocka_unit_test(test_connect_close_cycles_free_memory),
        cmocka_unit_test(test_store_beyond_loopback_needs_a_secret),
        cmocka_unit_test_teardown(test_store_tool_beyond_loopback, spawn_teardown),
        cmocka_unit_test_teardown(test_store_tool_token_file_permissions, spawn_teardown),
        cmocka_unit_test(test_comm_beyond_loopback_needs_a_secret),
    };
    return cltest_main(tests, NULL, NULL);
}
