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

#define STORE_TOOL_TOKEN_MAX 4096

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

/* Read the token file; trailing whitespace (the newline) is dropped.
 * Returns 0, or an exit status after printing why. */
static int store_tool_read_token(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "collie-store: cannot open token file %s: %s\n", path, strerror(errno));
        return 1;
    }
    size_t n = fread(buf, 1, cap - 1, f);
    bool more = fgetc(f) != EOF;
    fclose(f);
    if (more) {
        fprintf(stderr, "collie-store: token file %s is longer than %zu bytes\n", path, cap - 2);
        return 2;
    }
    buf[n] = '\0';
    while (n > 0 &&
           (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        buf[--n] = '\0';
    if (n == 0 || strlen(buf) != n) {
        fprintf(stderr, "collie-store: token file %s is empty or contains NUL bytes\n", path);
        return 2;
    }
    return 0;
}

int main(int argc, char **argv) {
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
    collie_store_server_opts so = COLLIE_STORE_SERVER_OPTS_INIT;
    const char *bind = "127.0.0.1", *token_file = NULL;
    uint32_t port = 0, v;
    bool have_port = false;
    static char token[STORE_TOOL_TOKEN_MAX + 2];
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'p':
            if (!store_tool_parse_u32(optarg, 65535, &port))
                return store_tool_bad_usage("--port '%s' is not a port number (0..65535)", optarg);
            have_port = true;
            break;
        case 'b': bind = optarg; break;
        case 't': token_file = optarg; break;
        case 'i': so.insecure = 1; break;
        case 'k':
        case 'K':
        case 'V':
        case 'C':
            if (!store_tool_parse_u32(optarg, UINT32_MAX, &v) || v == 0)
                return store_tool_bad_usage("a limit must be a positive number, not '%s'", optarg);
            if (c == 'k') so.max_keys = v;
            if (c == 'K') so.max_key_size = v;
            if (c == 'V') so.max_value_size = v;
            if (c == 'C') so.max_connections = v;
            break;
        case 's': cl_config_print_table(stdout); return 0;
        case 'h': store_tool_usage(stdout); return 0;
        default:
            return store_tool_bad_usage("unknown or incomplete option '%s'",
                                        argv[optind - 1] ? argv[optind - 1] : "?");
        }
    }
    if (optind < argc) return store_tool_bad_usage("unexpected argument '%s'", argv[optind]);
    if (!have_port) return store_tool_bad_usage("%s", "--port is required");
    if (token_file) {
        int rc = store_tool_read_token(token_file, token, sizeof token);
        if (rc) return rc;
        so.token = token;
    }
    if (!so.token && !getenv("COLLIE_STORE_TOKEN") && !so.insecure) {
        char host[256];
        size_t hl = strlen(bind);
        if (hl >= 2 && bind[0] == '[' && bind[hl - 1] == ']') /* "[::1]" */
            snprintf(host, sizeof host, "%.*s", (int)(hl - 2), bind + 1);
        else
            snprintf(host, sizeof host, "%s", bind);
        if (!cl_store_host_is_loopback(host))
            return store_tool_bad_usage(
                "--bind %s is beyond loopback and the store has no token: anyone who can reach "
                "it could read and write it. Give it --token-file FILE (or COLLIE_STORE_TOKEN), "
                "or --insecure if that is meant",
                bind);
    }

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
    if (rc == COLLIE_OK) rc = collie_store_server_create(e, bind, (uint16_t)port, &so, &srv);
    if (rc != COLLIE_OK) {
        fprintf(stderr, "collie-store: %s (%s)\n", collie_last_error(), collie_strerror(rc));
        collie_engine_destroy(e);
        return 1;
    }
    bool v6 = strchr(bind, ':') != NULL && bind[0] != '[';
    printf("collie-store listening on %s%s%s:%u\n", v6 ? "[" : "", bind, v6 ? "]" : "",
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
