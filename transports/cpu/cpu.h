/*
 * cpu.h — the CPU backend's internal state, shared by the files of transports/cpu.
 *
 * Objects, all owned by the loop (the progress thread, or a thread that
 * holds its role for a step: engine/assist.c), but for the loans a work
 * withdraws from whichever thread ends it (tcp_loan.c):
 *   tcp_comm   one per communicator: listeners (TCP, and the abstract Unix
 *              socket of same-host peers), connections by peer rank, the
 *              works it runs in sequence order.
 *   tcp_conn   one link to one peer, a TCP socket or shared-memory rings
 *              with a Unix socket as doorbell (tcp_local.c): handshake, a
 *              send queue of messages, the receive side (header, then
 *              payload straight into the matched receive slot).
 *   tcp_work   the per-work state living in the core's work (backend_data):
 *              its schedule, current step, and the messages and receive
 *              slots of that step.
 */
#ifndef CL_CPU_H
#define CL_CPU_H

#include <stdbool.h>
#include <stdint.h>

#include "collie_backend.h"
#include "base/dtype.h"
#include "base/idmap.h"
#include "base/list.h"
#include "transports/cpu/shm/host_id.h"
#include "transports/cpu/shm/link.h"
#include "transports/cpu/frame_mac.h"
#include "transports/cpu/sched.h"

/* cl_tcp_backend_ops: the TCP backend's ops table (transports/builtin.c
 * lists it among the built-in backends). */
const collie_backend_ops *cl_tcp_backend_ops(void);
/* the same transport with its link choice fixed: "auto" (the default CPU
 * backend: shared memory for same-host peers, TCP for the rest; the
 * setting COLLIE_CPU_TRANSPORT overrides its choice) and "shm" (shared
 * memory only); "tcp" is TCP only */
const collie_backend_ops *cl_auto_backend_ops(void);
const collie_backend_ops *cl_shm_backend_ops(void);

/* how a comm reaches its peers (tcp_comm.mode) */
enum tcp_mode { TCP_MODE_AUTO = 0, TCP_MODE_TCP, TCP_MODE_SHM };

#define TCP_FRAME_MAGIC 0x46544c43u /* "CLTF" */
#define TCP_HS_MAGIC    0x48544c43u /* "CLTH" (CL_TCP_HS_MAGIC, handshake.h) */
#define TCP_PROTO_VERSION                                                                          \
    6 /* 2: the ABORT frame; 3: the counts check, whole reasons;                                   \
          4: flow control of collective frames; 5: the frame MAC; 6: the HEARTBEAT frame */
/* A frame header (48 bytes, little-endian):
 *   0  u32 magic          TCP_FRAME_MAGIC
 *   4  u8  kind           collie_coll_kind, or TCP_KIND_* (control frames)
 *   5  u8  dtype
 *   6  u8  op             reduction op
 *   7  u8  flags          TCP_FRAME_LOAN | TCP_FRAME_RTS | TCP_FRAME_CLEARED | TCP_FRAME_MAC
 *   8  u32 step           TCP_P2P_STEP for point to point
 *  12  u32 generation
 *  16  u64 seq            collective seq; the tag for p2p
 *  24  u64 count          elements; CREDIT: bytes returned
 *  32  u64 length         payload bytes (RTS: of the frame it announces)
 *  40  u32 root           TCP_NO_ROOT for kinds without one; CREDIT: the window
 *  44  u32 vcheck         the counts check (below); 0 for other kinds
 * then `length` payload bytes (none for RTS and control frames; a lent
 * frame carries its loan descriptor instead, tcp_loan.c). Every argument
 * that must agree across ranks travels, and the receiver compares them all
 * (tcp_conn_match.c): with the slot the frame fills, or as soon as it arrives for
 * a collective running here that has no slot for it yet (a frame that can
 * never be consumed fails within a round trip, not at the deadline).
 * The counts check (bytes 44-47, cl_tcp_vcheck) covers what the count
 * field cannot for the v collectives: allgatherv, a 32-bit FNV-1a digest of
 * every rank's count (all ranks must agree on the whole vector); alltoallv,
 * the number of elements the sender expects back from the receiver
 * (saturated at 2^32-1), which must be what the receiver sends it — with
 * the frame's length (what the sender sends) one frame checks both
 * directions of the pair. Every pair that should talk exchanges a frame,
 * zero-length for an empty block (sched.c), so a disagreement on which
 * block is empty is seen too. 0 for every other kind.
 * With TCP_FRAME_MAC in byte 7, a 16-byte tag follows (after the payload,
 * or after the header of a frame without one): the frame MAC
 * (frame_mac.h) over the header and the payload, frame number n of its
 * direction (both ends count, from 0). Every frame of a TCP link whose
 * connection has a session key (the job has a secret) carries it, control
 * frames, RTS and ABORT/BYE included, unless COLLIE_FRAME_MAC=0 on the
 * sender; never on a shared-memory link (tcp_conn.c, design notes). */
#define TCP_FRAME_HDR  48
#define TCP_P2P_STEP   0xffffffffu /* step value of point-to-point frames */
#define TCP_KIND_BYE   0xfe        /* frame kind: the sender destroyed its comm */
#define TCP_KIND_ABORT 0xfd        /* frame kind: the sender's comm failed; payload: why */
/* flow control of collective frames (tcp_conn_write.c, design notes): */
#define TCP_KIND_CREDIT 0xfc /* the receiver returns `count` bytes of credit; root = its window */
#define TCP_KIND_CTS    0xfb /* the receiver posted (seq, step): send the frame announced */
#define TCP_KIND_GONE   0xfa /* answers a CTS: that frame's work ended, it never comes */
#define TCP_ABORT_MAX   8191 /* longest reason it carries: > a comm's (whole, tcp_conn.c) */
#define TCP_STAGE_BYTES (256 * 1024)
/* header byte 7 (flags); TCP_FRAME_LOAN (1) is defined with tcp_loan.c below */
#define TCP_FRAME_RTS     2 /* a collective frame announced, header only: CTS to send it */
#define TCP_FRAME_CLEARED 4 /* a collective frame sent after its CTS: not charged */
#define TCP_FRAME_MAC     8 /* a MAC tag (CL_FRAME_MAC_TAG bytes) follows the frame */
/* COLLIE_EARLY_BYTES: bytes of early collective frames parked per connection */
#define TCP_EARLY_BYTES_DEFAULT (16u << 20)
/* frame kind: the sender lives (a link idle for half COLLIE_HEARTBEAT_MS
 * carries one: cpu_backend.c, peer health) */
#define TCP_KIND_HEARTBEAT 0xf9

struct tcp_comm;
struct tcp_work;
struct tcp_xbuf;

/* The context of a store request whose callback may run after its target
 * (a connection, the comm) is freed: freeing clears `target`, the callback
 * then only releases the request (through `core`, which outlives every
 * comm) and frees the context. */
typedef struct tcp_req_ctx {
    void *target;
    const collie_core_services *core;
} tcp_req_ctx;

/* tcp_msg.ctl: what a message without an owner is */
enum { TCP_CTL_NONE = 0, TCP_CTL_CREDIT, TCP_CTL_CTS, TCP_CTL_HEARTBEAT };

/* One outgoing message: a frame header and a payload in the user's (or
 * scratch) memory, sent with writev without copying the payload. */
typedef struct tcp_msg {
    /* its connection's send queue, or (collective frames) held (waiting
     * for credit) or rts_wait (announced, waiting for the CTS) */
    cl_list_node node;
    struct tcp_work *owner; /* NULL once the owner is gone, and for control frames */
    uint8_t hdr[TCP_FRAME_HDR];
    const uint8_t *payload;
    uint64_t len;
    uint64_t sent;   /* bytes of the frame written: hdr, then payload (or loan), then tag */
    uint64_t charge; /* credit it took (queued, not yet written); 0 if none */
    uint8_t ctl;     /* TCP_CTL_*: a control frame (CTS: malloc'ed, freed once written) */
    /* shm single copy: the payload is lent (transports/cpu/shm/loan.h), the
     * frame carries `loan` instead of it. Lent iff loan_ticket != 0;
     * loan_rec is then its record in the owner's tcp_work.loans */
    uint64_t loan_ticket;
    int loan_rec;
    uint8_t loan[CL_SHM_LOAN_DESC];
    /* the frame MAC (TCP_FRAME_MAC in hdr[7]): the tag, valid iff `tagged`,
     * for frame number tag_n; a frame not started yet is re-tagged when its
     * number or header changed (cl_tcp_conn_flush) */
    bool tagged;
    uint64_t tag_n;
    uint8_t tag[CL_FRAME_MAC_TAG];
} tcp_msg;

/* One expected incoming message. */
typedef struct tcp_slot {
    union {
        cl_list_node node; /* p2p: its connection's p2p_expected */
        cl_idnode by_seq;  /* collective: its connection's expected (key = seq) */
    };
    struct tcp_work *owner;
    uint64_t seq;  /* collective seq, or tag for p2p */
    uint32_t step; /* TCP_P2P_STEP for p2p */
    uint8_t kind;  /* cl_sop kind (RECV, RECV_REDUCE, RECV_REDUCE3) */
    uint8_t *dst;
    const uint8_t *src; /* RECV_REDUCE3 */
    uint64_t len;
    uint64_t order; /* p2p: post order (tcp_comm.p2p_posts), to match as MPI does */
} tcp_slot;

/* A collective frame that arrived before its receive slot was posted (the
 * peer is ahead): its payload is parked here, within the connection's
 * budget, until the slot is posted (tcp_conn_match.c). */
typedef struct tcp_parked {
    cl_idnode by_seq;  /* its connection's parked (key = seq) */
    cl_list_node node; /* its connection's parked_list */
    uint8_t hdr[TCP_FRAME_HDR];
    uint64_t charge; /* what it counts against the budget */
    bool complete;   /* every payload byte is here */
    int verdict;     /* CL_LOAN_*: a lent payload that was withdrawn */
    uint8_t data[];  /* the payload (none for an RTS) */
} tcp_parked;

/* A p2p message that arrived before its receive was posted. */
typedef struct tcp_unexpected {
    cl_list_node node; /* its connection's unexpected */
    uint64_t tag;
    uint64_t arrival; /* tcp_comm.arrivals when its header came */
    uint8_t hdr[TCP_FRAME_HDR];
    uint8_t *data;
    uint64_t len;
} tcp_unexpected;

enum tcp_conn_state {
    TCP_CONN_ADDR = 0,   /* waiting for the peer's address from the store */
    TCP_CONN_CONNECTING, /* non-blocking connect in progress */
    TCP_CONN_HANDSHAKE,  /* exchanging challenge/hello/accept */
    TCP_CONN_READY,
    TCP_CONN_CLOSED,
};

typedef struct tcp_conn {
    struct tcp_comm *tc;
    int peer; /* -1 while an accepted connection is unidentified */
    int state;
    bool initiator;
    char closed_why[TCP_ABORT_MAX + 64]; /* why the connection closed (a peer's reason, whole) */
    int closed_status;                   /* ... and with which status */
    int fd;                  /* the TCP socket, or for a same-host link its Unix socket */
    collie_watch *rev, *wev; /* the fd's read and write watches */
    bool local;              /* fd is a same-host Unix socket: the link becomes shm */
    cl_shm_link shm;         /* the shared-memory link, once the handshake set it up */
    cl_list_node shm_node;   /* in tc->shm_conns while ready over it */
    collie_work *addr_req;
    struct tcp_req_ctx *addr_ctx; /* the store get's callback context */

    /* handshake */
    uint8_t nonce_mine[16], nonce_peer[16];
    uint8_t hs_in[128];
    size_t hs_in_len, hs_in_want;
    uint8_t hs_out[128];
    size_t hs_out_len, hs_out_sent;
    int hs_phase;
    int64_t hs_deadline_ns; /* accepted: closed unless identified by then (monotonic) */
    bool reaped;            /* closed before it was identified: in tc->reaped, freed soon */
    /* With a shared secret, set as the handshake completes: HMAC under the
     * secret over both nonces, the comm and both ranks (tcp_setup.c). Fresh
     * per connection and known only to its two ends: the key a frame MAC
     * is to use. */
    uint8_t session_key[32];
    bool session_keyed;
    /* the frame MAC (tcp_conn.c, design notes): keyed on a TCP link with a
     * session key; mac_tx on iff COLLIE_FRAME_MAC allows it here too */
    bool mac_keyed, mac_tx_on;
    cl_frame_mac mac_tx, mac_rx;
    uint64_t tx_next, rx_next; /* the number of the next frame in each direction */

    /* send side */
    cl_list sendq;         /* tcp_msg, in sending order */
    cl_list lent;          /* tcp_msg: frame sent, payload lent, not yet returned (ticket order) */
    cl_list doomed;        /* tcp_work: a loan it received was withdrawn (tcp_loan.c) */
    collie_watch *doom_ev; /* the grace timer of `doomed` */
    bool flush_scheduled;  /* wev activated to flush after the current callback */
    /* flow control of collective frames we send (tcp_conn_write.c) */
    uint64_t credit;      /* bytes of charged frames the peer will still take */
    uint64_t window;      /* the peer's budget (COLLIE_EARLY_BYTES there); 0 until it said */
    cl_list held;         /* tcp_msg: collective frames waiting for credit, in post order */
    cl_list rts_wait;     /* tcp_msg: announced (RTS written), waiting for the peer's CTS */
    tcp_msg credit_msg;   /* the CREDIT frame returning what we owe the peer */
    bool window_granted;  /* the first CREDIT frame (our window) was queued */
    tcp_msg hb_msg;       /* the HEARTBEAT frame (cl_tcp_conn_heartbeat) */
    bool tx_recent;       /* bytes were written since the last heartbeat tick */
    bool send_broken;     /* a message was cut off mid-way: nothing more is written */
    char broken_why[160]; /* which message, for the op that next needs this peer */

    /* receive side */
    uint8_t hdr[TCP_FRAME_HDR];
    size_t hdr_got;
    bool have_hdr;           /* hdr is complete and waits for / feeds `cur` */
    tcp_slot *cur;           /* matched slot being filled */
    tcp_slot drain;          /* stands in for cur when its work ended mid-message */
    tcp_unexpected *cur_unx; /* unexpected p2p being filled */
    tcp_parked *cur_park;    /* early collective frame being parked */
    cl_idmap parked;         /* tcp_parked.by_seq: early collective frames */
    cl_list parked_list;     /* tcp_parked.node: the same, for freeing */
    uint64_t parked_bytes;   /* their charges: at most tc->early_bytes */
    uint64_t owed;           /* charged bytes consumed, not yet returned to the peer */
    uint64_t frames_read;    /* frames read whole (conn_read_last_words sees progress) */
    collie_watch *grace_ev;  /* a large early frame waits this long before it is parked */
    bool grace_waiting, grace_over;
    bool reading_abort; /* the frame being read is the peer's ABORT */
    bool rx_ctl;        /* the header in hdr is a control frame (BYE, CREDIT, CTS, GONE, ...) */
    uint64_t heard_seq; /* the highest collective seq of a frame read from the peer */
    bool rx_mac;        /* the frame being read carries a tag: fed to mac_rx as it comes */
    uint8_t rx_tag[CL_FRAME_MAC_TAG];
    size_t rx_tag_got;
    char *peer_abort; /* its payload (allocated by the header, up to TCP_ABORT_MAX) */
    uint64_t payload_len, payload_got;
    uint8_t *stage;      /* TCP_STAGE_BYTES for receive-and-reduce, lazily */
    uint64_t stage_fill; /* bytes in stage for the current chunk */
    bool loan_frame;     /* the frame's payload is lent: read it from the peer's memory */
    bool loan_withdrawn; /* ... and the peer withdrew it (its work ended) */
    bool loan_skipped;   /* ... and nothing of it was needed here (the work is gone) */
    uint8_t loan_desc[CL_SHM_LOAN_DESC];
    size_t loan_desc_got;
    uint64_t loan_ticket, loan_addr;
    cl_idmap expected;         /* tcp_slot.by_seq: collective messages expected from this peer */
    cl_list p2p_expected;      /* tcp_slot: posted p2p receives from this peer (post order) */
    cl_list unexpected;        /* tcp_unexpected: p2p messages that came first */
    cl_list_node pending_node; /* tcp_comm.pending (accepted, not yet identified) or .reaped */
} tcp_conn;

typedef struct tcp_comm {
    collie_bcomm *bc;
    const collie_core_services *core;
    int rank, size;
    uint64_t comm_id, generation;
    int listen_fd;
    collie_watch *listen_ev;
    char addr[80];
    int mode;        /* enum tcp_mode */
    bool host_known; /* `host` was read (else no shared memory) */
    cl_host_id host; /* this rank's same-host identity */
    int unix_fd;     /* the abstract Unix listener for same-host peers, or -1 */
    collie_watch *unix_ev;
    char unix_name[96];       /* its abstract name, without the leading NUL */
    uint64_t shm_ring_bytes;  /* each direction's ring (COLLIE_SHM_RING_BYTES) */
    uint64_t shm_single_copy; /* lend payloads of at least this many bytes (0: never) */
    uint64_t early_bytes;     /* COLLIE_EARLY_BYTES: early frames parked per connection */
    bool frame_mac;           /* COLLIE_FRAME_MAC: send TCP frames with a MAC (with a key) */
    tcp_conn **conns;
    cl_list shm_conns;         /* tcp_conn.shm_node: ready over shared memory (polled) */
    bool polled;               /* the loop spins and polls the rings: readers need no doorbell */
    int socket_conns;          /* ready connections over TCP (not shared memory) */
    cl_list pending;           /* tcp_conn.pending_node: accepted, handshake not finished,
                                  oldest first */
    int npending;              /* in `pending`: at most TCP_PENDING_MAX */
    cl_list reaped;            /* tcp_conn.pending_node: closed unidentified, to be freed */
    collie_watch *reap_ev;     /* frees `reaped` on the loop's next turn */
    collie_watch *hs_timer;    /* closes pending connections past their deadline */
    collie_watch *hb_timer;    /* heartbeats over idle links (NULL: COLLIE_HEARTBEAT_MS=0) */
    int64_t hs_timeout_ns;     /* COLLIE_HANDSHAKE_TIMEOUT_MS */
    int64_t refused_log_ns;    /* the last refusal logged (refusals are rate-limited) */
    uint64_t refused_quiet;    /* refusals since then, not logged */
    cl_list works;             /* started works, start order */
    cl_list any_expected;      /* tcp_slot: posted COLLIE_ANY_SOURCE receives (post order) */
    cl_list lost;              /* tcp_work.lost_node: to fail, a lost peer needed them */
    collie_watch *lost_ev;     /* fails the next slice of `lost` on the next turn */
    uint64_t p2p_posts;        /* receives posted so far (tcp_slot.order) */
    uint64_t arrivals;         /* unexpected p2p messages so far (tcp_unexpected.arrival) */
    cl_idmap running;          /* tcp_work.by_seq: started collectives not yet detached */
    uint64_t coll_seq_started; /* the highest collective seq started */
    collie_work *publish_req;
    struct tcp_req_ctx *publish_ctx;
    uint8_t *discard;
    cl_list xb_pool; /* idle execution buffers (tcp_xbuf.pool_node), newest first */
    int xb_pooled;
    bool aborted;
    int abort_status;
    char abort_reason[TCP_ABORT_MAX + 1];
} tcp_comm;

/* The reusable memory of running a schedule: kept in a per-comm pool so a
 * steady stream of collectives allocates nothing (grow-only). */
typedef struct tcp_xbuf {
    cl_list_node pool_node; /* in tcp_comm.xb_pool while idle */
    cl_sched sched;
    tcp_msg *msgs; /* per op of the widest step */
    tcp_slot *slots;
    uint32_t cap;
    uint8_t *scratch;
    uint64_t scratch_cap;
} tcp_xbuf;

/* An open loan of a work's message (tcp_work.loans). */
typedef struct tcp_loan_rec {
    _Atomic(cl_shm_loan_side *) to; /* the link's loans (shared memory) */
    _Atomic uint64_t ticket;        /* 0: free */
} tcp_loan_rec;
#define TCP_WORK_LOANS 8 /* a work's messages lent at once; more go through the ring */

typedef struct tcp_work {
    collie_work *w;
    tcp_comm *tc;
    collie_coll_args args;
    tcp_xbuf *xb; /* NULL for point-to-point works */
    uint32_t step;
    uint32_t pending; /* ops of the current step not yet done */
    uint32_t nposted; /* ops of the current step posted: its msgs/slots [0, nposted) */
    bool finished, running, posted, kind_p2p;
    uint32_t vdigest; /* allgatherv: the digest of every rank's count (cl_tcp_vcheck) */
    int p2p_src; /* a receive's sender: its peer, or once matched an any-source one's; else -1 */
    tcp_msg p2p_msg;
    tcp_slot p2p_slot;
    cl_list_node node; /* tcp_comm.works */
    cl_idnode by_seq;  /* collectives: tcp_comm.running (key = seq) */
    /* a message it was to receive was withdrawn (tcp_loan.c): it fails
     * unless the sender's root cause comes first */
    cl_list_node doomed_node; /* tcp_conn.doomed */
    uint64_t doomed_seq;      /* that message's seq (tag for p2p) */
    int doomed_peer, doomed_verdict;
    cl_list_node lost_node;     /* a peer it needs was lost: to fail (tcp_comm.lost) */
    int lost_peer, lost_status; /* which peer, with which status */
    /* Its messages' open loans, for the unlend hook, which withdraws them
     * from any thread as the work ends. Last, and not cleared by start (the
     * core zeroes a work's data when it makes it): written only by the
     * loop, under the BUSY bracket to open, atomically to close. */
    tcp_loan_rec loans[TCP_WORK_LOANS];
} tcp_work;

/* tcp_conn*.c, the connection's files (cl_tcp_conn_get: tcp_setup.c) */
/* creates and connects lazily; closes a connection whose sending broke */
tcp_conn *cl_tcp_conn_get(tcp_comm *tc, int peer);
/* one polling step of a ready shm connection (tcp_progress) */
void cl_tcp_conn_poll(tcp_conn *c, bool sleeping);
void cl_tcp_conn_close(tcp_conn *c, int status, const char *why);
/* the comm is closing: tell the peer (goodbye, or the abort's reason), close */
void cl_tcp_conn_abort(tcp_conn *c, int status, const char *why);
void cl_tcp_conn_free(tcp_conn *c);
void cl_tcp_conn_send(tcp_conn *c, tcp_msg *m);
void cl_tcp_conn_expect(tcp_conn *c, tcp_slot *s);
/* drop one message / slot of an ending work (O(1); tcp_conn_write.c,
 * tcp_conn_read.c) */
void cl_tcp_conn_forget_msg(tcp_conn *c, tcp_msg *m);
void cl_tcp_conn_forget_slot(tcp_conn *c, tcp_slot *s);
/* the unfinished works with a message or a receive on c, each once, onto
 * `out` (tcp_work.lost_node): O(what c holds) */
void cl_tcp_conn_works(tcp_conn *c, cl_list *out);
/* collective `seq` just finished here (`ok`: it completed): a frame for it
 * held back or parked on c is a mismatch (comm fault); if it ended early,
 * the frames parked for it are dropped */
void cl_tcp_conn_recheck(tcp_conn *c, uint64_t seq, bool ok);
/* is a frame for (seq, step) parked on c, ready to be taken (also once c
 * closed: what the peer sent before it left is still ours)? */
bool cl_tcp_conn_has_parked(tcp_conn *c, uint64_t seq, uint32_t step);
/* A collective frame (header h) from c's peer for tw's seq, which runs here
 * but has no slot for the frame's step (yet): the peer may just be ahead,
 * but a frame whose arguments differ from tw's can never be consumed. True
 * if they agree; else the comm faults (COLLIE_EPROTO naming both ranks and
 * both posts, tw failing with it) and false. Call it wherever such a frame
 * is noticed: as it arrives, and as tw starts with one held back
 * (cl_tcp_conn_check_early). */
bool cl_tcp_frame_agrees(tcp_conn *c, const uint8_t *h, tcp_work *tw);
/* tw just started: compare a frame held back on c for its seq (one that
 * came before tw was posted here) with its arguments */
void cl_tcp_conn_check_early(tcp_conn *c, tcp_work *tw);
/* write the counts check into a frame header (see TCP_FRAME_HDR) */
void cl_tcp_frame_set_vcheck(uint8_t *hdr, uint32_t vcheck);
int cl_tcp_listen(tcp_comm *tc);
/* tcp_setup.c: the timers of accepted connections (init), and freeing
 * those closed before they were identified (destroy) */
int cl_tcp_pending_init(tcp_comm *tc);
void cl_tcp_pending_fini(tcp_comm *tc);

/* peer health: a tick of tc->hb_timer (every half COLLIE_HEARTBEAT_MS): a
 * HEARTBEAT frame onto c if it wrote nothing since the last tick
 * (tcp_conn_write.c) */
void cl_tcp_conn_heartbeat(tcp_conn *c);

/* tcp_local.c: same-host peers over shared memory */
/* listen for same-host peers (when the mode allows) and add what they need
 * to tc->addr's published form: out = "ip:port[|host-id|unix-name]" */
int cl_tcp_local_listen(tcp_comm *tc, char *published, size_t len);
void cl_tcp_local_close(tcp_comm *tc);
void cl_tcp_frame_header(uint8_t *hdr, const tcp_comm *tc, const collie_coll_args *a, uint64_t seq,
                         uint32_t step, uint64_t len);

/* tcp_loan.c: single copy to and from same-host peers (transports/cpu/shm/loan.h) */
#define TCP_FRAME_LOAN 1 /* header byte 7: the payload is lent, a loan descriptor follows */
/* the bytes of m's frame after the header: its payload, or the loan */
static inline uint64_t tcp_msg_body_len(const tcp_msg *m) {
    if (m->hdr[7] & TCP_FRAME_RTS) return 0; /* announced: the header alone */
    return m->loan_ticket ? CL_SHM_LOAN_DESC : m->len;
}
/* the bytes of m's whole frame on the wire: header, body, tag */
static inline uint64_t tcp_msg_frame_len(const tcp_msg *m) {
    return TCP_FRAME_HDR + tcp_msg_body_len(m) +
           ((m->hdr[7] & TCP_FRAME_MAC) ? CL_FRAME_MAC_TAG : 0);
}
/* could m's payload be lent to c's peer (a large payload of a kind that
 * does not reduce, on a shared-memory link)? */
bool cl_tcp_loan_may(const tcp_conn *c, const tcp_msg *m);
/* lend m's payload instead of sending it, if it may (under the owner's
 * BUSY bracket, before its first byte goes); true if it did */
bool cl_tcp_loan_open(tcp_conn *c, tcp_msg *m);
/* collect the loans the peer returned (their messages are done); with
 * `park`, arrange to be woken by the next return */
void cl_tcp_loans_settle(tcp_conn *c, bool park);
/* the connection closes: withdraw its loans, fail their works */
void cl_tcp_loans_close(tcp_conn *c);
/* m's work ended (its loan was withdrawn as it was published): free its record */
void cl_tcp_loan_forget(tcp_msg *m);
/* the work is ending, visibly at once (any thread): withdraw its loans */
void cl_tcp_work_unlend(tcp_work *tw);
/* receiving: a loan frame's header arrived; read its descriptor; pull
 * payload bytes at offset `off` (bytes, or -errno); end it: CL_LOAN_* */
void cl_tcp_loan_begin(tcp_conn *c);
ssize_t cl_tcp_loan_read_desc(tcp_conn *c);
ssize_t cl_tcp_loan_pull(tcp_conn *c, void *buf, uint64_t off, uint64_t len);
int cl_tcp_loan_end(tcp_conn *c, bool used);
/* try the single-copy probe of a new shm link (until it ran) */
void cl_tcp_loans_probe(tcp_conn *c);
/* the message s was to receive was withdrawn (verdict CL_LOAN_*): fail
 * its work after a grace, unless the sender's root cause comes first */
void cl_tcp_loan_doom(tcp_conn *c, const tcp_slot *s, int verdict);

/* tcp_exec.c */
void cl_tcp_xbuf_put(tcp_comm *tc, tcp_xbuf *xb);
void cl_tcp_xbuf_free_all(tcp_comm *tc);
int cl_tcp_work_start(tcp_comm *tc, tcp_work *tw);
/* tw is ending: unlink its messages and slots of the current step that
 * were posted (the only ones that can be linked), each in O(1) */
void cl_tcp_work_forget(tcp_work *tw);
/* has this rank finished collective `seq` (started it, and it is no longer
 * in flight)? */
bool cl_tcp_coll_finished(const tcp_comm *tc, uint64_t seq);
/* the collective running here as `seq` (started, not yet detached), or NULL */
tcp_work *cl_tcp_coll_running(const tcp_comm *tc, uint64_t seq);
/* The counts check of tw's frames to (`outgoing`) or from `peer` (see
 * TCP_FRAME_HDR): what a frame must carry to agree with tw. */
uint32_t cl_tcp_vcheck(const tcp_work *tw, int peer, bool outgoing);
void cl_tcp_op_done(tcp_work *tw); /* one op of the current step finished */
/* Does the p2p frame header h carry what the receive `a` expects (count,
 * dtype, and a frame of want_len bytes)? If not, why (naming the peer and
 * both sides). */
bool cl_tcp_p2p_matches(const uint8_t *h, const collie_coll_args *a, int peer, uint64_t want_len,
                        char *why, size_t len);
void cl_tcp_work_fail(tcp_work *tw, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* tw can never complete: an op of it needs a link that is closed or
 * broken. It fails as a work that saw a fault of the comm: with `status`
 * if that is the comm's first fault (or under policy NONE), else with
 * EABORTED naming the root cause (the core's fault service decides). */
void cl_tcp_work_fault(tcp_work *tw, int status, const char *why);
/* a receive's message comes from `peer` (collie_work_source for an
 * any-source one) */
void cl_tcp_p2p_source(tcp_work *tw, int peer);
/* receive u (arrived unexpected from `peer`, unlinked here) into tw and
 * finish it (or fail it: a count or dtype that differs) */
void cl_tcp_p2p_take(tcp_work *tw, tcp_unexpected *u, int peer);
/* a peer's connection broke: fault the comm */
void cl_tcp_peer_lost(tcp_comm *tc, int peer, int status, const char *why);

#endif
