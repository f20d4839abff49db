/*
 * fuzz_shm_link.c — libFuzzer target: the memory of a same-host link as
 * the dialer finds it (transports/cpu/shm/link.c) and the link's byte stream
 * over it, against a hostile creator.
 *
 * Design notes
 *  - What it feeds: a link made honestly by cl_shm_link_create (the peer,
 *    ring size from the input), then the peer's edits of its header page
 *    (any field, or any bytes anywhere in the memory), and in one mode a
 *    file made by hand instead: any size near the valid ones, sealed or
 *    not, handed over read-only or not, with the peer's header. This side
 *    checks it twice: with the pure cl_shm_link_check on an exact-size heap
 *    copy (ASan sees any read outside it) and with the real
 *    cl_shm_link_attach on the memfd (the size and seals, the mapping, fd
 *    ownership). An accepted link then
 *    runs a program: the peer pokes bytes anywhere in the memory (rings'
 *    counters and data, loans, header), writes honestly through its own
 *    view, rings the doorbell or hangs up, and this side receives (parked
 *    or polling), sends, asks readable, drains the doorbell.
 *  - What it asserts: both checks agree, and accept exactly a header that
 *    names the expected comm, generation and ranks with the layout of its
 *    ring size in a file of exactly that size (and attach: sealed against
 *    shrinking, mappable for writing); attach refuses with EPROTO, closes
 *    the fd either way and maps nothing when it refuses; the views lie
 *    inside the memory. recv returns at most what was asked and never more
 *    than the ring held; EPROTO exactly when the ring's counters are
 *    corrupt (and from then on), EAGAIN only when the ring is empty, 0 only
 *    at the doorbell's end with the ring empty; writev likewise (EPIPE
 *    after the end); readable is true for a corrupt ring. With an honest
 *    peer the bytes are the peer's stream. Every step is bounded (no loop
 *    waits for the peer).
 *  - The header layout is mirrored here (fz_header): a change in link.c
 *    shows as a disagreement, not as a silent loss of coverage.
 *  - Seeds (fuzz_seeds, make fuzz-seeds): honest links of 4 and 32 KiB
 *    rings and a hand-made sealed file running an exchange both ways;
 *    unsealed, read-only, another generation, other ranks, another ring
 *    size (refused).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/fuzz/fuzz.h"

#include "collie.h"
#include "transports/cpu/shm/link.h"

#define FZ_CHECK(cond) FUZZ_CHECK(cond, "the link's contract")

/* link.c's header page, as this target expects it */
typedef struct fz_header {
    uint32_t magic, version;
    uint64_t comm_id, generation;
    uint32_t creator, dialer;
    uint64_t ring_cap;
    uint64_t ring_off[2];
} fz_header;

#define FZ_PAGE 4096u

static uint64_t page_up(uint64_t v) { return (v + FZ_PAGE - 1) & ~(uint64_t)(FZ_PAGE - 1); }
static uint64_t link_size(uint64_t cap) { return FZ_PAGE + 2 * page_up(cl_shm_ring_bytes(cap)); }

static bool header_valid(const fz_header *h, size_t size, const cl_shm_link_id *id,
                         const uint8_t *map) {
    uint64_t cap = h->ring_cap;
    if (h->magic != 0x4c534c43u || h->version != 2 || h->comm_id != id->comm_id ||
        h->generation != id->generation || h->creator != id->creator || h->dialer != id->dialer)
        return false;
    if (cap < 4096 || cap > (1u << 30) || (cap & (cap - 1)) || link_size(cap) != size ||
        h->ring_off[0] != FZ_PAGE || h->ring_off[1] != FZ_PAGE + page_up(cl_shm_ring_bytes(cap)))
        return false;
    for (int i = 0; i < 2; i++) { /* the rings' own words */
        const cl_shm_ring_shared *sh = (const cl_shm_ring_shared *)(map + h->ring_off[i]);
        uint64_t head = atomic_load(&sh->head), tail = atomic_load(&sh->tail);
        if (sh->capacity != cap || head - tail > cap) return false;
    }
    return true;
}

static bool ring_sane(const cl_shm_ring *r, uint64_t *used) {
    uint64_t head = atomic_load(&r->sh->head), tail = atomic_load(&r->sh->tail);
    *used = head - tail;
    return head - tail <= r->cap;
}

/* byte i of the honest peer's stream */
static uint8_t pattern(uint64_t i) { return (uint8_t)((i * 2654435761u) >> 9); }

/* The accepted link: the peer's program against this side. */
static void run_link(cl_shm_link *me, cl_shm_link *peer, uint8_t *map, size_t size, fuzz_in *in) {
    int sv[2];
    FZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
    bool hung_up = false, rx_broken = false, tx_broken = false;
    bool honest = atomic_load(&me->rx.sh->head) == 0 && atomic_load(&me->rx.sh->tail) == 0;
    uint64_t made = 0, taken = 0;
    for (int steps = 0; steps < 128 && fuzz_left(in) > 0; steps++) {
        uint8_t op = fuzz_u8(in);
        switch (op & 0x0f) { /* the step; the high bits are its flags */
        case 0: {            /* the peer pokes bytes anywhere */
            size_t off = (fuzz_u16(in) | (size_t)(fuzz_u8(in) & 1) << 16) % size;
            size_t len = fuzz_u8(in) % 32;
            for (size_t i = 0; i < len && off + i < size; i++)
                map[off + i] = fuzz_u8(in);
            honest = false;
            break;
        }
        case 1: { /* the peer stores a counter of a ring */
            cl_shm_ring *r = (op & 0x10) ? &me->rx : &me->tx;
            _Atomic uint64_t *c = (op & 0x20) ? &r->sh->head : &r->sh->tail;
            atomic_store(c, (op & 0x40) ? fuzz_u64(in) : atomic_load(c) + (int8_t)fuzz_u8(in));
            honest = false;
            break;
        }
        case 2: { /* the peer writes honestly (its tx is this side's rx) */
            uint64_t used;
            if (hung_up || !ring_sane(&peer->tx, &used)) break;
            size_t n = fuzz_u16(in) % (peer->tx.cap + 100);
            uint8_t *b = malloc(n + 1);
            FZ_CHECK(b);
            for (size_t i = 0; i < n; i++)
                b[i] = pattern(made + i);
            struct iovec iov = {.iov_base = b, .iov_len = n};
            ssize_t w = cl_shm_link_writev(peer, sv[1], &iov, 1);
            if (w > 0) made += (uint64_t)w;
            free(b);
            break;
        }
        case 3: { /* this side receives */
            size_t len = fuzz_u16(in) % (me->rx.cap + 100);
            bool park = op & 0x10;
            uint64_t used;
            bool sane = ring_sane(&me->rx, &used);
            uint8_t *b = malloc(len + 1);
            FZ_CHECK(b);
            cl_shm_link_drain_doorbell(me, sv[0]);
            errno = 0;
            ssize_t n = cl_shm_link_recv(me, sv[0], len ? b : NULL, len, park);
            if (len == 0) {
                FZ_CHECK(n == 0);
            } else if (!sane || rx_broken) {
                FZ_CHECK(n == -1 && errno == EPROTO);
                rx_broken = true;
            } else if (used == 0) {
                FZ_CHECK(me->eof ? n == 0 : (n == -1 && errno == EAGAIN));
            } else {
                FZ_CHECK(n > 0 && (uint64_t)n == (len < used ? len : used));
                if (honest)
                    for (ssize_t i = 0; i < n; i++)
                        FZ_CHECK(b[i] == pattern(taken + (uint64_t)i));
                taken += (uint64_t)n;
            }
            free(b);
            break;
        }
        case 4: { /* this side sends */
            size_t len = fuzz_u16(in) % (me->tx.cap + 100);
            uint8_t *b = malloc(len + 1);
            FZ_CHECK(b);
            memset(b, 0x77, len);
            struct iovec iov[2] = {{.iov_base = b, .iov_len = len / 2},
                                   {.iov_base = b + len / 2, .iov_len = len - len / 2}};
            uint64_t used;
            bool sane = ring_sane(&me->tx, &used);
            errno = 0;
            ssize_t n = cl_shm_link_writev(me, sv[0], iov, 2);
            if (me->eof)
                FZ_CHECK(n == -1 && errno == EPIPE);
            else if (len == 0)
                FZ_CHECK(n == 0);
            else if (!sane || tx_broken) {
                FZ_CHECK(n == -1 && errno == EPROTO);
                tx_broken = true;
            } else if (used == me->tx.cap)
                FZ_CHECK(n == -1 && errno == EAGAIN);
            else
                FZ_CHECK(n > 0 &&
                         (uint64_t)n == (len < me->tx.cap - used ? len : me->tx.cap - used));
            free(b);
            break;
        }
        case 5: { /* the peer reads what this side sent */
            uint8_t b[512];
            uint64_t used;
            if (!hung_up && ring_sane(&peer->rx, &used))
                (void)cl_shm_link_recv(peer, sv[1], b, sizeof b, false);
            break;
        }
        case 6: { /* is there something to read? */
            uint64_t used;
            bool sane = ring_sane(&me->rx, &used);
            bool rd = cl_shm_link_readable(me);
            FZ_CHECK(rd == (!sane || rx_broken || used > 0));
            break;
        }
        case 8: /* the peer hangs up */
            if (!hung_up) close(sv[1]);
            hung_up = true;
            break;
        default: /* the peer rings the doorbell */
            if (!hung_up) cl_shm_link_ring_doorbell(sv[1]);
            break;
        }
    }
    close(sv[0]);
    if (!hung_up) close(sv[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_in in = {.p = data, .len = size};
    const cl_shm_link_id id = {.comm_id = 0x1234, .generation = 7, .creator = 1, .dialer = 0};
    uint8_t cfg = fuzz_u8(&in);
    char why[200] = "";
    cl_shm_link made;
    cl_shm_link_init(&made);
    FZ_CHECK(cl_shm_link_create(&made, &id, (uint64_t)4096 << (cfg & 3), why, sizeof why) ==
             COLLIE_OK);
    int fd = made.fd;
    made.fd = -1;
    uint8_t *map = made.map;
    size_t len = made.map_len;
    bool sealed = true, read_only = false;
    if (cfg & 4) { /* a file made by hand: any size, sealed or not */
        uint8_t k = fuzz_u8(&in);
        size_t sizes[] = {
            len,           len - 1,         len + 1,         len + FZ_PAGE,
            len - FZ_PAGE, link_size(4096), link_size(8192), fuzz_u16(&in) + (size_t)FZ_PAGE};
        size_t want = sizes[k % 8];
        sealed = !(k & 0x80);
        int hand = memfd_create("fuzz-link", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        FZ_CHECK(hand >= 0);
        FZ_CHECK(ftruncate(hand, (off_t)want) == 0);
        uint8_t *hm = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_SHARED, hand, 0);
        FZ_CHECK(hm != MAP_FAILED);
        memcpy(hm, map, want < len ? want : len); /* the honest layout, as far as it goes */
        if (sealed) FZ_CHECK(fcntl(hand, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
        cl_shm_link_close(&made); /* this side's copy of the honest link goes */
        close(fd);
        cl_shm_link_init(&made);
        fd = hand;
        if (k & 0x40) { /* handed over read-only: it cannot be mapped for writing */
            char path[64];
            snprintf(path, sizeof path, "/proc/self/fd/%d", hand);
            fd = open(path, O_RDONLY | O_CLOEXEC);
            FZ_CHECK(fd >= 0);
            close(hand);
            read_only = true;
        }
        map = hm;
        len = want;
    }
    /* the peer's edits of the header page */
    int edits = fuzz_u8(&in) % 8;
    fz_header *h = (fz_header *)map;
    for (int i = 0; i < edits; i++) {
        uint8_t e = fuzz_u8(&in);
        switch (e % 8) {
        case 0: h->magic ^= 1u << (fuzz_u8(&in) % 32); break;
        case 1: h->version = fuzz_u8(&in); break;
        case 2: h->comm_id += (int8_t)fuzz_u8(&in); break;
        case 3: h->generation += (int8_t)fuzz_u8(&in); break;
        case 4: *((e & 8) ? &h->creator : &h->dialer) = fuzz_u8(&in) % 4; break;
        case 5: h->ring_cap = (e & 8) ? fuzz_u64(&in) : (uint64_t)1 << (fuzz_u8(&in) % 64); break;
        case 6: h->ring_off[(e >> 3) & 1] += (int16_t)fuzz_u16(&in); break;
        default: { /* any bytes of the header page, or a ring's words */
            size_t off = fuzz_u16(&in) % (len < 2 * FZ_PAGE ? len : 2 * FZ_PAGE);
            size_t n = fuzz_u8(&in) % 16;
            for (size_t j = 0; j < n && off + j < len; j++)
                map[off + j] = fuzz_u8(&in);
        }
        }
    }
    /* the pure check, on an exact copy */
    fz_header hc;
    memcpy(&hc, map, sizeof hc);
    uint8_t *copy = malloc(len);
    FZ_CHECK(copy);
    memcpy(copy, map, len);
    bool valid = header_valid(&hc, len, &id, copy);
    cl_shm_ring tx, rx;
    const char *bad = cl_shm_link_check(copy, len, &id, &tx, &rx);
    FZ_CHECK((bad == NULL) == valid);
    if (!bad)
        FZ_CHECK(tx.data + tx.cap <= copy + len && rx.data + rx.cap <= copy + len &&
                 (uint8_t *)rx.sh >= tx.data + tx.cap);
    free(copy);
    /* the real attach, on the file */
    cl_shm_link me;
    cl_shm_link_init(&me);
    me.fd = fd;
    int rc = cl_shm_link_attach(&me, &id, why, sizeof why);
    FZ_CHECK(me.fd == -1 && fcntl(fd, F_GETFD) == -1 && errno == EBADF); /* closed either way */
    if (rc != COLLIE_OK) {
        FZ_CHECK(rc == COLLIE_EPROTO && !me.map && why[0]);
        /* beyond the check, only an unsealed or read-only file is refused */
        FZ_CHECK(!valid || !sealed || read_only);
    } else {
        FZ_CHECK(valid && sealed && !read_only && me.map_len == len);
        FZ_CHECK(me.tx.data + me.tx.cap <= (uint8_t *)me.map + len &&
                 me.rx.data + me.rx.cap <= (uint8_t *)me.map + len);
        if (cfg & 4) {
            /* the peer's view of a hand-made file: its rings, swapped */
            cl_shm_link_init(&made);
            made.map = map;
            made.map_len = len;
            made.rx = me.tx;
            made.tx = me.rx;
            made.rx.sh = (cl_shm_ring_shared *)(map + ((uint8_t *)me.tx.sh - (uint8_t *)me.map));
            made.rx.data = map + (me.tx.data - (uint8_t *)me.map);
            made.tx.sh = (cl_shm_ring_shared *)(map + ((uint8_t *)me.rx.sh - (uint8_t *)me.map));
            made.tx.data = map + (me.rx.data - (uint8_t *)me.map);
            made.rx.corrupt = made.tx.corrupt = false;
            run_link(&me, &made, map, len, &in);
            made.map = NULL; /* unmapped below */
        } else {
            run_link(&me, &made, map, len, &in);
        }
        cl_shm_link_close(&me);
    }
    if (cfg & 4)
        munmap(map, len);
    else
        cl_shm_link_close(&made);
    return 0;
}

/* ---- seeds: valid programs (make fuzz-seeds) ---------------------------------------- */

enum { L_POKE, L_COUNTER, L_PEERW, L_RECV, L_SEND, L_PEERR, L_READABLE, L_BELL, L_HANGUP };

/* an honest exchange both ways, parked and polling, then the peer hangs up */
static void seed_prog(fuzz_seed *s) {
    fuzz_put8(s, L_PEERW), fuzz_put16(s, 3000), fuzz_put8(s, L_BELL), fuzz_put8(s, L_RECV | 0x10);
    fuzz_put16(s, 1000);
    fuzz_put8(s, L_RECV), fuzz_put16(s, 5000), fuzz_put8(s, L_READABLE);
    fuzz_put8(s, L_RECV | 0x10), fuzz_put16(s, 10);
    fuzz_put8(s, L_SEND), fuzz_put16(s, 2000), fuzz_put8(s, L_PEERR), fuzz_put8(s, L_SEND);
    fuzz_put16(s, 9000);
    fuzz_put8(s, L_PEERW), fuzz_put16(s, 7), fuzz_put8(s, L_HANGUP), fuzz_put8(s, L_RECV);
    fuzz_put16(s, 100);
    fuzz_put8(s, L_RECV), fuzz_put16(s, 100), fuzz_put8(s, L_SEND), fuzz_put16(s, 1);
}

static void fuzz_seeds(const char *dir) {
    static const struct {
        const char *name;
        uint8_t pre[6];
        size_t npre;
        bool prog;
    } seeds[] = {
        {"honest-4k", {0, 0}, 2, true},
        {"honest-32k", {3, 0}, 2, true},
        {"hand-made-sealed", {4, 0, 0, 0, 0}, 5, true},       /* the right size, sealed */
        {"hand-made-unsealed", {4, 0x80, 0, 0, 0}, 5, false}, /* refused */
        {"hand-made-read-only", {4, 0x40, 0, 0, 0}, 5, false},
        {"other-generation", {0, 1, 3, 1}, 4, false}, /* header edits that are refused */
        {"other-ranks", {0, 1, 4 | 8, 3}, 4, false},
        {"ring-cap-changed", {1, 1, 5, 13}, 4, false},
    };
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        fuzz_seed s = {.n = 0};
        for (size_t j = 0; j < seeds[i].npre; j++)
            fuzz_put8(&s, seeds[i].pre[j]);
        if (seeds[i].prog) seed_prog(&s);
        fuzz_seed_write(dir, seeds[i].name, s.b, s.n);
    }
}

FUZZ_SEEDS_MAIN(fuzz_seeds)
