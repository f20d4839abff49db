/*
 * test_trace.c — collie-trace, the reader of flight-recorder dumps: on dumps
 * written by real comms (ranks of one process: one that never posted a
 * collective, two that posted mismatched ones), on hand-written dumps for
 * the corners (ring wrapped, recorder off, send/recv, several comms), and
 * on malformed input, which must be rejected with the file, the line and
 * the reason (exit 2). The multi-process hang test in test_faults runs it
 * on the dumps COLLIE_DUMP_DIR collects after a real hang.
 */
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll_fixture.h"
#include "harness.h"
#include "runner.h"

#define TOOL_TIMEOUT_MS 10000

static char tmp_dir[64];

static const char *tool_path(void) {
    static char path[4096];
    const char *dir = getenv("CLTEST_BUILD_DIR");
    snprintf(path, sizeof path, "%s/bin/collie-trace", dir && *dir ? dir : "build");
    return path;
}

typedef struct result {
    int status; /* exit code, 128+signal */
    char out[32768], err[4096];
} result;

static result res; /* large: not on the stack */

/* Run collie-trace with the given files (NULL-terminated), bounded. */
static result *trace(const char *const *files) {
    memset(&res, 0, sizeof res);
    const char *argv[32] = {tool_path()};
    size_t n = 1;
    for (size_t i = 0; files[i]; i++)
        argv[n++] = files[i];
    int po[2], pe[2];
    assert_int_equal(pipe2(po, O_CLOEXEC), 0);
    assert_int_equal(pipe2(pe, O_CLOEXEC), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(po[1], 1);
        dup2(pe[1], 2);
        char *envp[] = {NULL};
        execve(argv[0], (char *const *)argv, envp);
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    int fds[2] = {po[0], pe[0]};
    char *bufs[2] = {res.out, res.err};
    size_t caps[2] = {sizeof res.out, sizeof res.err}, lens[2] = {0, 0};
    int64_t until = now_ms() + TOOL_TIMEOUT_MS;
    while ((fds[0] >= 0 || fds[1] >= 0) && now_ms() < until) {
        struct pollfd p[2];
        int map[2], k = 0;
        for (int i = 0; i < 2; i++)
            if (fds[i] >= 0) {
                p[k] = (struct pollfd){.fd = fds[i], .events = POLLIN};
                map[k++] = i;
            }
        if (poll(p, (nfds_t)k, 100) <= 0) continue;
        for (int j = 0; j < k; j++) {
            if (!p[j].revents) continue;
            int i = map[j];
            ssize_t got = read(fds[i], bufs[i] + lens[i], caps[i] - 1 - lens[i]);
            if (got <= 0) {
                close(fds[i]);
                fds[i] = -1;
                continue;
            }
            lens[i] += (size_t)got;
        }
    }
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0) close(fds[i]);
    int ws = 0;
    pid_t got;
    while ((got = waitpid(pid, &ws, WNOHANG)) == 0 && now_ms() < until)
        usleep(5000);
    if (got != pid) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        fail_msg("collie-trace did not finish within %d ms", TOOL_TIMEOUT_MS);
    }
    res.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    return &res;
}

#define assert_out(r, cond)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            print_error("exit %d\n--- stdout:\n%s--- stderr:\n%s---\n", (r)->status, (r)->out,     \
                        (r)->err);                                                                 \
            fail_msg("%s", #cond);                                                                 \
        }                                                                                          \
    } while (0)

/* print_message holds 1 KiB: long output goes out line by line. */
static void print_lines(const char *text) {
    for (const char *l = text; *l;) {
        size_t n = strcspn(l, "\n");
        print_message("%.*s\n", (int)(n < 1000 ? n : 1000), l);
        l += n + (l[n] == '\n');
    }
}

/* A file in the temporary directory with `text`; returns its path. */
static const char *write_file(const char *name, const char *text) {
    static char paths[16][256];
    static int k;
    char *p = paths[k++ % 16];
    snprintf(p, 256, "%s/%s", tmp_dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return p;
}

static const char *dump_comm(collie_comm *c, const char *name) {
    static char paths[8][256];
    static int k;
    char *p = paths[k++ % 8];
    snprintf(p, 256, "%s/%s", tmp_dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    assert_int_equal(collie_comm_dump(c, f), COLLIE_OK);
    fclose(f);
    return p;
}

static int setup(void **state) {
    (void)state;
    test_tmpdir_make(tmp_dir, sizeof tmp_dir, "cl-trace");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    test_tmpdir_remove(tmp_dir);
    return 0;
}

/* ---- dumps of real comms ---------------------------------------------------- */

/* Three ranks; rank 2 stops posting after seq 3: ranks 0 and 1 are stuck
 * in seq 4, which rank 2 never posted. */
static void test_real_dumps_show_the_straggler(void **state) {
    (void)state;
    world w;
    world_create(&w, 3, "straggle", NULL);
    int32_t v[3][16];
    for (int k = 0; k < 3; k++) {
        collie_work *wk[3];
        for (int r = 0; r < 3; r++)
            assert_int_equal(
                collie_allreduce(w.c[r], v[r], v[r], 16, COLLIE_INT32, COLLIE_SUM, NULL, &wk[r]),
                COLLIE_OK);
        for (int r = 0; r < 3; r++) {
            assert_int_equal(collie_work_wait(wk[r], 10000), COLLIE_OK);
            collie_work_release(wk[r]);
        }
    }
    collie_work *stuck[2];
    for (int r = 0; r < 2; r++)
        assert_int_equal(
            collie_allreduce(w.c[r], v[r], v[r], 16, COLLIE_INT32, COLLIE_SUM, NULL, &stuck[r]),
            COLLIE_OK);
    assert_int_equal(collie_work_wait(stuck[0], 200), COLLIE_INPROGRESS);
    const char *files[] = {dump_comm(w.c[2], "r2.json"), dump_comm(w.c[0], "r0.json"),
                           dump_comm(w.c[1], "r1.json"), NULL};
    result *r = trace(files);
    print_lines(r->out);
    assert_out(r, r->status == 0);
    assert_out(r, strstr(r->out, "comm 'straggle' generation 0: 3 ranks, 3 dumps"));
    assert_out(r, strstr(r->out, "rank 0: posted 4, completed 3, comm COLLIE_OK"));
    assert_out(r, strstr(r->out, "rank 2: posted 3, completed 3, comm COLLIE_OK"));
    assert_out(r, strstr(r->out, "oldest unfinished: allreduce seq 4 (16 x int32 sum) running"));
    assert_out(r,
               strstr(r->out, "first collective not completed by every rank: seq 4 (allreduce)"));
    assert_out(r, strstr(r->out, "never posted it: rank 2 (last posted 3)"));
    assert_out(r, strstr(r->out, "posted it, not completed: rank 0 (running), rank 1 (running)"));
    assert_out(r, strstr(r->out, "mismatches: none"));
    /* the same dumps reformatted by jq (pretty, then compact) read the same */
    static char first[sizeof res.out];
    memcpy(first, r->out, sizeof first);
    static const char *const jq_modes[] = {".", "-c ."};
    for (size_t m = 0; m < 2; m++) {
        const char *re[4] = {NULL};
        for (int i = 0; i < 3; i++) {
            char name[32], cmd[1024];
            snprintf(name, sizeof name, "jq%zu-%d.json", m, i);
            re[i] = write_file(name, "");
            snprintf(cmd, sizeof cmd, "timeout 10 jq %s '%s' > '%s'", jq_modes[m], files[i], re[i]);
            assert_int_equal(system(cmd), 0);
        }
        r = trace(re);
        assert_out(r, r->status == 0);
        assert_string_equal(r->out, first);
    }
    /* with a dump missing, the rank is named as such */
    const char *two[] = {files[1], files[2], NULL};
    r = trace(two);
    assert_out(r, r->status == 0 && strstr(r->out, "rank 2: no dump"));
    assert_out(r, strstr(r->out, "no dump: rank 2"));
    for (int k = 0; k < 2; k++) {
        assert_int_equal(collie_comm_abort(w.c[k], "test over"), COLLIE_OK);
        assert_int_equal(collie_work_wait(stuck[k], 5000), COLLIE_EABORTED);
        collie_work_release(stuck[k]);
    }
    world_destroy(&w);
}

/* Two ranks post different counts at the same sequence number: the
 * transport fails it with EPROTO, and collie-trace names the mismatch. */
static void test_real_dumps_show_a_mismatch(void **state) {
    (void)state;
    world w;
    world_create(&w, 2, "mismatch", NULL);
    int32_t a[16] = {0}, b[16] = {0};
    collie_work *wa, *wb;
    assert_int_equal(collie_allreduce(w.c[0], a, a, 8, COLLIE_INT32, COLLIE_SUM, NULL, &wa),
                     COLLIE_OK);
    assert_int_equal(collie_allreduce(w.c[1], b, b, 16, COLLIE_INT32, COLLIE_SUM, NULL, &wb),
                     COLLIE_OK);
    int ra = collie_work_wait(wa, 10000), rb = collie_work_wait(wb, 10000);
    assert_true(ra == COLLIE_EPROTO || rb == COLLIE_EPROTO);
    /* both comms fail: one with EPROTO, the other learns it */
    int st = COLLIE_OK;
    for (int i = 0; i < 200; i++) {
        int s0, s1;
        collie_comm_error(w.c[0], &s0, NULL);
        collie_comm_error(w.c[1], &s1, NULL);
        if (s0 != COLLIE_OK && s1 != COLLIE_OK) {
            st = s0;
            break;
        }
        usleep(10000);
    }
    assert_int_not_equal(st, COLLIE_OK);
    const char *files[] = {dump_comm(w.c[0], "m0.json"), dump_comm(w.c[1], "m1.json"), NULL};
    result *r = trace(files);
    print_lines(r->out);
    assert_out(r, r->status == 0);
    assert_out(r,
               strstr(r->out, "mismatch at seq 1: rank 0 posted allreduce seq 1 (8 x int32 sum), "
                              "rank 1 posted allreduce seq 1 (16 x int32 sum)"));
    assert_out(r,
               strstr(r->out, "failed COLLIE_EPROTO") || strstr(r->out, "failed COLLIE_EABORTED"));
    collie_work_release(wa);
    collie_work_release(wb);
    world_destroy(&w);
}

/* Failure as data in the dump and in collie-trace: rank 1 never posts, rank
 * 0's allreduce runs into its deadline and the desync report names rank 1:
 * the failed entry and the comm's header carry kind and set. */
static void test_real_dumps_show_the_fault(void **state) {
    (void)state;
    world w;
    world_create(&w, 2, "faultdump", NULL);
    world_link(&w);
    int32_t a[4] = {0};
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.timeout_ms = 300;
    collie_work *wa;
    assert_int_equal(collie_allreduce(w.c[0], a, a, 4, COLLIE_INT32, COLLIE_SUM, &o, &wa),
                     COLLIE_OK);
    assert_int_equal(collie_work_wait(wa, 10000), COLLIE_ETIMEDOUT);
    collie_fault f = COLLIE_FAULT_INIT;
    assert_int_equal(collie_work_fault(wa, &f), COLLIE_OK);
    assert_int_equal(f.kind, COLLIE_FAULT_DEADLINE);
    assert_int_equal(f.nranks, 1);
    assert_int_equal(f.ranks[0], 1);
    collie_work_release(wa);
    const char *files[] = {dump_comm(w.c[0], "f0.json"), NULL};
    FILE *in = fopen(files[0], "r");
    char json[65536];
    size_t n = fread(json, 1, sizeof json - 1, in);
    fclose(in);
    json[n] = '\0';
    if (!strstr(json, "\"fault\":\"deadline\",\"fault_ranks\":[1],\"fault_nranks\":1}"))
        fail_msg("no entry fault in: %s", json);
    if (!strstr(json, "\"fault\":\"deadline\",\"fault_origin\":0,\"fault_ranks\":[1]"))
        fail_msg("no comm fault in: %s", json);
    result *r = trace(files);
    print_lines(r->out);
    assert_out(r, r->status == 0);
    assert_out(r, strstr(r->out, "deadline of 300 ms passed"));
    assert_out(r, strstr(r->out, " [deadline: ranks 1]\n"));
    world_destroy(&w);
}

/* ---- hand-written dumps --------------------------------------------------------- */

#define HDR(comm, gen, rank, size, posted, cap)                                                    \
    "{\"comm\":\"" comm "\",\"generation\":" #gen ",\"rank\":" #rank ",\"size\":" #size            \
    ",\"status\":\"COLLIE_OK\",\"last_posted\":" #posted ",\"error\":\"\",\"capacity\":" #cap      \
    ",\"entries\":[\n"
#define ENTRY(seq, op, count, state, status, err)                                                  \
    "{\"seq\":" #seq ",\"op\":\"" op "\",\"dtype\":\"fp32\",\"redop\":\"sum\",\"count\":" #count   \
    ",\"peer\":0,\"cuda\":false,\"state\":\"" state "\",\"status\":\"" status                      \
    "\",\"post_us\":1,\"start_us\":2,\"end_us\":3,\"error\":\"" err "\"}"

/* The ring kept only seq 100..102 of rank 0; rank 1's recorder is off;
 * send/recv have their own sequence space; an error with escapes. */
static void test_corners(void **state) {
    (void)state;
    const char *r0 =
        write_file("c0.json", HDR("w", 3, 0, 2, 102, 3)
                                  ENTRY(100, "allreduce", 4, "done", "COLLIE_OK", "") ",\n" ENTRY(
                                      101, "send", 4, "running", "COLLIE_INPROGRESS",
                                      "") ",\n" ENTRY(102, "allreduce", 4, "failed", "COLLIE_EPEER",
                                                      "rank 1 said \\\"bye\\\"\\u0021") "\n]}\n");
    const char *r1 = write_file("c1.json", HDR("w", 3, 1, 2, 102, 0) "]}\n");
    const char *files[] = {r0, r1, NULL};
    result *r = trace(files);
    print_lines(r->out);
    assert_out(r, r->status == 0);
    assert_out(r, strstr(r->out, "rank 0: posted 102, completed 100"));
    assert_out(r, strstr(r->out, "failed COLLIE_EPEER: rank 1 said \"bye\"!"));
    assert_out(r, strstr(r->out, "send/recv not finished: 1"));
    assert_out(r, strstr(r->out, "flight recorder off"));
    assert_out(r, strstr(r->out, "first collective not completed by every rank: seq 101"));

    /* two incarnations of a comm, and another comm: reported apart */
    const char *g0 = write_file("g0.json", HDR("w", 0, 0, 1, 1, 8) ENTRY(1, "barrier", 0, "done",
                                                                         "COLLIE_OK", "") "\n]}\n");
    const char *g1 = write_file("g1.json", HDR("w", 1, 0, 1, 0, 8) "]}\n");
    const char *o = write_file("o.json", HDR("other", 0, 0, 1, 0, 8) "]}\n");
    const char *three[] = {g1, o, g0, NULL};
    r = trace(three);
    assert_out(r, r->status == 0);
    assert_out(r, strstr(r->out, "comm 'other' generation 0"));
    assert_out(r, strstr(r->out, "comm 'w' generation 0"));
    assert_out(r, strstr(r->out, "comm 'w' generation 1"));
    assert_out(r, strstr(r->out, "every rank with a dump completed every collective it posted"));
}

/* Malformed input: rejected with the file, the line and why; exit 2. */
static void test_malformed_input(void **state) {
    (void)state;
    static const struct {
        const char *name, *text, *why;
    } cases[] = {
        {"empty.json", "", "empty file"},
        {"text.json", "hello\n", ":1:5: not a valid JSON dump"},
        {"trunc.json", HDR("w", 0, 0, 2, 1, 8) ENTRY(1, "allreduce", 4, "done", "COLLIE_OK", ""),
         "truncated"},
        {"noseq.json", HDR("w", 0, 0, 2, 1, 8) "{\"op\":\"allreduce\",\"state\":\"done\"}\n]}\n",
         "entries[0]: an entry needs seq, op and state"},
        {"type.json",
         HDR("w", 0, 0, 2, 1, 8) "{\"seq\":\"one\",\"op\":\"x\",\"state\":\"done\"}\n]}\n",
         "entries[0]: \"seq\" must be an integer"},
        {"escape.json",
         HDR("w", 0, 0, 2, 1, 8) "{\"seq\":1,\"op\":\"a\\q\",\"state\":\"done\"}\n]}\n",
         "not a valid JSON dump: invalid escape"},
        {"state.json", HDR("w", 0, 0, 2, 1, 8) "{\"seq\":1,\"op\":\"a\",\"state\":\"lost\"}\n]}\n",
         "entries[0]: unknown state \"lost\""},
        {"after.json", HDR("w", 0, 0, 2, 0, 8) "]}\n{}\n",
         ":3:1: not a valid JSON dump: end of file expected"},
        {"hdr.json", "{\"comm\":\"w\",\"rank\":0,\"entries\":[\n]}\n", "header: the header lacks"},
        {"rank.json", HDR("w", 0, 5, 2, 0, 8) "]}\n", "header: rank is not below size"},
        {"frac.json", HDR("w", 0, 0, 2, 1, 8) "{\"seq\":1.5,\"op\":\"a\",\"state\":\"done\"}\n]}\n",
         "entries[0]: \"seq\" must be an integer, not a fraction"},
        {"two.json", HDR("w", 0, 0, 2, 1, 8) "{\"seq\":1,\"op\":\"a\",\"state\":\"done\"} {}\n]}\n",
         ":2:35: not a valid JSON dump: ']' expected"},
        {"unterminated.json", HDR("w", 0, 0, 2, 1, 8) "{\"seq\":1,\"op\":\"a\n]}\n",
         "not a valid JSON dump"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *f = write_file(cases[i].name, cases[i].text);
        const char *files[] = {f, NULL};
        result *r = trace(files);
        assert_out(r, r->status == 2);
        assert_out(r, strstr(r->err, cases[i].name) && strstr(r->err, cases[i].why));
        assert_out(r, r->out[0] == '\0');
    }
    /* inconsistent sets of dumps */
    const char *a = write_file("a.json", HDR("w", 0, 0, 2, 0, 8) "]}\n");
    const char *b = write_file("b.json", HDR("w", 0, 0, 2, 0, 8) "]}\n");
    const char *c = write_file("c.json", HDR("w", 0, 1, 3, 0, 8) "]}\n");
    const char *dup[] = {a, b, NULL};
    result *r = trace(dup);
    assert_out(r, r->status == 2 && strstr(r->err, "are both rank 0"));
    const char *sizes[] = {a, c, NULL};
    r = trace(sizes);
    assert_out(r, r->status == 2 && strstr(r->err, "has size"));
    const char *missing[] = {"/nonexistent/dump.json", NULL};
    r = trace(missing);
    assert_out(r, r->status == 2 && strstr(r->err, "/nonexistent/dump.json: cannot open"));
    const char *none[] = {NULL};
    r = trace(none);
    assert_out(r, r->status == 2 && strstr(r->err, "usage: collie-trace"));
    const char *help[] = {"--help", NULL};
    r = trace(help);
    assert_out(r, r->status == 0 && strstr(r->out, "usage: collie-trace"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_real_dumps_show_the_straggler, setup, teardown),
        cmocka_unit_test_setup_teardown(test_real_dumps_show_a_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_real_dumps_show_the_fault, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corners, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_input, setup, teardown),
    };
    return cltest_main(tests, NULL, NULL);
}
