/*
 * trust.c — who may join a comm (docs/security.md): the check a comm's
 * creation makes of its store before anything of it is published.
 *
 * Design notes
 *  - With a shared secret (the store handle's token) the store and every
 *    rank's handshake prove it: nothing more to check here.
 *  - Without one, whoever reaches the store can read the ranks' addresses
 *    and join (the transport cannot tell a rank from an impostor). A store
 *    on loopback limits that to this host: allowed, and said once per
 *    process. A store beyond loopback is refused unless COLLIE_INSECURE=1
 *    says that is meant. (The TCP transport applies the same rule to its
 *    own listener.)
 *  - Runs on the caller's thread: resolving the store's host may block.
 */
#include <stdatomic.h>
#include <stdio.h>

#include "comm/comm.h"
#include "engine/engine.h"
#include "store/store.h"

int cl_comm_trust_check(collie_store *store, const char *name) {
    static atomic_bool told;
    const char *tok = NULL;
    size_t tlen = 0;
    if (!store) return COLLIE_OK; /* refused with its own message by the caller */
    cl_store_token(store, &tok, &tlen);
    if (tok) return COLLIE_OK;
    char addr[300];
    bool local = cl_store_on_loopback(store, addr, sizeof addr);
    if (!local && !cl_config_get()->insecure)
        return cl_set_last_error(
            COLLIE_EINVAL,
            "collie_comm_create: comm '%s' has no shared secret and its store %s is not on "
            "loopback: anyone who can reach the store could join it. Give the store and every "
            "rank a secret (COLLIE_STORE_TOKEN, or the store options' token; collie-run makes "
            "one), or set COLLIE_INSECURE=1 if that is meant",
            name ? name : "world", addr);
    if (!atomic_exchange(&told, true))
        CL_WARN("comm",
                "comm '%s': no shared secret (COLLIE_STORE_TOKEN): any process %s that can reach "
                "the store %s can join this process's comms (docs/security.md)",
                name ? name : "world", local ? "on this host" : "anywhere", addr);
    return COLLIE_OK;
}
