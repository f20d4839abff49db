/*
 * loan.c — single copy between same-host ranks (see loan.h).
 *
 * Design notes
 *  - Claim and withdrawal are compare-and-swaps on the same slot word, so
 *    exactly one wins: a borrower that claims (ticket -> ticket|DONE) did
 *    every read before the lender could withdraw, and a lender withdraws
 *    (ticket -> 0) before its work's end is visible (the backend's unlend
 *    hook, any thread). The reads themselves are system calls that end
 *    before the claim in program order (and a full fence sits between).
 *  - A withdrawn loan is still returned in order: `returned` only moves
 *    forward, and the lender reuses a slot only for a ticket
 *    CL_SHM_LOAN_SLOTS later, which it opens only once the borrower
 *    returned the older one.
 *  - The peer is trusted to be the same program, not to be sane: a ticket
 *    out of order is a protocol error, and so is a `returned` past the
 *    newest ticket lent (the lender would complete messages the peer has
 *    not read); an address it lends can only make process_vm_readv read
 *    its own memory or fail. Each word the peer writes is read once per
 *    use and checked before it is acted on (tests/fuzz/fuzz_shm_loan.c).
 *  - The probe reads a word the peer published with the peer's pid from
 *    SO_PEERCRED, after taking a pidfd of that pid; a probe that reads the
 *    right value from a process that is still alive afterwards has found
 *    the peer. Every later loan is checked against that pidfd at its
 *    return: a peer that exited (its pid free for reuse) fails the read.
 *    The look at the pidfd (poll, timeout 0) fails with EINTR whenever a
 *    signal is caught meanwhile, even under SA_RESTART; that is looked at
 *    again, not taken for the peer's exit (a read, claimed loan would fail
 *    its receive, or be dropped unexpected, while its send completed OK).
 */
#include "base/pidfd.h"
#include "transports/cpu/shm/loan.h"

#include <errno.h>
#include <openssl/rand.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "collie.h"
#include "base/endian.h"

#define LOAN_DONE ((uint64_t)1 << 63) /* a slot's ticket the borrower claimed */

/* What peers read to probe this process: random, set once (a link's
 * struct may move, this does not). */
static uint64_t probe_word;
static pthread_once_t probe_once = PTHREAD_ONCE_INIT;

static void probe_word_init(void) {
    if (RAND_bytes((unsigned char *)&probe_word, sizeof probe_word) != 1)
        probe_word = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uintptr_t)&probe_word;
    probe_word |= 1; /* never 0 */
}

void cl_shm_loans_init(cl_shm_loans *lo, cl_shm_loan_side *mine, cl_shm_loan_side *peer) {
    memset(lo, 0, sizeof *lo);
    lo->mine = mine;
    lo->peer = peer;
    lo->next_ticket = 1;
    lo->pidfd = -1;
    pthread_once(&probe_once, probe_word_init);
    atomic_store_explicit(&mine->probe_value, probe_word, memory_order_relaxed);
    atomic_store_explicit(&mine->probe_addr, (uint64_t)(uintptr_t)&probe_word,
                          memory_order_release);
}

void cl_shm_loans_fini(cl_shm_loans *lo) {
    if (lo->pidfd >= 0) close(lo->pidfd);
    lo->pidfd = -1;
    lo->pid = 0;
}

/* Has the process behind the pidfd exited? A signal caught meanwhile
 * (EINTR, even under SA_RESTART and a timeout of 0) says nothing of the
 * peer: look again (a few times: a process flooded with signals might be
 * interrupted at each look). */
static bool pidfd_exited(int pidfd) {
    for (int tries = 0; tries < 64; tries++) {
        struct pollfd p = {.fd = pidfd, .events = POLLIN};
        int n = poll(&p, 1, 0);
        if (n >= 0) return n != 0; /* readable (or POLLNVAL, POLLERR): exited */
        if (errno != EINTR) break;
    }
    return true; /* an error: assume the worst */
}

bool cl_shm_loans_probe(cl_shm_loans *lo, int sock, char *why, size_t why_len) {
    if (lo->probed || !lo->peer) return false;
    uint64_t addr = atomic_load_explicit(&lo->peer->probe_addr, memory_order_acquire);
    if (addr == 0) return false; /* not published yet: the next look */
    uint64_t want = atomic_load_explicit(&lo->peer->probe_value, memory_order_relaxed);
    lo->probed = true;
    struct ucred cred;
    socklen_t cl = sizeof cred;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cred.pid <= 0) {
        snprintf(why, why_len, "its process id is unknown here (another pid namespace?)");
        return true;
    }
    int pidfd = cl_pidfd_open(cred.pid);
    if (pidfd < 0) {
        snprintf(why, why_len, "pidfd_open(%d): %s", (int)cred.pid, strerror(errno));
        return true;
    }
    uint64_t got = 0;
    struct iovec local = {.iov_base = &got, .iov_len = sizeof got};
    struct iovec remote = {.iov_base = (void *)(uintptr_t)addr, .iov_len = sizeof got};
    ssize_t n = process_vm_readv(cred.pid, &local, 1, &remote, 1, 0);
    if (n != (ssize_t)sizeof got || got != want || pidfd_exited(pidfd)) {
        snprintf(why, why_len, "process_vm_readv from pid %d: %s", (int)cred.pid,
                 n < 0 ? strerror(errno) : "it read something else");
        close(pidfd);
        return true;
    }
    lo->pid = cred.pid;
    lo->pidfd = pidfd;
    atomic_store_explicit(&lo->peer->readable, 1, memory_order_release);
    return true;
}

/* ---- the lender --------------------------------------------------------------------- */

int cl_shm_loans_returned(const cl_shm_loans *lo, uint64_t *back) {
    *back = atomic_load_explicit(&lo->mine->returned, memory_order_acquire);
    return *back < lo->next_ticket ? COLLIE_OK : COLLIE_EPROTO;
}

bool cl_shm_loan_can_lend(const cl_shm_loans *lo) {
    if (!lo->mine || !atomic_load_explicit(&lo->mine->readable, memory_order_acquire)) return false;
    uint64_t back;
    if (cl_shm_loans_returned(lo, &back) != COLLIE_OK) return false; /* collecting reports it */
    return lo->next_ticket - 1 - back < CL_SHM_LOAN_SLOTS;
}

uint64_t cl_shm_loan_open(cl_shm_loans *lo, const void *addr, uint8_t desc[CL_SHM_LOAN_DESC]) {
    uint64_t t = lo->next_ticket++;
    /* published to the borrower by the ring's release of the frame */
    atomic_store_explicit(&lo->mine->slot[t % CL_SHM_LOAN_SLOTS], t, memory_order_release);
    cl_put64le(desc, t);
    cl_put64le(desc + 8, (uint64_t)(uintptr_t)addr);
    return t;
}

void cl_shm_loan_withdraw(cl_shm_loan_side *mine, uint64_t ticket) {
    uint64_t t = ticket;
    atomic_compare_exchange_strong_explicit(&mine->slot[ticket % CL_SHM_LOAN_SLOTS], &t, 0,
                                            memory_order_seq_cst, memory_order_relaxed);
}

bool cl_shm_loans_park(cl_shm_loans *lo, uint64_t newest) {
    atomic_store_explicit(&lo->mine->lender_parked, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&lo->mine->returned, memory_order_seq_cst) < newest) return true;
    atomic_store_explicit(&lo->mine->lender_parked, 0, memory_order_relaxed);
    return false;
}

/* ---- the borrower ------------------------------------------------------------------- */

int cl_shm_loan_borrow(cl_shm_loans *lo, const uint8_t desc[CL_SHM_LOAN_DESC], uint64_t *ticket,
                       uint64_t *addr) {
    uint64_t t = cl_get64le(desc);
    if (lo->pid == 0 || t <= lo->last_borrowed || t - lo->last_borrowed > ((uint64_t)1 << 40))
        return COLLIE_EPROTO;
    lo->last_borrowed = t;
    *ticket = t;
    *addr = cl_get64le(desc + 8);
    return COLLIE_OK;
}

bool cl_shm_loan_live(const cl_shm_loans *lo, uint64_t ticket) {
    return atomic_load_explicit(&lo->peer->slot[ticket % CL_SHM_LOAN_SLOTS],
                                memory_order_acquire) == ticket;
}

ssize_t cl_shm_loan_read(const cl_shm_loans *lo, void *buf, uint64_t addr, size_t len) {
    struct iovec local = {.iov_base = buf, .iov_len = len};
    struct iovec remote = {.iov_base = (void *)(uintptr_t)addr, .iov_len = len};
    return process_vm_readv(lo->pid, &local, 1, &remote, 1, 0);
}

int cl_shm_loan_return(cl_shm_loans *lo, uint64_t ticket, bool used, bool *ring) {
    int verdict = CL_LOAN_READ;
    if (used) {
        atomic_thread_fence(memory_order_seq_cst); /* the reads come first */
        uint64_t t = ticket;
        if (!atomic_compare_exchange_strong_explicit(&lo->peer->slot[ticket % CL_SHM_LOAN_SLOTS],
                                                     &t, ticket | LOAN_DONE, memory_order_seq_cst,
                                                     memory_order_relaxed))
            verdict = CL_LOAN_WITHDRAWN;
        else if (pidfd_exited(lo->pidfd))
            verdict = CL_LOAN_PEER_EXITED;
    }
    atomic_store_explicit(&lo->peer->returned, ticket, memory_order_seq_cst);
    *ring = atomic_load_explicit(&lo->peer->lender_parked, memory_order_seq_cst) != 0 &&
            atomic_exchange_explicit(&lo->peer->lender_parked, 0, memory_order_acq_rel) != 0;
    return verdict;
}
