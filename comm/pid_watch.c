/*
 * pid_watch.c — watching same-host processes for their exit: one pidfd per
 * (engine, process), shared by every comm that has that process as a peer
 * (peer health, health.c).
 *
 * Design notes
 *  - A process with many comms (torch's groups, splits) has the same peers
 *    in each: one pidfd per comm and peer would spend a file descriptor per
 *    pair and run out. So watches live in one process-wide list keyed by
 *    engine, pid and start time; each holds its subscribers (cl_pid_sub) and
 *    is closed when the last one leaves. The list's mutex guards the list
 *    and the subscriber lists; the pidfd's libevent event belongs to the
 *    engine's loop, and subscribe, unsubscribe and the exit callback all
 *    run there.
 *  - The start time (field 22 of /proc/<pid>/stat) read after the pidfd is
 *    open guards against a recycled pid: a mismatch means the process the
 *    peer published is gone already.
 *  - Whether a watched process lives (cl_pid_sub_alive) is certain at any
 *    instant: exited (the pidfd), or exiting (its PF_EXITING flag, set
 *    before the kernel closes its files: a connection a killed process
 *    drops is seen closed only after it), or alive. So a closed
 *    connection from a process that lives is not taken for a death.
 *  - The exit callback detaches every subscriber first, then calls each
 *    one's `exited` without the lock (it may unsubscribe others, post
 *    store requests, fault a comm).
 */
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/pidfd.h"
#include "comm/comm.h"
#include "engine/engine.h"

typedef struct cl_pid_watch { /* one watched process (the header's opaque type) */
    cl_list_node node;        /* in pid_watches */
    collie_engine *engine;
    pid_t pid;
    unsigned long long start;
    int pidfd;
    struct event *ev;
    cl_list subs; /* cl_pid_sub.node */
} pid_entry;

static pthread_mutex_t pid_mu = PTHREAD_MUTEX_INITIALIZER;
static cl_list pid_watches = {.head = {&pid_watches.head, &pid_watches.head}};

/* /proc/<pid>/stat: the state (field 3), the flags (9) and the start time
 * (22). False if unreadable (the process is gone). */
static bool pid_stat(pid_t pid, char *state, unsigned long *flags, unsigned long long *start) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return false;
    buf[n] = '\0';
    const char *s = strrchr(buf, ')'); /* the command may hold spaces and parentheses */
    if (!s || !s[1] || !s[2]) return false;
    s += 2; /* ") S": at field 3 */
    *state = *s;
    for (int field = 3; field < 22 && s; field++) { /* to the space before field + 1 */
        s = strchr(s + 1, ' ');
        if (s && field == 8) *flags = strtoul(s + 1, NULL, 10);
    }
    *start = s ? strtoull(s + 1, NULL, 10) : 0;
    return s != NULL;
}

unsigned long long cl_pid_start_time(pid_t pid) {
    char state;
    unsigned long flags = 0;
    unsigned long long start = 0;
    return pid_stat(pid, &state, &flags, &start) ? start : 0;
}

/* under pid_mu */
static void pid_watch_free(pid_entry *w) {
    cl_list_remove(&w->node);
    if (w->ev) event_free(w->ev);
    close(w->pidfd);
    free(w);
}

static void pid_on_exit(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    pid_entry *w = arg;
    cl_list gone;
    cl_list_init(&gone);
    pthread_mutex_lock(&pid_mu);
    cl_pid_sub *s;
    while ((s = cl_list_first(&w->subs, cl_pid_sub, node))) {
        cl_list_remove(&s->node);
        s->watch = NULL;
        cl_list_push_back(&gone, &s->node);
    }
    pid_watch_free(w);
    pthread_mutex_unlock(&pid_mu);
    while ((s = cl_list_first(&gone, cl_pid_sub, node))) {
        cl_list_remove(&s->node);
        s->exited(s);
    }
}

int cl_pid_watch(collie_engine *e, pid_t pid, unsigned long long start, cl_pid_sub *s) {
    pthread_mutex_lock(&pid_mu);
    pid_entry *w;
    cl_list_foreach(&pid_watches, w, pid_entry, node) {
        if (w->engine == e && w->pid == pid && w->start == start) {
            cl_list_push_back(&w->subs, &s->node);
            s->watch = w;
            pthread_mutex_unlock(&pid_mu);
            return COLLIE_OK;
        }
    }
    pthread_mutex_unlock(&pid_mu);
    int fd = cl_pidfd_open(pid);
    if (fd < 0) /* no such process; or no pidfd here (old kernel, seccomp): links alone tell */
        return errno == ESRCH ? COLLIE_ENOENT : COLLIE_ENOTSUP;
    unsigned long long now_start = cl_pid_start_time(pid);
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if ((start && now_start && now_start != start) || poll(&pf, 1, 0) > 0) {
        close(fd);
        return COLLIE_ENOENT; /* recycled, or exited already */
    }
    w = calloc(1, sizeof *w);
    struct event *ev = w ? event_new(cl_engine_base(e), fd, EV_READ, pid_on_exit, w) : NULL;
    if (!ev || event_add(ev, NULL) != 0) {
        if (ev) event_free(ev);
        free(w);
        close(fd);
        return COLLIE_ENOMEM;
    }
    w->engine = e;
    w->pid = pid;
    w->start = start;
    w->pidfd = fd;
    w->ev = ev;
    cl_list_init(&w->subs);
    cl_list_push_back(&w->subs, &s->node);
    s->watch = w;
    pthread_mutex_lock(&pid_mu);
    cl_list_push_back(&pid_watches, &w->node);
    pthread_mutex_unlock(&pid_mu);
    return COLLIE_OK;
}

void cl_pid_unwatch(cl_pid_sub *s) {
    pthread_mutex_lock(&pid_mu);
    pid_entry *w = s->watch;
    if (w) {
        cl_list_remove(&s->node);
        s->watch = NULL;
        if (cl_list_empty(&w->subs)) pid_watch_free(w);
    }
    pthread_mutex_unlock(&pid_mu);
}

#define PF_EXITING_FLAG 0x4ul /* the kernel's PF_EXITING: set before its files close */

int cl_pid_sub_alive(const cl_pid_sub *s) {
    pthread_mutex_lock(&pid_mu);
    const pid_entry *w = s->watch;
    pid_t pid = w ? w->pid : 0;
    unsigned long long start = w ? w->start : 0;
    int fd = w ? w->pidfd : -1;
    int res = -1;
    if (w) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        char state = '?';
        unsigned long flags = 0;
        unsigned long long now_start = 0;
        res = poll(&pf, 1, 0) == 0 && pid_stat(pid, &state, &flags, &now_start) &&
              (!start || now_start == start) && state != 'Z' && state != 'X' &&
              !(flags & PF_EXITING_FLAG);
    }
    pthread_mutex_unlock(&pid_mu);
    return res;
}

size_t cl_pid_watches(void) {
    size_t n = 0;
    pthread_mutex_lock(&pid_mu);
    for (cl_list_node *at = pid_watches.head.next; at != &pid_watches.head; at = at->next)
        n++;
    pthread_mutex_unlock(&pid_mu);
    return n;
}
