#!/usr/bin/python3
"""chaos.py - the chaos harness's driver (docs/chaos.md).

  chaos.py --seed S --ranks N --transport tcp|shm|auto --hosts 1|2 --faults LIST
  chaos.py --seconds N              a time-boxed campaign of random runs
  chaos.py --suite                  the fixed-seed set of `make test`
  chaos.py --replay S [shape] [--count K] [--expect KINDS]
  chaos.py --self-test              the oracle catches planted faults (fake_rank.py)

Design notes
 - Python 3 standard library only, run by /usr/bin/python3 from the
   repository root (`make chaos`, `make test-chaos`); --build DIR picks the
   build (build, build/asan, build/tsan).
 - The rank program (build/tests/chaos/chaos_rank) runs the seeded program
   and checks every work itself; this driver starts the job, injects the
   process and link faults, and judges the run as a whole
   (chaos_run.py). The contract between them is docs/chaos.md's.
 - Violations fail the run, the campaign and the suite (exit 1); they are
   never warnings. A failing run prints its seed, its violations and one
   command that replays it (same rank program, same fault schedule).
 - --suite prints the cmocka runner's lines (tests/runner.c), so
   scripts/run-tests.sh and scripts/test-summary.sh count it like the test
   binaries; a shape that cannot run here (two hosts without root) is a
   skip that says why.
 - SIGTERM/SIGINT end the driver through its cleanup (sys.exit in the
   handler): stopped ranks are continued, the run's processes killed, its
   namespaces deleted.
"""

import argparse
import os
import random
import shutil
import signal
import sys
import time

sys.dont_write_bytecode = True  # nothing of ours in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chaos_run import run_once  # noqa: E402
from chaos_sched import (DEFAULT_INFLIGHT, DEFAULT_OPS, DEFAULT_ROUND_WAIT_MS, KNOWN_FAULTS,  # noqa: E402
                         DEFAULT_ROUNDS, Shape, UsageError, parse_faults, random_shape,
                         schedule)
import chaos_elastic  # noqa: E402
import chaos_faults  # noqa: E402
import chaos_netns  # noqa: E402

# The fixed-seed set of `make test` (with the self-test 94 s on this 2-core
# machine under a load of 17, most of it the two kill runs; docs/chaos.md). Each line: seed,
# ranks, transport, hosts, faults, rounds, ops, inflight-max. Their round
# wait is SUITE_ROUND_WAIT_MS: a kill costs its peers a work's deadline and
# then that.
SUITE = [
    (1, 2, "shm", 1, "none", 2, 60, 16),
    (2, 4, "tcp", 1, "cancel,deadline,disagree", 3, 60, 64),
    (14, 3, "auto", 1, "abort,destroy,cancel,deadline,stall", 3, 60, 256),
    (4, 4, "shm", 1, "kill", 3, 60, 64),
    (5, 5, "auto", 1, "stop,cancel,deadline", 3, 60, 64),
    (6, 8, "tcp", 1, "all", 2, 40, 1000),
    (7, 4, "auto", 2, "none", 2, 60, 64),
    (8, 4, "tcp", 2, "link,deadline", 3, 60, 64),
    (9, 6, "auto", 2, "kill,stop,link", 3, 40, 16),
    (10, 3, "tcp", 1, "none", 2, 60, 64),
    (20, 4, "tcp", 1, "abort", 2, 40, 64),  # an abort during split (slow_after_abort)
    # elastic: a kill, a second kill and a stop while the survivors shrink,
    # a grow that takes two replacements back (chaos_elastic.c)
    (48, 4, "auto", 1, "shrink,grow,kill,stop", 3, 40, 64),
]
SUITE_TIMEOUT_S = 90
SUITE_ROUND_WAIT_MS = 5000

# The driver's self-test: fake_rank.py plants one fault of each kind and the
# oracle must report exactly the expected violation kinds (and none for a
# clean run with kills and stops: a killed rank owes no end line).
# Each case: the planted fault, the kinds expected, the faults allowed, and
# the run's timeout and stall bounds (s). The hang is caught once by the
# job's timeout, once by the stall bound.
SELFTEST = [("clean", (), "kill,stop", 10, 5), ("wrong_ok", ("wrong_ok",), "none", 10, 5),
            ("crash", ("crash",), "none", 10, 5), ("noend", ("crash",), "none", 10, 5),
            ("hang", ("hang",), "none", 2, 60), ("stall", ("hang",), "none", 30, 1),
            ("shm", ("leak",), "none", 10, 5), ("orphan", ("leak",), "none", 10, 5),
            ("garbled", ("bad_report",), "none", 10, 5),
            ("unexplained", ("unexplained_failure",), "none", 10, 5),
            ("vacuous", ("vacuous",), "none", 10, 5),
            ("spurious", ("unexplained_failure",), "none", 10, 5),
            ("shrink_healthy", ("shrink_set",), "none", 10, 5),
            ("shrink_split", ("shrink_split",), "none", 10, 5)]
MAX_VIOLATION_LINES = 20


def out(s=""):
    print(s, flush=True)


class Summary:
    def __init__(self):
        self.runs = self.failed = self.skipped = 0
        self.works = self.works_ok = self.bytes_checked = 0
        self.injected, self.rank_faults, self.violations = {}, {}, {}
        self.shapes, self.statuses = {}, {}
        self.not_injected = 0
        self.fault_stats = chaos_faults.Stats()
        self.elastic_stats = chaos_elastic.Stats()
        self.t0 = time.monotonic()

    @staticmethod
    def _add(table, key, n=1):
        table[key] = table.get(key, 0) + n

    def add(self, res):
        if res.skipped:
            self.skipped += 1
            return
        self.runs += 1
        self.failed += res.failed()
        self.works += res.works
        self.works_ok += res.works_ok
        self.bytes_checked += res.bytes_checked
        self.not_injected += res.not_injected
        for t, src in ((self.injected, res.injected), (self.rank_faults, res.rank_faults),
                       (self.statuses, res.statuses)):
            for k, v in src.items():
                self._add(t, k, v)
        for k, _, _ in res.violations:
            self._add(self.violations, k)
        self._add(self.shapes, res.shape.kind())
        self.fault_stats.add(res.fault_stats)
        self.elastic_stats.add(res.elastic_stats)

    @staticmethod
    def _table(t):
        return ", ".join("%s %d" % kv for kv in sorted(t.items())) or "none"

    def print(self, title):
        out("%s: %d runs (%d passed, %d failed, %d skipped) in %.1f s" % (
            title, self.runs, self.runs - self.failed, self.failed, self.skipped,
            time.monotonic() - self.t0))
        out("  works: %d (%d ok, %d failed), bytes checked: %d" % (
            self.works, self.works_ok, self.works - self.works_ok, self.bytes_checked))
        out("  work statuses: %s" % self._table(self.statuses))
        out("  faults injected by the driver: %s (scheduled but not injected: %d)" % (
            self._table(self.injected), self.not_injected))
        out("  faults injected by the ranks: %s" % self._table(self.rank_faults))
        out("  failures by fault kind: %s" % self.fault_stats.text())
        out("  shrink and grow: %s" % self.elastic_stats.text())
        out("  violations: %s" % self._table(self.violations))
        out("  runs by shape: %s" % self._table(self.shapes))


def script_path():
    return os.path.relpath(os.path.abspath(__file__))


def replay_command(shape, build, expect):
    return shape.replay_command(build, expect).replace("tests/chaos/chaos.py", script_path(), 1)


def describe(shape):
    return "seed=%d ranks=%d transport=%s hosts=%d faults=%s rounds=%d ops=%d inflight-max=%d%s" % (
        shape.seed, shape.ranks, shape.transport, shape.hosts, shape.faults_arg(), shape.rounds,
        shape.ops, shape.inflight, "" if shape.round_wait_ms == DEFAULT_ROUND_WAIT_MS else
        " round-wait-ms=%d" % shape.round_wait_ms)


def print_failure(res, build, indent="  "):
    out("%sFAILED: %s" % (indent, describe(res.shape)))
    out("%sviolations (%d):" % (indent, len(res.violations)))
    for kind, rank, text in res.violations[:MAX_VIOLATION_LINES]:
        out("%s  [%s]%s %s" % (indent, kind, "" if rank is None else " rank %d:" % rank, text))
    if len(res.violations) > MAX_VIOLATION_LINES:
        out("%s  ... and %d more" % (indent, len(res.violations) - MAX_VIOLATION_LINES))
    if res.events:
        out("%sdriver faults: %s" % (indent, "; ".join(res.events)))
    if res.dir:
        out("%sreports and logs kept in %s" % (indent, res.dir))
    out("%sreplay: %s" % (indent, replay_command(res.shape, build, res.kinds())))


def one_line(res):
    if res.skipped:
        return "SKIPPED (%s)" % res.skipped
    return "%s in %.1f s: %d works (%d ok), %d bytes checked, faults %s%s%s" % (
        "FAILED" if res.failed() else "ok", res.seconds, res.works, res.works_ok,
        res.bytes_checked, Summary._table(res.injected),
        "" if not res.rank_faults else " + ranks' " + Summary._table(res.rank_faults),
        "" if not res.elastic_stats.t else "; elastic: " + res.elastic_stats.text())


def mode_single(shape, args):
    if args.verbose:
        for f in schedule(shape):
            out("  scheduled: " + f.describe())
    res = run_once(shape, args.build, args.timeout, keep=args.keep, verbose=args.verbose, log=out)
    out("run %s: %s" % (describe(shape), one_line(res)))
    if res.failed():
        print_failure(res, args.build)
        return 1
    if res.dir:
        out("  reports kept in %s" % res.dir)
    return 77 if res.skipped else 0


def mode_replay(shape, args):
    expect = set(k for k in args.expect.split(",") if k) if args.expect else set()
    reproduced = same = 0
    for i in range(args.count):
        res = run_once(shape, args.build, args.timeout, keep=args.keep, verbose=args.verbose,
                       log=out)
        if res.skipped:
            out("replay: SKIPPED (%s)" % res.skipped)
            return 77
        out("replay %d/%d: %s%s" % (i + 1, args.count, one_line(res),
                                   (" [%s]" % ",".join(res.kinds())) if res.failed() else ""))
        if res.failed():
            reproduced += 1
            same += bool(expect) and expect <= set(res.kinds())
            for kind, rank, text in res.violations[:5]:
                out("    [%s]%s %s" % (kind, "" if rank is None else " rank %d:" % rank, text))
            if res.dir:
                out("    kept in %s" % res.dir)
    out("replay of %s: failed %d of %d%s" % (
        describe(shape), reproduced, args.count,
        (", with every expected kind (%s) %d of %d" % (",".join(sorted(expect)), same, args.count))
        if expect else ""))
    return 1 if reproduced else 0


def mode_campaign(args):
    cseed = args.campaign_seed if args.campaign_seed is not None else random.SystemRandom(
    ).getrandbits(32)
    rng = random.Random(cseed)
    two = chaos_netns.unavailable() is None
    out("chaos campaign: %d s, campaign seed %d (--campaign-seed %d draws the same runs)%s" % (
        args.seconds, cseed, cseed, "" if two else "; one host only: " + chaos_netns.unavailable()))
    summary = Summary()
    end = time.monotonic() + args.seconds
    i = 0
    failures = []
    while time.monotonic() < end:
        i += 1
        shape = random_shape(rng, two, args.rounds or DEFAULT_ROUNDS, args.ops or DEFAULT_OPS)
        res = run_once(shape, args.build, args.timeout, keep=args.keep, verbose=args.verbose,
                       log=out)
        summary.add(res)
        out("run %d: %s: %s" % (i, describe(shape), one_line(res)))
        if res.failed():
            print_failure(res, args.build)
            failures.append(res)
    summary.print("chaos campaign summary")
    for res in failures:
        out("  failed: seed %d: %s" % (res.shape.seed, replay_command(res.shape, args.build,
                                                                      res.kinds())))
    return 1 if summary.failed else 0


def selftest_cases(args):
    """(name, run) of each self-test case: run() gives (ok, Result)."""
    fake = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_rank.py")
    cases = []
    for i, (bug, expect, faults, timeout, stall) in enumerate(SELFTEST):
        shape = Shape(100 + i, 3, "tcp", 1, parse_faults(faults, 1), 2, 100, 4)

        def run(shape=shape, bug=bug, expect=expect, timeout=timeout, stall=stall):
            res = run_once(shape, args.build, timeout, verbose=args.verbose, log=out,
                           rank_prog=fake, stall_s=stall,
                           extra_env={"CHAOS_FAKE_BUG": "hang" if bug == "stall" else bug,
                                      "CHAOS_ROUND_WAIT_MS": "2000"})
            for name in os.listdir("/dev/shm"):
                if name.startswith("collie-chaos-selftest-"):
                    os.unlink(os.path.join("/dev/shm", name))
            ok = res.skipped is None and tuple(res.kinds()) == tuple(sorted(expect))
            if bug == "clean" and not res.injected.get("kill"):
                ok = False  # the case is there to see a killed rank excused
                out("    the clean case's SIGKILL was not injected")
            out("    planted %s: expected violations [%s], the driver found [%s]%s" % (
                bug or "nothing", ",".join(sorted(expect)), ",".join(res.kinds()),
                "" if ok else " - WRONG"))
            if not ok:
                for kind, rank, text in res.violations[:MAX_VIOLATION_LINES]:
                    out("      [%s]%s %s" % (kind, "" if rank is None else " rank %d:" % rank,
                                            text))
            if res.dir and ok:
                shutil.rmtree(res.dir, ignore_errors=True)
            return ok, res

        cases.append(("chaos_selftest_" + bug, run))
    return cases


def mode_selftest(args):
    bad = 0
    for name, run in selftest_cases(args):
        ok, res = run()
        out("%s: %s (%.1f s)" % (name, "ok" if ok else "FAILED", res.seconds))
        bad += not ok
    return 1 if bad else 0


def mode_suite(args):
    shapes = []
    for seed, n, tr, hosts, faults, rounds, ops, infl in SUITE:
        shapes.append(Shape(seed, n, tr, hosts, parse_faults(faults, hosts), rounds, ops, infl,
                            SUITE_ROUND_WAIT_MS))
    out("[==========] Running %d test(s): the driver's self-test, chaos runs with fixed seeds "
        "(bound %d s each)." % (len(SELFTEST) + len(shapes), args.timeout or SUITE_TIMEOUT_S))
    summary = Summary()
    passed, failed, skipped = [], [], []
    for name, run in selftest_cases(args):
        out("[ RUN      ] %s" % name)
        ok, res = run()
        (passed if ok else failed).append(name)
        out("[%s] %s (%d ms)" % ("       OK " if ok else "  FAILED  ", name, res.seconds * 1000))
    for shape in shapes:
        name = "chaos_" + shape.name()
        out("[ RUN      ] %s" % name)
        res = run_once(shape, args.build, args.timeout or SUITE_TIMEOUT_S, keep=args.keep,
                       verbose=args.verbose, log=out, strict=True)
        summary.add(res)
        ms = int(res.seconds * 1000)
        if res.skipped:
            out("SKIPPED: %s" % res.skipped)
            out("[  SKIPPED ] %s" % name)
            skipped.append(name)
        elif res.failed():
            print_failure(res, args.build, indent="    ")
            out("[  FAILED  ] %s (%d ms)" % (name, ms))
            failed.append(name)
        else:
            out("    %s" % one_line(res))
            out("[       OK ] %s (%d ms)" % (name, ms))
            passed.append(name)
    summary.print("chaos suite summary")
    out("[==========] %d test(s) run." % (len(passed) + len(failed) + len(skipped)))
    out("[  PASSED  ] %d test(s)." % len(passed))
    if skipped:
        out("[  SKIPPED ] %d test(s), listed below:" % len(skipped))
        for n in skipped:
            out("[  SKIPPED ] %s" % n)
    if failed:
        out("[  FAILED  ] %d test(s), listed below:" % len(failed))
        for n in failed:
            out("[  FAILED  ] %s" % n)
        out("\n %d FAILED TEST(S)" % len(failed))
    return 1 if failed else 0


def main(argv):
    ap = argparse.ArgumentParser(
        prog="chaos.py", description="collie's chaos harness driver (docs/chaos.md)")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--seed", type=int, help="one run with this seed")
    mode.add_argument("--seconds", type=int, help="a random campaign of about this long")
    mode.add_argument("--suite", action="store_true", help="the fixed-seed set of make test")
    mode.add_argument("--replay", type=int, metavar="SEED", help="run one shape --count times")
    mode.add_argument("--self-test", action="store_true",
                      help="check that the oracle catches planted faults (fake_rank.py)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--transport", default="auto")
    ap.add_argument("--hosts", type=int, default=1)
    ap.add_argument("--faults", default="all", help="comma list of " +
                    ",".join(KNOWN_FAULTS) + ", all or none")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--ops", type=int, default=None)
    ap.add_argument("--inflight-max", type=int, default=DEFAULT_INFLIGHT)
    ap.add_argument("--round-wait-ms", type=int, default=DEFAULT_ROUND_WAIT_MS,
                    help="the ranks' wait between rounds (CHAOS_ROUND_WAIT_MS)")
    ap.add_argument("--count", type=int, default=5, help="replays (--replay)")
    ap.add_argument("--expect", default="", help="violation kinds the replayed failure had")
    ap.add_argument("--campaign-seed", type=int, default=None)
    ap.add_argument("--build", default=os.environ.get("CHAOS_BUILD", "build"))
    ap.add_argument("--timeout", type=int, default=None,
                    help="a run's hard bound in seconds (default 300; suite %d)" % SUITE_TIMEOUT_S)
    ap.add_argument("--keep", action="store_true", help="keep every run's reports")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)

    def on_signal(sig, _frame):
        sys.exit(128 + sig)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        if args.suite:
            return mode_suite(args)
        if args.self_test:
            return mode_selftest(args)
        if args.timeout is None:
            args.timeout = 300
        if args.seconds is not None:
            return mode_campaign(args)
        seed = args.seed if args.seed is not None else args.replay
        shape = Shape(seed, args.ranks, args.transport, args.hosts,
                      parse_faults(args.faults, args.hosts), args.rounds or DEFAULT_ROUNDS,
                      args.ops or DEFAULT_OPS, args.inflight_max, args.round_wait_ms)
        if args.replay is not None:
            return mode_replay(shape, args)
        return mode_single(shape, args)
    except UsageError as e:
        print("chaos.py: %s" % e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
