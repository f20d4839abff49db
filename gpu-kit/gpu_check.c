/*
 * gpu_check.c — collie-gpucheck, the checks of the GPU verification kit
 * (make gpu-kit; run through the kit's run.sh, which finds the host's NCCL).
 *
 * Design notes
 *  - One program, statically linked with libcollie, libevent and libcrypto,
 *    so that it runs on a CUDA host that has none of them. The CUDA runtime
 *    and NCCL are opened at run time (dlopen, kit_cuda.c), as the NCCL
 *    plugin does, so the same binary runs on a GPU, on a host without one
 *    (every GPU check says SKIP and why) and against the CPU test double
 *    (make test's self-test).
 *  - Each check prints one line `PASS|FAIL|SKIP <name>: <detail>` with its
 *    figures; the report folder gets report.txt (the same lines, plus the
 *    environment) and report.json (the same, as data) (kit_report.c).
 *  - Checks that need the device to stop a stream on demand use a gate: a
 *    host-mapped flag the stream waits on (cuStreamWaitValue32, from the
 *    driver, libcuda.so.1), opened by the host (kit_world.c). Without the
 *    driver API (the double has none) those checks SKIP.
 *  - Every wait is bounded; a gate left shut is always opened before the
 *    check returns.
 *  - This file runs the checks in order (gpu_check.h lists the parts); the
 *    exit status is 1 when one FAILed, 2 for a usage error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu_check.h"

char kit_bin[1024]; /* the folder of this program (collie-run, collie-bench) */

static const char *const kit_multi_checks[] = {"multi_gpu_collectives", "multi_gpu_rank_killed",
                                               "multi_gpu_split"};

static void kit_usage(void) {
    fprintf(stderr, "usage: collie-gpucheck --report DIR [--quick]\n"
                    "  (run it through the kit's run.sh, which finds the host's NCCL)\n");
}

/* The command line: 0 to go on, or 2 after the usage. */
static int kit_parse_args(int argc, char **argv, const char **dir, bool *quick) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--report") && i + 1 < argc)
            *dir = argv[++i];
        else if (!strcmp(argv[i], "--quick"))
            *quick = true;
        else {
            kit_usage();
            return 2;
        }
    }
    if (!*dir) {
        kit_usage();
        return 2;
    }
    return 0;
}

/* This program's folder into kit_bin: the multi-GPU checks run the kit's
 * collie-run and collie-bench from there. */
static void kit_find_bin(void) {
    ssize_t nl = readlink("/proc/self/exe", kit_bin, sizeof kit_bin - 1);
    if (nl > 0) {
        kit_bin[nl] = '\0';
        char *slash = strrchr(kit_bin, '/');
        if (slash) *slash = '\0';
    }
}

/* Open CUDA and NCCL and report the environment (PASS with the versions,
 * or SKIP); why stays "" when the GPU checks can run. Returns the number of
 * devices. */
static int kit_environment(char *why, size_t len) {
    kit_cuda_open(why, len);
    int ndev = 0;
    int e = why[0] ? -1 : kit_cu.GetDeviceCount(&ndev);
    if (!why[0] && e) snprintf(why, len, "cudaGetDeviceCount: %s", kit_cuerr(e));
    if (!why[0] && ndev < 1) snprintf(why, len, "no CUDA device");
    if (why[0]) {
        kit_result("SKIP", "environment", "", "%s", why);
        return ndev;
    }
    int drv_v = 0, rt_v = 0, nv = 0;
    if (kit_cu.DriverGetVersion) kit_cu.DriverGetVersion(&drv_v);
    if (kit_cu.RuntimeGetVersion) kit_cu.RuntimeGetVersion(&rt_v);
    kit_nccl.GetVersion(&nv);
    char name[256] = "?";
    if (kit_cu.GetDeviceProperties) {
        char *prop = calloc(1, 1 << 16); /* cudaDeviceProp starts with char name[256] */
        if (prop && kit_cu.GetDeviceProperties(prop, 0) == 0)
            snprintf(name, sizeof name, "%s", prop);
        free(prop);
    }
    for (char *p = name; *p; p++)
        if (*p == ' ') *p = '_';
    char env[1024];
    snprintf(env, sizeof env,
             "devices=%d gpu0=%s driver=%d runtime=%d nccl=%d nccl_lib=%s double=%s", ndev, name,
             drv_v, rt_v, nv, kit_nccl.path, kit_cu.double_ ? "yes" : "no");
    kit_result("PASS", "environment", env, "CUDA and NCCL found");
    return ndev;
}

/* Every GPU check SKIPs, saying why. */
static void kit_skip_all(const char *why) {
    static const char *const gpu_checks[] = {
        "collectives_1gpu",       "cpu_and_cuda_interleaved", "stream_order",
        "wait_after_gpu_done",    "wait_stream_nonblocking",  "completion_latency",
        "post_overhead",          "allreduce_time_vs_raw",    "hang_deadline_abort",
        "destroy_blocked_cycles", "graph_capture_refused",    "multi_gpu_collectives",
        "multi_gpu_rank_killed",  "multi_gpu_split"};
    for (size_t i = 0; i < sizeof gpu_checks / sizeof gpu_checks[0]; i++)
        kit_result("SKIP", gpu_checks[i], "", "%s", why);
}

/* The checks, in order, on device 0 (and the others for the multi-GPU ones). */
static void kit_run_checks(int ndev, bool quick) {
    kit_cu.SetDevice(0);
    kit_check_collectives();
    kit_check_mixed();
    kit_check_stream_order();
    kit_check_wait_semantics();
    kit_check_completion_latency(quick ? 50 : 1000);
    kit_check_overhead(quick ? (1u << 20) : (256u << 20), quick ? 20 : 200);
    kit_check_hang();
    kit_check_destroy_cycles(quick ? 5 : 50);
    kit_check_graph_capture();
    if (ndev < 2) {
        for (size_t i = 0; i < 3; i++)
            kit_result("SKIP", kit_multi_checks[i], "",
                       "needs 2 or more GPUs (NCCL refuses two ranks on one GPU); this host "
                       "has %d",
                       ndev);
        return;
    }
    kit_check_multi_collectives(ndev < 4 ? ndev : 4);
    kit_check_multi_killed(ndev < 3 ? ndev : 3);
    kit_check_multi_split();
}

int main(int argc, char **argv) {
    const char *dir = NULL;
    bool quick = false;
    int rc = kit_parse_args(argc, argv, &dir, &quick);
    if (rc == 0) rc = kit_report_open(dir);
    if (rc != 0) return rc;
    kit_find_bin();
    char bound[16];
    snprintf(bound, sizeof bound, "%d", ABORT_BOUND_MS);
    setenv("COLLIE_NCCL_ABORT_TIMEOUT_MS", bound, 0); /* before collie reads its settings */
    char why[512];
    int ndev = kit_environment(why, sizeof why);
    if (why[0])
        kit_skip_all(why);
    else
        kit_run_checks(ndev, quick);
    return kit_report_close() ? 1 : 0;
}
