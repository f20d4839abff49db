/*
 * endian.h — integers stored in little-endian byte order, whatever the
 * host's order and the pointer's alignment: the wire formats (frames,
 * handshakes, loan descriptors) read and write through these. Header-only,
 * below every layer, so a backend needs no core header for them.
 */
#ifndef CL_BASE_ENDIAN_H
#define CL_BASE_ENDIAN_H

#include <stdint.h>

/* cl_put32le / cl_put64le / cl_get32le / cl_get64le: an integer stored at
 * p in little-endian byte order. */
static inline void cl_put32le(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void cl_put64le(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t cl_get32le(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t cl_get64le(const uint8_t *p) {
    return cl_get32le(p) | (uint64_t)cl_get32le(p + 4) << 32;
}

#endif
