"""chaos_report.py - read the ranks' reports (DIR/rank-<R>.log).

Design notes
 - The format is the rank's (tests/chaos/chaos_report.h; docs/chaos.md
   says what the driver makes of the records): one record per line, the
   record's name first, then `key=value` fields; the last field `msg=` runs
   to the end of the line. A rank killed mid-write leaves whole lines (one
   write() per line); a last line without its newline is ignored.
 - RankReport.feed() takes bytes as they arrive (the driver tails the files
   to fire its faults at a rank's progress) and keeps counts, not lines, so
   a long run costs no memory.
 - A line the driver cannot parse is itself a violation (`bad_report`): the
   report is the oracle's voice, and a garbled one could hide a wrong OK.
   A well-formed record of a name the driver does not know (the rank
   program may add some, e.g. `group`) is read and ignored.
"""

import re

RECORD_RE = re.compile(r"^[a-z_]{1,32}$")


def parse_line(line):
    """(record, {field: value}) of one report line; raises ValueError."""
    head, _, rest = line.partition(" ")
    if not RECORD_RE.match(head):
        raise ValueError("'%s' is not a record name" % head[:40])
    fields = {}
    while rest:
        if rest.startswith("msg="):
            fields["msg"] = rest[4:]
            break
        word, _, rest = rest.partition(" ")
        k, eq, v = word.partition("=")
        if not eq or not k:
            raise ValueError("field '%s' is not key=value" % word[:40])
        fields[k] = v
    return head, fields


def _int(fields, key, default=0):
    if key not in fields:
        return default
    try:
        return int(fields[key])
    except ValueError:
        return default


class Failure:
    """One failure's fault data (a work line's or a comm_end line's f*
    fields): who reported it, where, and the set in world ranks."""

    def __init__(self, rank, src, rnd, comm, kind, view, origin, ranks, more, status, t, line):
        self.rank, self.src, self.round, self.comm = rank, src, rnd, comm
        self.kind, self.view, self.origin, self.ranks = kind, view, origin, ranks
        self.more, self.status, self.t, self.line = more, status, t, line


class RankReport:
    def __init__(self, rank):
        self.rank = rank
        self.buf = b""
        self.lines = 0
        self.pid = None
        self.start = None
        self.end = None  # the end record's fields
        self.rounds = 0
        self.works = 0
        self.works_ok = 0
        self.bytes_checked = 0
        self.works_stopped = 0  # work lines with stopped=1
        self.statuses = {}
        self.faults = {}  # rank-side faults by kind
        self.violations = []  # (kind, text)
        self.leak_checks = 0
        # failures, for a run without faults: each must be explained
        self.failures = 0  # failed works, refused posts, failed comm creates/splits
        self.first_failure = None
        self.slow_timeouts = 0  # works that ran into their own deadline
        # the earliest failure (the rank's monotonic us, `end_us=`) and whether it
        # was a slow timeout: the slow-machine excuse holds only when a
        # timeout came first (a spurious failure elsewhere makes its peers
        # time out after it)
        self.first_fail_t = None
        self.first_fail_slow = False
        self.bad = []  # unparsable lines
        self.barriers = {}  # (round, seq, comm) -> (status, post_us, end_us)
        # splits and new_groups with their clocks: (round, op, status, start_us,
        # end_us, paused_ms); this rank's abort during them: round -> fired_us
        self.subgroup_calls = []
        self.sub_aborts = {}
        # failure as data (chaos_run.check_faults): every failed work's and
        # failed comm's fault, a Failure each; when each round started, when
        # this rank first failed in it (a failed work or refused post), when
        # it began to destroy each comm (it "left" it), its own faults
        self.fault_records = []
        self.round_start = {}  # round -> start_us
        self.round_failed = {}  # round -> the earliest end_us of a failure there
        self.left = {}  # (round, comm) -> destroy_us
        self.round_faults = {}  # round -> {rank-side fault kinds}
        self.cancelled_rounds = set()  # rounds in which this rank cancelled a work
        self.abort_comms = {}  # round -> {comms this rank aborted (-1: not said)}
        # an elastic run (chaos_elastic.c): its shrink, grow and join lines'
        # fields, in order, and the time of its first shrink_enter line (the
        # driver's AT_SHRINK faults fire on the first of any rank)
        self.shrink_enters = []
        self.shrinks = []
        self.grow_enters = []
        self.grows = []
        self.joins = []
        self.excluded = []

    def feed(self, data):
        self.buf += data
        *whole, self.buf = self.buf.split(b"\n")
        for raw in whole:
            self.lines += 1
            self._line(raw.decode(errors="replace"))

    def _failure(self, line, f, slow=False):
        self.failures += 1
        if self.first_failure is None:
            self.first_failure = line[:300]
        if slow:
            self.slow_timeouts += 1
        t = _int(f, "end_us", None)
        if t is not None and (self.first_fail_t is None or t < self.first_fail_t or
                              (t == self.first_fail_t and slow)):
            self.first_fail_t, self.first_fail_slow = t, slow

    def _fault_record(self, src, f, line):
        ranks, more = f.get("franks", "-"), 0
        if "+" in ranks:
            ranks, _, m = ranks.partition("+")
            more = int(m) if m.isdigit() else 0
        try:
            rs = [] if ranks == "-" else [int(x) for x in ranks.split(",")]
        except ValueError:
            self.bad.append("line %d: franks=%s is not a rank list" % (self.lines, ranks))
            return
        self.fault_records.append(Failure(
            self.rank, src, _int(f, "r"), _int(f, "comm"), f.get("fkind", "?"),
            _int(f, "fview"), _int(f, "forigin", -1), rs, more, f.get("status", "?"),
            _int(f, "end_us", None) if src == "work" else _int(f, "destroy_us", None),
            line[:300]))

    def _line(self, line):
        try:
            rec, f = parse_line(line)
        except ValueError as e:
            self.bad.append("line %d: %s: %.200s" % (self.lines, e, line))
            return
        if self.end is not None and rec != "end":
            self.bad.append("line %d after the end line: %.200s" % (self.lines, line))
        if rec == "start":
            self.start = f
            self.pid = _int(f, "pid", None)
        elif rec == "round":
            self.rounds += 1
            if "start_us" in f:
                self.round_start[_int(f, "r")] = _int(f, "start_us")
        elif rec == "work":
            self.works += 1
            st = f.get("status", "?")
            self.statuses[st] = self.statuses.get(st, 0) + 1
            if st == "COLLIE_OK":
                self.works_ok += 1
            self.bytes_checked += _int(f, "checked")
            if f.get("stopped") == "1":
                self.works_stopped += 1
            if f.get("op") == "barrier" and "post_us" in f:
                self.barriers[(_int(f, "r"), _int(f, "seq"), _int(f, "comm"))] = (
                    st, _int(f, "post_us", None), _int(f, "end_us", None))
            if st != "COLLIE_OK":
                self._failure(line, f, st == "COLLIE_ETIMEDOUT" and
                              _int(f, "ms") >= _int(f, "deadline_ms", 1))
                rnd, t = _int(f, "r"), _int(f, "end_us", None)
                if t is not None and (rnd not in self.round_failed or t < self.round_failed[rnd]):
                    self.round_failed[rnd] = t
                if "fkind" in f:
                    self._fault_record("work", f, line)
            if f.get("cancelled") == "1":
                self.cancelled_rounds.add(_int(f, "r"))
        elif rec == "comm_end":
            self.left[(_int(f, "r"), _int(f, "comm"))] = _int(f, "destroy_us")
            if "fkind" in f:
                self._fault_record("comm", f, line)
        elif rec == "group":
            st = f.get("status", "?")
            if f.get("op") in ("comm_split", "comm_new_group") and "end_us" in f:
                self.subgroup_calls.append((_int(f, "r"), f["op"], st, _int(f, "start_us"),
                                            _int(f, "end_us"), _int(f, "paused_ms")))
            if st not in ("COLLIE_OK", "COLLIE_ENOTMEMBER"):
                rnd, t = _int(f, "r"), _int(f, "end_us", None)
                if t is not None and (rnd not in self.round_failed or t < self.round_failed[rnd]):
                    self.round_failed[rnd] = t
                # a create that timed out is slow only if it took its
                # deadline (ms and deadline_ms where the line has them)
                self._failure(line, f, st == "COLLIE_ETIMEDOUT" and
                              _int(f, "ms", 1) >= _int(f, "deadline_ms", 0))
        elif rec == "fault":
            k = f.get("kind", "?")
            self.faults[k] = self.faults.get(k, 0) + 1
            rnd = _int(f, "r")
            if k == "stall" and f.get("role") == "sender":
                k = "stall_" + f.get("end", "?")  # how its send ends: deadline, cancel, abort
            self.round_faults.setdefault(rnd, set()).add(k)
            if k == "abort":  # which comm it aborted (a callback's line does not say: -1)
                self.abort_comms.setdefault(rnd, set()).add(_int(f, "comm", -1))
            if k == "abort" and f.get("phase") == "subgroups" and "fired_us" in f:
                self.sub_aborts[_int(f, "r")] = _int(f, "fired_us")
        elif rec in ("shrink_enter", "shrink", "grow_enter", "grow", "join", "excluded"):
            f["line"] = line[:300]
            {"shrink_enter": self.shrink_enters, "shrink": self.shrinks,
             "grow_enter": self.grow_enters, "grow": self.grows, "join": self.joins,
             "excluded": self.excluded}[rec].append(f)
            if rec in ("shrink", "grow", "join") and f.get("status") not in ("COLLIE_OK", None):
                rnd, t = _int(f, "r", -1), _int(f, "end_us", None)
                if rec == "shrink" and t is not None and (
                        rnd not in self.round_failed or t < self.round_failed[rnd]):
                    self.round_failed[rnd] = t
                self._failure(line, f)
        elif rec == "violation":
            self.violations.append((f.get("kind", "?"), line))
        elif rec == "leak":
            self.leak_checks += 1
        elif rec == "end":
            if self.end is not None:
                self.bad.append("line %d: a second end line" % self.lines)
            self.end = f
