/*
 * addr.c — see addr.h. Resolution (cl_store_addr_resolve) may block on
 * DNS, so it runs on application threads only (the client's and the
 * server's create), never on the loop thread; parsing and formatting are
 * pure and run on any thread (the loop formats peers for log lines).
 */
#include "store/addr.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collie.h"
#include "engine/engine.h"

void cl_store_addr_format(const struct sockaddr *sa, char *buf, size_t len) {
    char host[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (sa && sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        port = ntohs(in->sin_port);
        snprintf(buf, len, "%s:%u", host, port);
    } else if (sa && sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        port = ntohs(in6->sin6_port);
        snprintf(buf, len, "[%s]:%u", host, port);
    } else {
        snprintf(buf, len, "?");
    }
}

int cl_store_addr_parse(const char *addr, char *host, size_t hostlen, uint16_t *port) {
    const char *colon, *hs = addr, *he;
    if (addr[0] == '[') {
        he = strchr(addr, ']');
        if (!he || he[1] != ':')
            return cl_set_last_error(COLLIE_EINVAL, "store address '%s': expected [ipv6]:port",
                                     addr);
        hs = addr + 1;
        colon = he + 1;
    } else {
        colon = strrchr(addr, ':');
        if (!colon) return cl_set_last_error(COLLIE_EINVAL, "store address '%s': no port", addr);
        he = colon;
        if (memchr(addr, ':', (size_t)(colon - addr)))
            return cl_set_last_error(COLLIE_EINVAL,
                                     "store address '%s': write IPv6 hosts as [addr]:port", addr);
    }
    size_t hl = (size_t)(he - hs);
    if (hl == 0) return cl_set_last_error(COLLIE_EINVAL, "store address '%s': no host", addr);
    if (hl >= hostlen)
        return cl_set_last_error(COLLIE_EINVAL, "store address '%s': host too long", addr);
    char *end;
    const char *ps = colon + 1;
    long p = strtol(ps, &end, 10);
    if (*ps < '0' || *ps > '9' || *end != '\0' || p < 1 || p > 65535)
        return cl_set_last_error(
            COLLIE_EINVAL, "store address '%s': port '%s' is not a number in 1..65535", addr, ps);
    memcpy(host, hs, hl);
    host[hl] = '\0';
    *port = (uint16_t)p;
    return COLLIE_OK;
}

int cl_store_addr_resolve(const char *host, uint16_t port, bool passive, cl_store_addrs *out) {
    out->n = 0;
    if (passive && host && (!strcmp(host, "0.0.0.0") || !strcmp(host, "::"))) {
        struct sockaddr_in *in = (struct sockaddr_in *)&out->sa[0];
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&out->sa[1];
        memset(out->sa, 0, 2 * sizeof out->sa[0]);
        in->sin_family = AF_INET;
        in->sin_port = htons(port);
        in->sin_addr.s_addr = htonl(INADDR_ANY);
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons(port);
        in6->sin6_addr = in6addr_any;
        out->len[0] = sizeof *in;
        out->len[1] = sizeof *in6;
        out->n = 2;
        return COLLIE_OK;
    }
    char ps[8];
    snprintf(ps, sizeof ps, "%u", (unsigned)port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
    struct addrinfo *ai = NULL;
    int r = getaddrinfo(host, ps, &hints, &ai);
    if (r != 0 || !ai)
        return cl_set_last_error(COLLIE_EINVAL, "cannot resolve '%s': %s", host ? host : "(any)",
                                 r ? gai_strerror(r) : "no address");
    for (struct addrinfo *it = ai; it && out->n < CL_STORE_ADDRS_MAX; it = it->ai_next) {
        if ((it->ai_family != AF_INET && it->ai_family != AF_INET6) ||
            it->ai_addrlen > sizeof out->sa[0])
            continue;
        bool dup = false;
        for (int i = 0; i < out->n && !dup; i++)
            dup =
                out->len[i] == it->ai_addrlen && !memcmp(&out->sa[i], it->ai_addr, it->ai_addrlen);
        if (dup) continue;
        memset(&out->sa[out->n], 0, sizeof out->sa[0]);
        memcpy(&out->sa[out->n], it->ai_addr, it->ai_addrlen);
        out->len[out->n++] = (socklen_t)it->ai_addrlen;
    }
    freeaddrinfo(ai);
    if (out->n == 0)
        return cl_set_last_error(COLLIE_EINVAL, "cannot resolve '%s': no IPv4 or IPv6 address",
                                 host ? host : "(any)");
    return COLLIE_OK;
}
