/*
 * loan.h — single copy between same-host ranks: instead of copying a large
 * payload into the ring, the sender *lends* it: a frame carries its address
 * and the receiver reads it straight out of the sender's memory with
 * process_vm_readv (Linux cross-memory attach), one copy instead of two.
 *
 * The danger is a sender whose work ends early (deadline, cancel, abort):
 * its user gets the buffer back and may write it while the peer still
 * reads. So every loan has a ticket in a slot of shared memory that only
 * the lender writes: it withdraws a loan by clearing the slot *before* its
 * work ends, and the borrower, after its last read, claims the slot
 * (compare-and-swap ticket -> ticket|DONE). A claim that fails means the
 * data may be torn: the receive fails, naming the peer; a claim that
 * succeeds means every read happened before any withdrawal, so the user
 * had not got the buffer back yet. No wait on the peer is ever needed: a
 * stopped borrower cannot hold up a lender's deadline.
 *
 * Tickets increase per direction and are returned in order (the borrower
 * reads frames in stream order): `returned` = the last ticket the borrower
 * is done with, read, withdrawn or dropped. The lender completes its
 * messages up to it; at most CL_SHM_LOAN_SLOTS tickets are out at once
 * (the slot of ticket t is t % CL_SHM_LOAN_SLOTS), beyond that a message
 * goes through the ring. A lender that may sleep parks (`lender_parked`,
 * the ring's Dekker pattern) and the borrower rings the doorbell when it
 * returns one.
 *
 * Whether the peer can read us at all (Yama's ptrace_scope, a seccomp
 * filter, another pid namespace) is probed once per link: each side
 * publishes the address and value of a word of its own memory; the other
 * reads it through the peer's pid (SO_PEERCRED of the doorbell socket) and,
 * if that works, tells it "I can read you" - only then does it lend. A
 * pidfd taken before the probe tells a borrower that the process it reads
 * is still the one that answered (a dead peer's pid could be reused).
 */
#ifndef CL_SHM_LOAN_H
#define CL_SHM_LOAN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define CL_SHM_LOAN_SLOTS 32
#define CL_SHM_LOAN_DESC  16 /* the frame's payload: ticket, address */

/* One lender's loans, in the link's header page (one per direction). */
typedef struct cl_shm_loan_side {
    /* written by the lender */
    _Alignas(64) _Atomic uint64_t probe_addr;              /* a word of its memory ... */
    _Atomic uint64_t probe_value;                          /* ... and what it holds */
    _Alignas(64) _Atomic uint64_t slot[CL_SHM_LOAN_SLOTS]; /* ticket lent, 0 = withdrawn */
    /* written by the borrower */
    _Alignas(64) _Atomic uint64_t returned; /* every ticket up to it is done with */
    _Atomic uint32_t readable;              /* the probe worked: the lender may lend */
    /* written by both: the lender sleeps, ring its doorbell on a return */
    _Alignas(64) _Atomic uint32_t lender_parked;
} cl_shm_loan_side;

/* One side's view of the loans of a link. */
typedef struct cl_shm_loans {
    cl_shm_loan_side *mine, *peer; /* my loans (I lend), the peer's (I borrow) */
    uint64_t next_ticket;          /* lender: from 1 */
    uint64_t last_borrowed;        /* borrower: the last ticket seen (they increase) */
    pid_t pid;                     /* the peer's process, once the probe worked; else 0 */
    int pidfd;                     /* ... and its pidfd, or -1 */
    bool probed;                   /* the probe ran (or cannot run) */
} cl_shm_loans;

/* Lay out and publish this side (mine/peer: the two sides in the header
 * page; the creator of the memory zeroed them). */
void cl_shm_loans_init(cl_shm_loans *lo, cl_shm_loan_side *mine, cl_shm_loan_side *peer);
/* Close the pidfd; the memory is the link's. */
void cl_shm_loans_fini(cl_shm_loans *lo);

/* Probe the peer once its probe is published (a no-op after that): can
 * this process read the peer's memory (`sock`: the doorbell socket, whose
 * SO_PEERCRED names the peer's pid)? If so, tell the peer it may lend.
 * Returns true if the probe ran now (false: done before, or the peer has
 * not published yet). `why` gets the reason when reading is refused. */
bool cl_shm_loans_probe(cl_shm_loans *lo, int sock, char *why, size_t why_len);

/* ---- the lender ---- */

/* May a message be lent now (the peer reads us, a slot is free, and what
 * it returned makes sense)? */
bool cl_shm_loan_can_lend(const cl_shm_loans *lo);
/* Lend `addr`: fills the frame's payload, returns the ticket. */
uint64_t cl_shm_loan_open(cl_shm_loans *lo, const void *addr, uint8_t desc[CL_SHM_LOAN_DESC]);
/* The message's work is ending before the peer returned it: from now on
 * the peer's claim fails (and its receive with it). `mine` is lo->mine
 * (shared memory: valid while the link is mapped). Any thread. */
void cl_shm_loan_withdraw(cl_shm_loan_side *mine, uint64_t ticket);
/* The last ticket the peer is done with, in *back (one snapshot of what it
 * wrote): COLLIE_EPROTO if that names a ticket this side never lent (past
 * the newest it opened) - a corrupt peer: its messages must not complete
 * as if read. */
int cl_shm_loans_returned(const cl_shm_loans *lo, uint64_t *back);
/* About to sleep with loans out (up to `newest`): true if the peer will
 * ring the doorbell on its next return; false if it returned some
 * meanwhile (collect them, then park again). */
bool cl_shm_loans_park(cl_shm_loans *lo, uint64_t newest);

/* ---- the borrower ---- */

/* Parse a loan frame's payload: COLLIE_EPROTO if this side cannot read the
 * peer (it was never told so) or the tickets do not increase. */
int cl_shm_loan_borrow(cl_shm_loans *lo, const uint8_t desc[CL_SHM_LOAN_DESC], uint64_t *ticket,
                       uint64_t *addr);
/* Is the loan still lent (not withdrawn)? A hint: only the claim counts. */
bool cl_shm_loan_live(const cl_shm_loans *lo, uint64_t ticket);
/* Read len bytes at the peer's address `addr` into buf: bytes read, or -1
 * with errno (EFAULT: not mapped there - withdrawn and freed, or a peer
 * bug; ESRCH: gone; EPERM). */
ssize_t cl_shm_loan_read(const cl_shm_loans *lo, void *buf, uint64_t addr, size_t len);

/* What a return found (cl_shm_loan_return). */
enum { CL_LOAN_READ = 0, CL_LOAN_WITHDRAWN, CL_LOAN_PEER_EXITED };
/* Done with `ticket`. `used`: its data was read (else it is only handed
 * back, e.g. for a receive that ended): claim it and say whether the data
 * is good. Returns CL_LOAN_*; *ring is set when the lender parked (ring
 * its doorbell). */
int cl_shm_loan_return(cl_shm_loans *lo, uint64_t ticket, bool used, bool *ring);

#endif
