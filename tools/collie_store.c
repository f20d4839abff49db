/*
 * collie-store — the standalone key/value store server, for jobs whose
 * store must outlive any rank.
 *
 *   collie-store --port P [--bind ADDR] [--token-file F] [--insecure] [limits...]
 *
 * Listens on 127.0.0.1 unless --bind says otherwise; an address beyond
 * loopback needs a token (--token-file, or COLLIE_STORE_TOKEN), or
 * --insecure to say that anyone who can reach it may use the store.
 *
 * Prints "collie-store listening on ADDR:PORT" (flushed; with --port 0 the
 * port picked) once it accepts connections, then serves until SIGTERM or
 * SIGINT, and exits 0 after closing every connection. Usage errors exit 2,
 * failures to start exit 1.
 *
 * Design notes: the signals are blocked before the engine starts (its
 * threads inherit the mask) and taken synchronously with sigwait on the
 * main thread, so shutdown runs in ordinary code, not in a handler.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collie.h"
#include "engine/config.h"
#include "store/auth.h"
#include "tools/common/token_file.h"

static void store_tool_usage(FILE *f) {
    fprintf(f, "usage: collie-store --port P [--bind ADDR] [--token-file FILE] [--insecure]\n"
               "                    [--max-keys N] [--max-key-size BYTES]\n"
               "                    [--max-value-size BYTES] [--max-connections N]\n"
               "       collie-store --settings | --help\n"
               "\n"
               "Serve a collie key/value store until SIGTERM or SIGINT.\n"
               "  --port P            TCP port (0: pick a free one; it is printed)\n"
               "  --bind ADDR         address to listen on (default 127.0.0.1; '::1', '0.0.0.0');\n"
               "                      beyond loopback it needs a token, or --insecure\n"
               "  --token-file FILE   require clients to prove they know the token in FILE\n"
               "                      (trailing newline ignored); default: COLLIE_STORE_TOKEN\n"
               "  --insecure          serve beyond loopback without a token: anyone who can\n"
               "                      reach the port can read and write the store\n"
               "  --max-*             limits (defaults: 1000000 keys, 4096-byte keys,\n"
               "                      64 MiB values, 16384 connections)\n"
               "  --settings          print the COLLIE_* environment settings and exit\n");
}

static int store_tool_bad_usage(const char *fmt, const char *arg) {
    fprintf(stderr, "collie-store: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    store_tool_usage(stderr);
    return 2;
}

static bool store_tool_parse_u32(const char *s, uint32_t max, uint32_t *out) {
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v > max) return false;
    *out = (uint32_t)v;
    return true;
}

/* What the command line asks for. */
typedef struct store_tool_args {
    collie_store_server_opts so;
    const char *bind, *token_file;
    uint32_t port;
    bool have_port;
} store_tool_args;

/* One option c: -1 to go on, or the exit status (0 for --help, --settings). */
static int store_tool_parse_opt(int c, char **argv, store_tool_args *a) {
    uint32_t v;
    switch (c) {
    case 'p':
        if (!store_tool_parse_u32(optarg, 65535, &a->port))
            return store_tool_bad_usage("--port '%s' is not a port number (0..65535)", optarg);
        a->have_port = true;
        return -1;
    case 'b': a->bind = optarg; return -1;
    case 't': a->token_file = optarg; return -1;
    case 'i': a->so.insecure = 1; return -1;
    case 'k':
    case 'K':
    case 'V':
    case 'C':
        if (!store_tool_parse_u32(optarg, UINT32_MAX, &v) || v == 0)
            return store_tool_bad_usage("a limit must be a positive number, not '%s'", optarg);
        if (c == 'k') a->so.max_keys = v;
        if (c == 'K') a->so.max_key_size = v;
        if (c == 'V') a->so.max_value_size = v;
        if (c == 'C') a->so.max_connections = v;
        return -1;
    case 's': cl_config_print_table(stdout); return 0;
    case 'h': store_tool_usage(stdout); return 0;
    default:
        return store_tool_bad_usage("unknown or incomplete option '%s'",
                                    argv[optind - 1] ? argv[optind - 1] : "?");
    }
}

/* The command line into *a (the token read from --token-file): -1 to go
 * on, or the exit status. */
static int store_tool_parse_args(int argc, char **argv, store_tool_args *a) {
    static const struct option opts[] = {
        {"port", required_argument, NULL, 'p'},
        {"bind", required_argument, NULL, 'b'},
        {"token-file", required_argument, NULL, 't'},
        {"max-keys", required_argument, NULL, 'k'},
        {"max-key-size", required_argument, NULL, 'K'},
        {"max-value-size", required_argument, NULL, 'V'},
        {"max-connections", required_argument, NULL, 'C'},
        {"insecure", no_argument, NULL, 'i'},
        {"settings", no_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    static char token[TOOL_TOKEN_MAX + 2];
    int c, rc;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1)
        if ((rc = store_tool_parse_opt(c, argv, a)) >= 0) return rc;
    if (optind < argc) return store_tool_bad_usage("unexpected argument '%s'", argv[optind]);
    if (!a->have_port) return store_tool_bad_usage("%s", "--port is required");
    if (a->token_file) {
        rc = tool_token_file_read("collie-store", a->token_file, token, sizeof token);
        if (rc) return rc;
        a->so.token = token;
    }
    return -1;
}

/* A store beyond loopback needs a token, or --insecure: -1 to go on, or
 * the usage error. */
static int store_tool_check_exposure(const store_tool_args *a) {
    if (a->so.token || getenv("COLLIE_STORE_TOKEN") || a->so.insecure) return -1;
    char host[256];
    size_t hl = strlen(a->bind);
    if (hl >= 2 && a->bind[0] == '[' && a->bind[hl - 1] == ']') /* "[::1]" */
        snprintf(host, sizeof host, "%.*s", (int)(hl - 2), a->bind + 1);
    else
        snprintf(host, sizeof host, "%s", a->bind);
    if (cl_store_host_is_loopback(host)) return -1;
    return store_tool_bad_usage(
        "--bind %s is beyond loopback and the store has no token: anyone who can reach "
        "it could read and write it. Give it --token-file FILE (or COLLIE_STORE_TOKEN), "
        "or --insecure if that is meant",
        a->bind);
}

/* Serve until SIGTERM or SIGINT (blocked here, before the engine's threads
 * start, and taken with sigwait). */
static int store_tool_serve(const store_tool_args *a) {
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    collie_engine_opts eo = COLLIE_ENGINE_OPTS_INIT;
    eo.name = "collie-store";
    collie_engine *e = NULL;
    collie_store_server *srv = NULL;
    int rc = collie_engine_create(&eo, &e);
    if (rc == COLLIE_OK)
        rc = collie_store_server_create(e, a->bind, (uint16_t)a->port, &a->so, &srv);
    if (rc != COLLIE_OK) {
        fprintf(stderr, "collie-store: %s (%s)\n", collie_last_error(), collie_strerror(rc));
        collie_engine_destroy(e);
        return 1;
    }
    bool v6 = strchr(a->bind, ':') != NULL && a->bind[0] != '[';
    printf("collie-store listening on %s%s%s:%u\n", v6 ? "[" : "", a->bind, v6 ? "]" : "",
           (unsigned)collie_store_server_port(srv));
    fflush(stdout);

    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "collie-store: %s received, shutting down (%zu connections open)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", collie_store_server_num_connections(srv));
    collie_store_server_destroy(srv);
    collie_engine_destroy(e);
    return 0;
}

int main(int argc, char **argv) {
    store_tool_args a = {.so = COLLIE_STORE_SERVER_OPTS_INIT, .bind = "127.0.0.1"};
    int rc = store_tool_parse_args(argc, argv, &a);
    if (rc < 0) rc = store_tool_check_exposure(&a);
    if (rc >= 0) return rc;
    return store_tool_serve(&a);
}
