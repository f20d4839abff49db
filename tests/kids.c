/*
 * kids.c — ranks as forked children of a test (kids.h).
 */
#include "kids.h"

#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static bool kids_readable(int fd, int timeout_ms) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, timeout_ms) == 1 && (p.revents & (POLLIN | POLLHUP));
}

void kids_start(kids *k, int n, kid_fn fn, void *arg, const char *const *settings) {
    memset(k, 0, sizeof *k);
    assert_true(n > 0 && n <= KIDS_MAX);
    k->n = n;
    assert_int_equal(collie_engine_create(NULL, &k->e), COLLIE_OK);
    assert_int_equal(collie_store_server_create(k->e, "127.0.0.1", 0, NULL, &k->srv), COLLIE_OK);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", collie_store_server_port(k->srv));
    for (int r = 0; r < n; r++) {
        int po[2], pi[2];
        assert_int_equal(pipe(po), 0);
        assert_int_equal(pipe(pi), 0);
        k->pid[r] = fork();
        assert_true(k->pid[r] >= 0);
        if (k->pid[r] == 0) {
            for (int i = 0; settings && settings[i]; i++) {
                char name[64];
                const char *eq = strchr(settings[i], '=');
                snprintf(name, sizeof name, "%.*s", (int)(eq - settings[i]), settings[i]);
                setting_set(name, eq + 1); /* the parent's engine read them already */
            }
            dup2(po[1], 1);
            dup2(pi[0], 0);
            _exit(fn(addr, r, arg));
        }
        close(po[1]);
        close(pi[0]);
        k->out[r] = po[0];
        k->in[r] = pi[1];
    }
}

bool kids_wait(kids *k, int r, const char *text, int timeout_ms) {
    int64_t until = now_ms() + timeout_ms;
    do {
        if (strstr(k->buf[r], text)) return true;
        if (k->got[r] >= sizeof k->buf[r] - 1 || !kids_readable(k->out[r], 10)) continue;
        ssize_t n = read(k->out[r], k->buf[r] + k->got[r], sizeof k->buf[r] - 1 - k->got[r]);
        if (n <= 0) return strstr(k->buf[r], text) != NULL;
        k->got[r] += (size_t)n;
    } while (now_ms() < until);
    return strstr(k->buf[r], text) != NULL;
}

void kids_tell(kids *k, int r, const char *line) {
    ssize_t n = write(k->in[r], line, strlen(line));
    assert_int_equal(n, (ssize_t)strlen(line));
}

void kids_end(kids *k, int *codes, int bound_ms) {
    for (int r = 0; r < k->n; r++) {
        int stw = reap_bounded(k->pid[r], bound_ms);
        codes[r] = stw == -1        ? 128 + SIGKILL
                   : WIFEXITED(stw) ? WEXITSTATUS(stw)
                                    : 128 + WTERMSIG(stw);
        kids_wait(k, r, "\x01", 0); /* what it said last */
        close(k->out[r]);
        close(k->in[r]);
    }
    collie_store_server_destroy(k->srv);
    assert_int_equal(collie_engine_destroy(k->e), COLLIE_OK);
}
