/*
 * ring.h — a single-producer, single-consumer byte ring in shared memory:
 * the byte stream of the planned same-host link (docs/shm.md §2).
 *
 * One ring carries one direction between two processes that map the same
 * memory (a memfd). The producer only writes `head` and the data it
 * publishes; the consumer only writes `tail`. Both are running byte counts
 * (never wrapped; 64 bits do not overflow in practice), so the ring is
 * empty when head == tail and full when head - tail == capacity.
 *
 * Sleeping without losing a wake-up: a side that finds nothing to do may
 * park - set its flag, then look again (both seq_cst, so either it sees the
 * other side's progress or the other side sees the flag: the Dekker pattern).
 * A side that moves bytes then asks whether the other side was parked and,
 * if so, rings its doorbell (the link's Unix socket; not part of the ring).
 *
 * Nothing here blocks, allocates or makes a system call; every call is
 * O(bytes moved). The mapping is the caller's; init only lays out the ring.
 */
#ifndef CL_SHM_RING_H
#define CL_SHM_RING_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#define CL_SHM_CACHELINE 64

/* The shared part, at the start of the ring's memory; the data follows. */
typedef struct cl_shm_ring_shared {
    _Alignas(CL_SHM_CACHELINE) _Atomic uint64_t head; /* bytes ever written */
    _Atomic uint32_t reader_parked;                   /* the consumer waits for data */
    _Alignas(CL_SHM_CACHELINE) _Atomic uint64_t tail; /* bytes ever read */
    _Atomic uint32_t writer_parked;                   /* the producer waits for room */
    _Alignas(CL_SHM_CACHELINE) uint64_t capacity;     /* data bytes, a power of two */
} cl_shm_ring_shared;

/* One side's view of a ring (each process has its own). */
typedef struct cl_shm_ring {
    cl_shm_ring_shared *sh;
    uint8_t *data;
    uint64_t cap, mask;
    bool corrupt; /* a call found the shared counters corrupt: the ring is of no more use */
} cl_shm_ring;

/* cl_shm_ring_bytes: the memory a ring of `cap` data bytes takes (cap a
 * power of two, at least 4096); 0 for an invalid cap. */
size_t cl_shm_ring_bytes(uint64_t cap);

/* cl_shm_ring_init: lay a new, empty ring of `cap` bytes out in `mem`
 * (cl_shm_ring_bytes(cap) bytes, 64-byte aligned) - done once, by the side
 * that makes the memory. */
int cl_shm_ring_init(cl_shm_ring *r, void *mem, uint64_t cap);

/* cl_shm_ring_attach: the view of a ring another process laid out in
 * `mem` (of `bytes` bytes), checking what the memory claims: COLLIE_EPROTO
 * if the capacity is not a power of two, does not fit, or the counters are
 * inconsistent. */
int cl_shm_ring_attach(cl_shm_ring *r, void *mem, size_t bytes);

/* cl_shm_ring_span: the bytes in a ring whose counters read `head` and
 * `tail` (one snapshot of each), or -1 if they make no sense - tail ahead
 * of head, or more than `cap` apart: the peer corrupted them. The one
 * check of what the other process wrote; every call below makes it. */
int64_t cl_shm_ring_span(uint64_t head, uint64_t tail, uint64_t cap);

/* Producer: copy as much of iov[0..n) as fits, in order; returns the bytes
 * written (0 when full), or -1 with errno EPROTO if the counters are
 * corrupt (nothing moves; from then on every call says so: r->corrupt). */
ssize_t cl_shm_ring_writev(cl_shm_ring *r, const struct iovec *iov, int n);
/* Consumer: copy up to len bytes out; returns the bytes read (0 when
 * empty), or -1 with errno EPROTO as above. */
ssize_t cl_shm_ring_read(cl_shm_ring *r, void *buf, size_t len);

/* Bytes a read would get now / room a write would find now (0 if the
 * counters are corrupt: the next read or write reports it). */
uint64_t cl_shm_ring_readable(const cl_shm_ring *r);
uint64_t cl_shm_ring_writable(const cl_shm_ring *r);
/* Are the counters sane now (and were they in every call so far)? */
bool cl_shm_ring_sane(const cl_shm_ring *r);

/* Consumer about to sleep: true if it may (it is parked and the ring was
 * still empty after parking); false if data came meanwhile (not parked),
 * or the counters are corrupt (the next read reports it). */
bool cl_shm_ring_reader_park(cl_shm_ring *r);
/* Producer about to sleep until there is room for `want` bytes (at most the
 * capacity): as above. */
bool cl_shm_ring_writer_park(cl_shm_ring *r, uint64_t want);

/* After writing: true (and the flag cleared) if the consumer was parked -
 * ring its doorbell. After reading: the same for a parked producer. */
bool cl_shm_ring_wake_reader(cl_shm_ring *r);
bool cl_shm_ring_wake_writer(cl_shm_ring *r);

#endif
