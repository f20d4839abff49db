/*
 * test_shm_host_id.c — the same-host identity (transports/cpu/shm/host_id.c):
 * this process's, the text form both ways, what makes two differ (a rank
 * in another network namespace included), and strict parsing of a peer's
 * entry.
 */
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "runner.h"
#include "transports/cpu/shm/host_id.h"

static void test_self_and_text_form(void **state) {
    (void)state;
    cl_host_id a, b;
    assert_int_equal(cl_host_id_self(&a), COLLIE_OK);
    struct stat st;
    assert_int_equal(stat("/proc/self/ns/net", &st), 0);
    assert_int_equal(a.netns, (uint64_t)st.st_ino);
    assert_int_equal(a.uid, (uint32_t)getuid());
    assert_int_equal(strlen(a.boot_id), 36);
    assert_true(cl_host_id_same(&a, &a));
    char text[CL_HOST_ID_TEXT];
    cl_host_id_format(&a, text);
    assert_int_equal(cl_host_id_parse(text, &b), COLLIE_OK);
    assert_true(cl_host_id_same(&a, &b));
    assert_string_equal(a.boot_id, b.boot_id);
}

static void test_any_part_differing_is_another_host(void **state) {
    (void)state;
    cl_host_id a, b;
    assert_int_equal(cl_host_id_self(&a), COLLIE_OK);
    b = a;
    b.uid++;
    assert_false(cl_host_id_same(&a, &b));
    b = a;
    b.netns++;
    assert_false(cl_host_id_same(&a, &b));
    b = a;
    b.boot_id[0] = b.boot_id[0] == '0' ? '1' : '0';
    assert_false(cl_host_id_same(&a, &b));
}

static void test_parse_is_strict(void **state) {
    (void)state;
    const char *good = "0a1b2c3d-0000-4000-8000-00000000abcd/4026531840/1000";
    cl_host_id id;
    assert_int_equal(cl_host_id_parse(good, &id), COLLIE_OK);
    assert_int_equal(id.netns, 4026531840u);
    assert_int_equal(id.uid, 1000);
    const char *bad[] = {
        "",
        "garbage",
        "0a1b2c3d-0000-4000-8000-00000000abcd/4026531840/1000 ",       /* trailing */
        "0a1b2c3d-0000-4000-8000-00000000abcd/4026531840",             /* no uid */
        "0a1b2c3d-0000-4000-8000-00000000abcd//1000",                  /* no netns */
        "0a1b2c3d-0000-4000-8000-00000000abcd/+5/1000",                /* sign */
        "0a1b2c3d-0000-4000-8000-00000000abcd/5/-1",                   /* negative */
        "0a1b2c3d-0000-4000-8000-00000000abcd/5/4294967296",           /* uid past 32 bits */
        "0a1b2c3d-0000-4000-8000-00000000abcd/99999999999999999999/1", /* overflow */
        "0a1b2c3dx0000-4000-8000-00000000abcd/5/1",                    /* boot id shape */
        "0a1b2c3d-0000-4000-8000-00000000abcg/5/1",                    /* not hex */
        "0a1b2c3d-0000-4000-8000-00000000abcd/5/1/7",                  /* a fourth part */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cl_host_id out = {.uid = 77};
        if (cl_host_id_parse(bad[i], &out) != COLLIE_EPROTO) fail_msg("accepted '%s'", bad[i]);
        assert_int_equal(out.uid, 77); /* nothing written */
    }
    assert_int_equal(cl_host_id_parse(NULL, &id), COLLIE_EPROTO);
}

/* A process in a network namespace of its own is another host. */
static void test_other_network_namespace_differs(void **state) {
    (void)state;
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(p[0]);
        char text[CL_HOST_ID_TEXT] = "unshare failed";
        cl_host_id id;
        if (unshare(CLONE_NEWNET) == 0 && cl_host_id_self(&id) == COLLIE_OK)
            cl_host_id_format(&id, text);
        ssize_t n = write(p[1], text, strlen(text) + 1);
        _exit(n > 0 ? 0 : 1);
    }
    close(p[1]);
    char text[CL_HOST_ID_TEXT] = {0};
    size_t got = 0;
    int64_t end = now_ms() + 10000;
    while (got < sizeof text - 1 && now_ms() < end) {
        ssize_t n = read(p[0], text + got, sizeof text - 1 - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(p[0]);
    int status = reap_bounded(child, 10000);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (strcmp(text, "unshare failed") == 0) skip(); /* needs CAP_SYS_ADMIN */
    cl_host_id mine, theirs;
    assert_int_equal(cl_host_id_self(&mine), COLLIE_OK);
    assert_int_equal(cl_host_id_parse(text, &theirs), COLLIE_OK);
    assert_string_equal(mine.boot_id, theirs.boot_id);
    assert_int_equal(mine.uid, theirs.uid);
    assert_true(mine.netns != theirs.netns);
    assert_false(cl_host_id_same(&mine, &theirs));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_self_and_text_form),
        cmocka_unit_test(test_any_part_differing_is_another_host),
        cmocka_unit_test(test_parse_is_strict),
        cmocka_unit_test(test_other_network_namespace_differs),
    };
    return cltest_main(tests, NULL, NULL);
}
