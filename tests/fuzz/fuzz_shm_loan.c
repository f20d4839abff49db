/*
 * fuzz_shm_loan.c — libFuzzer target: single copy's loans
 * (transports/cpu/shm/loan.c, as transports/cpu/tcp_loan.c uses them) against
 * a hostile same-host peer.
 *
 * Design notes
 *  - What it feeds: the two loan sides of a link's header page in one
 *    allocation of exactly their size (ASan sees any access outside), this
 *    side's view of them and an honest peer's, and a program: the peer
 *    pokes any bytes of either side (slots, returned, readable, parked
 *    flags, its probe's address and value), lends honestly (a buffer of
 *    this process: the peer is this process, so process_vm_readv works)
 *    or puts a forged descriptor (any ticket, any address) on the stream,
 *    withdraws; this side probes the peer (SO_PEERCRED of a socketpair:
 *    its own pid), borrows the next descriptor of the stream, asks whether
 *    a loan is live, reads it (any offset and length), returns it (read or
 *    not), and as a lender asks whether it may lend, lends, collects what
 *    the peer returned, parks and withdraws.
 *  - What it asserts: borrow accepts a descriptor exactly when the probe
 *    worked and its ticket is above the last one borrowed (by at most
 *    2^40), and then reports that ticket and address; live is the slot
 *    holding exactly the ticket; a read returns at most the bytes asked
 *    (the loan's bytes, for an honest loan in range); a return of a read
 *    loan is READ exactly when the slot held the ticket (it is then
 *    claimed, ticket|DONE) and WITHDRAWN otherwise (slot untouched), sets
 *    the peer's `returned` to the ticket, and asks for the doorbell exactly
 *    when the lender had parked (clearing the flag). As a lender: what the
 *    peer says it returned is refused (EPROTO) exactly when it names a
 *    ticket never lent, and then nothing is lent; it may lend only with
 *    the peer's consent and fewer than CL_SHM_LOAN_SLOTS tickets out; park
 *    sleeps exactly when the newest loan is still out. Every step is
 *    bounded.
 *  - Seeds (fuzz_seeds, make fuzz-seeds): borrow/read/return of honest
 *    loans, a withdrawal before the claim, lending/parking/withdrawing, a
 *    return never lent, forged descriptors.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/fuzz/fuzz.h"

#include "collie.h"
#include "engine/common.h"
#include "transports/cpu/shm/loan.h"

#define FZ_CHECK(cond) FUZZ_CHECK(cond, "the loans' contract")

#define FZ_DONE    ((uint64_t)1 << 63) /* loan.c's claimed mark */
#define FZ_STREAM  64                  /* descriptors in flight on the "ring" */
#define FZ_SRC     4096                /* bytes of a buffer the honest peer lends */
#define FZ_BORROWS 8

/* the buffer the honest peer lends (static: a forged address may point
 * anywhere in it, and it outlives every read) */
static uint8_t fz_src[FZ_SRC];

typedef struct fz_borrow {
    uint64_t ticket, addr;
    bool honest; /* the peer lent fz_src with this ticket and did not touch the slot */
} fz_borrow;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_in in = {.p = data, .len = size};
    for (int i = 0; i < FZ_SRC; i++)
        fz_src[i] = (uint8_t)(i * 7 + 3);
    cl_shm_loan_side *sides = aligned_alloc(64, 2 * sizeof(cl_shm_loan_side));
    FZ_CHECK(sides);
    memset(sides, 0, 2 * sizeof(cl_shm_loan_side));
    cl_shm_loan_side *mine = &sides[0], *theirs = &sides[1];
    cl_shm_loans lo, peer;
    cl_shm_loans_init(&peer, theirs, mine); /* the peer publishes its probe */
    cl_shm_loans_init(&lo, mine, theirs);
    int sv[2];
    FZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    uint8_t stream[FZ_STREAM][CL_SHM_LOAN_DESC];
    bool stream_honest[FZ_STREAM];
    int s_head = 0, s_len = 0;
    fz_borrow held[FZ_BORROWS];
    int nheld = 0;
    uint64_t my_out[CL_SHM_LOAN_SLOTS * 2];
    int nmy = 0;
    bool touched = false; /* the peer poked the sides: no loan is honest any more */
    for (int steps = 0; steps < 256 && fuzz_left(&in) > 0; steps++) {
        uint8_t op = fuzz_u8(&in);
        switch (op & 0x0f) { /* the step; the high bits are its flags */
        case 0: {            /* the peer pokes bytes of either side */
            size_t off = fuzz_u16(&in) % (2 * sizeof(cl_shm_loan_side)), len = fuzz_u8(&in) % 16;
            for (size_t i = 0; i < len && off + i < 2 * sizeof(cl_shm_loan_side); i++)
                ((uint8_t *)sides)[off + i] = fuzz_u8(&in);
            touched = true;
            break;
        }
        case 1: { /* the peer stores a word: what it returned of ours, a slot of its own */
            uint64_t v = (op & 0x10) ? fuzz_u64(&in) : lo.next_ticket - 2 + fuzz_u8(&in) % 4;
            if (op & 0x20)
                atomic_store(&theirs->slot[fuzz_u8(&in) % CL_SHM_LOAN_SLOTS], v);
            else
                atomic_store(&mine->returned, v);
            if (op & 0x40) atomic_store(&mine->readable, fuzz_u8(&in));
            touched = true;
            break;
        }
        case 2: /* this side probes the peer */
            if (!lo.probed) {
                char why[160] = "";
                (void)cl_shm_loans_probe(&lo, sv[0], why, sizeof why);
                FZ_CHECK(lo.probed || atomic_load(&theirs->probe_addr) == 0);
                if (lo.pid) FZ_CHECK(lo.pid == getpid() && lo.pidfd >= 0);
            }
            break;
        case 3: { /* the honest peer lends fz_src (it reads us: it was told) */
            if (s_len == FZ_STREAM || !cl_shm_loan_can_lend(&peer)) break;
            int at = (s_head + s_len++) % FZ_STREAM;
            (void)cl_shm_loan_open(&peer, fz_src, stream[at]);
            stream_honest[at] = !touched;
            break;
        }
        case 4: { /* a forged descriptor on the stream */
            if (s_len == FZ_STREAM) break;
            int at = (s_head + s_len++) % FZ_STREAM;
            uint8_t k = fuzz_u8(&in);
            uint64_t t = (k & 1) ? fuzz_u64(&in) : lo.last_borrowed + (int8_t)fuzz_u8(&in);
            uint64_t a = (k & 2) ? fuzz_u64(&in) : (uint64_t)(uintptr_t)fz_src + fuzz_u16(&in);
            cl_put64le(stream[at], t);
            cl_put64le(stream[at] + 8, a);
            stream_honest[at] = false;
            break;
        }
        case 5: { /* this side borrows the next descriptor */
            if (!s_len || nheld == FZ_BORROWS) break;
            const uint8_t *d = stream[s_head];
            bool honest = stream_honest[s_head];
            s_head = (s_head + 1) % FZ_STREAM;
            s_len--;
            uint64_t t = cl_get64le(d), a = cl_get64le(d + 8), last = lo.last_borrowed, gt = 0,
                     ga = 0;
            bool ok = lo.pid != 0 && t > last && t - last <= ((uint64_t)1 << 40);
            int rc = cl_shm_loan_borrow(&lo, d, &gt, &ga);
            FZ_CHECK(rc == (ok ? COLLIE_OK : COLLIE_EPROTO));
            if (!ok) {
                FZ_CHECK(lo.last_borrowed == last);
                break; /* the connection would fail here: EPROTO */
            }
            FZ_CHECK(gt == t && ga == a && lo.last_borrowed == t);
            held[nheld++] = (fz_borrow){.ticket = t, .addr = a, .honest = honest && !touched};
            break;
        }
        case 6: { /* is it live? */
            if (!nheld) break;
            fz_borrow *b = &held[fuzz_u8(&in) % nheld];
            uint64_t slot = atomic_load(&theirs->slot[b->ticket % CL_SHM_LOAN_SLOTS]);
            FZ_CHECK(cl_shm_loan_live(&lo, b->ticket) == (slot == b->ticket));
            break;
        }
        case 7: { /* read some of it */
            if (!nheld || !lo.pid) break;
            fz_borrow *b = &held[fuzz_u8(&in) % nheld];
            uint64_t off = fuzz_u16(&in) % (2 * FZ_SRC);
            size_t len = fuzz_u16(&in) % (FZ_SRC + 1);
            uint8_t *buf = malloc(len + 1);
            FZ_CHECK(buf);
            errno = 0;
            ssize_t n = cl_shm_loan_read(&lo, buf, b->addr + off, len);
            FZ_CHECK(n <= (ssize_t)len && (n >= 0 || errno != 0));
            if (b->honest && off + len <= FZ_SRC) {
                FZ_CHECK(n == (ssize_t)len);
                FZ_CHECK(memcmp(buf, fz_src + off, len) == 0);
            }
            free(buf);
            break;
        }
        case 8: { /* return the oldest (in order, as the stream is read) */
            if (!nheld) break;
            fz_borrow b = held[0];
            memmove(held, held + 1, (size_t)--nheld * sizeof *held);
            bool used = op & 0x10;
            _Atomic uint64_t *slot = &theirs->slot[b.ticket % CL_SHM_LOAN_SLOTS];
            uint64_t before = atomic_load(slot);
            uint32_t parked = atomic_load(&theirs->lender_parked);
            bool ring = false;
            int v = cl_shm_loan_return(&lo, b.ticket, used, &ring);
            if (!used) {
                FZ_CHECK(v == CL_LOAN_READ && atomic_load(slot) == before);
            } else if (before == b.ticket) {
                FZ_CHECK(v == CL_LOAN_READ && atomic_load(slot) == (b.ticket | FZ_DONE));
            } else {
                FZ_CHECK(v == CL_LOAN_WITHDRAWN && atomic_load(slot) == before);
            }
            if (b.honest && !touched && used) FZ_CHECK(v == CL_LOAN_READ);
            FZ_CHECK(atomic_load(&theirs->returned) == b.ticket);
            FZ_CHECK(ring == (parked != 0) && atomic_load(&theirs->lender_parked) == 0);
            break;
        }
        case 9: { /* the peer withdraws a loan of its own */
            uint64_t t = peer.next_ticket - 1 - fuzz_u8(&in) % 4;
            if (t >= 1 && t < peer.next_ticket) {
                for (int i = 0; i < nheld; i++) /* borrowed, or still on the stream */
                    if (held[i].ticket == t) held[i].honest = false;
                for (int i = 0; i < s_len; i++)
                    if (cl_get64le(stream[(s_head + i) % FZ_STREAM]) == t)
                        stream_honest[(s_head + i) % FZ_STREAM] = false;
                cl_shm_loan_withdraw(theirs, t);
            }
            break;
        }
        case 10: { /* this side lends, if it may */
            uint64_t back = 0;
            int rc = cl_shm_loans_returned(&lo, &back);
            FZ_CHECK(back == atomic_load(&mine->returned));
            FZ_CHECK(rc == (back < lo.next_ticket ? COLLIE_OK : COLLIE_EPROTO));
            bool may = atomic_load(&mine->readable) != 0 && rc == COLLIE_OK &&
                       lo.next_ticket - 1 - back < CL_SHM_LOAN_SLOTS;
            FZ_CHECK(cl_shm_loan_can_lend(&lo) == may);
            if (!may || nmy == (int)(sizeof my_out / sizeof my_out[0])) break;
            uint8_t d[CL_SHM_LOAN_DESC];
            uint64_t t = cl_shm_loan_open(&lo, fz_src, d);
            FZ_CHECK(t == lo.next_ticket - 1 && cl_get64le(d) == t &&
                     cl_get64le(d + 8) == (uint64_t)(uintptr_t)fz_src);
            FZ_CHECK(atomic_load(&mine->slot[t % CL_SHM_LOAN_SLOTS]) == t);
            my_out[nmy++] = t;
            break;
        }
        case 11: { /* this side's loans: park with the newest out */
            if (!nmy) break;
            uint64_t newest = my_out[nmy - 1], back = atomic_load(&mine->returned);
            FZ_CHECK(cl_shm_loans_park(&lo, newest) == (back < newest));
            FZ_CHECK(atomic_load(&mine->lender_parked) == (back < newest));
            break;
        }
        case 12: { /* this side withdraws one of its loans */
            if (!nmy) break;
            int i = fuzz_u8(&in) % nmy;
            uint64_t t = my_out[i];
            _Atomic uint64_t *slot = &mine->slot[t % CL_SHM_LOAN_SLOTS];
            uint64_t before = atomic_load(slot);
            cl_shm_loan_withdraw(mine, t);
            FZ_CHECK(atomic_load(slot) == (before == t ? 0 : before));
            my_out[i] = my_out[--nmy];
            break;
        }
        default: /* the peer stores its probe's address or value */
            if (op & 0x10)
                atomic_store(&theirs->probe_addr, fuzz_u64(&in));
            else
                atomic_store(&theirs->probe_value, fuzz_u64(&in));
            touched = true;
            break;
        }
    }
    cl_shm_loans_fini(&lo);
    cl_shm_loans_fini(&peer);
    close(sv[0]);
    close(sv[1]);
    free(sides);
    return 0;
}

/* ---- seeds: valid programs (make fuzz-seeds) ---------------------------------------- */

enum {
    N_POKE,
    N_STORE,
    N_PROBE,
    N_PEERLEND,
    N_FORGED,
    N_BORROW,
    N_LIVE,
    N_READ,
    N_RETURN,
    N_PWITHDRAW,
    N_LEND,
    N_PARK,
    N_WITHDRAW
};
#define RET_USED (N_RETURN | 0x10)

static void fuzz_seeds(const char *dir) {
    fuzz_seed s = {.n = 0};
    /* probe, the peer lends three, this side borrows, reads, returns them in order */
    fuzz_put8(&s, N_PROBE);
    for (int i = 0; i < 3; i++) {
        fuzz_put8(&s, N_PEERLEND), fuzz_put8(&s, N_BORROW), fuzz_put8(&s, N_LIVE), fuzz_put8(&s, 0);
        fuzz_put8(&s, N_READ), fuzz_put8(&s, 0), fuzz_put16(&s, 100), fuzz_put16(&s, 1000);
    }
    fuzz_put8(&s, RET_USED), fuzz_put8(&s, RET_USED), fuzz_put8(&s, N_RETURN);
    fuzz_seed_write(dir, "borrow-read-return", s.b, s.n);
    /* the peer withdraws before the claim: the return says WITHDRAWN */
    s.n = 0;
    fuzz_put8(&s, N_PROBE), fuzz_put8(&s, N_PEERLEND), fuzz_put8(&s, N_BORROW);
    fuzz_put8(&s, N_PWITHDRAW);
    fuzz_put8(&s, 0), fuzz_put8(&s, RET_USED);
    fuzz_seed_write(dir, "withdrawn-before-claim", s.b, s.n);
    /* this side lends (the peer says it may), parks, collects, withdraws */
    s.n = 0;
    fuzz_put8(&s, N_STORE | 0x40), fuzz_put8(&s, 1), fuzz_put8(&s, 1); /* returned 0, readable 1 */
    fuzz_put8(&s, N_LEND), fuzz_put8(&s, N_LEND), fuzz_put8(&s, N_PARK), fuzz_put8(&s, N_STORE);
    fuzz_put8(&s, 3);
    fuzz_put8(&s, N_LEND), fuzz_put8(&s, N_PARK), fuzz_put8(&s, N_WITHDRAW), fuzz_put8(&s, 0);
    fuzz_seed_write(dir, "lend-park-withdraw", s.b, s.n);
    /* a return never lent: refused, and nothing is lent on it */
    s.n = 0;
    fuzz_put8(&s, N_STORE | 0x40), fuzz_put8(&s, 1), fuzz_put8(&s, 1), fuzz_put8(&s, N_LEND);
    fuzz_put8(&s, N_STORE | 0x10), fuzz_put16(&s, 0), fuzz_put16(&s, 0), fuzz_put16(&s, 0);
    fuzz_put16(&s, 0x100);
    fuzz_put8(&s, N_LEND), fuzz_put8(&s, N_PARK);
    fuzz_seed_write(dir, "return-never-lent", s.b, s.n);
    /* forged descriptors: a ticket that does not go up, then one that does */
    s.n = 0;
    fuzz_put8(&s, N_PROBE), fuzz_put8(&s, N_FORGED), fuzz_put8(&s, 0), fuzz_put8(&s, 0);
    fuzz_put8(&s, N_BORROW);
    fuzz_put8(&s, N_FORGED), fuzz_put8(&s, 0), fuzz_put8(&s, 5), fuzz_put16(&s, 0);
    fuzz_put8(&s, N_BORROW);
    fuzz_put8(&s, N_READ), fuzz_put8(&s, 0), fuzz_put16(&s, 0), fuzz_put16(&s, 64);
    fuzz_put8(&s, RET_USED);
    fuzz_seed_write(dir, "forged-descriptors", s.b, s.n);
}

FUZZ_SEEDS_MAIN(fuzz_seeds)
