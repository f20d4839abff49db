/*
 * ring.c — the single-producer, single-consumer shared-memory byte ring
 * (see ring.h).
 *
 * Design notes
 *  - Publication: the producer copies the bytes, then stores head with
 *    release; the consumer loads head with acquire before reading them, and
 *    stores tail with release after; the producer loads tail with acquire
 *    before reusing that space. Each side reads the other's counter once
 *    per call, so a call costs two shared cache lines at most.
 *  - Parking is the only seq_cst pair (flag store, then counter load on one
 *    side; counter store, then flag load on the other): with anything
 *    weaker both sides could miss each other and sleep for good.
 *  - The other process is not trusted to be sane, only to be the same
 *    program. Each call reads each counter once (a snapshot the peer
 *    cannot change under the check) and checks the pair with the pure
 *    cl_shm_ring_span: counters that moved backwards or more than the
 *    capacity apart are refused by attach, and in use make read and writev
 *    fail with EPROTO (the link's connection then fails naming the peer)
 *    and keep failing - never a silent "empty" or "full", which would stall
 *    the link until the deadline and report a timeout instead of the cause.
 *    Positions are masked, so no counter can make this side copy out of
 *    the ring; the bytes between sane counters are the peer's to choose,
 *    as over TCP (the framing above checks them).
 */
#include "transports/cpu/shm/ring.h"

#include <errno.h>
#include <string.h>

#include "collie.h"

#define RING_MIN_CAP 4096u

static bool is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

size_t cl_shm_ring_bytes(uint64_t cap) {
    if (cap < RING_MIN_CAP || !is_pow2(cap) || cap > ((uint64_t)1 << 40)) return 0;
    return sizeof(cl_shm_ring_shared) + (size_t)cap;
}

static void ring_view(cl_shm_ring *r, void *mem, uint64_t cap) {
    r->sh = mem;
    r->data = (uint8_t *)mem + sizeof(cl_shm_ring_shared);
    r->cap = cap;
    r->mask = cap - 1;
    r->corrupt = false;
}

int cl_shm_ring_init(cl_shm_ring *r, void *mem, uint64_t cap) {
    if (!r || !mem || cl_shm_ring_bytes(cap) == 0 || ((uintptr_t)mem % CL_SHM_CACHELINE) != 0)
        return COLLIE_EINVAL;
    cl_shm_ring_shared *sh = mem;
    atomic_init(&sh->head, 0);
    atomic_init(&sh->tail, 0);
    atomic_init(&sh->reader_parked, 0);
    atomic_init(&sh->writer_parked, 0);
    sh->capacity = cap;
    ring_view(r, mem, cap);
    return COLLIE_OK;
}

int cl_shm_ring_attach(cl_shm_ring *r, void *mem, size_t bytes) {
    if (!r || !mem || bytes < sizeof(cl_shm_ring_shared) ||
        ((uintptr_t)mem % CL_SHM_CACHELINE) != 0)
        return COLLIE_EINVAL;
    const cl_shm_ring_shared *sh = mem;
    uint64_t cap = sh->capacity;
    size_t need = cl_shm_ring_bytes(cap);
    if (need == 0 || need > bytes) return COLLIE_EPROTO;
    uint64_t head = atomic_load_explicit(&sh->head, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&sh->tail, memory_order_acquire);
    if (cl_shm_ring_span(head, tail, cap) < 0) return COLLIE_EPROTO;
    ring_view(r, mem, cap);
    return COLLIE_OK;
}

int64_t cl_shm_ring_span(uint64_t head, uint64_t tail, uint64_t cap) {
    uint64_t used = head - tail; /* wraps to a huge value if tail is ahead */
    return used <= cap ? (int64_t)used : -1;
}

/* The bytes in r now, or -1 if its counters are (or were) corrupt. */
static int64_t ring_used(const cl_shm_ring *r, uint64_t head, uint64_t tail) {
    return r->corrupt ? -1 : cl_shm_ring_span(head, tail, r->cap);
}

/* A call found the counters corrupt: say so, now and from now on. */
static ssize_t ring_corrupt(cl_shm_ring *r) {
    r->corrupt = true;
    errno = EPROTO;
    return -1;
}

uint64_t cl_shm_ring_readable(const cl_shm_ring *r) {
    uint64_t head = atomic_load_explicit(&r->sh->head, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&r->sh->tail, memory_order_relaxed);
    int64_t used = ring_used(r, head, tail);
    return used > 0 ? (uint64_t)used : 0;
}

uint64_t cl_shm_ring_writable(const cl_shm_ring *r) {
    uint64_t head = atomic_load_explicit(&r->sh->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&r->sh->tail, memory_order_acquire);
    int64_t used = ring_used(r, head, tail);
    return used >= 0 ? r->cap - (uint64_t)used : 0;
}

bool cl_shm_ring_sane(const cl_shm_ring *r) {
    uint64_t head = atomic_load_explicit(&r->sh->head, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&r->sh->tail, memory_order_acquire);
    return ring_used(r, head, tail) >= 0;
}

ssize_t cl_shm_ring_writev(cl_shm_ring *r, const struct iovec *iov, int n) {
    uint64_t head = atomic_load_explicit(&r->sh->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&r->sh->tail, memory_order_acquire);
    int64_t used = ring_used(r, head, tail);
    if (used < 0) return ring_corrupt(r);
    uint64_t room = r->cap - (uint64_t)used;
    uint64_t wrote = 0;
    for (int i = 0; i < n && room > 0; i++) {
        const uint8_t *src = iov[i].iov_base;
        uint64_t len = iov[i].iov_len < room ? iov[i].iov_len : room;
        if (len == 0) continue; /* memcpy may not see an empty iovec's NULL base */
        uint64_t pos = (head + wrote) & r->mask;
        uint64_t first = r->cap - pos < len ? r->cap - pos : len;
        memcpy(r->data + pos, src, (size_t)first);
        if (len > first) memcpy(r->data, src + first, (size_t)(len - first));
        wrote += len;
        room -= len;
    }
    if (wrote > 0) atomic_store_explicit(&r->sh->head, head + wrote, memory_order_release);
    return (ssize_t)wrote;
}

ssize_t cl_shm_ring_read(cl_shm_ring *r, void *buf, size_t len) {
    uint64_t tail = atomic_load_explicit(&r->sh->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&r->sh->head, memory_order_acquire);
    int64_t used = ring_used(r, head, tail);
    if (used < 0) return ring_corrupt(r);
    uint64_t take = len < (uint64_t)used ? len : (uint64_t)used;
    if (take == 0) return 0;
    uint64_t pos = tail & r->mask;
    uint64_t first = r->cap - pos < take ? r->cap - pos : take;
    memcpy(buf, r->data + pos, (size_t)first);
    if (take > first) memcpy((uint8_t *)buf + first, r->data, (size_t)(take - first));
    atomic_store_explicit(&r->sh->tail, tail + take, memory_order_release);
    return (ssize_t)take;
}

/* Parking: a corrupt ring never sleeps - the next call reports it. */
bool cl_shm_ring_reader_park(cl_shm_ring *r) {
    atomic_store_explicit(&r->sh->reader_parked, 1, memory_order_seq_cst);
    uint64_t head = atomic_load_explicit(&r->sh->head, memory_order_seq_cst);
    uint64_t tail = atomic_load_explicit(&r->sh->tail, memory_order_relaxed);
    if (ring_used(r, head, tail) == 0) return true;
    atomic_store_explicit(&r->sh->reader_parked, 0, memory_order_relaxed);
    return false;
}

bool cl_shm_ring_writer_park(cl_shm_ring *r, uint64_t want) {
    if (want > r->cap) want = r->cap;
    atomic_store_explicit(&r->sh->writer_parked, 1, memory_order_seq_cst);
    uint64_t tail = atomic_load_explicit(&r->sh->tail, memory_order_seq_cst);
    uint64_t head = atomic_load_explicit(&r->sh->head, memory_order_relaxed);
    int64_t used = ring_used(r, head, tail);
    if (used >= 0 && r->cap - (uint64_t)used < want) return true;
    atomic_store_explicit(&r->sh->writer_parked, 0, memory_order_relaxed);
    return false;
}

/* The side that moved bytes (its counter already stored, seq_cst below
 * orders that store before the flag's load). */
static bool wake(_Atomic uint32_t *flag) {
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(flag, memory_order_seq_cst) == 0) return false;
    return atomic_exchange_explicit(flag, 0, memory_order_acq_rel) != 0;
}

bool cl_shm_ring_wake_reader(cl_shm_ring *r) { return wake(&r->sh->reader_parked); }

bool cl_shm_ring_wake_writer(cl_shm_ring *r) { return wake(&r->sh->writer_parked); }
