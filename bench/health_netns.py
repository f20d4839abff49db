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
 - Each rank of the second namespace also gets a pid namespace of its own
   (unshare --pid --fork --mount-proc), as a rank on another machine has:
   the same-host pidfd watch (comm/health.c) keys peers by boot id and pid
   namespace, so no rank watches a "remote" rank's process and only the
   links and the control channel tell. rank 3's process is the child of
   its unshare (read from /proc/<pid>/task/<pid>/children).
 - The store (collie-store) runs in the first namespace on the control
   link with a per-run token (so the ranks' TCP frames carry a MAC, as in
   a real job); ranks listen on the data link (COLLIE_SOCKET_ADDR).
 - Every wait is bounded; every process is killed in the end.

Usage (root, for the namespaces): bench/health_netns.py [--runs 10]
  [--what kill-netns,stop-netns,kill-host,idle] [--heartbeat-ms 1000]
  [--suspect-ms 5000]
"""

import argparse
import os
import secrets
import select
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "chaos"))
import chaos_netns  # noqa: E402

PY = os.environ.get("PYTHON", "/usr/bin/python3")
N, VICTIM = 4, 3
RANK_PY = os.path.join(ROOT, "bench", "health_rank.py")
STORE = os.path.join(ROOT, "build", "bin", "collie-store")


class Job:
    """A store and N ranks; `hosts` None: this host only."""

    def __init__(self, hosts, env, life_s):
        self.procs, self.buf, self.lines = [], {}, {}
        token = secrets.token_hex(16)
        base = {k: v for k, v in os.environ.items() if not k.startswith("COLLIE_")}
        if hosts:
            base["COLLIE_STORE_TOKEN"] = token
        bind = chaos_netns.CONTROL_ADDR[0] if hosts else "127.0.0.1"
        pre = hosts.exec_prefix(0) if hosts else []
        self.store = subprocess.Popen(pre + [STORE, "--port", "0", "--bind", bind], env=base,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      text=True)
        line = self._readline(self.store, 10)
        if "listening on" not in line:
            raise RuntimeError("collie-store did not start: %r" % line)
        addr = line.split()[-1]
        for r in range(N):
            e = dict(base, COLLIE_STORE_ADDR=addr, COLLIE_RANK=str(r), COLLIE_WORLD_SIZE=str(N),
                     **env)
            cmd = [PY, RANK_PY, ROOT, str(VICTIM), str(life_s)]
            if hosts:
                node = r * 2 // N
                e["COLLIE_SOCKET_ADDR"] = chaos_netns.DATA_ADDR[node]
                if node == 1:
                    cmd = ["unshare", "--pid", "--fork", "--mount-proc"] + cmd
                cmd = hosts.exec_prefix(node) + cmd
            self.procs.append(subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE,
                                               stderr=subprocess.DEVNULL, text=True))
            self.buf[r], self.lines[r] = "", []

    @staticmethod
    def _readline(p, timeout):
        r, _, _ = select.select([p.stdout], [], [], timeout)
        return p.stdout.readline() if r else ""

    def pump(self, timeout):
        """Read what the ranks said within timeout (seconds)."""
        fds = {p.stdout.fileno(): r for r, p in enumerate(self.procs) if p.stdout}
        ready, _, _ = select.select(list(fds), [], [], timeout)
        for fd in ready:
            r = fds[fd]
            data = os.read(fd, 65536).decode(errors="replace")
            if not data:
                self.procs[r].stdout.close()
                self.procs[r].stdout = None
                continue
            self.buf[r] += data
            *done, self.buf[r] = self.buf[r].split("\n")
            self.lines[r] += done

    def wait_for(self, pred, timeout):
        end = time.monotonic() + timeout
        while not pred() and time.monotonic() < end:
            self.pump(min(0.05, max(0.0, end - time.monotonic())))
        return pred()

    def said(self, r, prefix):
        return [ln for ln in self.lines[r] if ln.startswith(prefix)]

    def pid(self, r):
        """The rank's own process (under unshare: its child)."""
        p = self.procs[r].pid
        try:
            with open("/proc/%d/task/%d/children" % (p, p)) as f:
                kids = f.read().split()
            return int(kids[0]) if kids and os.path.basename(
                os.readlink("/proc/%d/exe" % p)).startswith("unshare") else p
        except OSError:
            return p

    def event_ms(self, r, kind, t0):
        """(seen, popped) ms after t0 of rank r's first `kind` event for VICTIM."""
        for ln in self.lines[r]:
            f = ln.split()
            if f[:3] == ["EV", kind, str(VICTIM)]:
                return (int(f[3]) - t0) / 1e6, (int(f[4]) - t0) / 1e6
        return None

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.store.terminate()
        try:
            self.store.wait(10)
        except subprocess.TimeoutExpired:
            self.store.kill()


def one_run(hosts, env, sig, kind, bound_s):
    """Start a job, signal rank 3, collect each survivor's `kind` event."""
    job = Job(hosts, env, life_s=bound_s + 40)
    try:
        if not job.wait_for(lambda: all(job.said(r, "up ") for r in range(N)), 40):
            raise RuntimeError("the ranks did not come up: %s" % job.lines)
        linked = {r: job.said(r, "up ")[0].split()[2] == "1" for r in range(N) if r != VICTIM}
        time.sleep(0.5)  # idle
        victim = job.pid(VICTIM)
        t0 = time.monotonic_ns()
        os.kill(victim, sig)
        want = [r for r in linked if kind == "peer_dead" or linked[r]]
        job.wait_for(lambda: all(job.event_ms(r, kind, t0) for r in want), bound_s)
        return {r: (linked[r], job.event_ms(r, kind, t0)) for r in want}
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
    job = Job(None, env, life_s=seconds + 30)
    try:
        if not job.wait_for(lambda: all(job.said(r, "up ") for r in range(N)), 40):
            raise RuntimeError("the ranks did not come up")
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
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--what", default="kill-netns,stop-netns,kill-host,idle")
    ap.add_argument("--heartbeat-ms", type=int, default=1000)
    ap.add_argument("--suspect-ms", type=int, default=5000)
    a = ap.parse_args()
    what = a.what.split(",")
    hb = {"COLLIE_HEARTBEAT_MS": str(a.heartbeat_ms), "COLLIE_SUSPECT_MS": str(a.suspect_ms)}
    print("| measure | runs | seen median ms | seen max ms | popped median ms | popped max ms "
          "| target |\n|---|---|---|---|---|---|---|", flush=True)
    hosts = None
    if any(w.endswith("-netns") for w in what):
        why = chaos_netns.unavailable()
        if why:
            sys.exit("health_netns: " + why)
        hosts = chaos_netns.Hosts()
        hosts.setup()
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
