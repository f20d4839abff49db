#!/usr/bin/env python3
"""health_netns.py - issue 32's peer-health targets, measured.

  kill-netns  4 ranks over TCP, 2 per network namespace (two "hosts" made by
              tests/chaos/chaos_netns.py), idle after one allreduce; rank 3
              SIGKILLed: time from the kill to the "peer_dead" event on
              every survivor's fd. Its linked survivors see the connection
              close; the one without a link learns it from the abort
              notice on the control channel (the store).
  stop-netns  the same, rank 3 SIGSTOPped: time to "peer_suspected" on its
              linked survivors, against the bound COLLIE_SUSPECT_MS + one
              COLLIE_HEARTBEAT_MS.
  kill-host   4 ranks on this host (COLLIE_CPU_TRANSPORT=auto: shared
              memory), rank 3 SIGKILLed: time to "peer_dead" everywhere.
  idle        4 ranks on this host, idle after one allreduce: each rank's
              CPU time over 10 s (/proc/<pid>/stat utime + stime) with
              heartbeats off, at the default period and at 100 ms.

Ranks are bench/health_rank.py (the collie Python package); an event's
time is when collie saw it (its time_ns), and when the rank's own loop
popped it. Every figure is a median (and the maximum) over --runs runs
of the slowest survivor of each run.

Design notes
 - The job (the store, ranks on two "hosts", rank 3 in a pid namespace of
   its own so only the links and the control channel tell its death) is
   bench/rank_job.py's, shared with bench/shrink_netns.py.
 - Every wait is bounded; every process is killed in the end.

Usage (root, for the namespaces): bench/health_netns.py [--runs 10]
  [--what kill-netns,stop-netns,kill-host,idle] [--heartbeat-ms 1000]
  [--suspect-ms 5000]
"""

import os
import signal
import statistics
import time

from rank_job import ROOT, Job, bench_args, two_hosts

N, VICTIM = 4, 3
RANK_PY = os.path.join(ROOT, "bench", "health_rank.py")


def start(hosts, env, life_s):
    """A store and N health_rank.py ranks; rank VICTIM waits to be signalled."""
    return Job(hosts, env, N, RANK_PY, [VICTIM, life_s])


def event_ms(job, r, kind, t0):
    """(seen, popped) ms after t0 of rank r's first `kind` event for VICTIM."""
    for ln in job.lines[r]:
        f = ln.split()
        if f[:3] == ["EV", kind, str(VICTIM)]:
            return (int(f[3]) - t0) / 1e6, (int(f[4]) - t0) / 1e6
    return None


def one_run(hosts, env, sig, kind, bound_s):
    """Start a job, signal rank 3, collect each survivor's `kind` event."""
    job = start(hosts, env, life_s=bound_s + 40)
    try:
        job.wait_up()
        linked = {r: job.said(r, "up ")[0].split()[2] == "1" for r in range(N) if r != VICTIM}
        time.sleep(0.5)  # idle
        victim = job.pid(VICTIM)
        t0 = time.monotonic_ns()
        os.kill(victim, sig)
        want = [r for r in linked if kind == "peer_dead" or linked[r]]
        job.wait_for(lambda: all(event_ms(job, r, kind, t0) for r in want), bound_s)
        return {r: (linked[r], event_ms(job, r, kind, t0)) for r in want}
    finally:
        if sig == signal.SIGSTOP:
            try:
                os.kill(job.pid(VICTIM), signal.SIGKILL)
            except OSError:
                pass
        job.close()


def cpu_ticks(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)


def idle_cpu(env, seconds=10.0):
    """Each rank's share of one core over `seconds`, idle after one allreduce."""
    job = start(None, env, life_s=seconds + 30)
    try:
        job.wait_up()
        time.sleep(1.0)
        pids = [job.pid(r) for r in range(N)]
        before, t = [cpu_ticks(p) for p in pids], time.monotonic()
        time.sleep(seconds)
        after, dt = [cpu_ticks(p) for p in pids], time.monotonic() - t
        hz = os.sysconf("SC_CLK_TCK")
        return [100.0 * (a - b) / hz / dt for a, b in zip(after, before)]
    finally:
        job.close()


def summary(name, per_run, target):
    """Medians and maxima over runs of the slowest survivor (seen, popped)."""
    seen = [v[0] for v in per_run]
    popped = [v[1] for v in per_run]
    print("| %s | %d | %.1f | %.1f | %.1f | %.1f | %s |" % (
        name, len(per_run), statistics.median(seen), max(seen), statistics.median(popped),
        max(popped), target), flush=True)


def main():
    a = bench_args(__doc__, "kill-netns,stop-netns,kill-host,idle", heartbeat_ms=1000,
                   suspect_ms=5000)
    what = a.what
    hb = {"COLLIE_HEARTBEAT_MS": str(a.heartbeat_ms), "COLLIE_SUSPECT_MS": str(a.suspect_ms)}
    print("| measure | runs | seen median ms | seen max ms | popped median ms | popped max ms "
          "| target |\n|---|---|---|---|---|---|---|", flush=True)
    hosts = None
    if any(w.endswith("-netns") for w in what):
        hosts = two_hosts("health_netns")
    try:
        tcp = dict(hb, COLLIE_CPU_TRANSPORT="tcp")
        if "kill-netns" in what:
            res = [one_run(hosts, tcp, signal.SIGKILL, "peer_dead", 10) for _ in range(a.runs)]
            for label, pick in (("every survivor", lambda l: True),
                                ("linked (connection closed)", lambda l: l),
                                ("unlinked (abort notice)", lambda l: not l)):
                rows = []
                for run in res:
                    vals = [v for l, v in run.values() if pick(l)]
                    if vals and all(vals):
                        rows.append((max(v[0] for v in vals), max(v[1] for v in vals)))
                    elif vals:
                        print("| kill-netns, %s: a survivor saw no peer_dead: %s |" % (label, run))
                if rows:
                    summary("TCP, 2 netns, SIGKILL -> peer_dead, " + label, rows, "<= 100 ms")
        if "stop-netns" in what:
            bound = a.suspect_ms + a.heartbeat_ms
            rows = []
            for _ in range(a.runs):
                run = one_run(hosts, tcp, signal.SIGSTOP, "peer_suspected", bound / 1000 + 10)
                if all(v for _, v in run.values()):
                    rows.append((max(v[0] for _, v in run.values()),
                                 max(v[1] for _, v in run.values())))
                else:
                    print("| stop-netns: a linked survivor saw no peer_suspected: %s |" % run)
            if rows:
                summary("TCP, 2 netns, SIGSTOP -> peer_suspected (linked survivors; "
                        "heartbeat %d ms, suspect %d ms)" % (a.heartbeat_ms, a.suspect_ms),
                        rows, "<= %d ms" % bound)
        if "kill-host" in what:
            env = dict(hb, COLLIE_CPU_TRANSPORT="auto")
            rows = []
            for _ in range(a.runs):
                run = one_run(None, env, signal.SIGKILL, "peer_dead", 10)
                vals = [v for _, v in run.values()]
                if all(vals):
                    rows.append((max(v[0] for v in vals), max(v[1] for v in vals)))
                else:
                    print("| kill-host: a survivor saw no peer_dead: %s |" % run)
            if rows:
                summary("one host (auto), SIGKILL -> peer_dead, every survivor", rows,
                        "<= 100 ms")
        if "idle" in what:
            print("\n| idle, 4 ranks on one host | % of a core per rank over 10 s |\n|---|---|")
            for label, env in (("heartbeats off (COLLIE_HEARTBEAT_MS=0)",
                                {"COLLIE_HEARTBEAT_MS": "0"}),
                               ("default (1000 ms, suspect 5000 ms)", {}),
                               ("100 ms, suspect 500 ms",
                                {"COLLIE_HEARTBEAT_MS": "100", "COLLIE_SUSPECT_MS": "500"})):
                pct = idle_cpu(env)
                print("| %s | %s |" % (label, ", ".join("%.2f" % p for p in pct)), flush=True)
    finally:
        if hosts:
            hosts.cleanup()


if __name__ == "__main__":
    main()
