/*
 * plugin_host.c — a program that uses collie only through collie.h and
 * loads the dummy backend plugin (COLLIE_PLUGIN_PATH, or beside libcollie
 * when unset): two ranks on one engine run an allreduce and check it; the
 * library's collie_version() must be the headers' COLLIE_VERSION. Built twice, linked with
 * libcollie.a (no -rdynamic) and with libcollie.so: a plugin that linked a
 * core symbol would fail to load into one of them. test_backend runs both.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collie.h"

#define N       1024
#define WAIT_MS 20000

static int fail(const char *what, const char *why) {
    fprintf(stderr, "plugin_host: %s: %s\n", what, why);
    return 1;
}

int main(int argc, char **argv) {
    const char *linkage = argc > 1 ? argv[1] : "?";
    /* the library running is the one these headers describe */
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", COLLIE_VERSION_MAJOR, COLLIE_VERSION_MINOR,
             COLLIE_VERSION_PATCH);
    if (collie_version() != COLLIE_VERSION || strcmp(collie_version_string(), want) != 0) {
        fprintf(stderr, "plugin_host: library version %d (%s), headers %d (%s)\n", collie_version(),
                collie_version_string(), COLLIE_VERSION, want);
        return 1;
    }
    collie_engine *e;
    collie_store_server *srv;
    collie_store *st[2];
    collie_comm *c[2];
    collie_work *w[2];
    if (collie_engine_create(NULL, &e) != COLLIE_OK) return fail("engine", collie_last_error());
    if (collie_store_server_create(e, "127.0.0.1", 0, NULL, &srv) != COLLIE_OK)
        return fail("store server", collie_last_error());
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", collie_store_server_port(srv));
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = "plugin_host";
    o.backend = "dummy";
    o.timeout_ms = WAIT_MS;
    for (int r = 0; r < 2; r++) {
        if (collie_store_connect(e, addr, NULL, &st[r]) != COLLIE_OK)
            return fail("store", collie_last_error());
        if (collie_comm_create_post(e, st[r], r, 2, &o, &c[r], &w[r]) != COLLIE_OK)
            return fail("comm create", collie_last_error());
    }
    for (int r = 0; r < 2; r++) {
        if (collie_work_wait(w[r], WAIT_MS) != COLLIE_OK)
            return fail("comm create", collie_work_error_message(w[r]));
        collie_work_release(w[r]);
    }
    static float in[2][N], out[2][N];
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < N; i++)
            in[r][i] = (float)(i * (r + 1));
    for (int r = 0; r < 2; r++)
        if (collie_allreduce(c[r], in[r], out[r], N, COLLIE_FP32, COLLIE_SUM, NULL, &w[r]) !=
            COLLIE_OK)
            return fail("allreduce post", collie_last_error());
    for (int r = 0; r < 2; r++) {
        if (collie_work_wait(w[r], WAIT_MS) != COLLIE_OK)
            return fail("allreduce", collie_work_error_message(w[r]));
        collie_work_release(w[r]);
        for (int i = 0; i < N; i++)
            if (out[r][i] != (float)(3 * i)) {
                fprintf(stderr, "plugin_host: rank %d element %d is %g, not %d\n", r, i,
                        (double)out[r][i], 3 * i);
                return 1;
            }
    }
    for (int r = 0; r < 2; r++) {
        collie_comm_destroy(c[r]);
        collie_store_destroy(st[r]);
    }
    collie_store_server_destroy(srv);
    collie_engine_destroy(e);
    printf("plugin_host (%s): collie %s, dummy plugin loaded, allreduce of %d fp32 correct\n",
           linkage, collie_version_string(), N);
    return 0;
}
