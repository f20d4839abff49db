/*
 * host_id.c — the same-host identity (see host_id.h).
 *
 * Design notes
 *  - Boot id, not host name: containers share a kernel (and so can share
 *    memory) under different names, and two machines can share a name.
 *    The network namespace keeps ranks in namespaces of their own (the
 *    partition tests) on TCP, where a cut link means something; the user
 *    keeps memfds away from processes of another user.
 *  - The text form is parsed strictly (a peer's store entry is input):
 *    36 characters of boot id in the UUID shape, then two decimal numbers,
 *    nothing else.
 */
#include "transports/cpu/shm/host_id.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "collie.h"

static bool boot_id_shape(const char *s) {
    for (int i = 0; i < 36; i++) {
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? s[i] != '-' : !isxdigit((unsigned char)s[i])) return false;
    }
    return true;
}

int cl_host_id_self(cl_host_id *out) {
    cl_host_id id;
    memset(&id, 0, sizeof id);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (!f) return COLLIE_ESYSTEM;
    char line[64] = {0};
    bool ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (!ok || strlen(line) < 36 || !boot_id_shape(line)) return COLLIE_ESYSTEM;
    memcpy(id.boot_id, line, 36);
    struct stat st;
    if (stat("/proc/self/ns/net", &st) != 0) return COLLIE_ESYSTEM;
    id.netns = (uint64_t)st.st_ino;
    id.uid = (uint32_t)getuid();
    *out = id;
    return COLLIE_OK;
}

void cl_host_id_format(const cl_host_id *id, char *buf) {
    snprintf(buf, CL_HOST_ID_TEXT, "%.36s/%" PRIu64 "/%" PRIu32, id->boot_id, id->netns, id->uid);
}

/* A decimal number of at most `max`, ending at *end. */
static bool parse_dec(const char *s, char **end, uint64_t max, uint64_t *v) {
    if (!isdigit((unsigned char)*s)) return false;
    errno = 0;
    unsigned long long x = strtoull(s, end, 10);
    if (errno != 0 || x > max) return false;
    *v = x;
    return true;
}

int cl_host_id_parse(const char *text, cl_host_id *out) {
    if (!text || !out || strlen(text) < 40 || !boot_id_shape(text) || text[36] != '/')
        return COLLIE_EPROTO;
    cl_host_id id;
    memset(&id, 0, sizeof id);
    memcpy(id.boot_id, text, 36);
    char *end;
    uint64_t netns, uid;
    if (!parse_dec(text + 37, &end, UINT64_MAX, &netns) || *end != '/') return COLLIE_EPROTO;
    if (!parse_dec(end + 1, &end, UINT32_MAX, &uid) || *end != '\0') return COLLIE_EPROTO;
    id.netns = netns;
    id.uid = (uint32_t)uid;
    *out = id;
    return COLLIE_OK;
}

bool cl_host_id_same(const cl_host_id *a, const cl_host_id *b) {
    return memcmp(a->boot_id, b->boot_id, 36) == 0 && a->netns == b->netns && a->uid == b->uid;
}
