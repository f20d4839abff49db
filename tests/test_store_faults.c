/*
 * test_store_faults.c — the store when things go wrong: the server dies
 * (in-process, or a collie-store process killed) with requests in flight,
 * comes back on the same port, is unreachable; hostile bytes on the server
 * port; authentication successes and refusals; the connection limit; the
 * collie-store binary's start, signals and usage errors.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "harness.h"
#include "runner.h"
#include "store_fixture.h"

#include "engine/engine.h"
#include "store/proto.h"
#include "store/server.h"

/* ---- helpers ------------------------------------------------------------------------------- */

static int raw_connect(uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

static void raw_send(int fd, const void *p, size_t len) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    (void)n; /* the server may already have hung up: that is the point */
}

/* True if the peer closes fd within ms (EOF or reset; data is discarded). */
static bool raw_closed_within(int fd, int ms) {
    int64_t until = fx_now_ms() + ms;
    char buf[4096];
    while (fx_now_ms() < until) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, (int)(until - fx_now_ms())) <= 0) continue;
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
    }
    return false;
}

static void put_hdr(uint8_t *buf, uint8_t op, uint32_t body_len) {
    cl_store_hdr h = {
        .version = CL_STORE_PROTO_VERSION, .op = op, .body_len = body_len, .req_id = 1};
    cl_store_hdr_encode(buf, &h);
}

/* A valid HELLO from a client without a token. */
static void raw_hello(int fd) {
    cl_store_wbuf b = {0};
    uint8_t nonce[CL_STORE_NONCE_LEN] = {0};
    cl_store_frame_begin(&b, CL_STORE_OP_HELLO, 0, 0);
    cl_store_put_u8(&b, 0);
    cl_store_put_bytes(&b, nonce, sizeof nonce);
    assert_int_equal(cl_store_frame_end(&b, 0), COLLIE_OK);
    raw_send(fd, b.p, b.len);
    cl_store_wbuf_fini(&b);
}

/* ---- a child collie-store
 * ------------------------------------------------------------------------ */

typedef struct child {
    pid_t pid;
    int out; /* its stdout */
    uint16_t port;
} child;

/* Start collie-store with args (NULL-terminated, after argv[0]). Returns
 * false if it exited before printing its address. */
static bool child_start(child *c, const char *const *args) {
    char bin[600];
    fx_store_binary(bin, sizeof bin);
    int pfd[2];
    assert_int_equal(pipe2(pfd, O_CLOEXEC), 0);
    const char *argv[16] = {bin};
    for (int i = 0; args[i] && i < 14; i++)
        argv[i + 1] = args[i];
    c->pid = fork();
    assert_true(c->pid >= 0);
    if (c->pid == 0) {
        dup2(pfd[1], 1);
        int devnull = open("/dev/null", O_WRONLY);
        if (!getenv("STORE_TEST_VERBOSE")) dup2(devnull, 2);
        execvp(bin, (char *const *)argv);
        _exit(127);
    }
    close(pfd[1]);
    c->out = pfd[0];
    char line[256];
    size_t n = 0;
    int64_t until = fx_now_ms() + FX_WAIT_MS;
    while (n < sizeof line - 1 && fx_now_ms() < until) {
        struct pollfd p = {c->out, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t r = read(c->out, line + n, sizeof line - 1 - n);
        if (r <= 0) break;
        n += (size_t)r;
        line[n] = '\0';
        if (strchr(line, '\n')) break;
    }
    line[n] = '\0';
    const char *p = strstr(line, "collie-store listening on 127.0.0.1:");
    if (!p) return false;
    c->port = (uint16_t)atoi(p + strlen("collie-store listening on 127.0.0.1:"));
    return c->port != 0;
}

/* Wait (bounded) for the child to exit; returns its exit status, or -signal. */
static int child_wait(child *c, int ms) {
    int64_t until = fx_now_ms() + ms;
    int st = 0;
    while (fx_now_ms() < until) {
        pid_t r = waitpid(c->pid, &st, WNOHANG);
        if (r == c->pid) {
            if (c->out >= 0) close(c->out);
            c->out = -1;
            return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        }
        fx_sleep_ms(5);
    }
    kill(c->pid, SIGKILL);
    waitpid(c->pid, &st, 0);
    fail_msg("collie-store (pid %d) did not exit within %d ms", (int)c->pid, ms);
    return 0;
}

/* Run collie-store with args to completion; its exit status. */
static int child_run(const char *const *args) {
    child c = {0};
    bool started = child_start(&c, args);
    if (started) kill(c.pid, SIGTERM);
    return child_wait(&c, FX_WAIT_MS);
}

/* ---- the server goes away
 * ---------------------------------------------------------------------------- */

static void test_server_destroyed_mid_wait(void **state) {
    (void)state;
    store_fx fx;
    fx_start(&fx, NULL, NULL);
    collie_work *w = NULL, *w2 = NULL;
    assert_int_equal(collie_store_post_get(fx.st, "k", NULL, &w), COLLIE_OK);
    assert_int_equal(collie_store_post_barrier(fx.st, "b", 3, NULL, &w2), COLLIE_OK);
    assert_true(FX_EVENTUALLY(fx_server_waits(fx.e, fx.srv) == 2));
    int64_t t0 = fx_now_ms();
    collie_store_server_destroy(fx.srv);
    fx.srv = NULL;
    assert_int_equal(fx_wait(w), COLLIE_EPEER);
    assert_int_equal(fx_wait(w2), COLLIE_EPEER);
    assert_true(fx_now_ms() - t0 < 2000);
    const char *msg = collie_work_error_message(w);
    assert_non_null(strstr(msg, fx.addr));
    assert_non_null(strstr(msg, "closed the connection"));
    collie_work_release(w);
    collie_work_release(w2);
    /* with no server, a new request waits for it, bounded by its deadline */
    void *v = NULL;
    assert_int_equal(collie_store_get(fx.st, "k", 200, &v, NULL), COLLIE_ETIMEDOUT);
    assert_non_null(strstr(collie_last_error(), "Connection refused"));
    assert_non_null(strstr(collie_last_error(), fx.addr));
    fx_stop(&fx);
}

static void test_unreachable_times_out(void **state) {
    (void)state;
    collie_engine *e = fx_engine();
    /* a port nobody listens on: take one and close it */
    collie_store_server *tmp = fx_server(e, 0, NULL);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", collie_store_server_port(tmp));
    collie_store_server_destroy(tmp);
    collie_store *st = fx_client(e, addr, NULL, FX_WAIT_MS);
    int64_t t0 = fx_now_ms();
    assert_int_equal(collie_store_set(st, "k", "v", 1, 300), COLLIE_ETIMEDOUT);
    int64_t took = fx_now_ms() - t0;
    assert_true(took >= 290 && took < 3000);
    const char *msg = collie_last_error();
    assert_non_null(strstr(msg, "store.set"));
    assert_non_null(strstr(msg, addr));
    char want[96]; /* the address that refused, as well as the one asked for */
    snprintf(want, sizeof want, "connect to %s: Connection refused", addr);
    assert_non_null(strstr(msg, want));
    collie_store_destroy(st);
    assert_int_equal(collie_engine_destroy(e), COLLIE_OK);
}

static void test_reconnect_same_port(void **state) {
    (void)state;
    store_fx fx;
    fx_start(&fx, NULL, NULL);
    uint16_t port = collie_store_server_port(fx.srv);
    assert_int_equal(collie_store_set(fx.st, "k", "1", 1, 2000), COLLIE_OK);
    collie_store_server_destroy(fx.srv);

    /* idle client, server back: the next request reconnects lazily */
    fx.srv = fx_server(fx.e, port, NULL);
    assert_int_equal(collie_store_set(fx.st, "k", "2", 1, 5000), COLLIE_OK);
    void *v = NULL;
    assert_int_equal(collie_store_get(fx.st, "k", 2000, &v, NULL), COLLIE_OK);
    assert_string_equal(v, "2");
    free(v);
    collie_store_server_destroy(fx.srv);

    /* requests posted while the server is down wait and go through when it returns */
    collie_work *set = NULL, *get = NULL;
    assert_int_equal(collie_store_post_set(fx.st, "k", "3", 1, NULL, &set), COLLIE_OK);
    assert_int_equal(collie_store_post_get(fx.st, "k", NULL, &get), COLLIE_OK);
    fx_sleep_ms(150); /* several refused attempts with backoff */
    assert_false(collie_work_test(set));
    fx.srv = fx_server(fx.e, port, NULL);
    assert_int_equal(fx_wait(set), COLLIE_OK);
    assert_int_equal(fx_wait(get), COLLIE_OK);
    const void *p;
    size_t len;
    assert_int_equal(collie_store_work_value(get, &p, &len), COLLIE_OK);
    assert_string_equal(p, "3");
    collie_work_release(set);
    collie_work_release(get);
    fx_stop(&fx);
}

static void test_store_process_killed_mid_wait(void **state) {
    (void)state;
    child c = {0};
    const char *args[] = {"--bind", "127.0.0.1", "--port", "0", NULL};
    assert_true(child_start(&c, args));
    collie_engine *e = fx_engine();
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", c.port);
    collie_store *st = fx_client(e, addr, NULL, FX_WAIT_MS);
    assert_int_equal(collie_store_set(st, "k", "v", 1, 2000), COLLIE_OK);
    collie_work *w = NULL;
    assert_int_equal(collie_store_post_get(st, "never", NULL, &w), COLLIE_OK);
    fx_sleep_ms(50); /* let it reach the server */
    kill(c.pid, SIGKILL);
    assert_int_equal(child_wait(&c, FX_WAIT_MS), -SIGKILL);
    assert_int_equal(fx_wait(w), COLLIE_EPEER);
    assert_non_null(strstr(collie_work_error_message(w), addr));
    collie_work_release(w);
    collie_store_destroy(st);
    assert_int_equal(collie_engine_destroy(e), COLLIE_OK);
}

/* ---- the collie-store binary
 * ------------------------------------------------------------------------ */

static void test_store_process_sigterm_and_usage(void **state) {
    (void)state;
    child c = {0};
    const char *args[] = {"--bind", "127.0.0.1", "--port", "0", NULL};
    assert_true(child_start(&c, args));
    collie_engine *e = fx_engine();
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", c.port);
    collie_store *st = fx_client(e, addr, NULL, FX_WAIT_MS);
    assert_int_equal(collie_store_set(st, "k", "v", 1, 2000), COLLIE_OK);
    collie_work *w = NULL;
    assert_int_equal(collie_store_post_get(st, "never", NULL, &w), COLLIE_OK);
    fx_sleep_ms(50);
    kill(c.pid, SIGTERM);
    assert_int_equal(child_wait(&c, 5000), 0); /* clean exit */
    assert_int_equal(fx_wait(w), COLLIE_EPEER);
    collie_work_release(w);
    collie_store_destroy(st);
    assert_int_equal(collie_engine_destroy(e), COLLIE_OK);

    const char *none[] = {NULL};
    const char *bad_port[] = {"--port", "70000", NULL};
    const char *bad_opt[] = {"--port", "0", "--frobnicate", NULL};
    const char *extra[] = {"--port", "0", "extra", NULL};
    const char *no_val[] = {"--port", NULL};
    const char *bad_lim[] = {"--port", "0", "--max-keys", "0", NULL};
    assert_int_equal(child_run(none), 2);
    assert_int_equal(child_run(bad_port), 2);
    assert_int_equal(child_run(bad_opt), 2);
    assert_int_equal(child_run(extra), 2);
    assert_int_equal(child_run(no_val), 2);
    assert_int_equal(child_run(bad_lim), 2);
    /* not ours (--insecure: beyond loopback without a token is a usage error) */
    const char *bad_bind[] = {"--bind", "192.0.2.1", "--port", "0", "--insecure", NULL};
    const char *no_token[] = {"--bind", "192.0.2.1", "--port", "0", NULL};
    const char *no_file[] = {"--port", "0", "--token-file", "/nonexistent/token", NULL};
    assert_int_equal(child_run(bad_bind), 1);
    assert_int_equal(child_run(no_token), 2);
    assert_int_equal(child_run(no_file), 1);
    const char *help[] = {"--help", NULL};
    assert_int_equal(child_run(help), 0);
}

static void test_store_process_token_file(void **state) {
    (void)state;
    char path[] = "/tmp/collie-store-token-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "s3cret\n", 7), 7);
    close(fd);
    child c = {0};
    const char *args[] = {"--bind", "127.0.0.1", "--port", "0", "--token-file", path, NULL};
    assert_true(child_start(&c, args));
    collie_engine *e = fx_engine();
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", c.port);
    collie_store *good = fx_client(e, addr, "s3cret", FX_WAIT_MS);
    collie_store *anon = fx_client(e, addr, NULL, FX_WAIT_MS);
    assert_int_equal(collie_store_set(good, "k", "v", 1, 2000), COLLIE_OK);
    assert_int_equal(collie_store_set(anon, "k", "v", 1, 2000), COLLIE_EAUTH);
    collie_store_destroy(good);
    collie_store_destroy(anon);
    assert_int_equal(collie_engine_destroy(e), COLLIE_OK);
    kill(c.pid, SIGTERM);
    assert_int_equal(child_wait(&c, 5000), 0);
    unlink(path);
}

/* ---- hostile input on the server port
 * ------------------------------------------------------------------ */

static void test_garbage_closes_only_that_connection(void **state) {
    (void)state;
    store_fx fx;
    fx_start(&fx, NULL, NULL);
    uint16_t port = collie_store_server_port(fx.srv);
    /* a well-behaved client with a request held by the server */
    collie_work *w = NULL;
    assert_int_equal(collie_store_post_get(fx.st, "k", NULL, &w), COLLIE_OK);
    assert_true(FX_EVENTUALLY(fx_server_waits(fx.e, fx.srv) == 1));

    srand(7);
    for (int round = 0; round < 5; round++) {
        int fd = raw_connect(port);
        uint8_t junk[4096];
        for (size_t i = 0; i < sizeof junk; i++)
            junk[i] = (uint8_t)rand();
        raw_send(fd, junk, sizeof junk);
        assert_true(raw_closed_within(fd, 2000));
        close(fd);
    }
    /* junk after a valid handshake is refused too */
    int fd = raw_connect(port);
    raw_hello(fd);
    uint8_t junk[64];
    memset(junk, 0xAB, sizeof junk);
    raw_send(fd, junk, sizeof junk);
    assert_true(raw_closed_within(fd, 2000));
    close(fd);

    assert_true(FX_EVENTUALLY(collie_store_server_num_connections(fx.srv) == 1));
    assert_false(collie_work_test(w));
    collie_store *other = fx_client(fx.e, fx.addr, NULL, FX_WAIT_MS);
    assert_int_equal(collie_store_set(other, "k", "v", 1, 2000), COLLIE_OK);
    assert_int_equal(fx_wait(w), COLLIE_OK);
    collie_work_release(w);
    collie_store_destroy(other);
    fx_stop(&fx);
}

static void test_oversized_and_malformed_frames(void **state) {
    (void)state;
    store_fx fx;
    collie_store_server_opts so = COLLIE_STORE_SERVER_OPTS_INIT;
    so.max_value_size = 1u << 20;
    fx_start(&fx, &so, NULL);
    uint16_t port = collie_store_server_port(fx.srv);
    uint8_t hdr[CL_STORE_HDR_LEN];

    /* an oversized length prefix is refused from the header alone */
    int fd = raw_connect(port);
    raw_hello(fd);
    put_hdr(hdr, CL_STORE_OP_SET, 512u << 20);
    raw_send(fd, hdr, sizeof hdr);
    assert_true(raw_closed_within(fd, 2000));
    close(fd);

    /* before the handshake, even a modest frame is too big */
    fd = raw_connect(port);
    put_hdr(hdr, CL_STORE_OP_HELLO, 4096);
    raw_send(fd, hdr, sizeof hdr);
    assert_true(raw_closed_within(fd, 2000));
    close(fd);

    /* a request without the handshake */
    fd = raw_connect(port);
    uint8_t frame[CL_STORE_HDR_LEN + 8] = {0};
    put_hdr(frame, CL_STORE_OP_GET, 8);
    frame[CL_STORE_HDR_LEN] = 4; /* key length 4 */
    raw_send(fd, frame, sizeof frame);
    assert_true(raw_closed_within(fd, 2000));
    close(fd);

    /* truncated fields: a key length pointing past the body */
    fd = raw_connect(port);
    raw_hello(fd);
    put_hdr(frame, CL_STORE_OP_SET, 8);
    memset(frame + CL_STORE_HDR_LEN, 0, 8);
    frame[CL_STORE_HDR_LEN] = 200;
    raw_send(fd, frame, sizeof frame);
    assert_true(raw_closed_within(fd, 2000));
    close(fd);

    /* a reply frame sent to the server, a bad version */
    fd = raw_connect(port);
    raw_hello(fd);
    put_hdr(hdr, CL_STORE_OP_NUM_KEYS | CL_STORE_OP_REPLY, 0);
    raw_send(fd, hdr, sizeof hdr);
    assert_true(raw_closed_within(fd, 2000));
    close(fd);
    /* a client of another protocol version is told why, then closed */
    fd = raw_connect(port);
    put_hdr(hdr, CL_STORE_OP_HELLO, 0);
    hdr[2] = CL_STORE_PROTO_VERSION + 1;
    raw_send(fd, hdr, sizeof hdr);
    struct pollfd pfd = {fd, POLLIN, 0};
    assert_int_equal(poll(&pfd, 1, 2000), 1);
    uint8_t reply[CL_STORE_HDR_LEN];
    assert_int_equal(recv(fd, reply, sizeof reply, MSG_WAITALL), (ssize_t)sizeof reply);
    cl_store_hdr rh;
    assert_int_equal(cl_store_hdr_decode(reply, 1024, &rh, NULL, 0), COLLIE_OK);
    assert_int_equal(rh.op, CL_STORE_OP_HELLO | CL_STORE_OP_REPLY);
    assert_int_equal(rh.status, COLLIE_EPROTO);
    assert_true(raw_closed_within(fd, 2000));
    close(fd);

    /* a request within limits that the table refuses only gets an error reply */
    assert_true(FX_EVENTUALLY(collie_store_server_num_connections(fx.srv) == 0));
    char *big = calloc(1, (1u << 20) + 1);
    assert_int_equal(collie_store_set(fx.st, "big", big, (1u << 20) + 1, 2000), COLLIE_ELIMIT);
    free(big);
    /* and the server keeps serving */
    assert_int_equal(collie_store_set(fx.st, "k", "v", 1, 2000), COLLIE_OK);
    assert_int_equal(collie_store_server_num_connections(fx.srv), 1);
    fx_stop(&fx);
}

static void test_connection_limit(void **state) {
    (void)state;
    store_fx fx;
    collie_store_server_opts so = COLLIE_STORE_SERVER_OPTS_INIT;
    so.max_connections = 1;
    fx_start(&fx, &so, NULL);
    assert_int_equal(collie_store_set(fx.st, "k", "v", 1, 2000), COLLIE_OK);
    collie_store *second = fx_client(fx.e, fx.addr, NULL, FX_WAIT_MS);
    assert_int_equal(collie_store_set(second, "k", "w", 1, 300), COLLIE_ETIMEDOUT);
    assert_non_null(strstr(collie_last_error(), "closed the connection"));
    void *v = NULL;
    assert_int_equal(collie_store_get(fx.st, "k", 2000, &v, NULL), COLLIE_OK);
    assert_string_equal(v, "v");
    free(v);
    collie_store_destroy(second);
    fx_stop(&fx);
}

/* ---- authentication
 * ---------------------------------------------------------------------------------- */

/* Capture what collie logs (stderr) while `body` runs. */
typedef struct log_capture {
    int saved;
    char path[64];
} log_capture;

static void capture_begin(log_capture *lc) {
    snprintf(lc->path, sizeof lc->path, "/tmp/collie-store-log-XXXXXX");
    int fd = mkstemp(lc->path);
    assert_true(fd >= 0);
    fflush(stderr);
    lc->saved = dup(2);
    dup2(fd, 2);
    close(fd);
}

static char *capture_end(log_capture *lc) {
    fflush(stderr);
    dup2(lc->saved, 2);
    close(lc->saved);
    FILE *f = fopen(lc->path, "r");
    assert_non_null(f);
    char *text = calloc(1, 65536);
    size_t n = fread(text, 1, 65535, f);
    text[n] = '\0';
    fclose(f);
    unlink(lc->path);
    return text;
}

/* An address that refuses connections is said while the request waits:
 * at the first failure and every 5 s, not only at the request's deadline. */
static void test_refusing_address_is_logged_while_waiting(void **state) {
    (void)state;
    collie_engine *e;
    assert_int_equal(collie_engine_create(NULL, &e), COLLIE_OK);
    /* a port bound but not listening: connections are refused, and no other
     * program can start listening there meanwhile */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sin;
    assert_int_equal(bind(fd, (struct sockaddr *)&sin, sizeof sin), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sin, &len), 0);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)ntohs(sin.sin_port));
    log_capture lc;
    capture_begin(&lc);
    collie_store *st;
    assert_int_equal(collie_store_connect(e, addr, NULL, &st), COLLIE_OK);
    void *v = NULL;
    int rc = collie_store_get(st, "k", 6500, &v, NULL);
    char *log = capture_end(&lc);
    assert_int_equal(rc, COLLIE_ETIMEDOUT);
    char first[128], later[128];
    snprintf(first, sizeof first, "client of %s:", addr);
    snprintf(later, sizeof later, "client of %s: still no connection after ", addr);
    if (!strstr(log, first) || !strstr(log, "retrying") || !strstr(log, later))
        fail_msg("log (%zu bytes): %.3000s", strlen(log), log);
    free(log);
    collie_store_destroy(st);
    collie_engine_destroy(e);
    close(fd);
}

static void test_auth_success_and_refusals(void **state) {
    (void)state;
    store_fx fx;
    collie_store_server_opts so = COLLIE_STORE_SERVER_OPTS_INIT;
    so.token = "right token";
    fx_start(&fx, &so, "right token");
    assert_int_equal(collie_store_set(fx.st, "k", "v", 1, 2000), COLLIE_OK);

    log_capture lc;
    capture_begin(&lc);
    collie_store *wrong = fx_client(fx.e, fx.addr, "wrong token", FX_WAIT_MS);
    int rc_wrong = collie_store_set(wrong, "k", "x", 1, 2000);
    char msg_wrong[512];
    snprintf(msg_wrong, sizeof msg_wrong, "%s", collie_last_error());
    collie_store *none = fx_client(fx.e, fx.addr, NULL, FX_WAIT_MS);
    int rc_none = collie_store_set(none, "k", "x", 1, 2000);
    char msg_none[512];
    snprintf(msg_none, sizeof msg_none, "%s", collie_last_error());
    /* the server logs each refusal (it needs a moment to read the last frame) */
    fx_sleep_ms(100);
    char *log = capture_end(&lc);

    assert_int_equal(rc_wrong, COLLIE_EAUTH);
    assert_non_null(strstr(msg_wrong, "tokens differ"));
    assert_non_null(strstr(msg_wrong, fx.addr));
    assert_int_equal(rc_none, COLLIE_EAUTH);
    assert_non_null(strstr(msg_none, "requires a token"));
    assert_non_null(strstr(log, "client 127.0.0.1:"));
    assert_non_null(strstr(log, "tokens differ"));
    /* refusals are logged at most once per 5 s (an outsider must not flood
     * the log): the second is only counted, in the next line logged */
    assert_null(strstr(log, "has no token"));
    free(log);
    /* refusals do not disturb the authenticated client or the data */
    void *v = NULL;
    assert_int_equal(collie_store_get(fx.st, "k", 2000, &v, NULL), COLLIE_OK);
    assert_string_equal(v, "v");
    free(v);
    /* a refused handle tries again on its next request (and is refused again) */
    assert_int_equal(collie_store_set(wrong, "k", "x", 1, 2000), COLLIE_EAUTH);
    collie_store_destroy(wrong);
    collie_store_destroy(none);
    assert_true(FX_EVENTUALLY(collie_store_server_num_connections(fx.srv) == 1));
    fx_stop(&fx);
}

static void test_auth_token_against_tokenless_server(void **state) {
    (void)state;
    store_fx fx;
    fx_start(&fx, NULL, "a token");
    int rc = collie_store_set(fx.st, "k", "v", 1, 2000);
    assert_int_equal(rc, COLLIE_EAUTH);
    assert_non_null(strstr(collie_last_error(), "does not use authentication"));
    /* nothing was stored */
    collie_store *anon = fx_client(fx.e, fx.addr, NULL, FX_WAIT_MS);
    int64_t n = -1;
    assert_int_equal(collie_store_num_keys(anon, 2000, &n), COLLIE_OK);
    assert_int_equal(n, 0);
    collie_store_destroy(anon);
    fx_stop(&fx);
}

/* ---- nothing left behind
 * ------------------------------------------------------------------------------ */

static void test_nothing_left_outstanding(void **state) {
    (void)state;
    fx_baseline_check();
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    fx_baseline_take();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_server_destroyed_mid_wait),
        cmocka_unit_test(test_unreachable_times_out),
        cmocka_unit_test(test_reconnect_same_port),
        cmocka_unit_test(test_store_process_killed_mid_wait),
        cmocka_unit_test(test_store_process_sigterm_and_usage),
        cmocka_unit_test(test_store_process_token_file),
        cmocka_unit_test(test_garbage_closes_only_that_connection),
        cmocka_unit_test(test_oversized_and_malformed_frames),
        cmocka_unit_test(test_connection_limit),
        cmocka_unit_test(test_refusing_address_is_logged_while_waiting),
        cmocka_unit_test(test_auth_success_and_refusals),
        cmocka_unit_test(test_auth_token_against_tokenless_server),
        cmocka_unit_test(test_nothing_left_outstanding),
    };
    return cltest_main(tests, NULL, NULL);
}
