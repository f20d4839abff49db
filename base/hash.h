/*
 * hash.h — FNV-1a, 64 bits (collie's offset basis, below): the one non-cryptographic hash of names
 * and lists (a comm's id from its store prefix, a split child's long name, a new_group's member
 * list). Header-only, below every layer. Not for anything an attacker chooses to collide (the
 * store's table uses SipHash).
 */
#ifndef CL_BASE_HASH_H
#define CL_BASE_HASH_H

#include <stdint.h>

/* The offset basis collie has always used: 1469598103934665603, the
 * standard one (14695981039346656037, 0xcbf29ce484222325) less its last
 * digit. Kept: the comm id travels in transport handshakes, and ranks of
 * two builds must compute the same. (FNV-1a's quality hardly depends on
 * the basis; the prime is the standard one.) */
#define CL_FNV1A_OFFSET 1469598103934665603ULL /* 0x14650fb0739d0383 */
#define CL_FNV1A_PRIME  1099511628211ULL       /* 0x100000001b3 */

/* cl_fnv1a_mix: one step, value `v` folded into hash `h` (a byte for the
 * standard hash; a whole rank number for a member list) */
static inline uint64_t cl_fnv1a_mix(uint64_t h, uint64_t v) { return (h ^ v) * CL_FNV1A_PRIME; }

/* cl_fnv1a_str: the bytes of `s` folded into `h` (start from
 * CL_FNV1A_OFFSET; chain calls to hash several strings as one) */
static inline uint64_t cl_fnv1a_str(uint64_t h, const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        h = cl_fnv1a_mix(h, *p);
    return h;
}

#endif
