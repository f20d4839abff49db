/*
 * run_master.c — torch's rendezvous address (MASTER_ADDR, MASTER_PORT), apart
 * from collie's store, so that init_process_group(init_method="env://")
 * works under collie-run.
 *
 * Design notes
 *  - torch's env:// has rank 0 listen on MASTER_PORT (its TCPStore) and the
 *    others speak TCPStore's protocol to it, so MASTER_PORT must be a port
 *    nobody serves: not collie's store, which the ranks find in
 *    COLLIE_STORE_ADDR only.
 *  - MASTER_ADDR: --master-addr, else node 0's host (--store's) in a
 *    multi-node job, else 127.0.0.1 (every rank runs here, torch's rank 0
 *    too). MASTER_PORT: --master-port, else --store's port + 1 in a
 *    multi-node job (every node must agree without talking), else a free
 *    port the kernel picks.
 *  - The race of "a free port" (found, closed, taken by someone else before
 *    torch binds it) is closed by never closing it: the launcher of node 0
 *    keeps a socket bound there (SO_REUSEADDR, never listening) for the
 *    whole job. Linux then refuses the port to any bind without
 *    SO_REUSEADDR and never hands it out as an ephemeral port, while
 *    torch's TCPStore (SO_REUSEADDR, as libuv's too) binds and listens
 *    there, also again after a restart of rank 0. A chosen port that cannot
 *    be held (something listens there) is a warning, not an error: a job
 *    that does not use torch's env:// runs anyway.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "run.h"

/* Bind a socket to port (0: any) on every address, SO_REUSEADDR, not
 * listening; its fd, or -1 with errno. *port gets the port bound. */
static int run_master_hold(int *port) {
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool v6 = fd >= 0;
    if (!v6) fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_storage ss = {0};
    socklen_t len;
    if (v6) { /* [::]:port, both families (as torch's "::" binds) */
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_any;
        a->sin6_port = htons((uint16_t)*port);
        len = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_ANY);
        a->sin_port = htons((uint16_t)*port);
        len = sizeof *a;
    }
    if (bind(fd, (struct sockaddr *)&ss, len) != 0 ||
        getsockname(fd, (struct sockaddr *)&ss, &len) != 0) {
        int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    *port =
        ntohs(v6 ? ((struct sockaddr_in6 *)&ss)->sin6_port : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

int run_master_init(run_job *job) {
    const run_opts *o = &job->opts;
    const char *host = o->master_addr  ? o->master_addr
                       : o->nnodes > 1 ? job->store_host
                                       : "127.0.0.1";
    snprintf(job->master_host, sizeof job->master_host, "%s", host);
    int port = o->master_port;
    if (port == 0 && o->nnodes > 1) {
        run_parse_int(job->store_port, 1, 65535, &port);
        if (port == 65535) {
            fprintf(stderr, "collie-run: the store's port is 65535: --master-port P needed "
                            "(torch's MASTER_PORT, the same on every node)\n");
            return -1;
        }
        port++;
    }
    if (o->node_rank == 0) { /* torch's rank 0 runs here: hold its port */
        int want = port;
        job->master_fd = run_master_hold(&port);
        if (job->master_fd < 0 && want == 0) {
            fprintf(stderr, "collie-run: no free port for MASTER_PORT: %s\n", strerror(errno));
            return -1;
        }
        if (job->master_fd < 0)
            fprintf(stderr,
                    "collie-run: warning: MASTER_PORT %d cannot be held here (%s): torch's "
                    "env:// will not listen there; --master-port P picks another\n",
                    want, strerror(errno));
    }
    snprintf(job->master_port, sizeof job->master_port, "%d", port);
    return 0;
}
