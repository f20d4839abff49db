/*
 * runner.h — the one test runner of every test binary: each test of the
 * binary's one table runs in a child process of its own, bounded by a
 * per-test timeout, and is checked for leftovers when it ends.
 *
 * Design notes
 *  - main() ends with `return cltest_main(tests, setup, teardown);` (the
 *    same arguments as cmocka_run_group_tests). In the parent, cltest_main
 *    runs this binary again (/proc/self/exe) once per test, with
 *    CLTEST_CHILD=<test name> in its environment, in a process group of
 *    its own; in that child it runs cmocka on that one test (its group
 *    setup and teardown around it), then the leftover check.
 *  - The per-test bound is CLTEST_TEST_TIMEOUT_S (default 120 s) times
 *    CLTEST_TIMEOUT_SCALE (default 1; the sanitizer suites raise it). Past
 *    it the child's whole process group is SIGKILLed and the test fails,
 *    saying so. scripts/run-tests.sh bounds the whole binary as a backstop.
 *  - The leftover check (child, after the group teardown): no thread but
 *    the main one (and TSan's own), no file descriptor that was not open before the group
 *    setup, no engine and no posted work still alive (cl_engines_live,
 *    cl_works_live). Counts are read settled (a joined thread lingers in
 *    /proc for a moment). A test that must leave something (an engine it
 *    could not stop on purpose) says so with cltest_allow_leftovers(why).
 *  - The child's output is passed through, each line prefixed with "    | "
 *    (so the child's own cmocka summary is not counted twice); a skipped
 *    test is one whose child says "[  SKIPPED ]". The parent prints
 *    cmocka's summary lines, which scripts/run-tests.sh counts.
 *  - CLTEST_FILTER (a glob, as fnmatch) selects the tests to run.
 *  - gcc 12's TSan runtime sometimes cannot map its shadow at start-up: a
 *    child that failed saying so never ran its test and is run again (at
 *    most twice).
 */
#ifndef CL_TEST_RUNNER_H
#define CL_TEST_RUNNER_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

/* the test this process runs as a child, or NULL in the parent */
const char *cltest_child_name(void);
/* child: note the resources open before the group setup */
void cltest_child_begin(void);
/* child: the leftover check; returns the exit code for cmocka's result */
int cltest_child_end(int cmocka_failed);
/* parent: run every test in a child; returns the number that failed */
int cltest_parent(const struct CMUnitTest *tests, size_t n);

/* cltest_allow_leftovers: this test leaves something on purpose (why) */
void cltest_allow_leftovers(const char *why);

#define cltest_main(tests, setup, teardown)                                                        \
    (cltest_child_name() ? (cltest_child_begin(), cmocka_set_test_filter(cltest_child_name()),     \
                            cltest_child_end(cmocka_run_group_tests(tests, setup, teardown)))      \
                         : cltest_parent(tests, sizeof(tests) / sizeof((tests)[0])))

#endif
