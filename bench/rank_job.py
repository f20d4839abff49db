"""rank_job.py - what bench/health_netns.py and bench/shrink_netns.py share:
a collie-store and N Python rank processes, on this host or over two
"hosts" (network namespaces, tests/chaos/chaos_netns.py), whose lines the
driver reads with bounded waits.

Design notes
 - The store (collie-store) outlives the ranks, as shrink needs. Over two
   hosts it runs in the first namespace on the control link with a per-run
   token (so the ranks' TCP frames carry a MAC, as in a real job); ranks
   listen on the data link (COLLIE_SOCKET_ADDR). Ranks 0..n/2-1 are on the
   first host, the others on the second.
 - Each rank of the second namespace also gets a pid namespace of its own
   (unshare --pid --fork --mount-proc), as a rank on another machine has:
   the same-host pidfd watch (comm/health.c) keys peers by boot id and pid
   namespace, so no rank watches a "remote" rank's process and only the
   links and the control channel tell. Such a rank's own process is the
   child of its unshare (Job.pid).
 - Every wait is bounded; close() kills every rank (the process under an
   unshare first: killing unshare alone would orphan it) and the store.
"""

import argparse
import os
import secrets
import select
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "chaos"))
import chaos_netns  # noqa: E402

PY = os.environ.get("PYTHON", "/usr/bin/python3")
STORE = os.path.join(ROOT, "build", "bin", "collie-store")


def bench_args(doc, what, **more):
    """The command line: --runs, --what (a comma list, default `what`; a
    list in the result) and --<name> for each of `more` (name=default, its
    type the default's)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--what", default=what)
    for name, default in more.items():
        ap.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    a = ap.parse_args()
    a.what = a.what.split(",")
    return a


def two_hosts(who):
    """Two network namespaces, made (chaos_netns.Hosts; call cleanup()), or
    exit naming why they cannot be made here."""
    why = chaos_netns.unavailable()
    if why:
        sys.exit("%s: %s" % (who, why))
    hosts = chaos_netns.Hosts()
    hosts.setup()
    return hosts


class Job:
    """A store and n ranks, each `PY rank_py ROOT *args`; `hosts` None: this
    host only. `env` is added to each rank's environment (COLLIE_* of the
    driver's own are dropped)."""

    def __init__(self, hosts, env, n, rank_py, args):
        self.procs, self.buf, self.lines, self.n = [], {}, {}, n
        base = {k: v for k, v in os.environ.items() if not k.startswith("COLLIE_")}
        if hosts:
            base["COLLIE_STORE_TOKEN"] = secrets.token_hex(16)
        bind = chaos_netns.CONTROL_ADDR[0] if hosts else "127.0.0.1"
        pre = hosts.exec_prefix(0) if hosts else []
        self.store = subprocess.Popen(pre + [STORE, "--port", "0", "--bind", bind], env=base,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      text=True)
        line = self._readline(self.store, 10)
        if "listening on" not in line:
            self.close()
            raise RuntimeError("collie-store did not start: %r" % line)
        addr = line.split()[-1]
        for r in range(n):
            e = dict(base, COLLIE_STORE_ADDR=addr, COLLIE_RANK=str(r), COLLIE_WORLD_SIZE=str(n),
                     **env)
            cmd = [PY, rank_py, ROOT] + [str(a) for a in args]
            if hosts:
                node = r * 2 // n
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
        if not fds:
            time.sleep(timeout)
            return
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

    def wait_up(self, timeout=40):
        """Every rank said "up ..."; raises RuntimeError otherwise."""
        if not self.wait_for(lambda: all(self.said(r, "up ") for r in range(self.n)), timeout):
            raise RuntimeError("the ranks did not come up: %s" % self.lines)

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

    def close(self):
        for r, p in enumerate(self.procs):
            if p.poll() is None:
                own = self.pid(r)
                if own != p.pid:
                    try:
                        os.kill(own, 9)
                    except OSError:
                        pass
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
            self.store.wait(10)
