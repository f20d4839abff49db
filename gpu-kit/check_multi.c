/*
 * check_multi.c — checks that need two GPUs or more: every collective with
 * ranks as processes (collie-run and collie-bench --check from the kit's
 * bin/), a rank SIGKILLed mid-run, and collie_comm_split (ncclCommSplit).
 *
 * Design notes
 *  - The commands run through `timeout`, so a hung job is bounded; their
 *    output is read back for the verdict.
 *  - The split check runs two ranks as threads of this process, one GPU
 *    each, and leaves device 0 current.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "gpu_check.h"

/* Run a shell command with a bound; its output into out. Returns the exit
 * status (124: past the bound). */
static int multi_run_cmd(const char *cmd, int bound_s, char *out, size_t len) {
    char full[4200];
    snprintf(full, sizeof full, "timeout -k 5 %d %s 2>&1", bound_s, cmd);
    FILE *p = popen(full, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, len - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Ranks as processes (collie-run), one GPU each: every collective, results
 * checked by collie-bench --check. */
void kit_check_multi_collectives(int n) {
    char cmd[4096], *out = malloc(1 << 20);
    snprintf(cmd, sizeof cmd,
             "%s/collie-run -n %d --timeout 300 -- %s/collie-bench --backend nccl --check "
             "--sizes 4,4096,1M --iters 3 --warmup 1",
             kit_bin, n, kit_bin);
    int rc = multi_run_cmd(cmd, 360, out, 1 << 20);
    char fig[64];
    snprintf(fig, sizeof fig, "ranks=%d", n);
    if (rc == 0 && strstr(out, "allreduce") && strstr(out, "alltoall"))
        kit_result("PASS", "multi_gpu_collectives", fig,
                   "collie-run -n %d collie-bench --backend nccl --check: every collective correct",
                   n);
    else
        kit_result("FAIL", "multi_gpu_collectives", fig, "exit %d: %.600s", rc, out);
    free(out);
}

/* A rank SIGKILLed mid-run: the survivors fail, naming it, well before
 * their ops' deadline, and the launcher exits. */
void kit_check_multi_killed(int n) {
    char cmd[4096], *out = malloc(1 << 20);
    int victim = n - 1;
    /* the victim's shell kills itself 3 s in: exec keeps its pid */
    snprintf(cmd, sizeof cmd,
             "%s/collie-run -n %d --keep-going --timeout 120 -- /bin/sh -c '"
             "if [ \"$COLLIE_RANK\" = %d ]; then (sleep 3; kill -9 $$) & fi; "
             "exec %s/collie-bench --backend nccl --op allreduce --sizes 4M --iters 100000 "
             "--warmup 1 --timeout-ms 30000'",
             kit_bin, n, victim, kit_bin);
    int64_t t0 = kit_now_ns();
    int rc = multi_run_cmd(cmd, 150, out, 1 << 20);
    int64_t took_s = (kit_now_ns() - t0) / 1000000000LL;
    char dead[64], killed[96], fig[96];
    snprintf(dead, sizeof dead, "rank %d", victim);
    snprintf(killed, sizeof killed, "rank %d killed by signal SIGKILL", victim);
    snprintf(fig, sizeof fig, "ranks=%d seconds=%" PRId64, n, took_s);
    int named = 0;
    for (int r = 0; r < n; r++) {
        if (r == victim) continue;
        char prefix[32];
        snprintf(prefix, sizeof prefix, "[%d] ", r);
        for (const char *l = out; (l = strstr(l, prefix)); l++) {
            const char *end = strchr(l, '\n');
            const char *hit = strstr(l, dead);
            if (hit && (!end || hit < end)) {
                named++;
                break;
            }
        }
    }
    if (rc == 124 || !strstr(out, killed))
        kit_result("FAIL", "multi_gpu_rank_killed", fig,
                   "the run did not end as expected (exit %d): %.600s", rc, out);
    else if (named == 0 || took_s > 25)
        kit_result("FAIL", "multi_gpu_rank_killed", fig,
                   "no survivor named %s before the ops' 30 s deadline: %.600s", dead, out);
    else
        kit_result("PASS", "multi_gpu_rank_killed", fig,
                   "rank %d SIGKILLed mid-allreduce: %d survivor(s) failed naming it", victim,
                   named);
    free(out);
}

/* ncclCommSplit: two ranks in this process (one GPU and one thread each)
 * split their comm; the child runs an allreduce, checked. */
typedef struct split_rank {
    collie_comm *c, *child;
    int rank, rc;
    char why[256];
} split_rank;

static void *multi_split_main(void *arg) {
    split_rank *sr = arg;
    kit_cu.SetDevice(sr->rank);
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = "kit-split-child";
    sr->rc = collie_comm_split(sr->c, 0, sr->rank, &o, &sr->child);
    if (sr->rc != COLLIE_OK) {
        snprintf(sr->why, sizeof sr->why, "split: %s", collie_last_error());
        return NULL;
    }
    stream_t s = NULL;
    kit_cu.StreamCreate(&s);
    enum { N = 4096 };
    static float h[2][N], back[2][N];
    float *hin = h[sr->rank], *hout = back[sr->rank];
    for (int i = 0; i < N; i++)
        hin[i] = (float)(i % 5 + sr->rank);
    void *d = NULL;
    kit_cu.Malloc(&d, N * sizeof(float));
    kit_cu.Memcpy(d, hin, N * sizeof(float), MEMCPY_DEFAULT);
    collie_work *wk = NULL;
    sr->rc = collie_cuda_allreduce(sr->child, d, d, N, COLLIE_FP32, COLLIE_SUM, s, NULL, &wk);
    if (sr->rc == COLLIE_OK) sr->rc = collie_work_wait(wk, WAIT_MS);
    if (sr->rc != COLLIE_OK)
        snprintf(sr->why, sizeof sr->why, "allreduce on the child: %s",
                 wk ? collie_work_error_message(wk) : collie_last_error());
    kit_cu.Memcpy(hout, d, N * sizeof(float), MEMCPY_DEFAULT);
    for (int i = 0; sr->rc == COLLIE_OK && i < N; i++)
        if (hout[i] != (float)(2 * (i % 5) + 1)) {
            snprintf(sr->why, sizeof sr->why, "element %d is %g, not %d", i, (double)hout[i],
                     2 * (i % 5) + 1);
            sr->rc = COLLIE_EPROTO;
        }
    if (wk) collie_work_release(wk);
    kit_cu.Free(d);
    kit_cu.StreamDestroy(s);
    return NULL;
}

void kit_check_multi_split(void) {
    collie_engine *e = NULL;
    collie_store_server *srv = NULL;
    collie_store *st[2] = {0};
    collie_work *cw[2] = {0};
    split_rank sr[2];
    memset(sr, 0, sizeof sr);
    char why[300] = "";
    if (collie_engine_create(NULL, &e) != COLLIE_OK ||
        collie_store_server_create(e, "127.0.0.1", 0, NULL, &srv) != COLLIE_OK) {
        snprintf(why, sizeof why, "engine/store: %s", collie_last_error());
    } else {
        char addr[64];
        snprintf(addr, sizeof addr, "127.0.0.1:%u", collie_store_server_port(srv));
        for (int r = 0; r < 2 && !why[0]; r++) {
            collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
            o.name = "kit-split";
            o.backend = "cuda:nccl";
            o.device = r;
            o.timeout_ms = WAIT_MS;
            sr[r].rank = r;
            if (collie_store_connect(e, addr, NULL, &st[r]) != COLLIE_OK ||
                collie_comm_create_post(e, st[r], r, 2, &o, &sr[r].c, &cw[r]) != COLLIE_OK)
                snprintf(why, sizeof why, "create rank %d: %s", r, collie_last_error());
        }
        for (int r = 0; r < 2 && !why[0]; r++)
            if (collie_work_wait(cw[r], WAIT_MS) != COLLIE_OK)
                snprintf(why, sizeof why, "create rank %d: %s", r,
                         collie_work_error_message(cw[r]));
    }
    for (int r = 0; r < 2; r++)
        if (cw[r]) collie_work_release(cw[r]);
    if (!why[0]) {
        pthread_t th[2];
        for (int r = 0; r < 2; r++)
            pthread_create(&th[r], NULL, multi_split_main, &sr[r]);
        for (int r = 0; r < 2; r++)
            pthread_join(th[r], NULL);
        for (int r = 0; r < 2 && !why[0]; r++)
            if (sr[r].rc != COLLIE_OK) snprintf(why, sizeof why, "rank %d: %s", r, sr[r].why);
    }
    if (why[0])
        kit_result("FAIL", "multi_gpu_split", "", "%s", why);
    else
        kit_result("PASS", "multi_gpu_split", "ranks=2",
                   "collie_comm_split of a 2-GPU comm (ncclCommSplit): the child's allreduce is "
                   "correct");
    for (int r = 0; r < 2; r++) {
        if (sr[r].child) collie_comm_destroy(sr[r].child);
        if (sr[r].c) collie_comm_destroy(sr[r].c);
        if (st[r]) collie_store_destroy(st[r]);
    }
    if (srv) collie_store_server_destroy(srv);
    if (e) collie_engine_destroy(e);
    kit_cu.SetDevice(0);
}
