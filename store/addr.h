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

/* cl_store_addr_resolve: the first address of host:port (numeric or a
 * name; blocking, so never on the loop thread). passive: for bind (host
 * may then be NULL = any). Errors: COLLIE_EINVAL naming the host. */
int cl_store_addr_resolve(const char *host, uint16_t port, bool passive,
                          struct sockaddr_storage *sa, socklen_t *salen);

#endif
