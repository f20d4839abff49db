/*
 * test_shm_ring.c — the shared-memory byte ring (transports/cpu/shm/ring.c):
 * order across the wrap, full and empty, what attach refuses, a corrupt
 * peer's counters, a byte stream between two processes over a memfd, and
 * parking with doorbells under a tiny-message storm between two threads
 * (a lost wake-up shows as a doorbell wait running past its bound).
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "runner.h"
#include "transports/cpu/shm/ring.h"

#define CAP 4096u

static void *ring_mem(uint64_t cap) {
    void *m = NULL;
    assert_int_equal(posix_memalign(&m, CL_SHM_CACHELINE, cl_shm_ring_bytes(cap)), 0);
    return m;
}

/* byte i of the test stream */
static uint8_t pattern(uint64_t i) { return (uint8_t)((i * 2654435761u) >> 13); }

static void test_order_across_the_wrap(void **state) {
    (void)state;
    void *mem = ring_mem(CAP);
    cl_shm_ring w, r;
    assert_int_equal(cl_shm_ring_init(&w, mem, CAP), COLLIE_OK);
    assert_int_equal(cl_shm_ring_attach(&r, mem, cl_shm_ring_bytes(CAP)), COLLIE_OK);
    uint64_t sent = 0, got = 0;
    uint8_t out[3000], in[3000];
    const size_t sizes[] = {1000, 3000, 7, 2999, 4096, 1, 2048};
    for (int round = 0; round < 50; round++) {
        size_t n = sizes[round % 7] % sizeof out + 1;
        for (size_t i = 0; i < n; i++)
            out[i] = pattern(sent + i);
        /* two iovecs, split in the middle */
        struct iovec iov[2] = {{out, n / 2}, {out + n / 2, n - n / 2}};
        size_t wrote = cl_shm_ring_writev(&w, iov, 2);
        assert_true(wrote <= n);
        sent += wrote;
        size_t take = cl_shm_ring_read(&r, in, sizeof in);
        for (size_t i = 0; i < take; i++)
            assert_int_equal(in[i], pattern(got + i));
        got += take;
    }
    while (got < sent) {
        size_t take = cl_shm_ring_read(&r, in, sizeof in);
        assert_true(take > 0);
        for (size_t i = 0; i < take; i++)
            assert_int_equal(in[i], pattern(got + i));
        got += take;
    }
    assert_true(sent > 10 * CAP); /* it wrapped many times */
    free(mem);
}

static void test_full_and_empty(void **state) {
    (void)state;
    void *mem = ring_mem(CAP);
    cl_shm_ring r;
    assert_int_equal(cl_shm_ring_init(&r, mem, CAP), COLLIE_OK);
    static uint8_t buf[2 * CAP];
    assert_int_equal(cl_shm_ring_readable(&r), 0);
    assert_int_equal(cl_shm_ring_read(&r, buf, 10), 0);
    struct iovec iov = {buf, sizeof buf};
    assert_int_equal(cl_shm_ring_writev(&r, &iov, 1), CAP); /* only what fits */
    assert_int_equal(cl_shm_ring_writable(&r), 0);
    assert_int_equal(cl_shm_ring_writev(&r, &iov, 1), 0);
    assert_int_equal(cl_shm_ring_readable(&r), CAP);
    assert_int_equal(cl_shm_ring_read(&r, buf, sizeof buf), CAP);
    assert_int_equal(cl_shm_ring_writable(&r), CAP);
    free(mem);
}

static void test_bad_layouts_are_refused(void **state) {
    (void)state;
    assert_int_equal(cl_shm_ring_bytes(4095), 0);
    assert_int_equal(cl_shm_ring_bytes(6000), 0);
    assert_int_equal(cl_shm_ring_bytes(0), 0);
    void *mem = ring_mem(CAP);
    cl_shm_ring r;
    assert_int_equal(cl_shm_ring_init(&r, mem, 5000), COLLIE_EINVAL);
    assert_int_equal(cl_shm_ring_init(&r, (uint8_t *)mem + 8, CAP), COLLIE_EINVAL);
    assert_int_equal(cl_shm_ring_init(&r, mem, CAP), COLLIE_OK);
    size_t bytes = cl_shm_ring_bytes(CAP);
    assert_int_equal(cl_shm_ring_attach(&r, mem, bytes - 1), COLLIE_EPROTO); /* too small */
    cl_shm_ring_shared *sh = mem;
    sh->capacity = 3000; /* not a power of two */
    assert_int_equal(cl_shm_ring_attach(&r, mem, bytes), COLLIE_EPROTO);
    sh->capacity = 2 * CAP; /* more than the memory */
    assert_int_equal(cl_shm_ring_attach(&r, mem, bytes), COLLIE_EPROTO);
    sh->capacity = CAP;
    atomic_store(&sh->head, 3 * CAP); /* more in it than it holds */
    assert_int_equal(cl_shm_ring_attach(&r, mem, bytes), COLLIE_EPROTO);
    atomic_store(&sh->head, 0);
    assert_int_equal(cl_shm_ring_attach(&r, mem, bytes), COLLIE_OK);
    free(mem);
}

/* Counters a peer corrupted fail every read and write with EPROTO (never
 * a silent "empty" or "full": a stall until the deadline), and go on
 * failing; nothing moves; a corrupt ring does not sleep. */
static void test_corrupt_counters_are_refused(void **state) {
    (void)state;
    void *mem = ring_mem(CAP);
    cl_shm_ring r;
    assert_int_equal(cl_shm_ring_init(&r, mem, CAP), COLLIE_OK);
    uint8_t buf[64];
    struct iovec iov = {buf, sizeof buf};
    /* a peer that wrote a nonsense head (more than the capacity ahead) */
    atomic_store(&r.sh->head, 5 * CAP);
    assert_int_equal(cl_shm_ring_readable(&r), 0);
    assert_int_equal(cl_shm_ring_writable(&r), 0);
    assert_false(cl_shm_ring_sane(&r));
    assert_false(cl_shm_ring_reader_park(&r));
    assert_false(cl_shm_ring_writer_park(&r, 1));
    errno = 0;
    assert_int_equal(cl_shm_ring_read(&r, buf, sizeof buf), -1);
    assert_int_equal(errno, EPROTO);
    assert_true(r.corrupt);
    assert_int_equal(atomic_load(&r.sh->tail), 0);
    /* put right again: still refused (the stream is broken) */
    atomic_store(&r.sh->head, 0);
    assert_int_equal(cl_shm_ring_read(&r, buf, sizeof buf), -1);
    assert_int_equal(cl_shm_ring_writev(&r, &iov, 1), -1);
    /* a tail ahead of head, seen by a fresh view */
    assert_int_equal(cl_shm_ring_attach(&r, mem, cl_shm_ring_bytes(CAP)), COLLIE_OK);
    atomic_store(&r.sh->head, 10);
    atomic_store(&r.sh->tail, 20);
    errno = 0;
    assert_int_equal(cl_shm_ring_writev(&r, &iov, 1), -1);
    assert_int_equal(errno, EPROTO);
    assert_int_equal(atomic_load(&r.sh->head), 10);
    /* the pure check */
    assert_int_equal(cl_shm_ring_span(10, 20, CAP), -1);
    assert_int_equal(cl_shm_ring_span(CAP + 20, 20, CAP), CAP);
    assert_int_equal(cl_shm_ring_span(CAP + 21, 20, CAP), -1);
    assert_int_equal(cl_shm_ring_span(5, UINT64_MAX - 2, CAP), 8); /* across the wrap */
    free(mem);
}

/* An empty iovec (a NULL base with no bytes, as a frame without payload
 * may give) is skipped, not handed to memcpy (UBSan: a null argument). */
static void test_empty_iovecs_are_skipped(void **state) {
    (void)state;
    void *mem = ring_mem(CAP);
    cl_shm_ring r;
    assert_int_equal(cl_shm_ring_init(&r, mem, CAP), COLLIE_OK);
    uint8_t out[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, in[16];
    struct iovec iov[3] = {{NULL, 0}, {out, sizeof out}, {NULL, 0}};
    assert_int_equal(cl_shm_ring_writev(&r, iov, 3), sizeof out);
    assert_int_equal(cl_shm_ring_writev(&r, iov, 1), 0);
    assert_int_equal(cl_shm_ring_read(&r, in, sizeof in), sizeof out);
    assert_memory_equal(in, out, sizeof out);
    free(mem);
}

/* The parking protocol, one interleaving at a time (deterministic: the
 * threaded tests below rarely hit the narrow windows). */
static void test_park_protocol_interleavings(void **state) {
    (void)state;
    void *mem = ring_mem(CAP);
    cl_shm_ring r;
    assert_int_equal(cl_shm_ring_init(&r, mem, CAP), COLLIE_OK);
    uint8_t b[CAP];
    struct iovec one = {b, 1}, all = {b, CAP};
    /* the reader saw empty; the writer wrote before the reader parked (no
     * flag, no bell): parking must see the data and refuse to sleep */
    assert_int_equal(cl_shm_ring_read(&r, b, 1), 0);
    assert_int_equal(cl_shm_ring_writev(&r, &one, 1), 1);
    assert_false(cl_shm_ring_wake_reader(&r));
    assert_false(cl_shm_ring_reader_park(&r));
    assert_false(cl_shm_ring_wake_reader(&r)); /* and it is not left parked */
    assert_int_equal(cl_shm_ring_read(&r, b, 1), 1);
    /* parked on empty: the next write must ring, once */
    assert_true(cl_shm_ring_reader_park(&r));
    assert_int_equal(cl_shm_ring_writev(&r, &one, 1), 1);
    assert_true(cl_shm_ring_wake_reader(&r));
    assert_false(cl_shm_ring_wake_reader(&r));
    assert_int_equal(cl_shm_ring_read(&r, b, 1), 1);
    /* the writer: full, then the reader made room before it parked */
    assert_int_equal(cl_shm_ring_writev(&r, &all, 1), CAP);
    assert_int_equal(cl_shm_ring_read(&r, b, 100), 100);
    assert_false(cl_shm_ring_wake_writer(&r));
    assert_false(cl_shm_ring_writer_park(&r, 100));
    assert_true(cl_shm_ring_writer_park(&r, 101)); /* not room enough for 101 */
    assert_int_equal(cl_shm_ring_read(&r, b, 1), 1);
    assert_true(cl_shm_ring_wake_writer(&r));
    assert_false(cl_shm_ring_wake_writer(&r));
    /* a want beyond the capacity means the whole capacity: parks until empty */
    assert_true(cl_shm_ring_writer_park(&r, 2 * CAP));
    assert_int_equal(cl_shm_ring_read(&r, b, CAP), CAP - 101);
    assert_true(cl_shm_ring_wake_writer(&r));
    assert_false(cl_shm_ring_writer_park(&r, 2 * CAP));
    free(mem);
}

/* ---- a stream with parking and doorbells (eventfds) ---------------------------------- */

#define STREAM_BYTES (8u << 20)
#define DOORBELL_MS  5000 /* a lost wake-up shows as a wait this long */

typedef struct stream_side {
    cl_shm_ring ring;
    int bell_reader, bell_writer; /* eventfds: wake the consumer / the producer */
    uint64_t total;
    size_t max_chunk;
    int parks; /* how often this side slept */
} stream_side;

static void ring_bell(int fd) {
    uint64_t one = 1;
    ssize_t n = write(fd, &one, sizeof one);
    (void)n;
}

/* Wait for the doorbell; false if it did not ring within DOORBELL_MS. */
static bool wait_bell(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int rc;
    do
        rc = poll(&p, 1, DOORBELL_MS);
    while (rc < 0 && errno == EINTR);
    if (rc != 1) return false;
    uint64_t v;
    ssize_t n = read(fd, &v, sizeof v);
    (void)n;
    return true;
}

/* Producer: the pattern in chunks of 1..max_chunk bytes (three iovecs). */
static bool produce(stream_side *s) {
    static _Thread_local uint8_t buf[1 << 16];
    uint64_t sent = 0, rnd = 88172645463325252ull;
    while (sent < s->total) {
        rnd ^= rnd << 13, rnd ^= rnd >> 7, rnd ^= rnd << 17;
        size_t n = 1 + (size_t)(rnd % s->max_chunk);
        if (n > s->total - sent) n = (size_t)(s->total - sent);
        for (size_t i = 0; i < n; i++)
            buf[i] = pattern(sent + i);
        size_t off = 0;
        while (off < n) {
            size_t a = (n - off) / 3, b = (n - off) / 3;
            struct iovec iov[3] = {
                {buf + off, a}, {buf + off + a, b}, {buf + off + a + b, n - off - a - b}};
            size_t wrote = cl_shm_ring_writev(&s->ring, iov, 3);
            if (wrote > 0) {
                off += wrote;
                if (cl_shm_ring_wake_reader(&s->ring)) ring_bell(s->bell_reader);
                continue;
            }
            if (cl_shm_ring_writer_park(&s->ring, 1)) {
                s->parks++;
                if (!wait_bell(s->bell_writer)) return false;
            }
        }
        sent += n;
    }
    return true;
}

/* Consumer: reads and checks every byte; false on a wrong byte or a lost
 * wake-up. */
static bool consume(stream_side *s) {
    static _Thread_local uint8_t buf[1 << 16];
    uint64_t got = 0;
    while (got < s->total) {
        size_t want = s->max_chunk < sizeof buf ? s->max_chunk : sizeof buf;
        size_t take = cl_shm_ring_read(&s->ring, buf, want);
        if (take > 0) {
            for (size_t i = 0; i < take; i++)
                if (buf[i] != pattern(got + i)) return false;
            got += take;
            if (cl_shm_ring_wake_writer(&s->ring)) ring_bell(s->bell_writer);
            continue;
        }
        if (cl_shm_ring_reader_park(&s->ring)) {
            s->parks++;
            if (!wait_bell(s->bell_reader)) return false;
        }
    }
    return true;
}

static void test_stream_between_two_processes(void **state) {
    (void)state;
    int mfd = memfd_create("collie-test-ring", MFD_CLOEXEC);
    assert_true(mfd >= 0);
    size_t bytes = cl_shm_ring_bytes(1 << 16);
    assert_int_equal(ftruncate(mfd, (off_t)bytes), 0);
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    assert_true(mem != MAP_FAILED);
    stream_side s = {.bell_reader = eventfd(0, EFD_CLOEXEC),
                     .bell_writer = eventfd(0, EFD_CLOEXEC),
                     .total = STREAM_BYTES,
                     .max_chunk = 40000};
    assert_true(s.bell_reader >= 0 && s.bell_writer >= 0);
    assert_int_equal(cl_shm_ring_init(&s.ring, mem, 1 << 16), COLLIE_OK);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) { /* the producer, in its own process and its own view */
        cl_shm_ring view;
        if (cl_shm_ring_attach(&view, mem, bytes) != COLLIE_OK) _exit(3);
        s.ring = view;
        _exit(produce(&s) ? 0 : 4);
    }
    bool ok = consume(&s);
    int status = reap_bounded(child, 20000);
    munmap(mem, bytes);
    close(mfd);
    close(s.bell_reader);
    close(s.bell_writer);
    assert_true(ok);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* ---- ping-pong: every message is the last one until it is answered ------------------- */

#define PINGS 20000

typedef struct pong_side {
    cl_shm_ring in, out;
    int bell_in, bell_out; /* eventfds: my doorbell, the other side's */
    int parks;
} pong_side;

/* Receive exactly len bytes, parking when the ring is empty. */
static bool pong_recv(pong_side *s, void *buf, size_t len) {
    size_t got = 0;
    while (got < len) {
        size_t n = cl_shm_ring_read(&s->in, (uint8_t *)buf + got, len - got);
        if (n > 0) {
            got += n;
            continue;
        }
        if (cl_shm_ring_reader_park(&s->in)) {
            s->parks++;
            if (!wait_bell(s->bell_in)) return false;
        }
    }
    return true;
}

static void pong_send(pong_side *s, const void *buf, size_t len) {
    struct iovec iov = {(void *)buf, len};
    size_t n = cl_shm_ring_writev(&s->out, &iov, 1);
    assert_int_equal(n, len); /* one message in flight: always room */
    if (cl_shm_ring_wake_reader(&s->out)) ring_bell(s->bell_out);
}

static void *echo_thread(void *arg) {
    pong_side *s = arg;
    for (uint64_t i = 0; i < PINGS; i++) {
        uint64_t v;
        if (!pong_recv(s, &v, sizeof v)) return NULL;
        v = ~v;
        pong_send(s, &v, sizeof v);
    }
    return arg;
}

static void test_parking_never_loses_a_wakeup(void **state) {
    (void)state;
    void *m1 = ring_mem(CAP), *m2 = ring_mem(CAP);
    pong_side a = {.bell_in = eventfd(0, EFD_CLOEXEC), .bell_out = eventfd(0, EFD_CLOEXEC)};
    assert_int_equal(cl_shm_ring_init(&a.out, m1, CAP), COLLIE_OK);
    assert_int_equal(cl_shm_ring_init(&a.in, m2, CAP), COLLIE_OK);
    pong_side b = {.in = a.out, .out = a.in, .bell_in = a.bell_out, .bell_out = a.bell_in};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, echo_thread, &b), 0);
    bool ok = true;
    for (uint64_t i = 0; i < PINGS && ok; i++) {
        uint64_t v = i * 0x9e3779b97f4a7c15ull, back = 0;
        pong_send(&a, &v, sizeof v);
        ok = pong_recv(&a, &back, sizeof back) && back == ~v;
    }
    void *res = NULL;
    pthread_join(t, &res); /* bounded: a parked side gives up after DOORBELL_MS */
    close(a.bell_in);
    close(a.bell_out);
    free(m1);
    free(m2);
    assert_true(ok);
    assert_non_null(res);
    print_message("    parks: %d and %d in %d round trips\n", a.parks, b.parks, PINGS);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_across_the_wrap),
        cmocka_unit_test(test_full_and_empty),
        cmocka_unit_test(test_bad_layouts_are_refused),
        cmocka_unit_test(test_corrupt_counters_are_refused),
        cmocka_unit_test(test_empty_iovecs_are_skipped),
        cmocka_unit_test(test_park_protocol_interleavings),
        cmocka_unit_test(test_stream_between_two_processes),
        cmocka_unit_test(test_parking_never_loses_a_wakeup),
    };
    return cltest_main(tests, NULL, NULL);
}
