/*
 * nosym_plugin.c — a broken backend plugin for test_backend: it loads, but
 * does not export collie_backend_plugin_v3 (only a look-alike), so collie
 * must refuse it with a message naming the missing symbol.
 */
#include "collie_backend.h"

COLLIE_API int collie_backend_plugin_v0(void);
COLLIE_API int collie_backend_plugin_v0(void) { return 0; }
