/*
 * spawn.c — see spawn.h.
 */
#include "spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

extern char **environ;

/* The one child at a time; static, so the teardown can clean up after a
 * failed assertion (kill a child still running, free its output). */
static spawn_proc the_spawn;

const char *spawn_build_path(const char *rel) {
    static char path[8][4096];
    static int next;
    const char *dir = getenv("CLTEST_BUILD_DIR");
    char *p = path[next++ % 8];
    snprintf(p, sizeof path[0], "%s/%s", dir && *dir ? dir : "build", rel);
    return p;
}

const char *spawn_bin_path(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "bin/%s", name);
    return spawn_build_path(rel);
}

/* Does one of the extra entries name the variable of `entry` ("NAME=...")? */
static bool env_named(const char *const *extra, size_t n, const char *entry) {
    size_t len = strcspn(entry, "=");
    for (size_t i = 0; i < n; i++)
        if (strncmp(extra[i], entry, len) == 0 && (extra[i][len] == '=' || !extra[i][len]))
            return true;
    return false;
}

spawn_proc *spawn_start(const char *name, const char *const *args, const char *const *env_extra,
                        int bound_ms) {
    spawn_proc *s = &the_spawn;
    assert_false(s->started); /* the previous one was freed */
    memset(s, 0, sizeof *s);
    s->started = true;
    s->status = -1;
    s->bound_ms = bound_ms;
    s->fds[0] = s->fds[1] = -1;
    snprintf(s->name, sizeof s->name, "%s", name);
    for (int i = 0; i < 2; i++)
        assert_non_null(s->text[i] = calloc(1, 1));
    const char *argv[SPAWN_MAX_ARGS + 2] = {strchr(name, '/') ? spawn_build_path(name)
                                                              : spawn_bin_path(name)};
    size_t n = 1;
    for (size_t i = 0; args[i]; i++) {
        assert_true(n <= SPAWN_MAX_ARGS);
        argv[n++] = args[i];
    }
    assert_int_equal(access(argv[0], X_OK), 0);
    size_t nextra = 0;
    while (env_extra && env_extra[nextra])
        nextra++;
    assert_true(nextra <= SPAWN_MAX_ENV);
    size_t nenv = 0;
    while (environ[nenv])
        nenv++;
    char **envp = calloc(nenv + nextra + 1, sizeof *envp);
    assert_non_null(envp);
    size_t k = 0;
    for (size_t i = 0; i < nenv; i++)
        if (strncmp(environ[i], "COLLIE_", 7) != 0 && !env_named(env_extra, nextra, environ[i]))
            envp[k++] = environ[i];
    for (size_t i = 0; i < nextra; i++)
        if (strchr(env_extra[i], '=')) envp[k++] = (char *)env_extra[i];

    int out[2], err[2];
    assert_int_equal(pipe2(out, O_CLOEXEC), 0);
    assert_int_equal(pipe2(err, O_CLOEXEC), 0);
    s->start_ms = now_ms();
    s->pid = fork();
    assert_true(s->pid >= 0);
    if (s->pid == 0) {
        int devnull = open("/dev/null", O_RDONLY);
        dup2(devnull, 0);
        dup2(out[1], 1);
        dup2(err[1], 2);
        execve(argv[0], (char *const *)argv, envp);
        _exit(126);
    }
    free(envp);
    close(out[1]);
    close(err[1]);
    s->fds[0] = out[0];
    s->fds[1] = err[0];
    for (int i = 0; i < 2; i++)
        fcntl(s->fds[i], F_SETFL, O_NONBLOCK);
    return s;
}

void spawn_pump(spawn_proc *s, int timeout_ms) {
    struct pollfd p[2];
    int map[2], n = 0;
    for (int i = 0; i < 2; i++)
        if (s->fds[i] >= 0) {
            p[n] = (struct pollfd){.fd = s->fds[i], .events = POLLIN};
            map[n++] = i;
        }
    if (n == 0 || poll(p, (nfds_t)n, timeout_ms) <= 0) return;
    for (int j = 0; j < n; j++) {
        if (!p[j].revents) continue;
        int i = map[j];
        char buf[65536];
        ssize_t got = read(s->fds[i], buf, sizeof buf);
        if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (got <= 0) {
            close(s->fds[i]);
            s->fds[i] = -1;
            continue;
        }
        s->text[i] = realloc(s->text[i], s->len[i] + (size_t)got + 1);
        assert_non_null(s->text[i]);
        memcpy(s->text[i] + s->len[i], buf, (size_t)got);
        s->len[i] += (size_t)got;
        s->text[i][s->len[i]] = '\0';
    }
}

int spawn_count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

bool spawn_wait_for(spawn_proc *s, int k, const char *needle, int count, int timeout_ms) {
    int64_t deadline = now_ms() + timeout_ms;
    while (spawn_count(s->text[k], needle) < count) {
        int64_t left = deadline - now_ms();
        if (left <= 0 || (s->fds[0] < 0 && s->fds[1] < 0)) return false;
        spawn_pump(s, (int)(left < 50 ? left : 50));
    }
    return true;
}

void spawn_dump(const spawn_proc *s) {
    /* not print_error: cmocka formats into a fixed buffer and cuts long output */
    fflush(stdout);
    fprintf(stderr, "%s: exit status %d after %lld ms\n--- stdout:\n%s\n--- stderr:\n%s\n---\n",
            s->name, s->status, (long long)s->elapsed_ms, s->text[0], s->text[1]);
    fflush(stderr);
}

void spawn_finish(spawn_proc *s) {
    int64_t deadline = s->start_ms + s->bound_ms;
    while ((s->fds[0] >= 0 || s->fds[1] >= 0) && now_ms() < deadline)
        spawn_pump(s, (int)(deadline - now_ms() < 100 ? deadline - now_ms() : 100));
    int ws = 0;
    pid_t got;
    while ((got = waitpid(s->pid, &ws, WNOHANG)) == 0 && now_ms() < deadline)
        usleep(5000);
    s->elapsed_ms = now_ms() - s->start_ms;
    if (got != s->pid) {
        spawn_dump(s);
        fail_msg("%s did not finish within %d ms", s->name, s->bound_ms);
    }
    s->status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    s->pid = 0;
    for (int i = 0; i < 2; i++)
        if (s->fds[i] >= 0) close(s->fds[i]);
    s->fds[0] = s->fds[1] = -1;
}

void spawn_free(spawn_proc *s) {
    if (!s->started) return;
    if (s->pid > 0) { /* a failed test left it running (collie-run's ranks follow it) */
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
    }
    for (int i = 0; i < 2; i++) {
        if (s->fds[i] >= 0) close(s->fds[i]);
        free(s->text[i]);
    }
    memset(s, 0, sizeof *s);
}

int spawn_teardown(void **state) {
    (void)state;
    spawn_free(&the_spawn);
    return 0;
}
