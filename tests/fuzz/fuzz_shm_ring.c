/*
 * fuzz_shm_ring.c — libFuzzer target: the shared-memory byte ring
 * (transports/cpu/shm/ring.c) against a hostile same-host peer.
 *
 * Design notes
 *  - What it feeds: two rings in one allocation of exactly their size (so
 *    ASan sees any byte outside them): rx, which this side consumes and
 *    the peer produces, and tx, which this side produces and the peer
 *    consumes. The input picks the capacity (4-32 KiB) and whether rx is
 *    laid out by the fuzzer and then attached (the dialer's path) or laid
 *    out by init, then it is a program of steps: the peer stores any head
 *    or tail (raw, or a small step from the current one), pokes any bytes
 *    anywhere in the memory (counters, flags, capacity, data), produces
 *    or consumes like an honest peer (its own view), and this side reads,
 *    writes (1-3 iovecs), asks readable/writable, parks and wakes. The
 *    peer's steps come between this side's calls: within a call the
 *    counters are read once (ring.c), so that is every interleaving a
 *    single-threaded target can express.
 *  - What it asserts, for each call of this side against the state the
 *    peer left (the target reads the counters itself first):
 *    sane counters (tail <= head <= tail + capacity): a read returns
 *    exactly min(asked, head - tail) bytes, equal to the ring's bytes at
 *    [tail, tail + n) in ring order, and moves tail by n; a write takes
 *    exactly min(given, room) bytes, lands them at [head, head + n) and
 *    moves head by n; readable/writable say head - tail / the room; park
 *    sleeps only on an empty (full) ring; with an honest peer the stream
 *    read is exactly the stream written, in both directions.
 *    Corrupt counters: read and write fail with -1 / EPROTO, move nothing,
 *    and keep failing (the ring is of no further use: never a silent 0,
 *    so never a stall or a loop on it); readable/writable say 0 and park
 *    does not sleep (the next call reports the error). Every call is
 *    bounded by what it moves. attach accepts only a power-of-two
 *    capacity that fits the memory and counters at most that far apart.
 *  - Seeds (fuzz_seeds, make fuzz-seeds): honest streams across the wrap,
 *    writes of 1-3 iovecs, parking and waking, an attached ring with data,
 *    a head corrupted after traffic.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "tests/fuzz/fuzz.h"

#include "collie.h"
#include "transports/cpu/shm/ring.h"

#define FZ_CHECK(cond) FUZZ_CHECK(cond, "the ring's contract")

/* byte i of an honest stream */
static uint8_t pattern(uint64_t i, uint8_t salt) {
    return (uint8_t)((i * 2654435761u) >> 11) ^ salt;
}

/* A new counter value: raw, or a small step from the current one. */
static uint64_t fz_counter(fuzz_in *in, uint64_t cur, uint64_t cap) {
    uint8_t k = fuzz_u8(in);
    switch (k % 4) {
    case 0: return fuzz_u64(in);
    case 1: return cur + (int16_t)fuzz_u16(in);
    case 2: return cur + cap + (k >> 2); /* just past the capacity */
    default: return cur - 1 - (k >> 2);  /* just behind */
    }
}

typedef struct fz_side {
    cl_shm_ring me, peer; /* this side's view; the peer's (honest) view */
    bool broken;          /* this side reported the ring corrupt */
    bool honest;          /* the peer did nothing but honest steps on it */
    uint64_t made, taken; /* honest stream: bytes produced / consumed */
} fz_side;

static bool counters_sane(const cl_shm_ring *r, uint64_t *used) {
    uint64_t head = atomic_load(&r->sh->head), tail = atomic_load(&r->sh->tail);
    *used = head - tail;
    return head - tail <= r->cap;
}

/* this side reads rx */
static void step_read(fz_side *s, size_t len) {
    cl_shm_ring *r = &s->me;
    uint64_t used, tail = atomic_load(&r->sh->tail), head = atomic_load(&r->sh->head);
    bool sane = counters_sane(r, &used);
    uint64_t want = len < used ? len : used;
    uint8_t *expect = malloc(want + 1), *buf = malloc(len + 1);
    FZ_CHECK(expect && buf);
    if (sane)
        for (uint64_t i = 0; i < want; i++)
            expect[i] = r->data[(tail + i) & r->mask];
    errno = 0;
    long n = (long)cl_shm_ring_read(r, len ? buf : NULL, len);
    if (!sane || s->broken) {
        FZ_CHECK(n == -1 && errno == EPROTO); /* never a silent 0 */
        FZ_CHECK(atomic_load(&r->sh->tail) == tail && atomic_load(&r->sh->head) == head);
        s->broken = true;
    } else {
        FZ_CHECK(n >= 0 && (uint64_t)n == want && (size_t)n <= len && (uint64_t)n <= r->cap);
        FZ_CHECK(memcmp(buf, expect, want) == 0);
        FZ_CHECK(atomic_load(&r->sh->tail) == tail + want);
        if (s->honest) {
            for (uint64_t i = 0; i < want; i++)
                FZ_CHECK(buf[i] == pattern(s->taken + i, 0x5a));
            s->taken += want;
        }
    }
    free(expect);
    free(buf);
}

/* this side writes tx: up to three iovecs of the given lengths */
static void step_write(fz_side *s, fuzz_in *in) {
    cl_shm_ring *r = &s->me;
    int niov = 1 + fuzz_u8(in) % 3;
    struct iovec iov[3];
    uint64_t total = 0;
    for (int i = 0; i < niov; i++) {
        size_t l = fuzz_u16(in) % (2 * r->cap + 1);
        uint8_t *b = malloc(l + 1);
        FZ_CHECK(b);
        for (size_t j = 0; j < l; j++)
            b[j] = pattern(s->made + total + j, 0xa5);
        iov[i] = (struct iovec){.iov_base = l ? b : NULL, .iov_len = l};
        total += l;
        if (!l) free(b);
    }
    uint64_t used, head = atomic_load(&r->sh->head), tail = atomic_load(&r->sh->tail);
    bool sane = counters_sane(r, &used);
    uint64_t room = sane ? r->cap - used : 0, want = total < room ? total : room;
    errno = 0;
    long n = (long)cl_shm_ring_writev(r, iov, niov);
    if (!sane || s->broken) {
        FZ_CHECK(n == -1 && errno == EPROTO);
        FZ_CHECK(atomic_load(&r->sh->tail) == tail && atomic_load(&r->sh->head) == head);
        s->broken = true;
    } else {
        FZ_CHECK(n >= 0 && (uint64_t)n == want && (uint64_t)n <= r->cap);
        FZ_CHECK(atomic_load(&r->sh->head) == head + want);
        uint64_t k = 0; /* the bytes landed where they belong, in order */
        for (int i = 0; i < niov && k < want; i++)
            for (size_t j = 0; j < iov[i].iov_len && k < want; j++, k++)
                FZ_CHECK(r->data[(head + k) & r->mask] == ((uint8_t *)iov[i].iov_base)[j]);
        s->made += want;
    }
    for (int i = 0; i < niov; i++)
        free(iov[i].iov_base);
}

/* the honest peer produces n bytes into rx / consumes up to n from tx */
static void peer_produce(fz_side *s, size_t n) {
    uint64_t used;
    if (!counters_sane(&s->peer, &used)) return; /* an honest peer would not */
    uint8_t *b = malloc(n + 1);
    FZ_CHECK(b);
    for (size_t i = 0; i < n; i++)
        b[i] = pattern(s->made + i, 0x5a);
    struct iovec iov = {.iov_base = b, .iov_len = n};
    long w = (long)cl_shm_ring_writev(&s->peer, &iov, 1);
    if (w > 0) s->made += (uint64_t)w;
    free(b);
}

static void peer_consume(fz_side *s, size_t n) {
    uint64_t used;
    if (!counters_sane(&s->peer, &used)) return;
    uint8_t *b = malloc(n + 1);
    FZ_CHECK(b);
    long got = (long)cl_shm_ring_read(&s->peer, b, n);
    if (got > 0 && s->honest)
        for (long i = 0; i < got; i++)
            FZ_CHECK(b[i] == pattern(s->taken + (uint64_t)i, 0xa5));
    if (got > 0) s->taken += (uint64_t)got;
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_in in = {.p = data, .len = size};
    uint8_t cfg = fuzz_u8(&in);
    uint64_t cap = (uint64_t)4096 << (cfg & 3);
    size_t rb = cl_shm_ring_bytes(cap);
    FZ_CHECK(rb == sizeof(cl_shm_ring_shared) + cap);
    uint8_t *mem = aligned_alloc(CL_SHM_CACHELINE, 2 * rb);
    FZ_CHECK(mem);
    memset(mem, 0, 2 * rb);
    fz_side rx = {.honest = true}, tx = {.honest = true};
    /* tx: laid out by this side; the peer's view of it is an attach */
    FZ_CHECK(cl_shm_ring_init(&tx.me, mem + rb, cap) == COLLIE_OK);
    FZ_CHECK(cl_shm_ring_attach(&tx.peer, mem + rb, rb) == COLLIE_OK);
    if (cfg & 4) { /* rx laid out by the peer: whatever it claims */
        cl_shm_ring_shared *sh = (cl_shm_ring_shared *)mem;
        FZ_CHECK(cl_shm_ring_init(&rx.peer, mem, cap) == COLLIE_OK);
        sh->capacity = (cfg & 8) ? fuzz_u64(&in) : cap << (fuzz_u8(&in) % 3);
        atomic_store(&sh->head, fz_counter(&in, 0, cap));
        atomic_store(&sh->tail, (cfg & 16) ? fz_counter(&in, 0, cap) : 0);
        uint64_t c = sh->capacity, h = atomic_load(&sh->head), t = atomic_load(&sh->tail);
        int rc = cl_shm_ring_attach(&rx.me, mem, rb);
        bool ok = c >= 4096 && (c & (c - 1)) == 0 && c <= ((uint64_t)1 << 40) &&
                  sizeof(cl_shm_ring_shared) + c <= rb && h - t <= c;
        FZ_CHECK(rc == (ok ? COLLIE_OK : COLLIE_EPROTO));
        if (!ok) goto out;
        FZ_CHECK(rx.me.cap == c && rx.me.data + rx.me.cap <= mem + rb);
        rx.honest = h == 0 && t == 0;
        rx.made = h; /* an honest peer carries on from there */
        rx.taken = t;
    } else {
        FZ_CHECK(cl_shm_ring_init(&rx.peer, mem, cap) == COLLIE_OK);
        FZ_CHECK(cl_shm_ring_attach(&rx.me, mem, rb) == COLLIE_OK);
    }
    for (int steps = 0; steps < 256 && fuzz_left(&in) > 0; steps++) {
        uint8_t op = fuzz_u8(&in);
        fz_side *s = (op & 0x80) ? &tx : &rx;
        cl_shm_ring_shared *sh = s->me.sh;
        switch (op & 0x0f) {
        case 0: /* the peer stores a head */
            atomic_store(&sh->head, fz_counter(&in, atomic_load(&sh->head), cap));
            s->honest = false;
            break;
        case 1: /* the peer stores a tail */
            atomic_store(&sh->tail, fz_counter(&in, atomic_load(&sh->tail), cap));
            s->honest = false;
            break;
        case 2: { /* the peer pokes bytes anywhere in the memory */
            size_t off = fuzz_u16(&in) % (2 * rb), len = fuzz_u8(&in) % 64;
            for (size_t i = 0; i < len && off + i < 2 * rb; i++)
                mem[off + i] = fuzz_u8(&in);
            rx.honest = tx.honest = false;
            break;
        }
        case 3: peer_produce(&rx, fuzz_u16(&in) % (cap + 64)); break;
        case 4: peer_consume(&tx, fuzz_u16(&in) % (cap + 64)); break;
        case 5: step_read(&rx, fuzz_u16(&in) % (cap + 64)); break;
        case 6: step_write(&tx, &in); break;
        case 7: { /* what this side would find */
            uint64_t used;
            bool sane = counters_sane(&s->me, &used);
            uint64_t rd = cl_shm_ring_readable(&s->me), wr = cl_shm_ring_writable(&s->me);
            FZ_CHECK(rd <= cap && wr <= cap);
            FZ_CHECK(cl_shm_ring_sane(&s->me) == (sane && !s->broken));
            if (sane && !s->broken)
                FZ_CHECK(rd == used && wr == cap - used);
            else
                FZ_CHECK(rd == 0 && wr == 0);
            break;
        }
        case 8: { /* this side parks as the reader of rx */
            uint64_t used;
            bool sane = counters_sane(&rx.me, &used);
            bool slept = cl_shm_ring_reader_park(&rx.me);
            FZ_CHECK(slept == (sane && !rx.broken && used == 0));
            FZ_CHECK(!slept || atomic_load(&rx.me.sh->reader_parked) != 0);
            break;
        }
        case 9: { /* ... as the writer of tx, waiting for room */
            uint64_t want = fuzz_u16(&in), used;
            bool sane = counters_sane(&tx.me, &used);
            bool slept = cl_shm_ring_writer_park(&tx.me, want);
            uint64_t w = want < cap ? want : cap;
            FZ_CHECK(slept == (sane && !tx.broken && cap - used < w));
            break;
        }
        case 10: (void)cl_shm_ring_wake_writer(&rx.me); break;
        case 11: (void)cl_shm_ring_wake_reader(&tx.me); break;
        default: { /* the peer stores a parked flag */
            _Atomic uint32_t *f = (op & 0x40) ? &sh->reader_parked : &sh->writer_parked;
            atomic_store(f, fuzz_u8(&in));
            break;
        }
        }
    }
out:
    free(mem);
    return 0;
}

/* ---- seeds: valid programs (make fuzz-seeds) ---------------------------------------- */

enum {
    R_HEAD,
    R_TAIL,
    R_POKE,
    R_PRODUCE,
    R_CONSUME,
    R_READ,
    R_WRITE,
    R_ASK,
    R_RPARK,
    R_WPARK,
    R_WAKEW,
    R_WAKER
};

static void fuzz_seeds(const char *dir) {
    fuzz_seed s = {.n = 0};
    /* an honest stream across the wrap, read in uneven pieces */
    static const unsigned rw[][2] = {
        {1000, 600}, {3000, 3400}, {4096, 100}, {50, 4096}, {4000, 4000}};
    fuzz_put8(&s, 0);
    for (size_t i = 0; i < sizeof rw / sizeof rw[0]; i++) {
        fuzz_put8(&s, R_PRODUCE), fuzz_put16(&s, rw[i][0]), fuzz_put8(&s, R_READ);
        fuzz_put16(&s, rw[i][1]);
        fuzz_put8(&s, R_ASK);
    }
    fuzz_seed_write(dir, "stream-across-the-wrap", s.b, s.n);
    /* this side writes 1-3 iovecs, the peer consumes: full, then room again */
    s.n = 0;
    fuzz_put8(&s, 1);
    fuzz_put8(&s, R_WRITE), fuzz_put8(&s, 0), fuzz_put16(&s, 5000);
    fuzz_put8(&s, R_CONSUME), fuzz_put16(&s, 3000), fuzz_put8(&s, R_ASK | 0x80);
    fuzz_put8(&s, R_WRITE), fuzz_put8(&s, 2), fuzz_put16(&s, 0), fuzz_put16(&s, 7000);
    fuzz_put16(&s, 9);
    fuzz_put8(&s, R_CONSUME), fuzz_put16(&s, 8192), fuzz_put8(&s, R_ASK | 0x80);
    fuzz_put8(&s, R_WRITE), fuzz_put8(&s, 1), fuzz_put16(&s, 4096), fuzz_put16(&s, 4096);
    fuzz_put8(&s, R_CONSUME), fuzz_put16(&s, 100);
    fuzz_seed_write(dir, "writes-and-consumes", s.b, s.n);
    /* parking on both sides, the wake-ups */
    s.n = 0;
    fuzz_put8(&s, 0), fuzz_put8(&s, R_RPARK), fuzz_put8(&s, R_PRODUCE), fuzz_put16(&s, 10);
    fuzz_put8(&s, R_WAKEW);
    fuzz_put8(&s, R_READ), fuzz_put16(&s, 10), fuzz_put8(&s, R_WRITE), fuzz_put8(&s, 0);
    fuzz_put16(&s, 4096);
    fuzz_put8(&s, R_WPARK), fuzz_put16(&s, 1), fuzz_put8(&s, R_CONSUME), fuzz_put16(&s, 4096);
    fuzz_put8(&s, R_WAKER);
    fuzz_put8(&s, R_WPARK), fuzz_put16(&s, 1);
    fuzz_seed_write(dir, "park-and-wake", s.b, s.n);
    /* rx laid out by the peer (attach): an honest capacity with data in it */
    s.n = 0;
    fuzz_put8(&s, 4 | 16), fuzz_put8(&s, 0), fuzz_put8(&s, 1), fuzz_put16(&s, 100);
    fuzz_put8(&s, 1), fuzz_put16(&s, 0);
    fuzz_put8(&s, R_READ), fuzz_put16(&s, 50), fuzz_put8(&s, R_READ), fuzz_put16(&s, 50);
    fuzz_seed_write(dir, "attach-with-data", s.b, s.n);
    /* 16 KiB rings, a corrupt head after some traffic: reads fail, for good */
    s.n = 0;
    fuzz_put8(&s, 2), fuzz_put8(&s, R_PRODUCE), fuzz_put16(&s, 2000), fuzz_put8(&s, R_READ);
    fuzz_put16(&s, 1000);
    fuzz_put8(&s, R_HEAD), fuzz_put8(&s, 6), fuzz_put8(&s, R_READ), fuzz_put16(&s, 10);
    fuzz_put8(&s, R_ASK);
    fuzz_put8(&s, R_RPARK), fuzz_put8(&s, R_READ), fuzz_put16(&s, 10);
    fuzz_seed_write(dir, "corrupt-head-after-traffic", s.b, s.n);
}

FUZZ_SEEDS_MAIN(fuzz_seeds)
