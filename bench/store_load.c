/*
 * store_load.c — one load shape for two key/value servers: C connections,
 * each with exactly one request outstanding (the next one goes out when
 * its reply is in), 8-byte values, for S seconds after a short warm-up.
 * It speaks collie's store protocol (store/proto.h) and Redis's RESP, from
 * one single-threaded epoll loop, so the client costs the same for both
 * and the servers are what differs.
 *
 *   store_load collie|redis HOST PORT get|add SECONDS CONNS
 *
 * "add" is collie's ADD (delta 1) and Redis's INCR. Each connection uses
 * its own key, set (get) before the clock starts. Prints one line:
 *   RESULT proto=P op=O conns=C seconds=S ops=N ops_per_s=R client_cpu_s=T
 * where client_cpu_s is this process's user + system time while measuring.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "store/proto.h"

#define MAX_CONNS 1024
#define VALUE     "12345678"

typedef struct conn {
    int fd;
    uint8_t req[128], rbuf[256];
    size_t req_len, rlen;
} conn;

static bool redis;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static void die(const char *what) {
    fprintf(stderr, "store_load: %s: %s\n", what, strerror(errno));
    exit(1);
}

/* ---- building requests ------------------------------------------------------- */

static size_t collie_frame(uint8_t *out, size_t cap, uint8_t op, const char *key, int64_t delta,
                           const char *val) {
    cl_store_wbuf b = {0};
    cl_store_frame_begin(&b, op, 1, 0);
    if (op == CL_STORE_OP_HELLO) {
        uint8_t nonce[CL_STORE_NONCE_LEN] = {0};
        cl_store_put_u8(&b, 0);
        cl_store_put_bytes(&b, nonce, sizeof nonce);
    } else {
        cl_store_put_bytes(&b, key, strlen(key));
        if (op == CL_STORE_OP_ADD) cl_store_put_i64(&b, delta);
        if (op == CL_STORE_OP_SET) cl_store_put_bytes(&b, val, strlen(val));
    }
    if (cl_store_frame_end(&b, 0) != 0 || b.len > cap) {
        fprintf(stderr, "store_load: cannot build a request\n");
        exit(1);
    }
    memcpy(out, b.p, b.len);
    size_t n = b.len;
    cl_store_wbuf_fini(&b);
    return n;
}

static size_t redis_cmd(uint8_t *out, size_t cap, const char *cmd, const char *key,
                        const char *val) {
    int n = val ? snprintf((char *)out, cap, "*3\r\n$%zu\r\n%s\r\n$%zu\r\n%s\r\n$%zu\r\n%s\r\n",
                           strlen(cmd), cmd, strlen(key), key, strlen(val), val)
                : snprintf((char *)out, cap, "*2\r\n$%zu\r\n%s\r\n$%zu\r\n%s\r\n", strlen(cmd), cmd,
                           strlen(key), key);
    return (size_t)n;
}

/* ---- replies -------------------------------------------------------------------- */

/* Bytes of the first complete reply in buf, 0 if incomplete, -1 if it is
 * an error reply. */
static long reply_len(const uint8_t *buf, size_t len) {
    if (!redis) {
        if (len < CL_STORE_HDR_LEN) return 0;
        cl_store_hdr h;
        char why[128];
        if (cl_store_hdr_decode(buf, 1u << 20, &h, why, sizeof why) != 0) {
            fprintf(stderr, "store_load: bad reply: %s\n", why);
            exit(1);
        }
        if (len < CL_STORE_HDR_LEN + h.body_len) return 0;
        return h.status < 0 ? -1 : (long)(CL_STORE_HDR_LEN + h.body_len);
    }
    const uint8_t *eol = memchr(buf, '\n', len);
    if (!eol) return 0;
    size_t line = (size_t)(eol - buf) + 1;
    if (buf[0] == '-') return -1;
    if (buf[0] != '$') return (long)line;
    long blen = atol((const char *)buf + 1);
    if (blen < 0) return (long)line; /* nil */
    return len >= line + (size_t)blen + 2 ? (long)(line + (size_t)blen + 2) : 0;
}

static void send_all(int fd, const uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) die("send");
        p += w;
        n -= (size_t)w;
    }
}

/* Read until one complete reply is in (blocking; set-up only). */
static void await_reply(conn *c) {
    for (;;) {
        long n = reply_len(c->rbuf, c->rlen);
        if (n < 0) {
            fprintf(stderr, "store_load: the server refused a set-up request\n");
            exit(1);
        }
        if (n > 0) {
            memmove(c->rbuf, c->rbuf + n, c->rlen - (size_t)n);
            c->rlen -= (size_t)n;
            return;
        }
        ssize_t r = recv(c->fd, c->rbuf + c->rlen, sizeof c->rbuf - c->rlen, 0);
        if (r <= 0) die("recv (set-up)");
        c->rlen += (size_t)r;
    }
}

int main(int argc, char **argv) {
    if (argc != 7 || (strcmp(argv[1], "collie") && strcmp(argv[1], "redis")) ||
        (strcmp(argv[4], "get") && strcmp(argv[4], "add"))) {
        fprintf(stderr, "usage: store_load collie|redis HOST PORT get|add SECONDS CONNS\n");
        return 2;
    }
    redis = !strcmp(argv[1], "redis");
    bool get = !strcmp(argv[4], "get");
    double seconds = atof(argv[5]);
    int nconn = atoi(argv[6]);
    if (nconn < 1 || nconn > MAX_CONNS || seconds <= 0) {
        fprintf(stderr, "store_load: CONNS must be 1..%d and SECONDS > 0\n", MAX_CONNS);
        return 2;
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[3]))};
    if (inet_pton(AF_INET, argv[2], &sa.sin_addr) != 1) {
        fprintf(stderr, "store_load: HOST must be an IPv4 address\n");
        return 2;
    }
    static conn cs[MAX_CONNS];
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) die("epoll_create1");
    for (int i = 0; i < nconn; i++) {
        conn *c = &cs[i];
        c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&sa, sizeof sa) != 0) die("connect");
        int one = 1;
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        char key[32];
        snprintf(key, sizeof key, "%s/%d", get ? "k" : "c", i);
        uint8_t tmp[128];
        size_t n;
        if (!redis) { /* the handshake (a server without a token) */
            n = collie_frame(tmp, sizeof tmp, CL_STORE_OP_HELLO, NULL, 0, NULL);
            send_all(c->fd, tmp, n);
            await_reply(c);
        }
        if (get) { /* the value the gets read */
            n = redis ? redis_cmd(tmp, sizeof tmp, "SET", key, VALUE)
                      : collie_frame(tmp, sizeof tmp, CL_STORE_OP_SET, key, 0, VALUE);
            send_all(c->fd, tmp, n);
            await_reply(c);
        }
        c->req_len = redis ? redis_cmd(c->req, sizeof c->req, get ? "GET" : "INCR", key, NULL)
                           : collie_frame(c->req, sizeof c->req,
                                          get ? CL_STORE_OP_GET : CL_STORE_OP_ADD, key, 1, NULL);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev) != 0) die("epoll_ctl");
    }
    for (int i = 0; i < nconn; i++)
        send_all(cs[i].fd, cs[i].req, cs[i].req_len);
    double warm_end = now_s() + 0.2, end = warm_end + seconds, cpu0 = 0;
    long ops = 0;
    bool measuring = false;
    struct epoll_event evs[64];
    for (;;) {
        double t = now_s();
        if (!measuring && t >= warm_end) {
            measuring = true;
            ops = 0;
            cpu0 = cpu_s();
        }
        if (t >= end) break;
        int n = epoll_wait(ep, evs, 64, 100);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) die("epoll_wait");
        for (int k = 0; k < n; k++) {
            conn *c = evs[k].data.ptr;
            ssize_t r = recv(c->fd, c->rbuf + c->rlen, sizeof c->rbuf - c->rlen, 0);
            if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            if (r <= 0) die("recv (the server closed the connection?)");
            c->rlen += (size_t)r;
            long len;
            while ((len = reply_len(c->rbuf, c->rlen)) != 0) {
                if (len < 0) {
                    fprintf(stderr, "store_load: the server answered with an error\n");
                    return 1;
                }
                memmove(c->rbuf, c->rbuf + len, c->rlen - (size_t)len);
                c->rlen -= (size_t)len;
                ops++;
                send_all(c->fd, c->req, c->req_len);
            }
        }
    }
    double cpu = cpu_s() - cpu0;
    printf("RESULT proto=%s op=%s conns=%d seconds=%.1f ops=%ld ops_per_s=%.0f client_cpu_s=%.2f\n",
           argv[1], argv[4], nconn, seconds, ops, (double)ops / seconds, cpu);
    for (int i = 0; i < nconn; i++)
        close(cs[i].fd);
    close(ep);
    return 0;
}
