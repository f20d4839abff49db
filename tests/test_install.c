/*
 * test_install.c — collie as an outside project gets it: the version at run
 * time, `make install` into a DESTDIR used through pkg-config by programs
 * linked shared and static (tests/install/check.sh), the NCCL plugin built
 * out of tree from that install (tests/install/plugin_out_of_tree.sh), and a library build
 * that needs none of the test-only packages.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "collie.h"
#include "tests/harness.h"
#include "tests/runner.h"

static void test_version_matches_headers(void **state) {
    (void)state;
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", COLLIE_VERSION_MAJOR, COLLIE_VERSION_MINOR,
             COLLIE_VERSION_PATCH);
    assert_int_equal(collie_version(), COLLIE_VERSION);
    assert_int_equal(COLLIE_VERSION, COLLIE_VERSION_CODE(COLLIE_VERSION_MAJOR, COLLIE_VERSION_MINOR,
                                                         COLLIE_VERSION_PATCH));
    assert_string_equal(collie_version_string(), want);
}

/* run a shell command; returns its exit status, its output in out */
static int run_capture(const char *cmd, char *out, size_t len) {
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, len - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static bool have_tool(const char *name) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", name);
    return system(cmd) == 0;
}

static bool normal_build(void) {
    const char *b = getenv("CLTEST_BUILD_DIR");
    return !b || strcmp(b, "build") == 0;
}

static void test_install_destdir_pkgconfig(void **state) {
    (void)state;
    if (!normal_build()) skip_because("installs the normal build (this suite's is sanitized)");
    if (!have_tool("pkg-config") || !have_tool("readelf") || !have_tool("cc"))
        skip_because("needs pkg-config, readelf and cc");
    static char out[1 << 16];
    int rc = run_capture("timeout 300 tests/install/check.sh 2>&1", out, sizeof out);
    print_message("%s", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "plugin_host (shared): collie"));
    assert_non_null(strstr(out, "plugin_host (static): collie"));
    assert_non_null(strstr(out, "plugin_host (relocated): collie"));
}

/* The NCCL plugin built out of tree from an install, with no symbol of the
 * core, loaded by the installed tools and checked on the CUDA double
 * (tests/install/plugin_out_of_tree.sh). */
static void test_nccl_plugin_builds_out_of_tree(void **state) {
    (void)state;
    if (!normal_build()) skip_because("installs the normal build (this suite's is sanitized)");
    if (!have_tool("pkg-config") || !have_tool("nm") || !have_tool("cc"))
        skip_because("needs pkg-config, nm and cc");
    static char out[1 << 16];
    int rc = run_capture("timeout 400 tests/install/plugin_out_of_tree.sh 2>&1", out, sizeof out);
    print_message("%s", out);
    if (rc == 77) skip_because("%.150s", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "out-of-tree: ok"));
}

/* `make lib tools examples plugins` on a machine without the test-only
 * packages: a dry run shows what it would do — the build profile of
 * deps.sh only, and no cmocka anywhere. */
static void test_library_build_needs_no_test_packages(void **state) {
    (void)state;
    char dir[64];
    test_tmpdir_make(dir, sizeof dir, "cltest-deps");
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "timeout 120 make -n --no-print-directory STAMP_DIR=%s BUILD=%s/b lib tools "
             "examples plugins 2>&1",
             dir, dir);
    static char out[1 << 20];
    int rc = run_capture(cmd, out, sizeof out);
    test_tmpdir_remove(dir);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "scripts/deps.sh build"));
    if (strstr(out, "deps.sh test")) fail_msg("the library build asks for the test packages");
    if (strstr(out, "cmocka")) fail_msg("the library build mentions cmocka");
    if (strstr(out, "tests/")) fail_msg("the library build compiles something of tests/");
}

/* Every long option a tool's --help lists is in its man page
 * (tests/install/man_options.sh). */
static void test_man_pages_cover_options(void **state) {
    (void)state;
    const char *b = getenv("CLTEST_BUILD_DIR");
    char cmd[512];
    snprintf(cmd, sizeof cmd, "timeout 60 tests/install/man_options.sh %s/bin docs/man 2>&1",
             b && *b ? b : "build");
    static char out[1 << 14];
    int rc = run_capture(cmd, out, sizeof out);
    print_message("%s", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "every --help option documented"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version_matches_headers),
        cmocka_unit_test(test_install_destdir_pkgconfig),
        cmocka_unit_test(test_nccl_plugin_builds_out_of_tree),
        cmocka_unit_test(test_library_build_needs_no_test_packages),
        cmocka_unit_test(test_man_pages_cover_options),
    };
    return cltest_main(tests, NULL, NULL);
}
