/*
 * link.h — the same-host link: a pair of shared-memory byte rings in one
 * memfd, with a connected Unix socket beside it as the doorbell and the
 * liveness signal (docs/shm.md §2-3). The TCP transport's framing runs on
 * top of it unchanged (transports/cpu/tcp_conn_impl.h picks the link).
 *
 * One link per connected pair of ranks. The side that accepted the Unix
 * connection makes the memory (cl_shm_link_create) and hands its fd to the
 * dialer with its ACCEPT (SCM_RIGHTS); the dialer checks the header page
 * before using it (cl_shm_link_attach): magic, layout version, comm id,
 * generation, both ranks, ring sizes, the file's size and its seals. A
 * stale process of an earlier incarnation never gets the new memfd (the
 * handshake refuses it), so it can neither read nor corrupt it.
 *
 * Nothing here blocks. recv/writev return bytes moved, or -1 with errno:
 * EAGAIN (nothing now: this side is parked, and the peer will ring the
 * doorbell when it moves bytes), EPIPE (writing to a peer that is gone),
 * EPROTO (the peer corrupted the ring's counters: ring.h; for good).
 * recv returns 0 only at the end: the socket reached EOF and the ring is
 * empty (every byte the peer wrote before dying is read first).
 */
#ifndef CL_SHM_LINK_H
#define CL_SHM_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "transports/cpu/shm/loan.h"
#include "transports/cpu/shm/ring.h"

#define CL_SHM_LINK_DEFAULT_RING   (512u * 1024u)
#define CL_SHM_SINGLE_COPY_DEFAULT (512u * 1024u) /* payloads from this size are lent (loan.h) */

/* Who the memory is for: checked by the dialer against the header page. */
typedef struct cl_shm_link_id {
    uint64_t comm_id, generation;
    uint32_t creator, dialer; /* ranks: the acceptor makes the memory */
} cl_shm_link_id;

typedef struct cl_shm_link {
    void *map;
    size_t map_len;
    cl_shm_ring tx, rx;
    int fd;             /* creator: the memfd until it went out with ACCEPT; dialer: as received */
    bool eof;           /* the doorbell socket reached its end (the peer is gone) */
    bool writer_wait;   /* a write found the ring full and parked */
    cl_shm_loans loans; /* single copy of large payloads (loan.h) */
} cl_shm_link;

/* An empty link (no memory yet). */
void cl_shm_link_init(cl_shm_link *l);

/* cl_shm_link_create: the acceptor's side: a sealed memfd with the header
 * page and two rings of `ring_bytes` each (rounded to a power of two within
 * [4 KiB, 1 GiB]). l->fd is the memfd to hand over. Errors (ESYSTEM,
 * ENOMEM) say why in `why`. */
int cl_shm_link_create(cl_shm_link *l, const cl_shm_link_id *id, uint64_t ring_bytes, char *why,
                       size_t why_len);

/* cl_shm_link_attach: the dialer's side: map the received memfd (l->fd,
 * closed here either way) and check that it is what `id` expects:
 * COLLIE_EPROTO with the reason in `why` if anything disagrees (also a
 * descriptor that cannot be mapped for writing); COLLIE_ENOMEM if the
 * mapping found no memory. */
int cl_shm_link_attach(cl_shm_link *l, const cl_shm_link_id *id, char *why, size_t why_len);

/* cl_shm_link_check: the dialer's checks of a link's memory `map` of
 * `size` bytes (a mapping, or a copy of one) against `id`, without system
 * calls: NULL if it is what `id` expects, with tx and rx set to views of
 * its rings (dialer to creator, creator to dialer); else the reason. Reads
 * each header word once (the peer may write it meanwhile). Attach calls it
 * after mapping; the fuzz target (tests/fuzz/fuzz_shm_link.c) calls it
 * directly too. */
const char *cl_shm_link_check(const void *map, size_t size, const cl_shm_link_id *id,
                              cl_shm_ring *tx, cl_shm_ring *rx);

/* The connection closed: close the fds the link holds but keep the memory
 * mapped (a thread ending a work may still withdraw its loans there, see
 * loan.h) until cl_shm_link_close. */
void cl_shm_link_hang_up(cl_shm_link *l);
/* Unmap and close what the link holds (safe on an empty link). */
void cl_shm_link_close(cl_shm_link *l);

bool cl_shm_link_ready(const cl_shm_link *l);

/* Ring the peer's doorbell on `sock`: one byte, never blocking (a full
 * socket already wakes it; a gone peer needs none). */
void cl_shm_link_ring_doorbell(int sock);
/* Read the doorbell bytes waiting on `sock` (bounded); sets l->eof when the
 * socket ended or failed. */
void cl_shm_link_drain_doorbell(cl_shm_link *l, int sock);

/* `park`: when the ring is empty, park (the peer rings the doorbell when
 * it writes); false for a reader that polls the ring instead. */
ssize_t cl_shm_link_recv(cl_shm_link *l, int sock, void *buf, size_t len, bool park);
ssize_t cl_shm_link_writev(cl_shm_link *l, int sock, const struct iovec *iov, int niov);

/* Is there something to read now (for progress without a doorbell)? True
 * also for a corrupt ring, whose read reports it. */
bool cl_shm_link_readable(const cl_shm_link *l);

#endif
