/*
 * link.c — the same-host link: two shared-memory rings in a sealed memfd,
 * a Unix socket as doorbell and liveness (see link.h).
 *
 * Design notes
 *  - Layout: one 4 KiB header page (the header, then each side's loans at
 *    LINK_LOANS_OFF: creator's, dialer's), then ring 0 (dialer → creator),
 *    then ring 1 (creator → dialer), each page-aligned. The header names the
 *    comm id, generation and both ranks; the dialer compares every field
 *    with what its handshake established before it maps a ring.
 *  - The memfd is sealed against shrinking and growing before it is handed
 *    over, so neither side can make the other's mapping fault (SIGBUS) by
 *    truncating the file; the dialer refuses an unsealed one.
 *  - No name anywhere: memfd_create has no path, the doorbell socket is an
 *    abstract Unix socket. A rank killed at any moment leaves nothing in
 *    /dev/shm; the memory goes when the last mapping and fd do.
 *  - Doorbells: a side that found nothing to do parks (ring.h) and waits
 *    for its socket to become readable; the other side writes one byte when
 *    it moves bytes past a parked side. A doorbell that cannot be written
 *    (the socket buffer is full of earlier ones) is not needed: the parked
 *    side has unread bytes waiting already. The socket's EOF is the peer's
 *    death or close, seen by the progress loop as soon as over TCP.
 */
#include "transports/cpu/shm/link.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "collie.h"

#define LINK_MAGIC   0x4c534c43u /* "CLSL" */
#define LINK_VERSION 2u          /* 2: the loans of single copy */
#define LINK_PAGE    4096u
#define LINK_MIN_CAP 4096u
#define LINK_MAX_CAP (1u << 30)

/* The header page, at offset 0 of the memfd. */
typedef struct link_header {
    uint32_t magic, version;
    uint64_t comm_id, generation;
    uint32_t creator, dialer;
    uint64_t ring_cap;
    uint64_t ring_off[2]; /* 0: dialer → creator, 1: creator → dialer */
} link_header;

#define LINK_LOANS_OFF 1024u /* side i's loans at LINK_LOANS_OFF * (1 + i) */
_Static_assert(sizeof(cl_shm_loan_side) <= LINK_LOANS_OFF, "the loans fit the header page");

static cl_shm_loan_side *link_loans(void *map, int side) {
    return (cl_shm_loan_side *)((uint8_t *)map + LINK_LOANS_OFF * (1 + side));
}

static uint64_t page_up(uint64_t v) { return (v + LINK_PAGE - 1) & ~(uint64_t)(LINK_PAGE - 1); }

static uint64_t cap_round(uint64_t want) {
    uint64_t cap = LINK_MIN_CAP;
    while (cap < want && cap < LINK_MAX_CAP)
        cap <<= 1;
    return cap;
}

/* total size of a link whose rings hold cap bytes each */
static uint64_t link_size(uint64_t cap) { return LINK_PAGE + 2 * page_up(cl_shm_ring_bytes(cap)); }

void cl_shm_link_init(cl_shm_link *l) {
    memset(l, 0, sizeof *l);
    l->fd = -1;
    l->loans.pidfd = -1;
}

bool cl_shm_link_ready(const cl_shm_link *l) { return l->map != NULL; }

void cl_shm_link_hang_up(cl_shm_link *l) {
    if (l->fd >= 0) close(l->fd);
    l->fd = -1;
    cl_shm_loans_fini(&l->loans);
}

void cl_shm_link_close(cl_shm_link *l) {
    cl_shm_link_hang_up(l);
    if (l->map) munmap(l->map, l->map_len);
    l->map = NULL;
    l->map_len = 0;
    l->fd = -1;
}

int cl_shm_link_create(cl_shm_link *l, const cl_shm_link_id *id, uint64_t ring_bytes, char *why,
                       size_t why_len) {
    uint64_t cap = cap_round(ring_bytes);
    uint64_t size = link_size(cap);
    int fd = memfd_create("collie", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        snprintf(why, why_len, "memfd_create: %s", strerror(errno));
        return COLLIE_ESYSTEM;
    }
    const char *step = "ftruncate";
    if (ftruncate(fd, (off_t)size) != 0 ||
        (step = "sealing", fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) !=
            0) {
        snprintf(why, why_len, "shared memory of %llu bytes: %s: %s", (unsigned long long)size,
                 step, strerror(errno));
        close(fd);
        return errno == ENOMEM || errno == ENOSPC ? COLLIE_ENOMEM : COLLIE_ESYSTEM;
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        snprintf(why, why_len, "mmap of %llu bytes: %s", (unsigned long long)size, strerror(errno));
        close(fd);
        return COLLIE_ENOMEM;
    }
    link_header *h = map;
    *h = (link_header){.magic = LINK_MAGIC,
                       .version = LINK_VERSION,
                       .comm_id = id->comm_id,
                       .generation = id->generation,
                       .creator = id->creator,
                       .dialer = id->dialer,
                       .ring_cap = cap,
                       .ring_off = {LINK_PAGE, LINK_PAGE + page_up(cl_shm_ring_bytes(cap))}};
    cl_shm_ring_init(&l->rx, (uint8_t *)map + h->ring_off[0], cap);
    cl_shm_ring_init(&l->tx, (uint8_t *)map + h->ring_off[1], cap);
    cl_shm_loans_init(&l->loans, link_loans(map, 0), link_loans(map, 1));
    l->map = map;
    l->map_len = (size_t)size;
    l->fd = fd;
    return COLLIE_OK;
}

const char *cl_shm_link_check(const void *map, size_t size, const cl_shm_link_id *id,
                              cl_shm_ring *tx, cl_shm_ring *rx) {
    link_header h;
    memcpy(&h, map, sizeof h); /* one copy: the peer cannot change it under the checks */
    if (h.magic != LINK_MAGIC || h.version != LINK_VERSION)
        return "not a collie link of this version";
    if (h.comm_id != id->comm_id || h.generation != id->generation)
        return "it belongs to another comm or generation";
    if (h.creator != id->creator || h.dialer != id->dialer) return "it names other ranks";
    if (h.ring_cap != cap_round(h.ring_cap) || link_size(h.ring_cap) != size ||
        h.ring_off[0] != LINK_PAGE ||
        h.ring_off[1] != LINK_PAGE + page_up(cl_shm_ring_bytes(h.ring_cap)))
        return "its layout does not add up";
    /* the rings' own words (capacity, counters) are read once each there */
    if (cl_shm_ring_attach(tx, (uint8_t *)map + h.ring_off[0], cl_shm_ring_bytes(h.ring_cap)) !=
            COLLIE_OK ||
        cl_shm_ring_attach(rx, (uint8_t *)map + h.ring_off[1], cl_shm_ring_bytes(h.ring_cap)) !=
            COLLIE_OK ||
        tx->cap != h.ring_cap || rx->cap != h.ring_cap)
        return "its rings are inconsistent";
    return NULL;
}

int cl_shm_link_attach(cl_shm_link *l, const cl_shm_link_id *id, char *why, size_t why_len) {
    int fd = l->fd;
    l->fd = -1;
    if (fd < 0) {
        snprintf(why, why_len, "no shared memory came with the answer");
        return COLLIE_EPROTO;
    }
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)link_size(LINK_MIN_CAP) ||
        st.st_size > (off_t)link_size(LINK_MAX_CAP) || seals < 0 || !(seals & F_SEAL_SHRINK)) {
        snprintf(why, why_len, "the shared memory it sent is not a sealed collie link");
        close(fd);
        return COLLIE_EPROTO;
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (map == MAP_FAILED) { /* EACCES, EPERM...: a descriptor that may not be mapped so */
        snprintf(why, why_len, "its shared memory cannot be mapped for reading and writing: %s",
                 strerror(err));
        return err == ENOMEM ? COLLIE_ENOMEM : COLLIE_EPROTO;
    }
    const char *bad = cl_shm_link_check(map, size, id, &l->tx, &l->rx);
    if (bad) {
        snprintf(why, why_len, "its shared memory was refused: %s", bad);
        munmap(map, size);
        return COLLIE_EPROTO;
    }
    l->map = map;
    l->map_len = size;
    cl_shm_loans_init(&l->loans, link_loans(map, 1), link_loans(map, 0));
    return COLLIE_OK;
}

void cl_shm_link_ring_doorbell(int sock) {
    char b = 1;
    ssize_t n = send(sock, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    (void)n; /* full of earlier doorbells, or the peer is gone: either way not needed */
}

void cl_shm_link_drain_doorbell(cl_shm_link *l, int sock) {
    char buf[256];
    for (int i = 0; i < 16; i++) {
        ssize_t n = recv(sock, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0) continue;
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) l->eof = true;
        return;
    }
}

bool cl_shm_link_readable(const cl_shm_link *l) {
    /* a corrupt ring has something to say: the read's EPROTO */
    return l->map && (cl_shm_ring_readable(&l->rx) > 0 || !cl_shm_ring_sane(&l->rx));
}

ssize_t cl_shm_link_recv(cl_shm_link *l, int sock, void *buf, size_t len, bool park) {
    if (len == 0) return 0;
    for (int tries = 0; tries < 2; tries++) {
        ssize_t n = cl_shm_ring_read(&l->rx, buf, len);
        if (n < 0) return -1; /* EPROTO: the peer corrupted the ring */
        if (n > 0) {
            if (cl_shm_ring_wake_writer(&l->rx)) cl_shm_link_ring_doorbell(sock);
            return (ssize_t)n;
        }
        if (l->eof) return 0;
        if (!park || cl_shm_ring_reader_park(&l->rx)) break;
    }
    errno = EAGAIN;
    return -1;
}

ssize_t cl_shm_link_writev(cl_shm_link *l, int sock, const struct iovec *iov, int niov) {
    if (l->eof) {
        errno = EPIPE;
        return -1;
    }
    size_t total = 0;
    for (int i = 0; i < niov; i++)
        total += iov[i].iov_len;
    if (total == 0) return 0;
    for (int tries = 0; tries < 2; tries++) {
        ssize_t n = cl_shm_ring_writev(&l->tx, iov, niov);
        if (n < 0) return -1; /* EPROTO, as above */
        if (n > 0) {
            if (cl_shm_ring_wake_reader(&l->tx)) cl_shm_link_ring_doorbell(sock);
            /* the ring filled up: park, so the reader's progress rings us
             * (if room came meanwhile, the caller simply writes again) */
            if ((size_t)n < total && cl_shm_ring_writer_park(&l->tx, 1)) l->writer_wait = true;
            return (ssize_t)n;
        }
        if (cl_shm_ring_writer_park(&l->tx, 1)) break;
    }
    l->writer_wait = true;
    errno = EAGAIN;
    return -1;
}
