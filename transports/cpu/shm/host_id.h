/*
 * host_id.h — what makes two ranks "the same host" for the shared-memory
 * link (docs/shm.md §3): the same boot (kernel boot id), the same network
 * namespace and the same user. Each rank publishes its identity in the
 * store beside its TCP address; a peer whose identity differs in any part
 * is reached over TCP.
 */
#ifndef CL_SHM_HOST_ID_H
#define CL_SHM_HOST_ID_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CL_HOST_ID_TEXT 96 /* room for the text form, NUL included */

typedef struct cl_host_id {
    char boot_id[37]; /* /proc/sys/kernel/random/boot_id: 36 characters */
    uint64_t netns;   /* the inode of /proc/self/ns/net */
    uint32_t uid;     /* the real user id */
} cl_host_id;

/* cl_host_id_self: this process's identity. COLLIE_ESYSTEM if /proc does
 * not say (then the caller uses TCP only). */
int cl_host_id_self(cl_host_id *out);

/* cl_host_id_format: "boot-id/netns/uid" into buf (CL_HOST_ID_TEXT bytes). */
void cl_host_id_format(const cl_host_id *id, char *buf);

/* cl_host_id_parse: the text form back; COLLIE_EPROTO (nothing written to
 * *out) for anything that is not exactly that. */
int cl_host_id_parse(const char *text, cl_host_id *out);

/* cl_host_id_same: all three parts equal. */
bool cl_host_id_same(const cl_host_id *a, const cl_host_id *b);

#endif
