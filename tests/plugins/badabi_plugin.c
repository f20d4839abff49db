/*
 * badabi_plugin.c — a broken backend plugin for test_backend: it exports
 * the entry point, but its ops speak a future ABI version, so collie must
 * refuse it naming both versions before calling any hook.
 */
#include <stddef.h>

#include "collie_backend.h"

static int badabi_init(collie_bcomm *bc, const collie_core_services *core, void **state) {
    (void)bc;
    (void)core;
    *state = NULL;
    return COLLIE_ENOTSUP;
}
static int badabi_start(void *state, collie_work *w, const collie_coll_args *a) {
    (void)state;
    (void)w;
    (void)a;
    return COLLIE_ENOTSUP;
}
static void badabi_detach(void *state, collie_work *w) {
    (void)state;
    (void)w;
}
static void badabi_abort(void *state, int status, const char *reason) {
    (void)state;
    (void)status;
    (void)reason;
}
static void badabi_destroy(void *state) { (void)state; }

static const collie_backend_ops badabi_ops = {
    .abi_version = 99,
    .size = sizeof(collie_backend_ops),
    .name = "badabi",
    .device = "cpu",
    .init = badabi_init,
    .start = badabi_start,
    .detach = badabi_detach,
    .abort = badabi_abort,
    .destroy = badabi_destroy,
};

COLLIE_API const collie_backend_ops *collie_backend_plugin_v3(void);
COLLIE_API const collie_backend_ops *collie_backend_plugin_v3(void) { return &badabi_ops; }
