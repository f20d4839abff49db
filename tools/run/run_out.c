/*
 * run_out.c — the ranks' output: each rank's stdout and stderr pipes, cut
 * into lines that go out with the rank's "[rank] " prefix.
 *
 * Design notes
 *  - Output: a rank's bytes are cut into lines and every line goes out with
 *    its "[rank] " prefix inside one buffered write(), so lines of different
 *    ranks never mix. Lines longer than RUN_LINE_MAX are split; a partial last
 *    line is completed with '\n'. When a rank is reaped, what is left in its
 *    pipes is drained and they are closed, so a background process it left
 *    behind cannot keep the job alive.
 *  - Writes to our own stdout/stderr block while the reader is slow: that is
 *    back-pressure (ranks then block on their pipes), the one wait the loop
 *    does not bound. EPIPE drops that output and the job goes on.
 */
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "run.h"

static void run_out_flush(run_job *job) {
    const char *p = job->out;
    size_t left = job->out_len;
    while (left > 0 && !job->out_dead[job->out_fd]) {
        ssize_t n = write(job->out_fd, p, left);
        if (n > 0) {
            p += n;
            left -= (size_t)n;
        } else if (n < 0 && errno == EAGAIN) {
            /* someone made our stdout non-blocking: wait for room */
            struct pollfd pfd = {.fd = job->out_fd, .events = POLLOUT};
            poll(&pfd, 1, RUN_TICK_MS);
        } else if (n < 0 && errno != EINTR) {
            job->out_dead[job->out_fd] = true; /* EPIPE or worse: drop it */
        }
    }
    job->out_len = 0;
}

/* Queue "[rank] line" (plus '\n' if the line lacks one) for fd. */
static void run_out_line(run_job *job, const run_rank *r, int fd, const char *line, size_t len) {
    bool nl = len == 0 || line[len - 1] != '\n';
    size_t need = r->prefix_len + len + nl;
    if (fd != job->out_fd || job->out_len + need > RUN_OUT_MAX) run_out_flush(job);
    job->out_fd = fd;
    memcpy(job->out + job->out_len, r->prefix, r->prefix_len);
    memcpy(job->out + job->out_len + r->prefix_len, line, len);
    job->out_len += r->prefix_len + len;
    if (nl) job->out[job->out_len++] = '\n';
}

/* Emit the complete lines in s->buf (and the rest too when `all`). */
static void run_stream_emit(run_job *job, const run_rank *r, run_stream *s, bool all) {
    size_t start = 0;
    for (;;) {
        char *nl = memchr(s->buf + start, '\n', s->len - start);
        if (!nl) break;
        size_t end = (size_t)(nl - s->buf) + 1;
        run_out_line(job, r, s->out_fd, s->buf + start, end - start);
        start = end;
    }
    if (start < s->len && (all || (start == 0 && s->len == RUN_LINE_MAX))) {
        run_out_line(job, r, s->out_fd, s->buf + start, s->len - start);
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
    run_out_flush(job);
}

static void run_stream_close(run_job *job, const run_rank *r, run_stream *s) {
    if (s->fd < 0) return;
    run_stream_emit(job, r, s, true);
    close(s->fd);
    s->fd = -1;
}

/* One read: emit the lines it completed; at EOF (or an error) close the
 * stream. Returns true when it got bytes. */
bool run_stream_read(run_job *job, const run_rank *r, run_stream *s) {
    ssize_t n = read(s->fd, s->buf + s->len, RUN_LINE_MAX - s->len);
    if (n > 0) {
        s->len += (size_t)n;
        run_stream_emit(job, r, s, false);
        return true;
    }
    if (n == 0 || (errno != EAGAIN && errno != EINTR)) run_stream_close(job, r, s);
    return false;
}

/* After a rank is reaped: take what is still in its pipes, then close them
 * (bounded: a process the rank left behind may still be writing). */
void run_rank_drain(run_job *job, run_rank *r) {
    for (int k = 0; k < 2; k++) {
        run_stream *s = &r->streams[k];
        for (int i = 0; i < RUN_DRAIN_READS && s->fd >= 0 && run_stream_read(job, r, s); i++)
            continue;
        run_stream_close(job, r, s);
    }
}
