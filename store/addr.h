/*
 * addr.h — socket addresses of the store: parsing "host:port" strings,
 * resolving them, and formatting peers for messages.
 */
#ifndef CL_STORE_ADDR_H
#define CL_STORE_ADDR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* cl_store_addr_format: "1.2.3.4:5000" or "[::1]:5000" ("?" if unknown). */
void cl_store_addr_format(const struct sockaddr *sa, char *buf, size_t len);

/* cl_store_addr_parse: split "host:port" or "[v6addr]:port". The port must
 * be 1..65535. Errors: COLLIE_EINVAL with collie_last_error naming `addr`
 * ("store address 'x': no port"). */
int cl_store_addr_parse(const char *addr, char *host, size_t hostlen, uint16_t *port);

/* The addresses a host name stands for, in the resolver's order. */
#define CL_STORE_ADDRS_MAX 8
typedef struct cl_store_addrs {
    int n;
    struct sockaddr_storage sa[CL_STORE_ADDRS_MAX];
    socklen_t len[CL_STORE_ADDRS_MAX];
} cl_store_addrs;

/* cl_store_addr_resolve: every address of host:port (numeric or a name:
 * "localhost" is often ::1 and 127.0.0.1), in the resolver's order, without
 * duplicates, at most CL_STORE_ADDRS_MAX; blocking, so never on the loop
 * thread. passive: for bind, where a wildcard ("0.0.0.0", "::") stands for
 * both families' (0.0.0.0 then ::). Errors: COLLIE_EINVAL naming the host. */
int cl_store_addr_resolve(const char *host, uint16_t port, bool passive, cl_store_addrs *out);

#endif
