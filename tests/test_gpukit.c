/*
 * test_gpukit.c — the GPU verification kit (make gpu-kit) run as it would
 * be on a GPU host: its run.sh against collie's CPU double of CUDA, NCCL
 * and the one driver call it makes (every check runs: the figures are not
 * GPU figures, the logic of each check is exercised), and against the real
 * CUDA runtime on this GPU-less machine (every check SKIPs, saying why). Both write
 * report.txt and report.json. The kit is built by the normal build only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "runner.h"
#include "spawn.h"

#define KIT_TIMEOUT_MS 120000

/* The kit's run.sh, relative to the build dir (as spawn_start takes it). */
static const char *kit_run(void) {
    const char *p = spawn_build_path("gpu-kit/run.sh");
    if (access(p, X_OK) != 0)
        skip_because("%s is missing (the kit is built by the normal build when CUDA and NCCL "
                     "are present)",
                     p);
    return "gpu-kit/run.sh";
}

/* Read a whole small file into a static buffer. */
static const char *slurp(const char *dir, const char *name) {
    static char buf[1 << 16];
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("%s was not written", path);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* The line of check `name` in the output, or fail. */
static void kit_expect(spawn_proc *s, const char *status, const char *name, const char *needle) {
    char want[128];
    snprintf(want, sizeof want, "%s %s: ", status, name);
    const char *l = strstr(s->text[0], want);
    assert_spawn(s, l != NULL);
    const char *end = strchr(l, '\n');
    if (needle) {
        const char *hit = strstr(l, needle);
        assert_spawn(s, hit && (!end || hit < end));
    }
}

static void test_kit_on_the_double(void **state) {
    (void)state;
    const char *run = kit_run();
    char dir[128];
    test_tmpdir_make(dir, sizeof dir, "cltest-gpukit");
    char nccl[600];
    snprintf(nccl, sizeof nccl, "CLKIT_NCCL_DIR=%s", spawn_build_path("tests/cuda_double"));
    const char *const env[] = {nccl, NULL};
    const char *const args[] = {dir, "--quick", NULL};
    spawn_proc *s = spawn_start(run, args, env, KIT_TIMEOUT_MS);
    spawn_finish(s);
    assert_spawn(s, s->status == 0);
    kit_expect(s, "PASS", "environment", "double=yes");
    kit_expect(s, "PASS", "collectives_1gpu", "cases=121");
    kit_expect(s, "PASS", "cpu_and_cuda_interleaved", NULL);
    kit_expect(s, "PASS", "completion_latency", "median_us=");
    kit_expect(s, "PASS", "post_overhead", "collie_k16_us=");
    kit_expect(s, "PASS", "allreduce_time_vs_raw", "262144B:");
    kit_expect(s, "PASS", "graph_capture_refused", NULL);
    /* the double has 4 devices: the multi-GPU section runs too */
    kit_expect(s, "PASS", "multi_gpu_collectives", "ranks=4");
    kit_expect(s, "PASS", "multi_gpu_rank_killed", "failed naming it");
    kit_expect(s, "PASS", "multi_gpu_split", NULL);
    /* the gate (the double's cuStreamWaitValue32) holds the stream */
    kit_expect(s, "PASS", "stream_order", NULL);
    kit_expect(s, "PASS", "wait_after_gpu_done", "waited_ms=");
    kit_expect(s, "PASS", "wait_stream_nonblocking", "call_us=");
    kit_expect(s, "PASS", "hang_deadline_abort", "comm faulted (COLLIE_ETIMEDOUT)");
    kit_expect(s, "PASS", "destroy_blocked_cycles", "cycles=5");
    assert_spawn(s, strstr(s->text[0], "15 passed, 0 failed, 0 skipped") != NULL);
    const char *json = slurp(dir, "report.json");
    if (!strstr(json, "\"check\": \"collectives_1gpu\", \"status\": \"PASS\"") ||
        !strstr(json, "\"passed\": 15, \"failed\": 0, \"skipped\": 0"))
        fail_msg("report.json: %s", json);
    const char *txt = slurp(dir, "report.txt");
    if (!strstr(txt, "PASS graph_capture_refused")) fail_msg("report.txt: %s", txt);
    if (!strstr(slurp(dir, "host.txt"), "nccl_dir: ")) fail_msg("host.txt lacks nccl_dir");
    spawn_free(s);
    test_tmpdir_remove(dir);
}

/* No GPU here: with the real CUDA runtime every check SKIPs, saying why,
 * and the run still succeeds and writes its report. */
static void test_kit_without_a_gpu(void **state) {
    (void)state;
    const char *run = kit_run();
    char dir[128];
    test_tmpdir_make(dir, sizeof dir, "cltest-gpukit");
    const char *const env[] = {"LD_LIBRARY_PATH", NULL}; /* nothing of the double */
    const char *const args[] = {dir, "--quick", NULL};
    spawn_proc *s = spawn_start(run, args, env, KIT_TIMEOUT_MS);
    spawn_finish(s);
    if (strstr(s->text[0], "PASS environment"))
        skip_because("this machine has a usable GPU: the GPU-less case cannot be shown here");
    assert_spawn(s, s->status == 0);
    kit_expect(s, "SKIP", "environment", NULL);
    kit_expect(s, "SKIP", "collectives_1gpu", NULL);
    kit_expect(s, "SKIP", "multi_gpu_split", NULL);
    assert_spawn(s, strstr(s->text[0], "0 passed, 0 failed, 15 skipped") != NULL);
    const char *json = slurp(dir, "report.json");
    if (!strstr(json, "\"passed\": 0, \"failed\": 0, \"skipped\": 15"))
        fail_msg("report.json: %s", json);
    spawn_free(s);
    test_tmpdir_remove(dir);
}

/* run.sh without a report folder is a usage error. */
static void test_kit_usage(void **state) {
    (void)state;
    const char *run = kit_run();
    const char *const args[] = {NULL};
    spawn_proc *s = spawn_start(run, args, NULL, KIT_TIMEOUT_MS);
    spawn_finish(s);
    assert_spawn(s, s->status == 2);
    assert_spawn(s, strstr(s->text[1], "usage:") != NULL);
    spawn_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_kit_on_the_double, spawn_teardown),
        cmocka_unit_test_teardown(test_kit_without_a_gpu, spawn_teardown),
        cmocka_unit_test_teardown(test_kit_usage, spawn_teardown),
    };
    return cltest_main(tests, NULL, NULL);
}
