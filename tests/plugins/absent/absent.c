/* absent.c — libcltest_absent.so: the library needslib_plugin.c links
 * against and that is deliberately not on any search path at run time. */
int cltest_absent_value(void);
__attribute__((visibility("default"))) int cltest_absent_value(void) { return 1; }
