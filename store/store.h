/*
 * store.h — what other collie modules may use of the store's internals.
 */
#ifndef CL_STORE_H
#define CL_STORE_H

#include <stdbool.h>
#include <stddef.h>

#include "collie.h"

/* cl_store_token: the shared secret the handle's connection authenticates
 * with (*token NULL if none), for the transports' handshakes. */
int cl_store_token(const collie_store *s, const char **token, size_t *len);

/* cl_store_on_loopback: does the handle's server address lie on loopback
 * (every address its host resolves to)? `addr` gets that address, for
 * messages. Blocking (resolves): the caller's thread, not the loop. */
bool cl_store_on_loopback(const collie_store *s, char *addr, size_t len);

/* cl_store_reconnects: how many times the handle's connection was made
 * again after its first (any thread). */
uint64_t cl_store_reconnects(const collie_store *s);

/* cl_store_lost: the handle's connection was up once and is down now (the
 * server went away; the client retries); `why` gets the last error. Any
 * thread. */
bool cl_store_lost(const collie_store *s, char *why, size_t len);

#endif
