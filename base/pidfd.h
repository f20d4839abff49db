/*
 * pidfd.h — pidfd_open(2) where the libc has no wrapper: a file descriptor
 * that becomes readable when the process exits (peer health's watch,
 * comm/pid_watch.c; the shm loans' peer check, transports/cpu/shm/loan.c).
 */
#ifndef CL_BASE_PIDFD_H
#define CL_BASE_PIDFD_H

#include <errno.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

/* a pidfd of `pid`, or -1 with errno (ESRCH: no such process; ENOSYS: no
 * pidfds on this kernel) */
static inline int cl_pidfd_open(pid_t pid) {
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

#endif
