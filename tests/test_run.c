/*
 * test_run.c — collie-run, the local launcher, run as a program: the rank
 * environment and the store it hosts, output prefixes, fail-fast with a
 * grace period, --keep-going, --restarts, --timeout, signal forwarding,
 * usage errors. Ranks are small /bin/sh scripts; every wait is bounded.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "runner.h"
#include "spawn.h"

#define LAUNCH_TIMEOUT_MS 8000 /* no test's launcher runs longer than this */

extern char **environ;

static char tmp_dir[64]; /* per run of this binary; marker files live here */

/* ---- running the launcher ------------------------------------------------ */

/* Start collie-run with args (NULL-terminated) and our environment minus
 * every COLLIE_* variable, plus env_extra (NULL-terminated, may be NULL). */
static spawn_proc *launch_start(const char *const *args, const char *const *env_extra) {
    return spawn_start("collie-run", args, env_extra, LAUNCH_TIMEOUT_MS);
}

/* Run collie-run to the end. */
static spawn_proc *launch_run(const char *const *args) {
    spawn_proc *l = launch_start(args, NULL);
    spawn_finish(l);
    return l;
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* A path in this run's temporary directory. */
static const char *tmp_path(const char *name) {
    static char path[4][256];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, sizeof path[0], "%s/%s", tmp_dir, name);
    return p;
}

/* A shell loop waiting (at most 5 s) for a marker file. */
static const char *wait_file_sh(const char *path) {
    static char sh[512];
    snprintf(sh, sizeof sh,
             "i=0; while [ ! -e %s ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done", path);
    return sh;
}

static void touch(const char *path) {
    int fd = open(path, O_WRONLY | O_CREAT, 0644);
    assert_true(fd >= 0);
    close(fd);
}

/* Connect to the store at addr (which l's ranks were given) and do a
 * set/get round trip; the set must return `want` (COLLIE_EAUTH when the
 * token is wrong). */
static void check_store(spawn_proc *l, const char *addr, const char *token, int want) {
    collie_engine *e;
    collie_store *s;
    assert_int_equal(collie_engine_create(NULL, &e), COLLIE_OK);
    collie_store_opts o = COLLIE_STORE_OPTS_INIT;
    o.token = token;
    o.timeout_ms = 3000;
    assert_int_equal(collie_store_connect(e, addr, &o, &s), COLLIE_OK);
    int set = collie_store_set(s, "test_run/key", "value", 5, 3000);
    void *val = NULL;
    size_t len = 0;
    int get = set == COLLIE_OK ? collie_store_get(s, "test_run/key", 3000, &val, &len) : set;
    bool same = get == COLLIE_OK && len == 5 && memcmp(val, "value", 5) == 0;
    free(val);
    collie_store_destroy(s);
    assert_int_equal(collie_engine_destroy(e), COLLIE_OK);
    if (set != want || (want == COLLIE_OK && !same)) {
        spawn_pump(l, 100);
        spawn_dump(l);
        fail_msg("store at %s: set %s, get %s", addr, collie_status_name(set),
                 collie_status_name(get));
    }
}

/* Alive: exists and is not a zombie (an orphan's zombie may linger if
 * nobody reaps it in this container). */
static bool process_alive(pid_t pid) {
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')'); /* "pid (comm) S ..." */
    return paren && paren[1] == ' ' && paren[2] != 'Z' && paren[2] != 'X';
}

/* ---- the rank environment and the store ---------------------------------- */

/* The job's secret as rank `rank` saw it ("[r] secret <token>"), checked:
 * 64 hex digits (collie-run made it), never in the launcher's own output. */
static void job_secret(spawn_proc *l, int rank, char *out, size_t len) {
    char needle[32];
    snprintf(needle, sizeof needle, "[%d] secret ", rank);
    const char *p = strstr(l->text[0], needle);
    assert_spawn(l, p);
    p += strlen(needle);
    size_t n = strcspn(p, "\n");
    assert_spawn(l, n == 64 && strspn(p, "0123456789abcdef") == 64 && n < len);
    snprintf(out, len, "%.*s", (int)n, p);
    assert_spawn(l, !strstr(l->text[1], out));
}

static void test_env_per_rank_and_store(void **state) {
    (void)state;
    enum { N = 4 };
    char sh[1024];
    snprintf(sh, sizeof sh,
             "echo \"env $COLLIE_RANK $COLLIE_WORLD_SIZE $COLLIE_STORE_ADDR\"; "
             "echo \"secret $COLLIE_STORE_TOKEN\"; "
             "echo \"names $(env | grep '^COLLIE_' | cut -d= -f1 | sort | tr '\\n' ' ')\"; %s",
             wait_file_sh(tmp_path("env-done")));
    spawn_proc *l = launch_start(ARGS("-n", "4", "--", "/bin/sh", "-c", sh), NULL);
    assert_spawn(l, spawn_wait_for(l, 0, " env ", N, 5000));

    int seen[N] = {0};
    char addr[N][64];
    for (const char *p = l->text[0]; (p = strstr(p, " env ")); p++) {
        const char *line = p;
        while (line > l->text[0] && line[-1] != '\n')
            line--;
        int prefix, rank, size;
        char a[64];
        assert_spawn(l, sscanf(line, "[%d] env %d %d %63s", &prefix, &rank, &size, a) == 4);
        assert_spawn(l, prefix == rank && rank >= 0 && rank < N && size == N);
        seen[rank]++;
        strcpy(addr[rank], a);
    }
    for (int r = 0; r < N; r++) {
        assert_spawn(l, seen[r] == 1);
        assert_string_equal(addr[r], addr[0]);
    }
    assert_spawn(l, strncmp(addr[0], "127.0.0.1:", 10) == 0);
    /* exactly the names collie-run sets (our own COLLIE_* were not passed in) */
    assert_spawn(l, spawn_wait_for(l, 0,
                                   "names COLLIE_LOCAL_RANK COLLIE_LOCAL_WORLD_SIZE "
                                   "COLLIE_NODE_RANK COLLIE_RANK COLLIE_RESTART_COUNT "
                                   "COLLIE_STORE_ADDR COLLIE_STORE_TOKEN COLLIE_WORLD_SIZE \n",
                                   N, 5000));
    /* one secret per job, made by the launcher, the same for every rank */
    char secret[N][80];
    for (int r = 0; r < N; r++) {
        job_secret(l, r, secret[r], sizeof secret[r]);
        assert_string_equal(secret[r], secret[0]);
    }
    check_store(l, addr[0], secret[0], COLLIE_OK); /* the launcher serves it while ranks run */
    check_store(l, addr[0], NULL, COLLIE_EAUTH);   /* to the job only */
    touch(tmp_path("env-done"));
    spawn_finish(l);
    assert_spawn(l, l->status == 0);
}

/* The store lives in the launcher: a dead rank does not take it down, and
 * --keep-going lets the others run on. */
static void test_store_outlives_a_rank(void **state) {
    (void)state;
    char sh[1024];
    snprintf(sh, sizeof sh,
             "if [ $COLLIE_RANK = 1 ]; then exit 1; fi; echo \"addr $COLLIE_STORE_ADDR\"; "
             "echo \"secret $COLLIE_STORE_TOKEN\"; %s; echo survived",
             wait_file_sh(tmp_path("outlive-done")));
    spawn_proc *l = launch_start(ARGS("-n", "2", "--keep-going", "--", "/bin/sh", "-c", sh), NULL);
    assert_spawn(l, spawn_wait_for(l, 1, "collie-run: rank 1 exited with status 1\n", 1, 5000));
    assert_spawn(l, spawn_wait_for(l, 0, "[0] addr ", 1, 5000));
    char addr[64];
    assert_spawn(l, sscanf(strstr(l->text[0], "[0] addr "), "[0] addr %63s", addr) == 1);
    char secret[80];
    assert_spawn(l, spawn_wait_for(l, 0, "[0] secret ", 1, 5000));
    job_secret(l, 0, secret, sizeof secret);
    check_store(l, addr, secret, COLLIE_OK);
    touch(tmp_path("outlive-done"));
    spawn_finish(l);
    assert_spawn(l, l->status == 1);
    assert_spawn(l, strstr(l->text[0], "[0] survived\n") != NULL);
}

/* A COLLIE_STORE_TOKEN is required by the store and handed to the ranks. */
static void test_token_is_passed_on(void **state) {
    (void)state;
    char sh[1024];
    snprintf(sh, sizeof sh, "echo \"addr $COLLIE_STORE_ADDR token $COLLIE_STORE_TOKEN\"; %s",
             wait_file_sh(tmp_path("token-done")));
    spawn_proc *l = launch_start(ARGS("-n", "1", "--", "/bin/sh", "-c", sh),
                                 ARGS("COLLIE_STORE_TOKEN=run-secret"));
    assert_spawn(l, spawn_wait_for(l, 0, " token run-secret\n", 1, 5000));
    char addr[64];
    assert_spawn(l, sscanf(strstr(l->text[0], "[0] addr "), "[0] addr %63s", addr) == 1);
    check_store(l, addr, "run-secret", COLLIE_OK);
    check_store(l, addr, "wrong-secret", COLLIE_EAUTH);
    check_store(l, addr, NULL, COLLIE_EAUTH);

    touch(tmp_path("token-done"));
    spawn_finish(l);
    assert_spawn(l, l->status == 0);
}

static void test_external_store_is_used(void **state) {
    (void)state;
    spawn_proc *l = launch_run(ARGS("-n", "2", "--store", "store.example:4711", "--", "/bin/sh",
                                    "-c", "echo \"addr $COLLIE_STORE_ADDR\""));
    assert_spawn(l, l->status == 0);
    assert_spawn(l, strstr(l->text[0], "[0] addr store.example:4711\n") != NULL);
    assert_spawn(l, strstr(l->text[0], "[1] addr store.example:4711\n") != NULL);
}

/* ---- output -------------------------------------------------------------- */

static void test_every_line_prefixed(void **state) {
    (void)state;
    enum { N = 3, LINES = 300 };
    const char *sh = "i=0; while [ $i -lt 300 ]; do "
                     "echo \"$COLLIE_RANK:$i:0123456789abcdefghijklmnopqrstuvwxyz\"; i=$((i+1)); "
                     "done; echo \"e$COLLIE_RANK\" >&2; printf 'tail%s' $COLLIE_RANK";
    spawn_proc *l = launch_run(ARGS("-n", "3", "--", "/bin/sh", "-c", sh));
    assert_spawn(l, l->status == 0);

    int per_rank[N] = {0}, tails[N] = {0};
    for (char *line = l->text[0]; *line;) {
        char *nl = strchr(line, '\n');
        assert_spawn(l, nl != NULL); /* every line ends, even the partial ones */
        *nl = '\0';
        int prefix, rank, i, used = 0;
        char rest[64];
        if (sscanf(line, "[%d] tail%d%n", &prefix, &rank, &used) == 2 && line[used] == '\0') {
            assert_spawn(l, prefix == rank && rank >= 0 && rank < N);
            tails[rank]++;
        } else {
            /* a whole line, from the rank its prefix names */
            assert_spawn(l, sscanf(line, "[%d] %d:%d:%63s", &prefix, &rank, &i, rest) == 4);
            assert_spawn(l, prefix == rank && rank >= 0 && rank < N);
            assert_string_equal(rest, "0123456789abcdefghijklmnopqrstuvwxyz");
            assert_spawn(l, i == per_rank[rank]); /* in order, none lost */
            per_rank[rank]++;
        }
        *nl = '\n';
        line = nl + 1;
    }
    for (int r = 0; r < N; r++) {
        assert_spawn(l, per_rank[r] == LINES && tails[r] == 1);
        char want[80];
        snprintf(want, sizeof want, "[%d] e%d\n", r, r);
        assert_spawn(l, strstr(l->text[1], want) != NULL);
    }
    assert_spawn(l, spawn_count(l->text[1], "\n") == N); /* stderr: only theirs */
}

/* ---- failures ------------------------------------------------------------ */

/* One rank fails: the others (and what they started) are stopped at once,
 * the failing rank's last words come before the verdict, the job exits
 * with the failing rank's code. */
static void test_failure_stops_the_others(void **state) {
    (void)state;
    const char *sh = "if [ $COLLIE_RANK = 1 ]; then sleep 0.3; echo 'last words' >&2; exit 3; fi; "
                     "sleep 30 & echo \"child $!\"; wait";
    spawn_proc *l = launch_run(ARGS("-n", "3", "--grace", "1", "--", "/bin/sh", "-c", sh));
    assert_spawn(l, l->status == 3);
    assert_spawn(l, l->elapsed_ms < 4000);
    const char *words = strstr(l->text[1], "[1] last words\n");
    const char *verdict = strstr(l->text[1], "collie-run: rank 1 exited with status 3\n");
    assert_spawn(l, words && verdict && words < verdict);
    assert_spawn(l, spawn_count(l->text[1], "exited with status") == 1); /* stopped ranks: quiet */

    /* the ranks' own children (`sleep 30`) went too: signals go to the group */
    for (const char *p = l->text[0]; (p = strstr(p, "child "));) {
        pid_t child = (pid_t)atoi(p + 6);
        p += 6;
        assert_true(child > 0);
        int64_t deadline = now_ms() + 3000;
        while (process_alive(child) && now_ms() < deadline)
            usleep(10000);
        assert_spawn(l, !process_alive(child));
    }
    assert_spawn(l, spawn_count(l->text[0], "child ") == 2);
}

/* A rank that ignores SIGTERM is killed once the grace period is over. */
static void test_sigkill_after_grace(void **state) {
    (void)state;
    char sh[1024];
    snprintf(sh, sizeof sh,
             "if [ $COLLIE_RANK = 0 ]; then trap '' TERM; touch %s; sleep 30; fi; %s; exit 2",
             tmp_path("grace-ready"), wait_file_sh(tmp_path("grace-ready")));
    spawn_proc *l = launch_run(ARGS("-n", "2", "--grace", "1", "--", "/bin/sh", "-c", sh));
    assert_spawn(l, l->status == 2);
    assert_spawn(l, l->elapsed_ms >= 900 && l->elapsed_ms < 5000);
    assert_spawn(l, strstr(l->text[1], "rank 0 still running after the grace period: SIGKILL"));
}

static void test_killed_by_signal(void **state) {
    (void)state;
    const char *sh = "if [ $COLLIE_RANK = 0 ]; then kill -KILL $$; fi; sleep 30";
    spawn_proc *l = launch_run(ARGS("-n", "2", "--", "/bin/sh", "-c", sh));
    assert_spawn(l, l->status == 128 + SIGKILL);
    assert_spawn(l, strstr(l->text[1], "collie-run: rank 0 killed by signal SIGKILL\n"));
    assert_spawn(l, l->elapsed_ms < 4000);
}

static void test_keep_going(void **state) {
    (void)state;
    const char *sh = "if [ $COLLIE_RANK = 1 ]; then exit 5; fi; sleep 0.5; echo done $COLLIE_RANK";
    spawn_proc *l = launch_run(ARGS("-n", "3", "--keep-going", "--", "/bin/sh", "-c", sh));
    assert_spawn(l, l->status == 5);
    assert_spawn(l, strstr(l->text[0], "[0] done 0\n") && strstr(l->text[0], "[2] done 2\n"));
    assert_spawn(l, strstr(l->text[1], "collie-run: rank 1 exited with status 5\n"));
    assert_spawn(l, !strstr(l->text[1], "stopping"));
}

/* The recovery demo: rank 1 fails once, is started again with the same
 * rank and store, and the job succeeds. */
static void test_restart_recovers(void **state) {
    (void)state;
    char sh[1024];
    snprintf(sh, sizeof sh,
             "if [ $COLLIE_RANK = 1 ] && [ ! -e %s ]; then touch %s; "
             "echo \"first $COLLIE_STORE_ADDR\"; exit 1; fi; "
             "echo \"ok $COLLIE_RANK $COLLIE_STORE_ADDR\"; "
             "echo \"count $COLLIE_RANK $COLLIE_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT\"",
             tmp_path("restart-marker"), tmp_path("restart-marker"));
    spawn_proc *l = launch_run(ARGS("-n", "2", "--restarts", "2", "--", "/bin/sh", "-c", sh));
    assert_spawn(l, l->status == 0);
    assert_spawn(l,
                 spawn_count(l->text[1], "collie-run: restarting rank 1 (restart 1 of 2)\n") == 1);
    assert_spawn(l, spawn_count(l->text[1], "restarting") == 1);
    char first[64], again[64];
    const char *p = strstr(l->text[0], "[1] first "), *q = strstr(l->text[0], "[1] ok 1 ");
    assert_spawn(l, p && q && p < q);
    assert_spawn(l, sscanf(p, "[1] first %63s", first) == 1);
    assert_spawn(l, sscanf(q, "[1] ok 1 %63s", again) == 1);
    assert_string_equal(first, again);
    assert_spawn(l, strstr(l->text[0], "[0] ok 0 "));
    /* the restart count, collie's and torchrun's name, per rank */
    assert_spawn(l, strstr(l->text[0], "[1] count 1 1 1\n"));
    assert_spawn(l, strstr(l->text[0], "[0] count 0 0 0\n"));
}

/* K restarts in all; the failure after that stops the job. */
static void test_restarts_run_out(void **state) {
    (void)state;
    const char *sh = "if [ $COLLIE_RANK = 1 ]; then exit 4; fi; sleep 30";
    spawn_proc *l = launch_run(ARGS("-n", "2", "--restarts", "2", "--", "/bin/sh", "-c", sh));
    assert_spawn(l, l->status == 4);
    assert_spawn(l, strstr(l->text[1], "restarting rank 1 (restart 1 of 2)\n"));
    assert_spawn(l, strstr(l->text[1], "restarting rank 1 (restart 2 of 2)\n"));
    assert_spawn(l, spawn_count(l->text[1], "restarting") == 2);
    assert_spawn(l, spawn_count(l->text[1], "rank 1 exited with status 4\n") == 3);
    assert_spawn(l, l->elapsed_ms < 4000);
}

static void test_timeout(void **state) {
    (void)state;
    spawn_proc *l = launch_run(ARGS("--timeout", "1", "-n", "2", "--", "sleep", "30"));
    assert_spawn(l, l->status == 124);
    assert_spawn(l, l->elapsed_ms >= 900 && l->elapsed_ms < 4000);
    assert_spawn(l, strstr(l->text[1], "collie-run: job timed out after 1 s"));
}

static void test_signal_is_forwarded(void **state) {
    (void)state;
    const char *sh = "trap 'echo got-term; exit 0' TERM; echo ready; "
                     "i=0; while [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done";
    spawn_proc *l = launch_start(ARGS("-n", "2", "--", "/bin/sh", "-c", sh), NULL);
    assert_spawn(l, spawn_wait_for(l, 0, "ready\n", 2, 5000));
    assert_int_equal(kill(l->pid, SIGTERM), 0);
    spawn_finish(l);
    assert_spawn(l, l->status == 128 + SIGTERM);
    assert_spawn(l, strstr(l->text[0], "[0] got-term\n") && strstr(l->text[0], "[1] got-term\n"));
    assert_spawn(l, strstr(l->text[1], "collie-run: got SIGTERM"));
    assert_spawn(l, l->elapsed_ms < 4000);
}

/* Asked twice, the launcher stops waiting for the grace period. */
static void test_second_signal_kills(void **state) {
    (void)state;
    const char *sh = "trap '' TERM; echo ready; sleep 30";
    spawn_proc *l = launch_start(ARGS("-n", "2", "--grace", "20", "--", "/bin/sh", "-c", sh), NULL);
    assert_spawn(l, spawn_wait_for(l, 0, "ready\n", 2, 5000));
    assert_int_equal(kill(l->pid, SIGTERM), 0);
    assert_spawn(l, spawn_wait_for(l, 1, "collie-run: stopping 2 rank(s)", 1, 5000));
    assert_int_equal(kill(l->pid, SIGTERM), 0);
    spawn_finish(l);
    assert_spawn(l, l->status == 128 + SIGTERM);
    assert_spawn(l, strstr(l->text[1], "rank 0 still running when SIGTERM came during the stop"));
    assert_spawn(l, l->elapsed_ms < 4000);
}

/* A line longer than the launcher's line buffer (64 KiB) is split into
 * prefixed pieces; nothing is lost. */
static void test_long_line_is_split(void **state) {
    (void)state;
    spawn_proc *l = launch_run(ARGS("-n", "1", "--", "/bin/sh", "-c",
                                    "head -c 100000 /dev/zero | tr '\\0' x; echo; echo after"));
    assert_spawn(l, l->status == 0);
    size_t xs = 0;
    int pieces = 0;
    for (char *line = l->text[0]; *line;) {
        char *nl = strchr(line, '\n');
        assert_spawn(l, nl && strncmp(line, "[0] ", 4) == 0);
        size_t n = (size_t)(nl - line) - 4;
        if (n > 0 && line[4] == 'x') {
            assert_spawn(l, strspn(line + 4, "x") == n);
            xs += n;
            pieces++;
        }
        line = nl + 1;
    }
    assert_spawn(l, xs == 100000 && pieces == 2);
    assert_spawn(l, strstr(l->text[0], "\n[0] after\n"));
}

/* ---- success and usage --------------------------------------------------- */

static void test_all_succeed(void **state) {
    (void)state;
    spawn_proc *l = launch_run(ARGS("-n", "3", "true"));
    assert_spawn(l, l->status == 0 && l->len[0] == 0 && l->len[1] == 0);
    spawn_free(l);
    l = launch_run(ARGS("-n", "1", "--timeout", "5", "--grace", "0.5", "--restarts", "0", "--",
                        "/bin/sh", "-c", "exit 0"));
    assert_spawn(l, l->status == 0 && l->len[1] == 0);
}

static void test_cannot_exec(void **state) {
    (void)state;
    spawn_proc *l = launch_run(ARGS("-n", "2", "--", "/nonexistent/collie-prog", "x"));
    assert_spawn(l, l->status == 127);
    assert_spawn(l, strstr(l->text[1], "collie-run: cannot run '/nonexistent/collie-prog': "
                                       "No such file or directory\n"));
}

static void test_usage_errors(void **state) {
    (void)state;
    static const char *const cases[][10] = {
        {NULL},                       /* nothing at all */
        {"--", "true", NULL},         /* no -n */
        {"-n", NULL},                 /* -n without a value */
        {"-n", "0", "true", NULL},    /* too few */
        {"-n", "1025", "true", NULL}, /* too many */
        {"-n", "two", "true", NULL},  /* not a number */
        {"-n", "2x", "true", NULL},   /* trailing junk */
        {"-n", "2", NULL},            /* no program */
        {"-n", "2", "--", NULL},      /* no program after -- */
        {"--bogus", "-n", "2", "true", NULL},
        {"-q", "-n", "2", "true", NULL},
        {"-n", "2", "--timeout", "x", "true", NULL},
        {"-n", "2", "--timeout", "0", "true", NULL},
        {"-n", "2", "--grace", "-1", "true", NULL},
        {"-n", "2", "--restarts", "-1", "true", NULL},
        {"-n", "2", "--store", "nocolon", "true", NULL},
        {"-n", "2", "--keep-going=1", "true", NULL},
        {"-np", NULL},                                      /* -np without a value */
        {"-np", "x", "true", NULL},                         /* not a number */
        {"--nproc-per-node", "0", "true", NULL},            /* too few */
        {"--nproc-per-node", "2", "-n", "3", "true", NULL}, /* 3 != 2 x 1 */
        {"-n", "3", "--nnodes", "2", "--node-rank", "0", "--store", "127.0.0.1:1", "true", NULL},
        {"-n", "4", "--nnodes", "2", "--store", "127.0.0.1:1", "true", NULL}, /* no node rank */
        {"-n", "4", "--nnodes", "2", "--node-rank", "2", "--store", "127.0.0.1:1", "true", NULL},
        {"-n", "4", "--nnodes", "2", "--node-rank", "1", "true", NULL}, /* no --store */
        {"-n", "4", "--nnodes", "2", "--node-rank", "1", "--store", "127.0.0.1:1", "true",
         NULL}, /* no secret (--token-file, COLLIE_STORE_TOKEN) for a store beyond this host */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        spawn_proc *l = launch_run(cases[i]);
        if (l->status != 2 || !strstr(l->text[1], "usage: collie-run") || l->elapsed_ms > 2000) {
            spawn_dump(l);
            fail_msg("usage case %zu", i);
        }
        assert_spawn(l, strncmp(l->text[1], "collie-run: ", 12) == 0); /* says what is wrong */
        spawn_free(l);
    }
    spawn_proc *l = launch_run(ARGS("--help"));
    assert_spawn(l, l->status == 0 && strstr(l->text[0], "usage: collie-run"));
}

/* ---- conventions of mpirun and torchrun ----------------------------------- */

/* -np N as mpirun; torchrun's variables beside collie's, consistent with
 * them; MASTER_ADDR:MASTER_PORT is torch's rendezvous on this host, not the
 * store (torch's env:// would listen there, or speak its protocol to it). */
static void test_torchrun_env(void **state) {
    (void)state;
    const char *sh = "echo \"t $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK "
                     "$MASTER_ADDR $MASTER_PORT $COLLIE_RANK $COLLIE_LOCAL_RANK "
                     "$COLLIE_NODE_RANK $COLLIE_STORE_ADDR\"";
    spawn_proc *l = launch_run(ARGS("-np", "3", "--", "/bin/sh", "-c", sh));
    assert_spawn(l, l->status == 0);
    char port0[16] = "";
    for (int r = 0; r < 3; r++) {
        char want[80], master[64], port[16], store[64];
        snprintf(want, sizeof want, "[%d] t %d 3 %d 3 0 ", r, r, r);
        const char *p = strstr(l->text[0], want);
        assert_spawn(l, p);
        int rank, local, node;
        assert_spawn(l, sscanf(p + strlen(want), "%63s %15s %d %d %d %63s", master, port, &rank,
                               &local, &node, store) == 6);
        assert_spawn(l, rank == r && local == r && node == 0);
        assert_string_equal(master, "127.0.0.1");
        assert_spawn(l, strncmp(store, "127.0.0.1:", 10) == 0 && atoi(port) > 0);
        assert_string_not_equal(port, strchr(store, ':') + 1);
        if (r == 0) snprintf(port0, sizeof port0, "%s", port);
        assert_string_equal(port, port0); /* one rendezvous for the job */
    }
}

/* Bind 0.0.0.0:port, with SO_REUSEADDR and listening (as torch's TCPStore)
 * or plainly; 0 or errno. */
static int bind_port(int port, bool reuse) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    int one = 1;
    if (reuse) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int rc = bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && (!reuse || listen(fd, 1) == 0);
    int err = rc ? 0 : errno;
    close(fd);
    return err;
}

/* -n 2: MASTER_PORT is held for the job (the race of a free port): a plain
 * bind there is refused while torch's way (SO_REUSEADDR, listen) works;
 * --master-addr/--master-port are passed on as given. */
static void test_torch_master_port_held(void **state) {
    (void)state;
    char sh[640];
    snprintf(sh, sizeof sh, "echo \"m $MASTER_ADDR $MASTER_PORT ${COLLIE_STORE_ADDR#*:}\"; %s",
             wait_file_sh(tmp_path("master-done")));
    spawn_proc *l = launch_start(ARGS("-n", "2", "--", "/bin/sh", "-c", sh), NULL);
    assert_spawn(l, spawn_wait_for(l, 0, " m 127.0.0.1 ", 2, 5000));
    const char *p = strstr(l->text[0], "[0] m 127.0.0.1 ");
    assert_spawn(l, p);
    int port = 0, store = 0;
    assert_spawn(l, sscanf(p, "[0] m 127.0.0.1 %d %d", &port, &store) == 2);
    assert_spawn(l, port > 0 && store > 0 && port != store);
    assert_int_equal(bind_port(port, false), EADDRINUSE);
    assert_int_equal(bind_port(port, true), 0);
    touch(tmp_path("master-done"));
    spawn_finish(l);
    assert_spawn(l, l->status == 0);
    spawn_free(l);

    l = launch_run(ARGS("-n", "1", "--master-addr", "10.1.2.3", "--master-port", "29400", "--",
                        "/bin/sh", "-c", "echo \"given $MASTER_ADDR $MASTER_PORT\""));
    assert_spawn(l, l->status == 0 && strstr(l->text[0], "[0] given 10.1.2.3 29400\n"));
}

/* An IPv6 store address reaches the ranks whole in COLLIE_STORE_ADDR; on
 * node 1 of a multi-node job MASTER_ADDR is node 0's host without its
 * brackets (as torch wants a host) and MASTER_PORT the store's port + 1. */
static void test_ipv6_store_env(void **state) {
    (void)state;
    spawn_proc *l = launch_start(ARGS("--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "1",
                                      "--store", "[::1]:29999", "--", "/bin/sh", "-c",
                                      "echo \"v6 $COLLIE_STORE_ADDR $MASTER_ADDR $MASTER_PORT\""),
                                 ARGS("COLLIE_STORE_TOKEN=v6-secret"));
    spawn_finish(l);
    assert_spawn(l, l->status == 0);
    assert_spawn(l, strstr(l->text[0], "[1] v6 [::1]:29999 ::1 30000\n"));
}

static uint16_t free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* The second launcher of test_two_nodes (spawn.c runs one child at a
 * time): collie-run with its output in a file and without our COLLIE_*. */
static pid_t start_second(const char *const *args, const char *out_path) {
    static const char *argv[24];
    size_t n = 0;
    argv[n++] = spawn_bin_path("collie-run");
    for (size_t i = 0; args[i] && n < 23; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    static char *envp[512];
    size_t k = 0;
    for (char **e = environ; *e && k < 511; e++)
        if (strncmp(*e, "COLLIE_", 7) != 0) envp[k++] = *e;
    envp[k] = NULL;
    int fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    assert_true(fd >= 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        execve(argv[0], (char *const *)argv, envp);
        _exit(127);
    }
    close(fd);
    return pid;
}

/* Its exit status, waiting at most timeout_ms (then SIGKILL and -1). */
static int wait_second(pid_t pid, int timeout_ms) {
    int st;
    for (int waited = 0; waited < timeout_ms; waited += 10) {
        if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

/* One job on two "nodes": two collie-runs, node 0 serving the store at the
 * agreed port, the demo's collectives across all 4 ranks, the user's secret
 * given to both. */
static void test_two_nodes(void **state) {
    (void)state;
    char store[32];
    snprintf(store, sizeof store, "127.0.0.1:%u", free_port());
    const char *demo = spawn_build_path("examples/demo");
    const char *out1 = tmp_path("node1.out");
    static char secret[256];
    snprintf(secret, sizeof secret, "%s", tmp_path("secret"));
    FILE *sf = fopen(secret, "w");
    assert_non_null(sf);
    fputs("two-node secret\n", sf);
    fclose(sf);
    assert_int_equal(chmod(secret, 0600), 0); /* its owner's only, as collie-run requires */
    pid_t n1 =
        start_second(ARGS("--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1", "--store",
                          store, "--token-file", secret, "--timeout", "6", "--", demo),
                     out1);
    spawn_proc *n0 =
        launch_start(ARGS("--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "0", "--store",
                          store, "--token-file", secret, "--timeout", "6", "--", demo),
                     NULL);
    spawn_finish(n0);
    int st1 = wait_second(n1, 8000);
    static char text1[65536];
    FILE *f = fopen(out1, "r");
    assert_non_null(f);
    text1[fread(text1, 1, sizeof text1 - 1, f)] = '\0';
    fclose(f);
    if (st1 != 0) fail_msg("node 1 exited with %d:\n%s", st1, text1);
    assert_spawn(n0, n0->status == 0);
    /* node 0 runs global ranks 0 and 1, node 1 ranks 2 and 3 */
    assert_spawn(n0, spawn_count(n0->text[0], "results correct") == 2);
    assert_spawn(n0, strstr(n0->text[0], "[1] rank 1: all 4 done"));
    assert_int_equal(spawn_count(text1, "results correct"), 2);
    assert_non_null(strstr(text1, "[2] rank 2: all 4 done"));
    assert_non_null(strstr(text1, "[3] rank 3: all 4 done"));
    assert_null(strstr(text1, "[0] "));
}

/* --token-file: a file group or others can read or write is refused with a
 * clear error, as ssh refuses such a key; its owner's alone, it is used. */
static void test_token_file_permissions(void **state) {
    (void)state;
    static char secret[256];
    snprintf(secret, sizeof secret, "%s", tmp_path("loose-secret"));
    FILE *sf = fopen(secret, "w");
    assert_non_null(sf);
    fputs("a secret\n", sf);
    fclose(sf);
    static const mode_t loose[] = {0644, 0640, 0604, 0620, 0602};
    for (size_t i = 0; i < sizeof loose / sizeof loose[0]; i++) {
        assert_int_equal(chmod(secret, loose[i]), 0);
        spawn_proc *l = launch_run(ARGS("-n", "1", "--token-file", secret, "--", "true"));
        assert_spawn(l, l->status == 1);
        assert_spawn(l, strstr(l->text[1], secret) && strstr(l->text[1], "group or others") &&
                            strstr(l->text[1], "owner only"));
        assert_spawn(l, !strstr(l->text[1], "a secret"));
        spawn_free(l);
    }
    assert_int_equal(chmod(secret, 0600), 0);
    spawn_proc *l = launch_run(ARGS("-n", "1", "--token-file", secret, "--", "/bin/sh", "-c",
                                    "echo \"token=$COLLIE_STORE_TOKEN\""));
    assert_spawn(l, l->status == 0);
    assert_spawn(l, strstr(l->text[0], "[0] token=a secret\n"));
    spawn_free(l);
}

/* --stats: a line per comm and rank after the job, from what the ranks'
 * comms counted. */
static void test_stats(void **state) {
    (void)state;
    spawn_proc *l = launch_run(ARGS("-n", "2", "--stats", "--", spawn_build_path("examples/demo")));
    assert_spawn(l, l->status == 0);
    const char *h = strstr(l->text[1], "collie-run: stats per comm and rank");
    assert_spawn(l, h);
    for (int r = 0; r < 2; r++) {
        char want[80];
        snprintf(want, sizeof want, "\ndemo                0 %5d ", r);
        const char *p = strstr(h, want);
        assert_spawn(l, p);
        long long posted, completed, failed, inflight, bytes;
        assert_spawn(l, sscanf(p + strlen(want), "%lld %lld %lld %lld %lld", &posted, &completed,
                               &failed, &inflight, &bytes) == 5);
        /* the demo: 4 collectives, then 4000 tiny allreduces */
        assert_spawn(l, posted == 4004 && completed == 4004 && failed == 0 && inflight == 0);
        assert_spawn(l, bytes > 0);
        assert_spawn(l, strstr(p, "COLLIE_OK\n"));
    }
}

/* --stats after a kill: the survivors' lines of the dead generation carry
 * the fault data (the comm's root fault kind, failed works by kind, the
 * dead peer); the next generation's is clean. */
static void test_stats_fault(void **state) {
    (void)state;
    spawn_proc *l = launch_run(
        ARGS("-n", "3", "--restarts", "1", "--stats", "--", spawn_build_path("examples/recovery")));
    assert_spawn(l, l->status == 0);
    const char *h = strstr(l->text[1], "collie-run: stats per comm and rank");
    assert_spawn(l, h);
    for (int r = 0; r < 2; r++) { /* the survivors of generation 0 (rank 2 is the victim) */
        char want[80];
        snprintf(want, sizeof want, "\nrecovery            0 %5d ", r);
        const char *p = strstr(h, want);
        assert_spawn(l, p);
        const char *eol = strchr(p + 1, '\n');
        char line[512];
        snprintf(line, sizeof line, "%.*s", (int)(eol ? eol - p - 1 : 400), p + 1);
        assert_spawn(l, strstr(line, " (peer_dead); failed: "));
        assert_spawn(l, strstr(line, "; by fault: peer_dead "));
        assert_spawn(l, strstr(line, "; peers dead 1, suspected 0, "));
    }
    const char *p = strstr(h, "\nrecovery            1     1 ");
    assert_spawn(l, p && strncmp(strstr(p, "COLLIE_"), "COLLIE_OK", 9) == 0);
}

/* NCCL's and PyTorch's settings: each named with collie's equivalent;
 * NCCL's own without one (NCCL still reads them) not at all. */
static void test_foreign_settings_warned(void **state) {
    (void)state;
    spawn_proc *l = launch_start(ARGS("-n", "1", "true"),
                                 ARGS("NCCL_BLOCKING_WAIT=1", "TORCH_NCCL_TRACE_BUFFER_SIZE=100",
                                      "TORCH_NCCL_NOVEL=1", "NCCL_IB_HCA=mlx5"));
    spawn_finish(l);
    assert_spawn(l, l->status == 0);
    assert_spawn(l, strstr(l->text[1], "NCCL_BLOCKING_WAIT is set; collie does not read it: its "
                                       "equivalent is COLLIE_BLOCKING_WAIT\n"));
    assert_spawn(l, strstr(l->text[1], "TORCH_NCCL_TRACE_BUFFER_SIZE is set; collie does not "
                                       "read it: its equivalent is COLLIE_TRACE_BUFFER\n"));
    assert_spawn(l, strstr(l->text[1], "TORCH_NCCL_NOVEL is set; it is PyTorch's NCCL process "
                                       "group's and has no collie equivalent"));
    assert_spawn(l, !strstr(l->text[1], "NCCL_IB_HCA"));
}

/* ---- fixture ------------------------------------------------------------- */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static int setup_tmp(void **state) {
    (void)state;
    strcpy(tmp_dir, "/tmp/collie-test-run.XXXXXX");
    return mkdtemp(tmp_dir) ? 0 : -1;
}

static int teardown_tmp(void **state) {
    (void)state;
    return nftw(tmp_dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_env_per_rank_and_store, spawn_teardown),
        cmocka_unit_test_teardown(test_store_outlives_a_rank, spawn_teardown),
        cmocka_unit_test_teardown(test_token_is_passed_on, spawn_teardown),
        cmocka_unit_test_teardown(test_external_store_is_used, spawn_teardown),
        cmocka_unit_test_teardown(test_every_line_prefixed, spawn_teardown),
        cmocka_unit_test_teardown(test_failure_stops_the_others, spawn_teardown),
        cmocka_unit_test_teardown(test_sigkill_after_grace, spawn_teardown),
        cmocka_unit_test_teardown(test_killed_by_signal, spawn_teardown),
        cmocka_unit_test_teardown(test_keep_going, spawn_teardown),
        cmocka_unit_test_teardown(test_restart_recovers, spawn_teardown),
        cmocka_unit_test_teardown(test_restarts_run_out, spawn_teardown),
        cmocka_unit_test_teardown(test_timeout, spawn_teardown),
        cmocka_unit_test_teardown(test_signal_is_forwarded, spawn_teardown),
        cmocka_unit_test_teardown(test_second_signal_kills, spawn_teardown),
        cmocka_unit_test_teardown(test_long_line_is_split, spawn_teardown),
        cmocka_unit_test_teardown(test_all_succeed, spawn_teardown),
        cmocka_unit_test_teardown(test_cannot_exec, spawn_teardown),
        cmocka_unit_test_teardown(test_usage_errors, spawn_teardown),
        cmocka_unit_test_teardown(test_torchrun_env, spawn_teardown),
        cmocka_unit_test_teardown(test_torch_master_port_held, spawn_teardown),
        cmocka_unit_test_teardown(test_ipv6_store_env, spawn_teardown),
        cmocka_unit_test_teardown(test_two_nodes, spawn_teardown),
        cmocka_unit_test_teardown(test_stats, spawn_teardown),
        cmocka_unit_test_teardown(test_stats_fault, spawn_teardown),
        cmocka_unit_test_teardown(test_token_file_permissions, spawn_teardown),
        cmocka_unit_test_teardown(test_foreign_settings_warned, spawn_teardown),
    };
    return cltest_main(tests, setup_tmp, teardown_tmp);
}
