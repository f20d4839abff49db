/*
 * cpu_backend.c — the CPU transport's backend ops: init (listen and
 * publish the address), start, detach, abort, destroy. Three backends share
 * them: "auto" (the default: shared memory for same-host peers, TCP for the
 * rest), "tcp" and "shm" (that link only); tcp_local.c chooses per peer.
 *
 * Design notes
 *  - Everything runs on the progress thread (the backend does not set
 *    COLLIE_BACKEND_POST_ON_CALLER), but for two hooks: progress also
 *    runs on a thread holding the engine's progress lock in the loop's
 *    stead (the same exclusion), and unlend on whichever thread claims an
 *    ending work (tcp_loan.c: it only withdraws loans, atomically).
 *  - abort tells every identified peer why (tcp_conn.c: BYE or an ABORT
 *    frame), closes every connection, fails every work it runs and
 *    withdraws every work's loans (the core calls unlend no more once
 *    destroy begins); the structures stay until destroy, so late events
 *    find them closed.
 *  - A work's transport state lives inside the core's work (work_data_size)
 *    so starting a work allocates only what its schedule needs.
 *  - Peer health: every frame read counts as heard from its sender
 *    (peer_heard). So that silence means trouble however idle the comm
 *    is, one timer per comm (not per link) ticks every half
 *    COLLIE_HEARTBEAT_MS and puts a HEARTBEAT frame (a header alone, ahead
 *    of what is queued) on every ready link that wrote nothing since the
 *    last tick: a link is silent for at most about one period, over TCP
 *    and shared memory alike. The healthy path pays one flag store per
 *    flush; an idle comm two wakeups per period. No timer when 0 (off).
 *  - A client of collie_backend.h alone, as a plugin is: every call into
 *    the core goes through the services table (tc->core; a store
 *    request's context keeps it too, for a callback that runs after its
 *    comm is gone), and the helpers it shares are header-only (base/).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transports/cpu/cpu.h"

static void tcp_on_published(collie_work *w, void *arg) {
    tcp_req_ctx *ctx = arg;
    tcp_comm *tc = ctx->target;
    const collie_core_services *core = ctx->core;
    free(ctx);
    int st = core->work_result(w);
    if (!tc) { /* destroyed meanwhile */
        core->work_release(w);
        return;
    }
    tc->publish_req = NULL;
    tc->publish_ctx = NULL;
    if (st == COLLIE_OK)
        tc->core->init_done(tc->bc, COLLIE_OK, NULL);
    else if (st != COLLIE_ECANCELED)
        tc->core->init_done(tc->bc, st, "publishing the TCP address failed: %s",
                            core->work_error_message(w));
    core->work_release(w);
}

/* Every half heartbeat period: a HEARTBEAT frame onto each link that
 * wrote nothing since the last tick (see the design notes). */
static void tcp_on_heartbeat_tick(int fd, unsigned what, void *arg) {
    (void)fd;
    (void)what;
    tcp_comm *tc = arg;
    if (tc->aborted) return;
    for (int p = 0; p < tc->size; p++)
        if (tc->conns[p]) cl_tcp_conn_heartbeat(tc->conns[p]);
}

static int heartbeat_init(tcp_comm *tc) {
    const char *hb = tc->core->setting("COLLIE_HEARTBEAT_MS");
    long long ms = hb ? strtoll(hb, NULL, 10) : 0;
    if (ms <= 0) return COLLIE_OK; /* off */
    tc->hb_timer = tc->core->watch_new(tc->bc, -1, 0, tcp_on_heartbeat_tick, tc);
    if (!tc->hb_timer) return COLLIE_ENOMEM;
    tc->core->watch_start(tc->hb_timer, ms * 500); /* microseconds: half a period */
    return COLLIE_OK;
}

static int comm_init(collie_bcomm *bc, const collie_core_services *core, void **state, int mode) {
    tcp_comm *tc = calloc(1, sizeof *tc);
    if (!tc) return COLLIE_ENOMEM;
    tc->mode = mode;
    tc->unix_fd = -1;
    cl_list_init(&tc->works);
    cl_list_init(&tc->xb_pool);
    cl_list_init(&tc->any_expected);
    cl_list_init(&tc->lost);
    cl_list_init(&tc->pending);
    cl_list_init(&tc->reaped);
    cl_list_init(&tc->shm_conns);
    tc->bc = bc;
    tc->core = core;
    tc->rank = core->rank(bc);
    tc->size = core->nranks(bc);
    tc->comm_id = core->comm_id(bc);
    tc->generation = core->generation(bc);
    tc->listen_fd = -1;
    tc->conns = calloc((size_t)tc->size, sizeof *tc->conns);
    tc->discard = malloc(TCP_STAGE_BYTES);
    const char *early = core->setting("COLLIE_EARLY_BYTES");
    tc->early_bytes = early ? strtoull(early, NULL, 10) : TCP_EARLY_BYTES_DEFAULT;
    const char *mac = core->setting("COLLIE_FRAME_MAC");
    tc->frame_mac = !mac || strcmp(mac, "0") != 0;
    *state = tc;
    if (!tc->conns || !tc->discard || !cl_idmap_grow(&tc->running)) return COLLIE_ENOMEM;
    int r = cl_tcp_pending_init(tc);
    if (r == COLLIE_OK) r = heartbeat_init(tc);
    if (r != COLLIE_OK) return r;
    r = cl_tcp_listen(tc);
    if (r != COLLIE_OK) return r;
    char published[256];
    r = cl_tcp_local_listen(tc, published, sizeof published);
    if (r != COLLIE_OK) return r;
    char key[32];
    snprintf(key, sizeof key, "tcp/%d", tc->rank);
    tc->publish_ctx = malloc(sizeof *tc->publish_ctx);
    if (!tc->publish_ctx) return COLLIE_ENOMEM;
    tc->publish_ctx->target = tc;
    tc->publish_ctx->core = core;
    r = core->store_set(bc, key, published, strlen(published), tcp_on_published, tc->publish_ctx,
                        &tc->publish_req);
    if (r != COLLIE_OK) {
        free(tc->publish_ctx);
        tc->publish_ctx = NULL;
    }
    return r;
}

static int tcp_init(collie_bcomm *bc, const collie_core_services *core, void **state) {
    return comm_init(bc, core, state, TCP_MODE_TCP);
}
static int auto_init(collie_bcomm *bc, const collie_core_services *core, void **state) {
    return comm_init(bc, core, state, TCP_MODE_AUTO);
}
static int shm_init(collie_bcomm *bc, const collie_core_services *core, void **state) {
    return comm_init(bc, core, state, TCP_MODE_SHM);
}

static int tcp_start(void *state, collie_work *w, const collie_coll_args *a) {
    tcp_comm *tc = state;
    tcp_work *tw = tc->core->work_backend_data(w);
    memset(tw, 0, offsetof(tcp_work, loans)); /* the loans: zero, and read by any thread */
    tw->w = w;
    tw->tc = tc;
    tw->args = *a;
    return cl_tcp_work_start(tc, tw);
}

static void tcp_detach(void *state, collie_work *w) {
    tcp_comm *tc = state;
    tcp_work *tw = tc->core->work_backend_data(w);
    cl_tcp_work_forget(tw); /* its own messages and slots only: O(ops of a step) */
    if (cl_list_linked(&tw->doomed_node)) cl_list_remove(&tw->doomed_node);
    if (cl_list_linked(&tw->lost_node)) cl_list_remove(&tw->lost_node);
    cl_list_remove(&tw->node);
    cl_idmap_remove(&tc->running, &tw->by_seq); /* a no-op for p2p works */
    /* a frame for this seq held back (its slot was not posted) can no
     * longer be consumed: the ranks disagreed (each check may fault) */
    if (tw->args.kind != COLLIE_COLL_SEND && tw->args.kind != COLLIE_COLL_RECV) {
        bool ok = tc->core->work_result(w) == COLLIE_OK;
        for (int p = 0; p < tc->size && !tc->aborted; p++)
            if (tc->conns[p]) cl_tcp_conn_recheck(tc->conns[p], tc->core->work_seq(w), ok);
    }
    if (tw->xb) {
        cl_tcp_xbuf_put(tc, tw->xb);
        tw->xb = NULL;
    }
}

/* A posted receive is unmatched while its slot waits in a list (its peer's
 * p2p_expected or the comm's any_expected): matching a frame unlinks it
 * (tcp_conn_match.c, cl_tcp_conn_p2p_slot_take), as does taking an
 * unexpected message (which ends it at once). Unlinked here, no later
 * frame can reach it. */
static bool tcp_recv_withdraw(void *state, collie_work *w) {
    tcp_comm *tc = state;
    tcp_work *tw = tc->core->work_backend_data(w);
    if (!tw->kind_p2p || tw->args.kind != COLLIE_COLL_RECV || !cl_list_linked(&tw->p2p_slot.node))
        return false;
    cl_list_remove(&tw->p2p_slot.node);
    return true;
}

static void tcp_unlend(void *state, collie_work *w) {
    tcp_comm *tc = state;
    cl_tcp_work_unlend(tc->core->work_backend_data(w));
}

static void tcp_abort(void *state, int status, const char *reason) {
    tcp_comm *tc = state;
    if (tc->aborted) return;
    tc->aborted = true;
    tc->abort_status = status;
    snprintf(tc->abort_reason, sizeof tc->abort_reason, "%s", reason);
    if (tc->listen_ev) tc->core->watch_stop(tc->listen_ev);
    if (tc->unix_ev) tc->core->watch_stop(tc->unix_ev);
    if (tc->hb_timer) tc->core->watch_stop(tc->hb_timer);
    for (int p = 0; p < tc->size; p++)
        if (tc->conns[p]) cl_tcp_conn_abort(tc->conns[p], status, reason);
    tcp_conn *c; /* closing one moves it to `reaped` */
    while ((c = cl_list_first(&tc->pending, tcp_conn, pending_node)))
        cl_tcp_conn_close(c, status, reason);
    /* finishing retires later, on the loop; detach then unlinks each work */
    tcp_work *tw;
    cl_list_foreach(&tc->works, tw, tcp_work, node) if (!tw->finished)
        cl_tcp_work_fail(tw, status, "%s", reason);
    /* a work another thread is ending (claimed there, so not failed here)
     * may still lend: destroy follows, after which its publication skips
     * the unlend hook (collie_backend.h), so every loan goes now */
    cl_list_foreach(&tc->works, tw, tcp_work, node) cl_tcp_work_unlend(tw);
    if (tc->publish_req) tc->core->work_cancel(tc->publish_req);
}

static void tcp_destroy(void *state) {
    tcp_comm *tc = state;
    if (!tc) return;
    for (int p = 0; tc->conns && p < tc->size; p++)
        cl_tcp_conn_free(tc->conns[p]);
    cl_tcp_pending_fini(tc);
    if (tc->hb_timer) tc->core->watch_free(tc->hb_timer);
    if (tc->lost_ev) tc->core->watch_free(tc->lost_ev);
    if (tc->publish_ctx) { /* its callback frees the context and the request */
        tc->publish_ctx->target = NULL;
        tc->core->work_cancel(tc->publish_req);
    }
    if (tc->listen_ev) tc->core->watch_free(tc->listen_ev);
    if (tc->listen_fd >= 0) close(tc->listen_fd);
    cl_tcp_local_close(tc);
    /* a work not detached yet (another thread was ending it, so it retires
     * after this, and its detach is skipped): its buffers go with the rest */
    tcp_work *tw;
    cl_list_foreach(&tc->works, tw, tcp_work, node) {
        if (tw->xb) cl_tcp_xbuf_put(tc, tw->xb);
        tw->xb = NULL;
    }
    cl_tcp_xbuf_free_all(tc);
    free(tc->conns);
    cl_idmap_fini(&tc->running);
    free(tc->discard);
    free(tc);
}

/* One step without the loop's events (collie_backend.h: progress): the
 * shared-memory rings have no file descriptor, so a spinning loop and the
 * threads helping it read them here, and their readers stop parking (no
 * doorbell per message) until the loop is about to sleep. */
static bool tcp_progress(void *state, bool sleeping) {
    tcp_comm *tc = state;
    tc->polled = !sleeping;
    /* polling one connection can close another (a step that needs a peer
     * whose sending broke, a fault): conns are not freed before destroy,
     * so a next node that got unlinked ends this round, the rest follow on
     * the next turn */
    for (cl_list_node *n = cl_list_first_node(&tc->shm_conns); n;) {
        cl_list_node *next = cl_list_next_node(&tc->shm_conns, n);
        cl_tcp_conn_poll(cl_list_entry(n, tcp_conn, shm_node), sleeping);
        if (next && !cl_list_linked(next)) break;
        n = next;
    }
    return tc->socket_conns > 0; /* TCP peers: only the event pass reads them */
}

#define TCP_OPS(var, backend_name, init_fn)                                                        \
    static const collie_backend_ops var = {                                                        \
        .abi_version = COLLIE_BACKEND_ABI_VERSION,                                                 \
        .size = sizeof(collie_backend_ops),                                                        \
        .name = backend_name,                                                                      \
        .device = "cpu",                                                                           \
        .flags = COLLIE_BACKEND_V_COLLECTIVES | COLLIE_BACKEND_ANY_SOURCE,                         \
        .work_data_size = sizeof(tcp_work),                                                        \
        .init = init_fn,                                                                           \
        .start = tcp_start,                                                                        \
        .detach = tcp_detach,                                                                      \
        .poll = NULL,                                                                              \
        .progress = tcp_progress,                                                                  \
        .unlend = tcp_unlend,                                                                      \
        .recv_withdraw = tcp_recv_withdraw,                                                        \
        .abort = tcp_abort,                                                                        \
        .destroy = tcp_destroy,                                                                    \
    }

TCP_OPS(tcp_ops, "tcp", tcp_init);
TCP_OPS(auto_ops, "auto", auto_init);
TCP_OPS(shm_ops, "shm", shm_init);

const collie_backend_ops *cl_tcp_backend_ops(void) { return &tcp_ops; }
const collie_backend_ops *cl_auto_backend_ops(void) { return &auto_ops; }
const collie_backend_ops *cl_shm_backend_ops(void) { return &shm_ops; }
