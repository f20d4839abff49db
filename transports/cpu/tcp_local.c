/*
 * tcp_local.c — reaching same-host peers over shared memory: the choice of
 * link per peer, the abstract Unix listener, and the handshake's passing of
 * the link's memfd.
 *
 * Design notes
 *  - A rank whose mode allows shared memory (auto, shm) listens on an
 *    abstract Unix socket ("\0collie/<comm id>/<generation>/<rank>/<nonce>",
 *    nothing on the file system) and publishes "ip:port|host-id|name" where
 *    TCP alone publishes "ip:port". The dialer (the lower rank, as for TCP)
 *    uses the Unix socket when both allow it and the host identities agree
 *    (boot id, network namespace, uid: transports/cpu/shm/host_id.h), TCP
 *    otherwise; forcing shm with a peer it cannot use is COLLIE_EINVAL
 *    naming the peer and why.
 *  - Over the Unix socket runs the same authenticated handshake as over
 *    TCP (tcp_setup.c). The acceptor makes the link's memory when it
 *    accepts the HELLO and sends the memfd with its ACCEPT (SCM_RIGHTS);
 *    the dialer checks it before the connection is ready. From then on the
 *    frames go through the rings and the socket carries only doorbells and,
 *    by its end, the peer's death (transports/cpu/shm/link.h).
 *  - An accepted Unix connection from another user (effective uids
 *    compared: SO_PEERCRED's is the peer's effective one) is refused before
 *    any handshake: an abstract name is visible to every process in the
 *    network namespace. Such refusals are logged as tcp_setup.c's are: at
 *    most once per 5 s, with a count.
 */
#include <errno.h>
#include <openssl/rand.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "transports/cpu/tcp_conn_impl.h"

/* ---- the link's memory in the handshake ------------------------------------------------ */

static cl_shm_link_id link_id(const tcp_conn *c, bool creator) {
    const tcp_comm *tc = c->tc;
    uint32_t me = (uint32_t)tc->rank, peer = (uint32_t)c->peer;
    return (cl_shm_link_id){.comm_id = tc->comm_id,
                            .generation = tc->generation,
                            .creator = creator ? me : peer,
                            .dialer = creator ? peer : me};
}

int cl_tcp_local_make(tcp_conn *c, char *why, size_t len) {
    cl_shm_link_id id = link_id(c, true);
    return cl_shm_link_create(&c->shm, &id, c->tc->shm_ring_bytes, why, len);
}

int cl_tcp_local_attach(tcp_conn *c, char *why, size_t len) {
    cl_shm_link_id id = link_id(c, false);
    return cl_shm_link_attach(&c->shm, &id, why, len);
}

ssize_t cl_tcp_hs_send(tcp_conn *c, const void *buf, size_t len) {
    if (!(c->local && c->shm.map && c->shm.fd >= 0)) return send(c->fd, buf, len, MSG_NOSIGNAL);
    /* the acceptor's ACCEPT carries the link's memfd */
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &c->shm.fd, sizeof(int));
    ssize_t n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
    if (n > 0) { /* it went with the first byte: ours is no longer needed */
        close(c->shm.fd);
        c->shm.fd = -1;
    }
    return n;
}

ssize_t cl_tcp_hs_recv(tcp_conn *c, void *buf, size_t len) {
    if (!c->local) return recv(c->fd, buf, len, 0);
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(4 * sizeof(int))];
    } ctl;
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    ssize_t n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC);
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); n >= 0 && cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
        size_t nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < nfd; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
            /* only the dialer expects one, once: anything else is closed */
            if (c->initiator && c->shm.fd < 0 && !c->shm.map)
                c->shm.fd = fd;
            else
                close(fd);
        }
    }
    return n;
}

/* ---- listening --------------------------------------------------------------------------- */

static void local_on_accept(int lfd, unsigned what, void *arg) {
    (void)what;
    tcp_comm *tc = arg;
    for (int i = 0; i < 16; i++) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        struct ucred cred = {0};
        socklen_t cl = sizeof cred;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) {
            cl_tcp_log_refusal(tc,
                               "refused a same-host connection: its credentials could not be "
                               "read (SO_PEERCRED: %s)",
                               strerror(errno));
            close(fd);
            continue;
        }
        /* like with like: SO_PEERCRED gives the peer's effective uid (as of
         * its connect), so it is compared with our effective uid, the one
         * the kernel checks our own accesses with */
        uid_t me = geteuid();
        if (cred.uid != me) {
            cl_tcp_log_refusal(tc,
                               "refused a same-host connection from pid %d: its effective user "
                               "is %u, ours %u",
                               (int)cred.pid, (unsigned)cred.uid, (unsigned)me);
            close(fd);
            continue;
        }
        cl_tcp_conn_accepted(tc, fd, true);
    }
}

static int parse_mode(tcp_comm *tc) {
    if (tc->mode != TCP_MODE_AUTO) return COLLIE_OK; /* the backend's name chose */
    const char *m = tc->core->setting("COLLIE_CPU_TRANSPORT");
    if (!m || !strcasecmp(m, "auto")) return COLLIE_OK;
    if (!strcasecmp(m, "tcp")) {
        tc->mode = TCP_MODE_TCP;
        return COLLIE_OK;
    }
    if (!strcasecmp(m, "shm")) {
        tc->mode = TCP_MODE_SHM;
        return COLLIE_OK;
    }
    tc->core->set_error("COLLIE_CPU_TRANSPORT='%s' is invalid: expected auto, tcp or shm", m);
    return COLLIE_EINVAL;
}

static unsigned long long local_nonce(void) {
    unsigned long long v;
    if (RAND_bytes((unsigned char *)&v, sizeof v) != 1)
        v = ((unsigned long long)getpid() << 32) ^ (unsigned long long)(uintptr_t)&v;
    return v;
}

int cl_tcp_local_listen(tcp_comm *tc, char *published, size_t len) {
    tc->unix_fd = -1;
    int r = parse_mode(tc);
    if (r != COLLIE_OK) return r;
    const char *bytes = tc->core->setting("COLLIE_SHM_RING_BYTES");
    tc->shm_ring_bytes = bytes ? strtoull(bytes, NULL, 10) : CL_SHM_LINK_DEFAULT_RING;
    const char *single = tc->core->setting("COLLIE_SHM_SINGLE_COPY");
    tc->shm_single_copy = single ? strtoull(single, NULL, 10) : CL_SHM_SINGLE_COPY_DEFAULT;
    snprintf(published, len, "%s", tc->addr);
    if (tc->mode == TCP_MODE_TCP) return COLLIE_OK;
    tc->host_known = cl_host_id_self(&tc->host) == COLLIE_OK;
    if (!tc->host_known) {
        if (tc->mode == TCP_MODE_AUTO) return COLLIE_OK; /* TCP for everyone */
        tc->core->set_error("the shm transport cannot tell this host's identity (/proc/sys/kernel/"
                            "random/boot_id, /proc/self/ns/net): use auto or tcp");
        return COLLIE_ESYSTEM;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        tc->core->set_error("a Unix socket for same-host peers: %s", strerror(errno));
        return COLLIE_ESYSTEM;
    }
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    socklen_t slen = 0;
    int bound = -1;
    for (int tries = 0; tries < 4 && bound != 0; tries++) {
        snprintf(tc->unix_name, sizeof tc->unix_name, "collie/%016llx/%llu/%d/%016llx",
                 (unsigned long long)tc->comm_id, (unsigned long long)tc->generation, tc->rank,
                 local_nonce());
        size_t n = strlen(tc->unix_name);
        memcpy(sun.sun_path + 1, tc->unix_name, n); /* sun_path[0] = 0: abstract */
        slen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
        bound = bind(fd, (struct sockaddr *)&sun, slen);
    }
    if (bound != 0 || listen(fd, 1024) != 0) {
        tc->core->set_error("listening on an abstract Unix socket for same-host peers: %s",
                            strerror(errno));
        close(fd);
        return COLLIE_ESYSTEM;
    }
    tc->unix_fd = fd;
    tc->unix_ev = tc->core->watch_new(tc->bc, fd, COLLIE_WATCH_READ, local_on_accept, tc);
    if (!tc->unix_ev) return COLLIE_ENOMEM;
    tc->core->watch_start(tc->unix_ev, -1);
    char host[CL_HOST_ID_TEXT];
    cl_host_id_format(&tc->host, host);
    snprintf(published, len, "%s|%s|%s", tc->addr, host, tc->unix_name);
    return COLLIE_OK;
}

void cl_tcp_local_close(tcp_comm *tc) {
    if (tc->unix_ev) tc->core->watch_free(tc->unix_ev);
    tc->unix_ev = NULL;
    if (tc->unix_fd >= 0) close(tc->unix_fd);
    tc->unix_fd = -1;
}

/* ---- choosing the link to a peer ------------------------------------------------------ */

/* Dial the peer's abstract Unix socket `name`. */
static int local_dial(tcp_conn *c, const char *name) {
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    size_t n = strlen(name);
    memcpy(sun.sun_path + 1, name, n);
    socklen_t slen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        cl_tcp_conn_lost(c, COLLIE_ESYSTEM, "socket: %s", strerror(errno));
        return -1;
    }
    c->local = true;
    if (cl_tcp_conn_attach_fd(c, fd) != COLLIE_OK) {
        cl_tcp_conn_lost(c, COLLIE_ENOMEM, "no memory for events");
        return -1;
    }
    c->state = TCP_CONN_CONNECTING;
    if (connect(fd, (struct sockaddr *)&sun, slen) < 0 && errno != EINPROGRESS) {
        cl_tcp_conn_lost(c, COLLIE_EPEER,
                         "connect to rank %d over its same-host socket failed: %s%s", c->peer,
                         strerror(errno), errno == EAGAIN ? " (its listen queue is full)" : "");
        return -1;
    }
    c->tc->core->watch_start(c->wev, -1);
    return 1;
}

int cl_tcp_local_route(tcp_conn *c, const char *value, char *tcp_addr, size_t len) {
    tcp_comm *tc = c->tc;
    const char *bar = strchr(value, '|');
    snprintf(tcp_addr, len, "%.*s", bar ? (int)(bar - value) : (int)strlen(value), value);
    cl_host_id theirs;
    char host[CL_HOST_ID_TEXT] = "", name[sizeof tc->unix_name] = "";
    bool offers = false;
    if (bar) {
        const char *bar2 = strchr(bar + 1, '|');
        size_t hl = bar2 ? (size_t)(bar2 - bar - 1) : 0;
        if (bar2 && hl < sizeof host && strlen(bar2 + 1) < sizeof name) {
            memcpy(host, bar + 1, hl);
            host[hl] = '\0';
            snprintf(name, sizeof name, "%s", bar2 + 1);
        }
        if (!name[0] || strchr(name, '|') || cl_host_id_parse(host, &theirs) != COLLIE_OK) {
            cl_tcp_conn_lost(c, COLLIE_EPROTO, "rank %d published a bad address", c->peer);
            return -1;
        }
        offers = true;
    }
    if (tc->mode == TCP_MODE_TCP) return 0;
    if (!offers) {
        if (tc->mode == TCP_MODE_AUTO) return 0;
        cl_tcp_conn_lost(c, COLLIE_EINVAL,
                         "rank %d cannot be reached over shared memory: it offers none (its CPU "
                         "transport is tcp); use the auto or tcp transport",
                         c->peer);
        return -1;
    }
    if (!tc->host_known || !cl_host_id_same(&tc->host, &theirs)) {
        if (tc->mode == TCP_MODE_AUTO) return 0;
        cl_tcp_conn_lost(c, COLLIE_EINVAL,
                         "rank %d is not on this host (its boot id, network namespace or user "
                         "differ): the shm transport reaches only same-host peers; use the auto "
                         "or tcp transport",
                         c->peer);
        return -1;
    }
    return local_dial(c, name);
}
