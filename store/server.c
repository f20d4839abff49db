/*
 * server.c — the store server's lifecycle: create, listen, accept, stop.
 *
 * Design notes
 *  - The server lives on an engine: its listener, connections and key table
 *    belong to the engine's loop thread. create and destroy run on the
 *    caller's thread and do their loop-side work through cl_engine_call, so
 *    the caller sees bind errors synchronously.
 *  - It is a cl_resident: collie_engine_destroy closes it (listener and
 *    connections, so clients see the server go away) and sets `shut`; the
 *    owner's collie_store_server_destroy then only frees memory and never
 *    touches the (freed) engine.
 *  - Accept errors such as EMFILE pause the listener for a moment instead of
 *    spinning on a socket that stays readable.
 *  - One listener per address the bind address names, all on one port (the
 *    first's, when asked for port 0): a wildcard is 0.0.0.0 and ::, a name
 *    such as "localhost" may be 127.0.0.1 and ::1, so a client reaches the
 *    server whichever of them it tries. IPv6 listeners are IPv6-only (the
 *    IPv4 one takes the v4 traffic). An address after the first that cannot
 *    be bound (no IPv6 here) is skipped, logged; none at all is an error.
 *  - The loopback rule (store/auth.h, docs/security.md): no address means
 *    127.0.0.1, and a server without a token is refused an address beyond
 *    loopback unless the caller opts in (opts.insecure, COLLIE_INSECURE).
 */
#include <errno.h>
#include <netinet/in.h>
#include <unistd.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "store/addr.h"
#include "store/auth.h"
#include "store/server.h"

#define STORE_SRV_BACKLOG     4096
#define STORE_SRV_RELISTEN_MS 100

static void store_srv_on_accept(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa,
                                int salen, void *arg) {
    CL_UNUSED(lis);
    collie_store_server *s = arg;
    const char *prev = cl_engine_set_activity(s->engine, "store server: accept");
    cl_store_srv_accept(s, fd, sa, salen);
    cl_engine_set_activity(s->engine, prev);
}

static void store_srv_on_relisten(evutil_socket_t fd, short what, void *arg) {
    CL_UNUSED(fd);
    CL_UNUSED(what);
    collie_store_server *s = arg;
    for (int i = 0; i < s->nlis; i++)
        evconnlistener_enable(s->lis[i]);
}

static void store_srv_on_accept_error(struct evconnlistener *lis, void *arg) {
    collie_store_server *s = arg;
    int err = EVUTIL_SOCKET_ERROR();
    cl_store_srv_log_refusal(s, "accept failed: %s; pausing accepts for %d ms", strerror(err),
                             STORE_SRV_RELISTEN_MS);
    CL_UNUSED(lis);
    for (int i = 0; i < s->nlis; i++) /* a lack of descriptors hits them all */
        evconnlistener_disable(s->lis[i]);
    struct timeval tv = {0, STORE_SRV_RELISTEN_MS * 1000};
    evtimer_add(s->relisten_ev, &tv);
}

static void store_srv_close_listeners(collie_store_server *s) {
    for (int i = 0; i < s->nlis; i++)
        evconnlistener_free(s->lis[i]);
    s->nlis = 0;
}

/* Listen on address i of s->bind at `port` (0: any): the listening socket,
 * or -1 with errno set. */
static int store_srv_listen_fd(collie_store_server *s, int i, uint16_t port) {
    struct sockaddr_storage sa = s->bind.sa[i];
    if (sa.ss_family == AF_INET6)
        ((struct sockaddr_in6 *)&sa)->sin6_port = htons(port);
    else
        ((struct sockaddr_in *)&sa)->sin_port = htons(port);
    int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if ((sa.ss_family == AF_INET6 &&
         setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) != 0) ||
        bind(fd, (struct sockaddr *)&sa, s->bind.len[i]) != 0 ||
        listen(fd, STORE_SRV_BACKLOG) != 0) {
        int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

/* Loop thread: a listener on every address of s->bind, on one port. */
static int store_srv_listen(collie_store_server *s, struct event_base *base) {
    uint16_t port = 0;
    for (int i = 0; i < s->bind.n; i++) {
        char where[64];
        cl_store_addr_format((struct sockaddr *)&s->bind.sa[i], where, sizeof where);
        if (i == 0)
            port = ntohs(s->bind.sa[0].ss_family == AF_INET6
                             ? ((struct sockaddr_in6 *)&s->bind.sa[0])->sin6_port
                             : ((struct sockaddr_in *)&s->bind.sa[0])->sin_port);
        int fd = store_srv_listen_fd(s, i, port);
        struct evconnlistener *lis =
            fd < 0 ? NULL
                   : evconnlistener_new(base, store_srv_on_accept, s, LEV_OPT_CLOSE_ON_FREE, 0, fd);
        if (!lis) {
            int err = errno;
            if (fd >= 0) close(fd);
            if (i == 0) {
                snprintf(s->start_err, sizeof s->start_err, "store server: cannot listen on %s: %s",
                         s->name, strerror(err));
                return COLLIE_ESYSTEM;
            }
            CL_INFO("store", "server %s: not listening on %s too: %s", s->name, where,
                    strerror(err));
            continue;
        }
        evconnlistener_set_error_cb(lis, store_srv_on_accept_error);
        s->lis[s->nlis++] = lis;
        if (i == 0) { /* the port the others take */
            struct sockaddr_storage bound;
            socklen_t blen = sizeof bound;
            if (getsockname(fd, (struct sockaddr *)&bound, &blen) == 0) {
                cl_store_addr_format((struct sockaddr *)&bound, s->name, sizeof s->name);
                port =
                    ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                      : ((struct sockaddr_in *)&bound)->sin_port);
                atomic_store(&s->port, port);
            }
        } else {
            CL_DEBUG("store", "server %s: also listening on %s", s->name, where);
        }
    }
    return COLLIE_OK;
}

/* Loop thread: close everything; from_engine: the engine is shutting down
 * (it forgets its residents itself). */
static void store_srv_stop(collie_store_server *s, bool from_engine) {
    if (atomic_load_explicit(&s->shut, memory_order_acquire)) return;
    store_srv_close_listeners(s);
    if (s->relisten_ev) event_free(s->relisten_ev);
    s->relisten_ev = NULL;
    store_srv_conn *c;
    while ((c = cl_list_first(&s->conns, store_srv_conn, link)))
        cl_store_srv_conn_free(c);
    if (s->flush_ev) event_free(s->flush_ev);
    s->flush_ev = NULL;
    while ((c = cl_list_first(&s->conns, store_srv_conn, link)))
        cl_store_srv_conn_free(c);
    cl_store_kv_destroy(s->kv);
    s->kv = NULL;
    if (!from_engine) cl_engine_remove_resident(s->engine, &s->resident);
    CL_INFO("store", "server %s: stopped", s->name);
    atomic_store_explicit(&s->shut, true, memory_order_release);
}

static void store_srv_on_engine_shutdown(cl_resident *r) {
    store_srv_stop(cl_container_of(r, collie_store_server, resident), true);
}

static void store_srv_stop_call(void *arg) { store_srv_stop(arg, false); }

static void store_srv_start_call(void *arg) {
    collie_store_server *s = arg;
    struct event_base *base = cl_engine_base(s->engine);
    s->relisten_ev = evtimer_new(base, store_srv_on_relisten, s);
    cl_list_init(&s->dirty);
    if (!s->relisten_ev) {
        s->start_status = COLLIE_ENOMEM;
        snprintf(s->start_err, sizeof s->start_err, "store server %s: out of memory", s->name);
        return;
    }
    if ((s->start_status = store_srv_listen(s, base)) != COLLIE_OK) goto fail;
    s->resident.shutdown = store_srv_on_engine_shutdown;
    s->resident.what = "store server: shutdown";
    if (cl_engine_add_resident(s->engine, &s->resident) != COLLIE_OK) {
        s->start_status = COLLIE_ECLOSED;
        snprintf(s->start_err, sizeof s->start_err, "store server: engine %s is shutting down",
                 cl_engine_name(s->engine));
        goto fail;
    }
    s->start_status = COLLIE_OK;
    return;
fail:
    store_srv_close_listeners(s);
    if (s->relisten_ev) event_free(s->relisten_ev);
    s->relisten_ev = NULL;
    if (s->flush_ev) event_free(s->flush_ev);
    s->flush_ev = NULL;
}

static void store_srv_free(collie_store_server *s) {
    if (!s) return;
    free(s->token);
    free(s);
}

static int store_srv_configure(collie_store_server *s, const char *bind_addr, uint16_t port,
                               const collie_store_server_opts *o) {
    int res = COLLIE_OK;
    char host[256];
    if (bind_addr && strlen(bind_addr) >= sizeof host)
        return cl_set_last_error(COLLIE_EINVAL, "store server: bind address too long");
    /* "[::1]" is accepted as well as "::1" */
    snprintf(host, sizeof host, "%s", bind_addr ? bind_addr : "127.0.0.1");
    size_t hl = strlen(host);
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    res = cl_store_addr_resolve(host, port, true, &s->bind);
    if (res != COLLIE_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", collie_last_error());
        return cl_set_last_error(res, "store server: bad bind address: %s", why);
    }
    snprintf(s->name, sizeof s->name, "%s%s%s:%u", strchr(host, ':') ? "[" : "", host,
             strchr(host, ':') ? "]" : "", (unsigned)port);
    CL_CHECK_GOTO(
        cl_store_auth_token(cl_opt(o, token, NULL), "collie_store_server_create", &s->token), res,
        out);
    s->token_len = s->token ? strlen(s->token) : 0;
    bool beyond = false; /* every address it would listen on must be loopback */
    for (int i = 0; i < s->bind.n; i++)
        beyond |= !cl_store_sockaddr_is_loopback((struct sockaddr *)&s->bind.sa[i]);
    if (!s->token && beyond) {
        if (!cl_opt(o, insecure, 0) && !cl_config_get()->insecure) {
            res = cl_set_last_error(
                COLLIE_EINVAL,
                "store server: %s is beyond loopback and the store has no token: anyone who "
                "can reach it could read and write it. Give it a token (opts.token, "
                "COLLIE_STORE_TOKEN, collie-store --token-file), or set opts.insecure or "
                "COLLIE_INSECURE=1 if that is meant",
                s->name);
            goto out;
        }
        CL_WARN("store",
                "server %s: no token, beyond loopback (insecure, as asked): anyone who "
                "can reach it can read and write it",
                s->name);
    }
    uint32_t v;
    s->lim.max_key_size = (v = cl_opt(o, max_key_size, 0)) ? v : 4096;
    s->lim.max_value_size = (v = cl_opt(o, max_value_size, 0)) ? v : 64u * 1024u * 1024u;
    s->lim.max_keys = (v = cl_opt(o, max_keys, 0)) ? v : 1000000;
    s->max_conns = (v = cl_opt(o, max_connections, 0)) ? v : 16384;
    s->handshake_ms = cl_config_get()->handshake_ms > 0 ? cl_config_get()->handshake_ms : 5000;
    if (s->lim.max_key_size > CL_STORE_PROTO_MAX_KEY ||
        s->lim.max_value_size > CL_STORE_PROTO_MAX_BODY / 2) {
        res = cl_set_last_error(COLLIE_EINVAL,
                                "store server: max_key_size %u or max_value_size %u exceeds the "
                                "protocol's limits (%u, %u)",
                                s->lim.max_key_size, s->lim.max_value_size, CL_STORE_PROTO_MAX_KEY,
                                CL_STORE_PROTO_MAX_BODY / 2);
        goto out;
    }
    /* one request carries at most a value and a key, or a multi_set /
     * multi-key request of about that total size */
    s->max_body = s->lim.max_value_size + s->lim.max_key_size + 64u * 1024u;
out:
    return res;
}

int collie_store_server_create(collie_engine *e, const char *bind_addr, uint16_t port,
                               const collie_store_server_opts *o, collie_store_server **out) {
    int res = COLLIE_OK;
    collie_store_server *s = NULL;
    uint8_t seed[16];
    cl_clear_last_error();
    if (out) *out = NULL;
    if (!e || !out)
        return cl_set_last_error(COLLIE_EINVAL, "collie_store_server_create: %s is NULL",
                                 e ? "out" : "engine");
    if (!cl_opts_ok(o, offsetof(collie_store_server_opts, max_connections)))
        return cl_set_last_error(COLLIE_EINVAL, "collie_store_server_create: opts.size not set "
                                                "(use COLLIE_STORE_SERVER_OPTS_INIT)");
    if (!(s = calloc(1, sizeof *s))) return COLLIE_ENOMEM;
    cl_list_init(&s->conns);
    cl_list_init(&s->pending);
    s->engine = e;
    CL_CHECK_GOTO(store_srv_configure(s, bind_addr, port, o), res, fail);
    CL_CHECK_GOTO(cl_store_auth_random(seed, sizeof seed), res, fail);
    if (!(s->kv = cl_store_kv_create(&s->lim, seed))) {
        res = COLLIE_ENOMEM;
        goto fail;
    }
    s->start_status = COLLIE_ECLOSED;
    res = cl_engine_call(e, store_srv_start_call, s, CL_ENGINE_CALL_TIMEOUT_MS);
    if (res == COLLIE_ETIMEDOUT) {
        CL_ERROR("store", "server %s: the engine did not start it in time; leaking it", s->name);
        return cl_set_last_error(res, "store server %s: engine %s did not respond", s->name,
                                 cl_engine_name(e));
    }
    if (res != COLLIE_OK && res != COLLIE_ECLOSED) goto fail; /* the call's own error (ESTATE) */
    if (res == COLLIE_OK) res = s->start_status;
    if (res != COLLIE_OK) {
        if (s->start_err[0]) CL_ERROR("store", "%s", s->start_err);
        cl_set_last_error(res, "%s",
                          s->start_err[0] ? s->start_err : "store server: engine is closed");
        goto fail;
    }
    CL_INFO("store", "server %s: listening%s", s->name, s->token ? " (token required)" : "");
    *out = s;
    return COLLIE_OK;
fail:
    if (s) cl_store_kv_destroy(s->kv);
    store_srv_free(s);
    return res;
}

uint16_t collie_store_server_port(const collie_store_server *s) {
    return s ? atomic_load(&((collie_store_server *)s)->port) : 0;
}

size_t collie_store_server_num_connections(const collie_store_server *s) {
    return s ? atomic_load(&((collie_store_server *)s)->nconns) : 0;
}

void collie_store_server_destroy(collie_store_server *s) {
    if (!s) return;
    if (!atomic_load_explicit(&s->shut, memory_order_acquire)) {
        int rc = cl_engine_call(s->engine, store_srv_stop_call, s, CL_ENGINE_CALL_TIMEOUT_MS);
        if (rc == COLLIE_ETIMEDOUT) {
            CL_ERROR("store", "server %s: the engine did not stop it in time; leaking it", s->name);
            return;
        }
    }
    store_srv_free(s);
}
