"""chaos_run.py - one chaos run: start the job, inject the driver's faults,
judge what is left.

Design notes
 - One host: one collie-run (`-n N --keep-going --timeout T`). Two hosts:
   two network namespaces (chaos_netns.py), one collie-run in each
   (`--nnodes 2 --node-rank R --store ADDR --token-file F`, one secret file,
   0600, in the run's private directory), COLLIE_SOCKET_ADDR the data link's
   address. COLLIE_CPU_TRANSPORT is the shape's transport.
 - Each collie-run is started in a session of its own (its ranks are in
   process groups of their own, but in its session): the run's processes
   are exactly those of the session, which is how the leftover check finds
   them and how a stuck run is killed whole. A signal to a rank goes only
   to a pid that is still in the run's session (no stray kill after the
   pid was reused).
 - The driver tails the reports every POLL_S and fires each scheduled fault
   when its watched rank reaches its line (chaos_sched.py). A SIGSTOPped
   rank always gets its SIGCONT (also when the run is torn down early); a
   fault whose victim has not started, already ended or is dead is not
   injected (and not counted).
 - Every wait is bounded: collie-run's own --timeout, then the driver's
   hard deadline (that plus KILL_MARGIN_S), after which the sessions are
   SIGKILLed and the run is a `hang`. A run is also a `hang` when no
   report has grown for stall_s (STALL_S) while the job runs: that tells a
   stuck job from a slow one (two cores shared with other work, the
   sanitizers), so the overall bound can be generous. Nothing of a rank's
   program is silent that long: a work ends within its deadline (at most
   12 s) plus the bounds, a round wait is 8 s (5 s in the suite).
 - A run without faults (none allowed to the ranks, none injected):
   every failure (a failed work, a refused post, a failed create or split,
   a round barrier given up) is `unexplained_failure` unless some work of
   the run ran into its own deadline and the run's first failure (the
   ranks' `end_us=`, one host's monotonic clock) was such a timeout (a
   machine too slow: the comm's fault then ends the others), or a rank
   crashed or hung. `strict` (the suite's small runs) excuses no timeout.
 - Failure as data: the failures' kinds and rank sets are held to the
   kills, stops and link faults the driver made (when) and to what the
   ranks did (chaos_faults.py).
 - A run in which no work ended OK is `vacuous`; a barrier that ended OK
   on a rank before another rank posted it is `wrong_ok` (post_us/end_us). The rank cannot tell this alone: a peer's fault
   fails its works with allowed statuses.
 - The oracle's process-level part (the rank checks its works itself):
   every violation line of a report; a rank that wrote no `end` and was not
   killed by us (`hang` when the job ran into its timeout, else `crash`);
   a rank that exited other than 0 (3: it reported a violation; a signal we
   did not send, or another code: `crash`); an unparsable report line
   (`bad_report`); a collie-run that failed by itself (`launcher`); a
   process of the run alive after collie-run ended, or a file in /dev/shm
   whose name holds "collie" that was not there before (`leak`: collie's
   shared memory is memfds and must leave nothing behind, however a rank
   died).
"""

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import chaos_elastic
import chaos_faults
import chaos_netns
from chaos_report import RankReport
from chaos_sched import AT_SHRINK, HARMLESS_FAULTS, schedule

POLL_S = 0.01
SUB_ABORT_BOUND_MS = 2000  # a split after its parent's abort (chaos_rank.c CH_ABORT_BOUND_MS)
SUB_ABORT_EXCUSE_S = 1.0  # a kill or stop this long before such an abort excuses a slow split
STALL_S = 60  # no report line from any rank for this long: the run hangs
KILL_MARGIN_S = 15  # collie-run's grace (3 s) and reap bound (5 s), and some
LEFTOVER_WAIT_S = 3  # processes of the run may take this long to go
MAX_IDS = 16  # world ids of an elastic run, replacements included (chaos_prog.h CH_MAX_RANKS)


def dev_shm_collie():
    try:
        return {n for n in os.listdir("/dev/shm") if "collie" in n}
    except OSError:
        return set()


def proc_stat(pid):
    """(state, session, comm) of a pid, or None if it is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            s = f.read().decode(errors="replace")
    except OSError:
        return None
    comm = s[s.find("(") + 1:s.rfind(")")]
    rest = s[s.rfind(")") + 2:].split()
    try:
        return rest[0], int(rest[3]), comm
    except (IndexError, ValueError):
        return None


def session_pids(sid):
    """Live (not zombie) processes of session sid: {pid: comm}."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        st = proc_stat(int(d))
        if st and st[1] == sid and st[0] != "Z":
            out[int(d)] = st[2]
    return out


def kill_session(sid):
    for pid in session_pids(sid):
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


class Result:
    def __init__(self, shape):
        self.shape = shape
        self.violations = []  # (kind, rank or None, text)
        self.skipped = None  # why, when the run could not be made here
        self.injected = {}  # driver faults by kind
        self.not_injected = 0
        self.rank_faults = {}
        self.works = self.works_ok = self.bytes_checked = 0
        self.rounds = 0
        self.statuses = {}
        self.seconds = 0.0
        self.dir = None
        self.elastic_stats = chaos_elastic.Stats()
        self.events = []  # what the driver did, with times
        self.fault_stats = chaos_faults.Stats()  # the failures' fault kinds and empty sets

    def failed(self):
        return bool(self.violations)

    def kinds(self):
        return sorted({k for k, _, _ in self.violations})

    def add(self, kind, rank, text):
        self.violations.append((kind, rank, text))

    def count(self, table, kind, n=1):
        table[kind] = table.get(kind, 0) + n


EXIT_RE = re.compile(r"^collie-run: rank (\d+) (exited with status (\d+)|killed by signal (\S+))")


def _launcher_verdicts(log_path):
    """{rank: (code or None, signal name or None)} from a collie-run log,
    and whether the job timed out."""
    out, timed_out = {}, False
    try:
        with open(log_path, "rb") as f:
            for raw in f:
                line = raw.decode(errors="replace")
                m = EXIT_RE.match(line)
                if m:
                    out[int(m.group(1))] = (int(m.group(3)) if m.group(3) else None, m.group(4))
                elif line.startswith("collie-run: job timed out"):
                    timed_out = True
    except OSError:
        pass
    return out, timed_out


def _tail(path, n=15):
    try:
        with open(path, "rb") as f:
            lines = f.read().decode(errors="replace").splitlines()
        return lines[-n:]
    except OSError:
        return []


def run_once(shape, build="build", timeout_s=300, keep=False, verbose=False, log=print,
             rank_prog=None, extra_env=None, stall_s=STALL_S, strict=False):
    """Run one shape; a Result. rank_prog and extra_env replace the rank
    program and add to its environment (the driver's self-test)."""
    res = Result(shape)
    hosts = None
    if shape.hosts == 2:
        why = chaos_netns.unavailable()
        if why:
            res.skipped = "two hosts need network namespaces: " + why
            return res
    collie_run = os.path.join(build, "bin", "collie-run")
    rank_prog = rank_prog or os.path.join(build, "tests", "chaos", "chaos_rank")
    for p in (collie_run, rank_prog):
        if not os.access(p, os.X_OK):
            res.skipped = "%s is not built (make tests)" % p
            return res
    collie_run, rank_prog = os.path.abspath(collie_run), os.path.abspath(rank_prog)
    run_dir = tempfile.mkdtemp(prefix="collie-chaos-%d-" % shape.seed)
    res.dir = run_dir
    report_dir = os.path.join(run_dir, "report")
    os.mkdir(report_dir)
    shm_before = dev_shm_collie()
    faults = schedule(shape)
    n = shape.ranks
    reports = [RankReport(r) for r in range(n)]
    files = {}
    procs, logs = [], []
    killed = {}  # rank -> monotonic time of our SIGKILL
    stopped = {}  # rank -> monotonic time of its SIGCONT
    signalled = []  # (from, to): monotonic times of our kills (from == to) and stops
    stops_at = {}  # rank -> [monotonic times of our SIGSTOPs]
    link_downs = []  # monotonic times the data link went down
    link_down, link_up_at = False, None
    joiners = {}  # world id -> Popen of a replacement (an elastic run's grow)
    grows_served = set()  # the comms whose grow_enter the driver answered
    timed_out = False
    hang_why = "the job's timeout (%d s)" % timeout_s
    t0 = time.monotonic()

    def note(what):
        res.events.append("+%.3fs %s" % (time.monotonic() - t0, what))
        if verbose:
            log("  " + res.events[-1])

    def rank_sig(rank, sig):
        pid = reports[rank].pid
        st = proc_stat(pid) if pid else None
        if not st or st[0] == "Z" or st[1] not in [p.pid for p in procs] + [
                j.pid for j in joiners.values()]:
            return False
        try:
            os.kill(pid, sig)
            return True
        except OSError:
            return False

    def live(q):
        rep = reports[q]
        return rep.pid is not None and rep.end is None and q not in killed

    def next_live(first, kind):
        """An AT_SHRINK fault's victim: `first`, else the next rank that is
        running (and not stopped), one that has not entered the shrink yet
        if there is one (a stop then lands before its proposal: the others
        may leave it out, and it must learn so when it resumes); a kill
        leaves at least one other."""
        ids = len(reports)
        if kind == "kill" and sum(live(q) for q in range(ids)) < 2:
            return None
        order = [(first + i) % ids for i in range(ids)]
        for q in ([q for q in order if not reports[q].shrink_enters] + order):
            if live(q) and q not in stopped:
                return q
        return None

    def start_joiners(now):
        """An elastic run's grow: the members wrote grow_enter (how many they
        take); start that many replacements, which join by the family name,
        once per comm."""
        for rep in list(reports):
            for g in rep.grow_enters:
                comm = g.get("comm")
                if comm in grows_served:
                    continue
                grows_served.add(comm)
                store = next((r.start.get("store") for r in reports
                              if r.start and r.start.get("store", "-") != "-"), None)
                for _ in range(int(g.get("count", "0") or 0)):
                    jid = len(reports)
                    if jid >= MAX_IDS or store is None:
                        res.not_injected += 1
                        note("no replacement for the grow of %s (%s)" % (
                            comm, "no store address" if store is None else "ids used up"))
                        break
                    jenv = dict(env)
                    jenv["COLLIE_STORE_ADDR"] = store
                    cmd = rank_cmd + ["--join", str(jid), "--world", str(n)]
                    with open(os.path.join(run_dir, "joiner-%d.log" % jid), "wb") as out:
                        joiners[jid] = subprocess.Popen(
                            cmd, env=jenv, stdin=subprocess.DEVNULL, stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True)
                    reports.append(RankReport(jid))
                    res.count(res.injected, "replacement")
                    note("replacement %d started for the grow of %s" % (jid, comm))

    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("COLLIE_")}
        env["COLLIE_CPU_TRANSPORT"] = shape.transport
        env["COLLIE_LOG"] = os.environ.get("CHAOS_COLLIE_LOG", "error")
        env["CHAOS_ROUND_WAIT_MS"] = str(shape.round_wait_ms)
        if "grow" in shape.faults:  # the replacements need the job's secret
            env["COLLIE_STORE_TOKEN"] = secrets.token_hex(32)
        env.update(extra_env or {})
        rank_cmd = [rank_prog, "--seed", str(shape.seed), "--report", report_dir, "--rounds",
                    str(shape.rounds), "--ops", str(shape.ops), "--inflight-max",
                    str(shape.inflight), "--faults", shape.rank_faults()]
        run_opts = ["--keep-going", "--timeout", str(timeout_s)]
        if shape.hosts == 1:
            cmds = [([collie_run, "-n", str(n)] + run_opts + ["--"] + rank_cmd, env)]
        else:
            hosts = chaos_netns.Hosts()
            try:
                hosts.setup()
            except RuntimeError as e:
                res.skipped = "two hosts need network namespaces: %s" % e
                hosts = None
                return res
            token = os.path.join(run_dir, "token")
            fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, (secrets.token_hex(32) + "\n").encode())
            os.close(fd)
            cmds = []
            for node in (0, 1):
                e = dict(env)
                e["COLLIE_SOCKET_ADDR"] = chaos_netns.DATA_ADDR[node]
                cmds.append((hosts.exec_prefix(node) + [
                    collie_run, "-n", str(n), "--nnodes", "2", "--node-rank", str(node),
                    "--store", hosts.store_addr(), "--token-file", token] + run_opts + ["--"] +
                    rank_cmd, e))
        for i, (cmd, e) in enumerate(cmds):
            lp = os.path.join(run_dir, "node-%d.log" % i)
            logs.append(lp)
            with open(lp, "wb") as out:
                procs.append(subprocess.Popen(cmd, env=e, stdin=subprocess.DEVNULL, stdout=out,
                                              stderr=subprocess.STDOUT, start_new_session=True))
        with open(os.path.join(run_dir, "command"), "w") as f:
            for cmd, _ in cmds:
                f.write(" ".join(cmd) + "\n")
        hard_deadline = t0 + timeout_s + KILL_MARGIN_S
        pending = list(faults)
        last_growth, last_lines = t0, 0
        while True:
            now = time.monotonic()
            lines = sum(rep.lines for rep in reports)
            if lines != last_lines:
                last_lines, last_growth = lines, now
            elif now - last_growth > stall_s:
                timed_out = True
                hang_why = "%d s without a new report line from any rank" % stall_s
                note("stalled: no report grew for %d s; killing the run" % stall_s)
                break
            for r in range(len(reports)):
                if r not in files:
                    try:
                        files[r] = open(os.path.join(report_dir, "rank-%d.log" % r), "rb")
                    except OSError:
                        continue
                data = files[r].read()
                if data:
                    reports[r].feed(data)
            start_joiners(now)
            shrinking = any(rep.shrink_enters for rep in reports)
            for f in list(pending):
                if f.watch == AT_SHRINK:
                    if not shrinking:
                        continue
                    f.rank = next_live(f.rank, f.kind)
                    if f.rank is None:
                        pending.remove(f)
                        res.not_injected += 1
                        continue
                elif reports[f.watch].lines < f.at_line:
                    continue
                if f.kind == "link":
                    pending.remove(f)
                    if link_down:
                        res.not_injected += 1
                        continue
                    ok, why = hosts.data_link(False)
                    if not ok:
                        res.add("driver", None, "cannot set the link down: %s" % why)
                        continue
                    link_down = True
                    link_downs.append(now)
                    res.count(res.injected, "link_down")
                    link_up_at = now + f.pause_ms / 1000 if f.pause_ms is not None else None
                    note("link down (%s)" % ("for %d ms" % f.pause_ms if f.pause_ms is not None
                                             else "for good"))
                    continue
                rep = reports[f.rank]
                if rep.pid is None and rep.end is None:
                    continue  # not started yet: wait for it
                pending.remove(f)
                if rep.end is not None or f.rank in killed:
                    res.not_injected += 1
                    continue
                during = " during a shrink" if f.watch == AT_SHRINK else ""
                if f.kind == "kill":
                    if rank_sig(f.rank, signal.SIGKILL):
                        killed[f.rank] = now
                        signalled.append((now, now))
                        stopped.pop(f.rank, None)
                        res.count(res.injected, "kill")
                        if during:
                            res.count(res.injected, "kill_in_shrink")
                        note("SIGKILL rank %d (at its line %d)%s" % (f.rank, rep.lines, during))
                    else:
                        res.not_injected += 1
                elif f.kind == "stop":
                    if f.rank in stopped or not rank_sig(f.rank, signal.SIGSTOP):
                        res.not_injected += 1
                        continue
                    stopped[f.rank] = now + f.pause_ms / 1000
                    stops_at.setdefault(f.rank, []).append(now)
                    signalled.append((now, now + f.pause_ms / 1000 + 10 * POLL_S))
                    res.count(res.injected, "stop")
                    if during:
                        res.count(res.injected, "stop_in_shrink")
                    note("SIGSTOP rank %d for %d ms (at its line %d)%s" % (f.rank, f.pause_ms,
                                                                           rep.lines, during))
            for r, until in list(stopped.items()):
                if now >= until:
                    rank_sig(r, signal.SIGCONT)
                    del stopped[r]
                    note("SIGCONT rank %d" % r)
            if link_down and link_up_at is not None and now >= link_up_at:
                ok, why = hosts.data_link(True)
                if not ok:
                    res.add("driver", None, "cannot set the link up: %s" % why)
                link_down, link_up_at = False, None
                res.count(res.injected, "link_up")
                note("link up")
            if all(p.poll() is not None for p in procs + list(joiners.values())):
                break
            if now > hard_deadline:
                timed_out = True
                note("hard deadline: killing the run")
                break
            time.sleep(POLL_S)
    except BaseException:
        print("chaos: interrupted during the run of seed %d; its directory %s is kept" %
              (shape.seed, run_dir), file=sys.stderr)
        raise
    finally:
        for r in list(stopped):
            rank_sig(r, signal.SIGCONT)
        procs_all = procs + list(joiners.values())
        for p in procs_all:
            if p.poll() is None:
                kill_session(p.pid)
        for p in procs_all:
            try:
                p.wait(timeout=KILL_MARGIN_S)
            except subprocess.TimeoutExpired:
                res.add("hang", None, "collie-run (pid %d) did not exit after SIGKILL" % p.pid)
        # what the run left: processes of its sessions
        wait_until = time.monotonic() + LEFTOVER_WAIT_S
        left = {}
        while True:
            left = {}
            for p in procs_all:
                left.update(session_pids(p.pid))
            if not left or time.monotonic() > wait_until:
                break
            time.sleep(0.05)
        for pid, comm in sorted(left.items()):
            res.add("leak", None, "process %d (%s) of the run is alive after collie-run ended"
                    % (pid, comm))
        for p in procs_all:
            kill_session(p.pid)
        for f in files.values():
            f.close()
        if hosts:
            hosts.cleanup()
    res.seconds = time.monotonic() - t0

    # the reports, whole
    for r in range(len(reports)):
        try:
            with open(os.path.join(report_dir, "rank-%d.log" % r), "rb") as f:
                f.seek(0)
                reports[r] = RankReport(r)
                reports[r].feed(f.read())
        except OSError:
            pass
    verdicts, job_timed_out = {}, timed_out
    for lp in logs:
        v, t = _launcher_verdicts(lp)
        verdicts.update(v)
        job_timed_out = job_timed_out or t
    for jid, p in joiners.items():  # a replacement's verdict is its Popen's
        rc = p.returncode
        verdicts[jid] = ((None, signal.Signals(-rc).name) if rc is not None and rc < 0 else
                         (rc, None))
    per_node = n // len(procs) if procs else n
    for i, p in enumerate(procs):
        rc = p.returncode
        started = any(reports[r].start for r in range(i * per_node, (i + 1) * per_node))
        if rc and not timed_out and ((rc in (1, 2) and not verdicts) or not started):
            res.add("launcher", None, "collie-run of node %d exited %d%s: %s" %
                    (i, rc, "" if started else " and none of its ranks started",
                     " | ".join(_tail(logs[i], 3))))
    for r, rep in enumerate(reports):
        res.works += rep.works
        res.works_ok += rep.works_ok
        res.bytes_checked += rep.bytes_checked
        res.rounds = max(res.rounds, rep.rounds)
        for k, c in rep.statuses.items():
            res.count(res.statuses, k, c)
        for k, c in rep.faults.items():
            res.count(res.rank_faults, k, c)
        for kind, line in rep.violations:
            res.add(kind, r, line)
        for b in rep.bad:
            res.add("bad_report", r, b)
        code, sig = verdicts.get(r, (0, None))
        if r in killed:
            continue
        if sig is not None:
            res.add("crash", r, "rank %d killed by signal %s (not by the driver)" % (r, sig))
        elif code == 3 and not rep.violations:
            res.add("crash", r, "rank %d exited 3 (violation) without a violation line" % r)
        elif code not in (0, 3):
            res.add("crash", r, "rank %d exited with status %d" % (r, code))
        if rep.end is None:
            if job_timed_out:
                res.add("hang", r, "rank %d wrote no end line: %s" % (r, hang_why))
            elif not (sig is not None or code not in (0, 3)):
                res.add("crash", r, "rank %d ended without an end line (%s)" % (
                    r, "no report" if rep.start is None else "last of %d lines" % rep.lines))
    # A run without faults (none allowed to the ranks, none injected by the
    # driver, no rank's fault line; a signal storm is no fault) has nothing
    # to fail its works: a failure
    # there is explained only by a work that ran into its own deadline
    # somewhere (a slow machine; its comm's fault then ends the rest), else
    # it is a violation, as is a round barrier given up (peer_gone).
    # A rank that crashed or hung explains its peers' failures (and is a
    # violation of its own).
    # The slow-machine excuse: some work ran into its own deadline, and the
    # run's first failure (by the ranks' clocks, where the lines have `end_us=`)
    # was such a timeout; a failure before it (a spurious one) makes its
    # peers time out after it, which excuses nothing. `strict` (the suite's
    # small fixed runs): no excuse at all, so a hang until a deadline shows.
    slow = not strict and any(rep.slow_timeouts for rep in reports)
    firsts = [(rep.first_fail_t, not rep.first_fail_slow) for rep in reports
              if rep.first_fail_t is not None]
    if slow and firsts and min(firsts)[1]:
        slow = False
    harmful = [k for k in shape.rank_faults().split(",") if k not in HARMLESS_FAULTS + ("none",)]
    if (not harmful and not res.injected and
            not [k for k in res.rank_faults if k not in HARMLESS_FAULTS] and not slow and
            not {"crash", "hang", "launcher"} & set(res.kinds())):
        for r, rep in enumerate(reports):
            if rep.failures:
                res.add("unexplained_failure", r, "%d failures in a run without faults, "
                        "none excused by a timeout that came first%s; the first: %s" %
                        (rep.failures, " (strict: the suite)" if strict else "",
                         rep.first_failure))
            if rep.end is not None and rep.end.get("reason", "done") != "done":
                res.add("unexplained_failure", r, "ended with reason=%s in a run without "
                        "faults: %s" % (rep.end.get("reason"), rep.end.get("msg", "")))
    # A barrier ends OK on no rank before every rank that posted it had
    # posted it (the ranks' monotonic clocks are the host's, also across the
    # namespaces): the oracle cannot see this from one rank.
    for key in sorted(set().union(*(rep.barriers for rep in reports))):
        got = [(r, rep.barriers[key]) for r, rep in enumerate(reports) if key in rep.barriers]
        posts = [(v[1], r) for r, v in got if v[1] is not None]
        ends = [(v[2], r) for r, v in got if v[0] == "COLLIE_OK" and v[2] is not None]
        if posts and ends and min(ends)[0] < max(posts)[0]:
            res.add("wrong_ok", min(ends)[1], "barrier r=%d seq=%d comm=%d ended OK on rank %d "
                    "at %d us, before rank %d posted it at %d us" % (
                        key + (min(ends)[1], min(ends)[0], max(posts)[1], max(posts)[0])))
    # An abort during the subgroups (a rank's `fault ... phase=subgroups
    # fired_us=`): the world of that round failed then, and every split and
    # new_group on it watches it (comm_split.c, comm_create.c; before
    # eb4b3bc they waited out the create timeout, 15 s, for a rank that had
    # refused its own). So none of that round, on any rank, returns more
    # than SUB_ABORT_BOUND_MS after the later of the abort and its start,
    # less the time its rank was stopped (one host's monotonic clock, as
    # above). The aborting rank judges its own calls (chaos_rank.c). A kill
    # or stop from SUB_ABORT_EXCUSE_S before the abort to the call's end
    # excuses it: a rank killed or stopped in the middle of writing a notice
    # to the control channel holds back the notices after it (comm_ctl.c).
    for rnd in sorted(set().union(*(rep.sub_aborts for rep in reports))):
        fired = min(rep.sub_aborts[rnd] for rep in reports if rnd in rep.sub_aborts)
        for r, rep in enumerate(reports):
            if rnd in rep.sub_aborts:
                continue
            for cr, op, st, start, end, paused in rep.subgroup_calls:
                frm = max(start, fired)
                late_ms = (end - frm) // 1000 - paused
                if cr != rnd or end <= fired or late_ms <= SUB_ABORT_BOUND_MS:
                    continue
                if any(a * 1e6 <= end and b * 1e6 >= fired - SUB_ABORT_EXCUSE_S * 1e6
                       for a, b in signalled):
                    continue
                res.add("slow_after_abort", r, "%s r=%d on rank %d returned %s %d ms after "
                        "the abort of its parent during the subgroups (fired_us=%d; bound %d "
                        "ms; it was stopped %d ms)" % (op, rnd, r, st, late_ms, fired,
                                                       SUB_ABORT_BOUND_MS, paused))
    # Failure as data (chaos_faults.py): every failure's kind and rank set
    # against what the driver and the ranks did.
    us = lambda t: int(t * 1e6)  # noqa: E731 (time.monotonic is the ranks' CLOCK_MONOTONIC)
    viol, res.fault_stats = chaos_faults.check(
        reports, {r: us(t) for r, t in killed.items()},
        {r: [us(t) for t in ts] for r, ts in stops_at.items()}, [us(t) for t in link_downs],
        per_node)
    for kind, r, text in viol:
        res.add(kind, r, text)
    # An elastic run (chaos_elastic.py): every shrink's decision against
    # the kills and stops, the grows and joins.
    viol, res.elastic_stats = chaos_elastic.check(
        reports, {r: us(t) for r, t in killed.items()},
        {r: [us(t) for t in ts] for r, ts in stops_at.items()}, [us(t) for t in link_downs])
    for kind, r, text in viol:
        res.add(kind, r, text)
    # A run in which no work ended OK checked nothing: the oracle cannot
    # have failed it (a library whose every create times out passed so).
    if not res.skipped and res.works_ok == 0 and not {"crash", "hang", "launcher"} & set(
            res.kinds()):
        res.add("vacuous", None, "no work of the run ended COLLIE_OK (%d works): nothing was "
                "checked" % res.works)
    for name in sorted(dev_shm_collie() - shm_before):
        res.add("leak", None, "/dev/shm/%s was left by the run" % name)
    if res.failed() or keep:
        with open(os.path.join(run_dir, "driver.log"), "w") as f:
            f.write("\n".join(res.events) + "\n")
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
        res.dir = None
    return res
