/*
 * needslib_plugin.c — a backend plugin for test_backend that needs a
 * library missing at run time (libcltest_absent.so, linked at build time
 * from tests/plugins/absent/ but on no search path when loaded): collie
 * must say the plugin was found but a library it needs was not — as for a
 * libcollie_nccl.so on a machine without libnccl.so.2.
 */
#include "collie_backend.h"

int cltest_absent_value(void);

COLLIE_API const collie_backend_ops *collie_backend_plugin_v3(void);
COLLIE_API const collie_backend_ops *collie_backend_plugin_v3(void) {
    return cltest_absent_value() ? NULL : NULL;
}
