/*
 * runner.c — see runner.h.
 */
#include "runner.h"

#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine.h"
#include "harness.h"
#include "work/work.h"

#define CLTEST_DEFAULT_TIMEOUT_S 120
#define CLTEST_KEEP_BYTES        (1 << 20) /* of a child's output, for the verdict */

/* Threads a test may leave: the main one, plus TSan's background thread
 * (started with the first thread the test makes) under TSan. */
#ifdef __SANITIZE_THREAD__
#define CLTEST_OWN_THREADS 2
#else
#define CLTEST_OWN_THREADS 1
#endif

extern char **environ;

/* ---- the child ------------------------------------------------------------------- */

static int child_fds_before = -1;
static const char *leftovers_allowed;

const char *cltest_child_name(void) {
    const char *n = getenv("CLTEST_CHILD");
    return n && *n ? n : NULL;
}

void cltest_allow_leftovers(const char *why) { leftovers_allowed = why; }

void cltest_child_begin(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    child_fds_before = count_open_fds();
}

int cltest_child_end(int cmocka_failed) {
    if (cmocka_failed) return 1; /* the failure is the news; leftovers follow from it */
    if (leftovers_allowed) {
        printf("leftover check skipped: %s\n", leftovers_allowed);
        return 0;
    }
    int threads = count_threads_settled(CLTEST_OWN_THREADS);
    int fds = count_open_fds_settled(child_fds_before);
    size_t engines = cl_engines_live(), works = cl_works_live();
    if (threads <= CLTEST_OWN_THREADS && fds == child_fds_before && engines == 0 && works == 0)
        return 0;
    printf("LEFTOVERS after %s: %d threads besides main, %d file descriptors more than before "
           "the test, %zu engines and %zu posted works not freed\n",
           cltest_child_name(), threads - 1, fds - child_fds_before, engines, works);
    fflush(stdout);
    return 1;
}

/* ---- the parent ------------------------------------------------------------------ */

typedef struct child_out {
    char *keep; /* the first CLTEST_KEEP_BYTES, NUL-terminated */
    size_t len;
    char line[4096]; /* the line being assembled, for the prefix */
    size_t line_len;
} child_out;

static void out_line_flush(child_out *o) {
    if (!o->line_len) return;
    printf("    | %.*s\n", (int)o->line_len, o->line);
    o->line_len = 0;
}

static void out_take(child_out *o, const char *buf, size_t n) {
    size_t room = CLTEST_KEEP_BYTES - o->len;
    size_t k = n < room ? n : room;
    memcpy(o->keep + o->len, buf, k);
    o->len += k;
    o->keep[o->len] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (buf[i] == '\n' || o->line_len == sizeof o->line) out_line_flush(o);
        if (buf[i] != '\n') o->line[o->line_len++] = buf[i];
    }
}

static int64_t timeout_ms(void) {
    const char *t = getenv("CLTEST_TEST_TIMEOUT_S"), *s = getenv("CLTEST_TIMEOUT_SCALE");
    int64_t secs = t && atoi(t) > 0 ? atoi(t) : CLTEST_DEFAULT_TIMEOUT_S;
    int64_t scale = s && atoi(s) > 0 ? atoi(s) : 1;
    return secs * scale * 1000;
}

/* Run test `name` in a child; its output into *o. Returns its wait status,
 * or -1 if it ran past the bound (then it was killed). */
static int child_run(const char *name, int64_t bound_ms, child_out *o) {
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        perror("runner: pipe");
        return 1 << 8;
    }
    char var[512];
    snprintf(var, sizeof var, "CLTEST_CHILD=%s", name);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        perror("runner: fork");
        return 1 << 8;
    }
    if (pid == 0) {
        setpgid(0, 0); /* its own group: a timeout kills the test's children too */
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        putenv(var);
        char *const argv[] = {(char *)"test", NULL};
        execve("/proc/self/exe", argv, environ);
        _exit(127);
    }
    setpgid(pid, pid);
    close(pfd[1]);
    int64_t until = now_ms() + bound_ms;
    int status = 0;
    bool exited = false, killed = false, eof = false;
    while (!exited || !eof) {
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        if (!eof && poll(&p, 1, 100) > 0) {
            char buf[8192];
            ssize_t n = read(pfd[0], buf, sizeof buf);
            if (n > 0)
                out_take(o, buf, (size_t)n);
            else if (n == 0 || errno != EINTR)
                eof = true;
        } else if (eof) {
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
        if (!exited && waitpid(pid, &status, WNOHANG) == pid) exited = true;
        if (!killed && now_ms() > until) { /* the whole group: the test and its children */
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            killed = true;
            until = now_ms() + 5000; /* for the pipe: a grandchild may hold it */
        } else if (killed && now_ms() > until) {
            break;
        }
    }
    if (!exited) waitpid(pid, &status, 0);
    out_line_flush(o);
    close(pfd[0]);
    return killed ? -1 : status;
}

int cltest_parent(const struct CMUnitTest *tests, size_t n) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *filter = getenv("CLTEST_FILTER");
    int64_t bound = timeout_ms();
    size_t run = 0, passed = 0, skipped = 0;
    const char **failed = calloc(n + 1, sizeof *failed), **skips = calloc(n + 1, sizeof *skips);
    child_out o = {.keep = malloc(CLTEST_KEEP_BYTES + 1)};
    if (!failed || !skips || !o.keep) return 1;
    size_t nfailed = 0;
    for (size_t i = 0; i < n; i++)
        if (!filter || !*filter || fnmatch(filter, tests[i].name, 0) == 0) run++;
    printf("[==========] Running %zu test(s), each in a child process (bound %lld s).\n", run,
           (long long)(bound / 1000));
    for (size_t i = 0; i < n; i++) {
        const char *name = tests[i].name;
        if (filter && *filter && fnmatch(filter, name, 0) != 0) continue;
        printf("[ RUN      ] %s\n", name);
        int64_t t0 = now_ms();
        int st;
        for (int attempt = 0;; attempt++) {
            o.len = 0;
            o.keep[0] = '\0';
            st = child_run(name, bound, &o);
            bool ok = st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
            if (ok || attempt == 2 || !strstr(o.keep, "ThreadSanitizer failed to allocate")) break;
            printf("  (the TSan runtime failed to start; running %s again)\n", name);
        }
        int64_t ms = now_ms() - t0;
        char skip_line[512];
        snprintf(skip_line, sizeof skip_line, "[  SKIPPED ] %s", name);
        if (st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0 && strstr(o.keep, skip_line)) {
            printf("[  SKIPPED ] %s\n", name);
            skips[skipped++] = name;
        } else if (st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
            printf("[       OK ] %s (%lld ms)\n", name, (long long)ms);
            passed++;
        } else {
            if (st < 0)
                printf("[  TIMEOUT ] %s: still running after %lld s; killed\n", name,
                       (long long)(bound / 1000));
            else if (WIFSIGNALED(st))
                printf("[  CRASHED ] %s: killed by signal %d (%s)\n", name, WTERMSIG(st),
                       strsignal(WTERMSIG(st)));
            printf("[  FAILED  ] %s (%lld ms)\n", name, (long long)ms);
            failed[nfailed++] = name;
        }
    }
    printf("[==========] %zu test(s) run.\n", run);
    printf("[  PASSED  ] %zu test(s).\n", passed);
    if (skipped) {
        printf("[  SKIPPED ] %zu test(s), listed below:\n", skipped);
        for (size_t i = 0; i < skipped; i++)
            printf("[  SKIPPED ] %s\n", skips[i]);
    }
    if (nfailed) {
        printf("[  FAILED  ] %zu test(s), listed below:\n", nfailed);
        for (size_t i = 0; i < nfailed; i++)
            printf("[  FAILED  ] %s\n", failed[i]);
        printf("\n %zu FAILED TEST(S)\n", nfailed);
    }
    free(failed);
    free(skips);
    free(o.keep);
    return (int)nfailed;
}
