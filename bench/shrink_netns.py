#!/usr/bin/env python3
"""shrink_netns.py - issue 33's shrink targets, measured.

  kill-host    4 ranks on this host (COLLIE_CPU_TRANSPORT=auto: shared
               memory), idle after one allreduce; rank 3 SIGKILLed: time
               from the kill to every survivor holding the shrunk comm and
               its first allreduce done (its bytes checked). Target 10 ms.
  kill-netns   8 ranks over TCP on two "hosts" (network namespaces, 4 per
               namespace; tests/chaos/chaos_netns.py), the last rank (on
               the second host, --netns-victim) SIGKILLed. Target 50 ms.
  second-kill  kill-host, and rank 2 SIGKILLed as soon as the first
               survivor says it entered shrink (--second-after-ms later):
               time to ranks 0 and 1 holding a comm of 2 with its first
               allreduce done.

Each case runs in two modes, alternating run by run (the same machine
state for both): "shrink" (Comm.shrink on the first comm_faulted or
peer_dead event) and "recreate" (what an application does today without
shrink: on the peer_dead event destroy the comm, create one of the
survivors through the store under a new name, ranks renumbered; for
second-kill only shrink: a re-create that a second death interrupts waits
out its create timeout).

Ranks are bench/shrink_rank.py (the collie Python package) reacting to the
comm's event fd. A figure is the median (and maximum) over --runs runs of
the slowest survivor of each run; the breakdown gives, per phase, the
median over runs of the time the last survivor reached it (ms after the
kill): exit (the victim's pidfd became readable in the driver: the kernel
has ended the process, its sockets closed), event (collie's time_ns of the
first event), popped (the rank's loop took it), shrunk / destroyed +
created, done.

Design notes
 - The job (collie-store that outlives the ranks, with a token over two
   hosts; ranks of the second host in pid namespaces of their own so only
   links and the control channel tell a death) is bench/rank_job.py's,
   shared with bench/health_netns.py.
 - A run that fails (a survivor without DONE, wrong bytes, wrong size) is
   printed and left out of the figures, never counted as fast.
 - Every wait is bounded; every process is killed in the end.

Usage (root, for the namespaces): bench/shrink_netns.py [--runs 10]
  [--what kill-host,kill-netns,second-kill] [--netns-victim 7]
  [--second-after-ms 0]
"""

import os
import select
import signal
import statistics
import time

from rank_job import ROOT, Job, bench_args, two_hosts

RANK_PY = os.path.join(ROOT, "bench", "shrink_rank.py")
LIFE_S = 90  # a rank's own bound
PHASES = {"shrink": ("exit", "event", "popped", "shrunk", "done"),
          "recreate": ("exit", "event", "popped", "destroyed", "created", "done")}


def one_run(hosts, env, n, victim, mode, second, second_after_ms=0.0):
    """One job: kill `victim` (then `second`, second_after_ms after the
    first survivor entered shrink); per survivor its phases (ms after the
    kill) and DONE fields."""
    job = Job(hosts, env, n, RANK_PY, [mode, victim, LIFE_S])
    try:
        job.wait_up(60)
        time.sleep(0.5)  # idle
        vpid = job.pid(victim)
        spid = job.pid(second) if second is not None else None
        gone = os.pidfd_open(vpid)  # readable once the kernel has ended the process
        t0 = time.monotonic_ns()
        os.kill(vpid, signal.SIGKILL)
        select.select([gone], [], [], 5)
        exit_ms = (time.monotonic_ns() - t0) / 1e6
        os.close(gone)
        extra, late = "", False
        if second is not None:
            cue = job.wait_for(lambda: any(job.said(r, "SH ") for r in range(n)), 10)
            sh = min((int(ln.split()[2]) for r in range(n) for ln in job.said(r, "SH ")),
                     default=time.monotonic_ns())
            time.sleep(max(0.0, (sh + second_after_ms * 1e6 - time.monotonic_ns()) / 1e9))
            t1 = time.monotonic_ns()
            os.kill(spid, signal.SIGKILL)
            extra = "second kill %.2f ms after the first (%.2f ms after the first SH)" % (
                (t1 - t0) / 1e6, (t1 - sh) / 1e6) if cue else "no survivor entered shrink"
        survivors = [r for r in range(n) if r not in (victim, second)]
        job.wait_for(lambda: all(job.said(r, "DONE ") or job.said(r, "ERR")
                                 for r in survivors), 30)
        if second is not None:
            # too late to count: the survivors made a comm without only the
            # first victim, whose first allreduce had the second's bytes
            late = all(job.said(r, "DONE ") and job.said(r, "DONE ")[0].split()[2] == str(n - 1)
                       for r in survivors)
            if late:
                extra += ": too late, the comm of %d had its first allreduce" % (
                    n - 1)
        res = {}
        for r in survivors:
            ph = {ln.split()[1]: (int(ln.split()[2]) - t0) / 1e6 for ln in job.said(r, "T ")}
            done = job.said(r, "DONE ")
            ph["exit"] = exit_ms
            res[r] = {"phases": ph, "done": done[0].split() if done else None,
                      "notes": job.said(r, "RETRY") + job.said(r, "ERR")}
        return res, extra, late
    finally:
        job.close()


def check_run(res, want_size):
    """Why the run does not count, or None."""
    for r, v in res.items():
        d = v["done"]
        if d is None:
            return "rank %d: no DONE (%s)" % (r, v["notes"] or "silent")
        if int(d[2]) != want_size or d[3] != d[4]:
            return "rank %d: size %s, sum %s want %s" % (r, d[2], d[3], d[4])
    return None


def row(label, vals, target):
    print("| %s | %d | %.1f | %.1f | %s |" % (label, len(vals), statistics.median(vals),
                                             max(vals), target), flush=True)


def main():
    a = bench_args(__doc__, "kill-host,kill-netns,second-kill", netns_victim=7,
                   second_after_ms=0.0)
    what = a.what
    cases = []  # (name, hosts?, n, victim, second, modes, target)
    if "kill-host" in what:
        cases.append(("kill-host", False, 4, 3, None, ("shrink", "recreate"), "<= 10 ms"))
    if "kill-netns" in what:
        cases.append(("kill-netns", True, 8, a.netns_victim, None, ("shrink", "recreate"),
                      "<= 50 ms"))
    if "second-kill" in what:
        cases.append(("second-kill", False, 4, 3, 2, ("shrink",), "bound stated"))
    if a.second_after_ms:
        print("second kill %.1f ms after the first survivor entered shrink" % a.second_after_ms)
    hosts = two_hosts("shrink_netns") if any(c[1] for c in cases) else None
    print("load average at the start: %.2f %.2f %.2f" % os.getloadavg(), flush=True)
    results, notes = {}, []
    try:
        for name, netns, n, victim, second, modes, target in cases:
            env = {"COLLIE_CPU_TRANSPORT": "tcp" if netns else "auto"}
            want = n - 1 - (second is not None)
            for i in range(a.runs):
                order = modes if i % 2 == 0 else tuple(reversed(modes))
                for mode in order:
                    res, extra, late = one_run(hosts if netns else None, env, n, victim, mode, second,
                                         a.second_after_ms)
                    bad = "not counted" if late else check_run(res, want)
                    retries = sorted({x for v in res.values() for x in v["notes"]})
                    if bad or retries or extra:
                        notes.append("%s %s run %d: %s%s%s" % (
                            name, mode, i, bad or "ok", "; " + extra if extra else "",
                            "; " + " | ".join(retries) if retries else ""))
                        print(notes[-1], flush=True)
                    if not bad:
                        results.setdefault((name, mode), []).append(res)
    finally:
        if hosts:
            hosts.cleanup()
    print("load average at the end: %.2f %.2f %.2f" % os.getloadavg(), flush=True)
    print("\n| case | mode | runs | kill to every survivor done: median ms | max ms | target |"
          "\n|---|---|---|---|---|---|")
    for name, netns, n, victim, second, modes, target in cases:
        for mode in modes:
            runs = results.get((name, mode), [])
            if runs:
                row("%s (%d ranks, rank %d killed%s) | %s" % (
                    name, n, victim, ", then rank %d" % second if second is not None else "",
                    mode), [max(v["phases"]["done"] for v in r.values()) for r in runs],
                    target if mode == "shrink" else "-")
    print("\nBreakdown: per phase, the median (max) over runs of the last survivor to "
          "reach it, ms after the kill.\n")
    for name, netns, n, victim, second, modes, target in cases:
        for mode in modes:
            runs = results.get((name, mode), [])
            if not runs:
                continue
            cells = []
            for ph in PHASES[mode]:
                vals = [max(v["phases"][ph] for v in r.values()) for r in runs]
                cells.append("%s %.2f (%.2f)" % (ph, statistics.median(vals), max(vals)))
            print("- %s, %s: %s" % (name, mode, "; ".join(cells)), flush=True)
    print("\nEach run's slowest survivor, kill to done (ms, sorted):\n")
    for name, netns, n, victim, second, modes, target in cases:
        for mode in modes:
            done = sorted(max(v["phases"]["done"] for v in r.values())
                          for r in results.get((name, mode), []))
            print("- %s, %s: %s" % (name, mode, " ".join("%.1f" % d for d in done)))


if __name__ == "__main__":
    main()
