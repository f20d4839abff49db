/*
 * abi2_plugin.c — a complete backend plugin built against the frozen ABI-2
 * header (tests/abi2): it exports collie_backend_plugin_v1 and expects an
 * event_base from the services table. A core speaking ABI 3 must refuse it
 * before calling any hook, naming both versions (test_backend).
 */
#include <stddef.h>

#include "../abi2/collie_backend_abi2.h"

static int abi2_init(collie_bcomm *bc, const collie_core_services *core, void **state) {
    *state = NULL;
    (void)core->event_base(bc); /* what ABI 2 offered and ABI 3 no longer does */
    core->init_done(bc, COLLIE_OK, NULL);
    return COLLIE_OK;
}
static int abi2_start(void *state, collie_work *w, const collie_coll_args *a) {
    (void)state;
    (void)w;
    (void)a;
    return COLLIE_ENOTSUP;
}
static void abi2_detach(void *state, collie_work *w) {
    (void)state;
    (void)w;
}
static void abi2_abort(void *state, int status, const char *reason) {
    (void)state;
    (void)status;
    (void)reason;
}
static void abi2_destroy(void *state) { (void)state; }

static const collie_backend_ops abi2_ops = {
    .abi_version = COLLIE_BACKEND_ABI_VERSION, /* 2, from the frozen header */
    .size = sizeof(collie_backend_ops),
    .name = "abi2",
    .device = "cpu",
    .init = abi2_init,
    .start = abi2_start,
    .detach = abi2_detach,
    .abort = abi2_abort,
    .destroy = abi2_destroy,
};

COLLIE_API const collie_backend_ops *collie_backend_plugin_v1(void);
COLLIE_API const collie_backend_ops *collie_backend_plugin_v1(void) { return &abi2_ops; }
