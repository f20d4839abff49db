/*
 * store.h — what other collie modules may use of the store's internals.
 */
#ifndef CL_STORE_H
#define CL_STORE_H

#include <stddef.h>

#include "collie.h"

/* cl_store_token: the shared secret the handle's connection authenticates
 * with (*token NULL if none), for the transports' handshakes. */
int cl_store_token(const collie_store *s, const char **token, size_t *len);

#endif
