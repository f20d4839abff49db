/*
 * siphash.h — SipHash-2-4 (Aumasson & Bernstein), the keyed hash of the
 * store's key table: keys come from the network, so a seeded hash keeps a
 * client from flooding one bucket.
 */
#ifndef CL_STORE_SIPHASH_H
#define CL_STORE_SIPHASH_H

#include <stddef.h>
#include <stdint.h>

uint64_t cl_store_siphash(const uint8_t key[16], const void *data, size_t len);

#endif
