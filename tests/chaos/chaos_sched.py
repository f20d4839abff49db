"""chaos_sched.py - run shapes and the driver's fault schedule.

Design notes
 - A run is a Shape: the seed, the world size, the transport, one host or
   two (network namespaces), the fault kinds allowed and the rank program's
   size knobs. Everything the driver does to a run is a pure function of the
   Shape (schedule()): the same Shape gives the same rank program (the rank
   derives it from the seed and world size) and the same fault schedule.
   Only the real moments drift: a fault fires when a rank's report reaches
   a given number of lines (its progress), not at a wall-clock time, so a
   replay hits about the same point of the program.
 - Fault kinds: the rank's own (RANK_FAULTS: abort, destroy, cancel,
   deadline, stall, signals, disagree) are passed to the rank program's
   --faults; the driver's (kill, stop, link) never are. `link` needs two
   hosts. The elastic kinds (shrink, grow) are passed to the rank and also
   change what the driver does (a kill or stop when a rank enters a
   shrink, the replacements it starts for a grow); `all` leaves them out.
 - Bounds: a SIGSTOP lasts STOP_MIN_MS..STOP_MAX_MS, always shorter than
   the rank's round wait (CHAOS_ROUND_WAIT_MS, DEFAULT_ROUND_WAIT_MS), so a stopped rank is
   never mistaken for a gone one; a link comes back after
   LINK_UP_MIN_MS..LINK_UP_MAX_MS, or stays down for the rest of the run.
"""

import random
import shlex

RANK_FAULTS = ("abort", "destroy", "cancel", "deadline", "stall", "signals", "disagree")
# rank-side conditions that must fail nothing (a signal storm): a run with
# only these is held to "every work OK" like a run without faults
HARMLESS_FAULTS = ("signals",)
DRIVER_FAULTS = ("kill", "stop", "link")
ALL_FAULTS = RANK_FAULTS + DRIVER_FAULTS
# An elastic run (chaos_elastic.c, chaos_elastic.py): one world that the
# survivors shrink after a fault and that takes replacements back. Both are
# passed to the rank and change what the driver does (a kill or stop when a
# rank enters a shrink; the replacements it starts for a grow); not in
# `all`, which stays the classic program's kinds.
ELASTIC_FAULTS = ("shrink", "grow")
HARMLESS_FAULTS = HARMLESS_FAULTS + ELASTIC_FAULTS
KNOWN_FAULTS = ALL_FAULTS + ELASTIC_FAULTS
# a fault of the schedule fired when the first rank enters a shrink (its
# `shrink_enter` line) rather than at a line of a watched rank
AT_SHRINK = -1
STOP_IN_SHRINK_MIN_MS = 1000
TRANSPORTS = ("tcp", "shm", "auto")

STOP_MIN_MS = 50
STOP_MAX_MS = 3000
LINK_UP_MIN_MS = 100
LINK_UP_MAX_MS = 5000

DEFAULT_ROUNDS = 4
DEFAULT_OPS = 200
DEFAULT_INFLIGHT = 64
# The ranks' wait for each other between rounds (CHAOS_ROUND_WAIT_MS): a
# killed rank costs its peers this much at the next barrier. Well above the
# longest SIGSTOP, so a stopped rank is not taken for a gone one; a rank that
# is (it resumed far behind) still ends with `end reason=peer_gone`, so a
# short wait costs coverage, never a false violation. (The rank's own
# default is 20 s.)
DEFAULT_ROUND_WAIT_MS = 8000


class UsageError(Exception):
    pass


def parse_faults(text, hosts):
    """The canonical (sorted, deduplicated) fault tuple of a --faults list.
    'all' is every kind this shape allows, 'none' none."""
    kinds = set()
    for word in text.split(","):
        word = word.strip()
        if word == "all":
            kinds.update(k for k in ALL_FAULTS if k != "link" or hosts == 2)
        elif word == "none" or word == "":
            pass
        elif word in KNOWN_FAULTS:
            kinds.add(word)
        else:
            raise UsageError("unknown fault kind '%s' (known: %s, all, none)" %
                             (word, ",".join(KNOWN_FAULTS)))
    if "link" in kinds and hosts != 2:
        raise UsageError("fault 'link' needs --hosts 2 (the link between the two namespaces)")
    if "grow" in kinds and "shrink" not in kinds:
        raise UsageError("fault 'grow' needs 'shrink' (an elastic run)")
    if "grow" in kinds and hosts != 1:
        raise UsageError("fault 'grow' needs --hosts 1 (the driver starts the replacements)")
    return tuple(sorted(kinds))


class Shape:
    """One run: what the rank program and the driver's schedule derive from."""

    def __init__(self, seed, ranks, transport, hosts, faults, rounds=DEFAULT_ROUNDS,
                 ops=DEFAULT_OPS, inflight=DEFAULT_INFLIGHT, round_wait_ms=DEFAULT_ROUND_WAIT_MS):
        if not 0 <= seed < 2**64:
            raise UsageError("--seed %d is not a uint64" % seed)
        if not 2 <= ranks <= 8:
            raise UsageError("--ranks %d is not in 2..8" % ranks)
        if transport not in TRANSPORTS:
            raise UsageError("--transport '%s' is not one of %s" % (transport, "|".join(TRANSPORTS)))
        if hosts not in (1, 2):
            raise UsageError("--hosts %d is not 1 or 2" % hosts)
        if hosts == 2 and ranks % 2:
            raise UsageError("--hosts 2 needs an even --ranks (collie-run splits them evenly)")
        if hosts == 2 and transport == "shm":
            raise UsageError("--transport shm cannot reach the other namespace: use tcp or auto")
        if not 1 <= rounds <= 1000 or not 1 <= ops <= 100000:
            raise UsageError("--rounds in 1..1000 and --ops in 1..100000")
        if not 1 <= inflight <= 10000:
            raise UsageError("--inflight-max %d is not in 1..10000" % inflight)
        if not STOP_MAX_MS < round_wait_ms <= 3600000:
            raise UsageError("--round-wait-ms %d is not above the longest stop (%d ms)" %
                             (round_wait_ms, STOP_MAX_MS))
        self.round_wait_ms = round_wait_ms
        self.seed, self.ranks, self.transport, self.hosts = seed, ranks, transport, hosts
        self.faults = tuple(sorted(set(faults)))  # canonical: the schedule keys on it
        self.rounds, self.ops, self.inflight = rounds, ops, inflight

    def rank_faults(self):
        """The --faults argument of the rank program."""
        kinds = [k for k in self.faults if k in RANK_FAULTS + ELASTIC_FAULTS]
        return ",".join(kinds) if kinds else "none"

    def faults_arg(self):
        return ",".join(self.faults) if self.faults else "none"

    def name(self):
        """A short name for the runner's lines (no spaces)."""
        return "s%d_n%d_%s_h%d_%s" % (self.seed, self.ranks, self.transport, self.hosts,
                                      "-".join(self.faults) or "none")

    def kind(self):
        """The shape without seed and faults, for the summary's 'runs by shape'."""
        return "n%d %s h%d" % (self.ranks, self.transport, self.hosts)

    def args(self):
        """The driver arguments that reproduce this shape."""
        return ["--seed", str(self.seed), "--ranks", str(self.ranks), "--transport",
                self.transport, "--hosts", str(self.hosts), "--faults", self.faults_arg(),
                "--rounds", str(self.rounds), "--ops", str(self.ops), "--inflight-max",
                str(self.inflight)] + (["--round-wait-ms", str(self.round_wait_ms)]
                                       if self.round_wait_ms != DEFAULT_ROUND_WAIT_MS else [])

    def replay_command(self, build, expect=(), count=5):
        cmd = ["/usr/bin/python3", "tests/chaos/chaos.py", "--replay"] + self.args()[1:]
        if build != "build":
            cmd += ["--build", build]
        if expect:
            cmd += ["--expect", ",".join(sorted(expect))]
        cmd += ["--count", str(count)]
        return " ".join(shlex.quote(c) for c in cmd)

    def key(self):
        return "chaos-driver/%d/%d/%s/%d/%s/%d/%d/%d" % (
            self.seed, self.ranks, self.transport, self.hosts, self.faults_arg(), self.rounds,
            self.ops, self.inflight)


class Fault:
    """A driver fault: `kind` (kill, stop, link) against `rank` (kill, stop),
    fired when rank `watch`'s report has `at_line` lines; `pause_ms` is how
    long a stop lasts or when a link comes back up (None: it stays down)."""

    def __init__(self, kind, rank, watch, at_line, pause_ms):
        self.kind, self.rank, self.watch = kind, rank, watch
        self.at_line, self.pause_ms = at_line, pause_ms

    def describe(self):
        what = {"kill": "SIGKILL rank %s" % self.rank,
                "stop": "SIGSTOP rank %s for %s ms" % (self.rank, self.pause_ms),
                "link": "link down" + (" for %s ms" % self.pause_ms
                                       if self.pause_ms is not None else " for good")}[self.kind]
        if self.watch == AT_SHRINK:
            return "%s (or the next live rank) when the first rank enters a shrink" % what
        return "%s when rank %d's report reaches line %d" % (what, self.watch, self.at_line)


def schedule(shape):
    """The driver's faults for this shape: a pure function of the shape."""
    rng = random.Random(shape.key())
    # lines a rank writes when nothing ends its rounds early: start, one
    # line per round, one per work, end
    expect_lines = shape.rounds * (shape.ops + 1) + 2
    n = shape.ranks

    def trigger():
        watch = rng.randrange(n)
        return watch, max(2, int(rng.uniform(0.02, 0.8) * expect_lines))

    faults = []
    if "kill" in shape.faults and rng.random() < 0.7:
        victims = rng.sample(range(n), 1 if rng.random() < 0.8 else 2)
        for v in victims:
            watch, at = trigger()
            faults.append(Fault("kill", v, watch, at, None))
    if "stop" in shape.faults:
        for _ in range(rng.randint(0, 3)):
            watch, at = trigger()
            faults.append(Fault("stop", rng.randrange(n), watch, at,
                                rng.randint(STOP_MIN_MS, STOP_MAX_MS)))
    if "link" in shape.faults:
        for _ in range(rng.randint(1, 2)):
            watch, at = trigger()
            pause = rng.randint(LINK_UP_MIN_MS, LINK_UP_MAX_MS) if rng.random() < 0.7 else None
            faults.append(Fault("link", None, watch, at, pause))
    # an elastic run: a second kill, or a stop, while the survivors shrink
    # (the agreement must tolerate it; a stopped rank that resumes after it
    # is left out and must be told so)
    if "shrink" in shape.faults:
        if "kill" in shape.faults and n >= 3 and rng.random() < 0.5:
            faults.append(Fault("kill", rng.randrange(n), AT_SHRINK, 0, None))
        if "stop" in shape.faults and rng.random() < 0.5:
            faults.append(Fault("stop", rng.randrange(n), AT_SHRINK, 0,
                                rng.randint(STOP_IN_SHRINK_MIN_MS, STOP_MAX_MS)))
    faults.sort(key=lambda f: (f.at_line, f.watch))
    return faults


def random_shape(rng, allow_two_hosts, rounds=DEFAULT_ROUNDS, ops=DEFAULT_OPS):
    """A campaign's next run: random seed and shape."""
    hosts = 2 if allow_two_hosts and rng.random() < 0.3 else 1
    if hosts == 2:
        ranks = rng.choice((2, 4, 6, 8))
        transport = rng.choice(("tcp", "auto"))
    else:
        ranks = rng.randint(2, 8)
        transport = rng.choice(TRANSPORTS)
    allowed = [k for k in ALL_FAULTS if k != "link" or hosts == 2]
    r = rng.random()
    if r < 0.1:
        faults = ()
    elif r < 0.3:
        faults = tuple(allowed)
    else:
        faults = tuple(sorted(rng.sample(allowed, rng.randint(1, len(allowed)))))
    inflight = rng.choice((1, 4, 16, 64, 64, 256, 1000, 10000))
    seed = rng.getrandbits(64)
    if rng.random() < 0.3:  # an elastic run: shrink (and grow on one host) with kills, stops
        kinds = ["shrink"] + (["grow"] if hosts == 1 and rng.random() < 0.7 else [])
        kinds += [k for k, p in (("kill", 0.85), ("stop", 0.5), ("abort", 0.3), ("cancel", 0.3),
                                 ("link", 0.3 if hosts == 2 else 0)) if rng.random() < p]
        faults = tuple(sorted(kinds))
    return Shape(seed, ranks, transport, hosts, faults, rounds, ops, inflight)
