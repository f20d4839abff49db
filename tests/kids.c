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

/* The child's first line on stdin: the store's address (read byte by byte,
 * so the lines the test tells it later stay in the pipe). Bounded. */
static bool kids_read_addr(char *addr, size_t len) {
    size_t at = 0;
    int64_t until = now_ms() + 30000;
    while (at + 1 < len && now_ms() < until) {
        if (!kids_readable(0, 100)) continue;
        char ch;
        if (read(0, &ch, 1) != 1) return false;
        if (ch == '\n') break;
        addr[at++] = ch;
    }
    addr[at] = '\0';
    return at > 0;
}

void kids_start(kids *k, int n, kid_fn fn, void *arg, const char *const *settings) {
    memset(k, 0, sizeof *k);
    assert_true(n > 0 && n <= KIDS_MAX);
    k->n = n;
    signal(SIGPIPE, SIG_IGN); /* a line told to a dead child fails its assert, not the test */
    /* fork before this process has threads of its own (its engine, the
     * store server): a child of a threaded process may inherit a lock
     * another thread held (the allocator's, under ASan) and hang; the
     * children learn the store's address on stdin */
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
                setting_set(name, eq + 1);
            }
            dup2(po[1], 1);
            dup2(pi[0], 0);
            for (int q = 0; q < r; q++) { /* the earlier children's pipes */
                close(k->out[q]);
                close(k->in[q]);
            }
            close(po[0]);
            close(pi[1]);
            close(po[1]);
            close(pi[0]);
            char addr[64];
            _exit(kids_read_addr(addr, sizeof addr) ? fn(addr, r, arg) : 99);
        }
        close(po[1]);
        close(pi[0]);
        k->out[r] = po[0];
        k->in[r] = pi[1];
    }
    assert_int_equal(collie_engine_create(NULL, &k->e), COLLIE_OK);
    assert_int_equal(collie_store_server_create(k->e, "127.0.0.1", 0, NULL, &k->srv), COLLIE_OK);
    char line[80];
    snprintf(line, sizeof line, "127.0.0.1:%u\n", collie_store_server_port(k->srv));
    for (int r = 0; r < n; r++)
        kids_tell(k, r, line);
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
