"""chaos_faults.py - failure as data, held to what the harness did.

Every failed work and every failed comm of a rank carries its fault's data
(collie_work_fault, collie_comm_fault: kind, view, origin, rank set), which
the rank writes into its report in world ranks (chaos_rank.c, fault_fields).
check() judges it against what the driver and the ranks did.

Design notes
 - A rank may be named in a set only for a reason the run shows, by the
   failure's time (`end_us` of a work, `destroy_us` of a comm; the ranks'
   monotonic clock is the driver's, time.monotonic, also across the
   namespaces):
     killed     the driver SIGKILLed it before;
     stopped    the driver SIGSTOPped it before (a stopped rank is silent);
     partition  the data link went down before, and it is on the other host
                than the observer (the reporter, or the origin for a set
                learnt from its notice: view PEER);
     stalled    the stall fault's victim in that round (its loop blocked);
     faulted    its own round had failed before (a failed work or refused
                post there), or it injected a fault of its own in that round:
                it stopped posting, so it is behind;
     left       it had begun to destroy that comm;
     self       the observer itself (its loop saw the deadline late).
   Which reasons a kind admits (the header's comment of each kind says what
   its set holds):
     peer_dead   killed only: a rank named dead is dead;
     peer_stuck  killed, stopped, partition, stalled: a rank that gave no
                 answer; never one that left or is merely behind;
     deadline    any reason (the ranks behind the deadline); and any rank
                 at all when the observer shortened deadlines itself in that
                 round (a `deadline` fault, a stall whose send ends by its
                 deadline): then a healthy rank that had not posted yet is
                 honestly behind;
     peer_left   left only;
     app_abort, peer_abort, local: no set (the header: ranks none).
   A named rank without an admitted reason is `fault_set`.
 - A set the survivors agreed on (view AGREED: a shrink's decision, which
   becomes the old comm's fault) and a rank's own exclusion (ENOTMEMBER)
   are not judged here: chaos_elastic.py holds every decision to the kills
   and stops.
 - The killed rank is named: in the round a rank was killed in (its last
   round line), on the world comm (every rank is a member), a failure of
   kind peer_dead, peer_stuck or deadline with a non-empty set that ended
   after the kill names a killed rank - where the round had no other
   cause: no rank-side fault there, no stop from 3.5 s before the round's
   start (a stop lasts up to 3 s), no link fault in the run (`fault_set`).
 - Kinds follow the cause (`fault_kind`): app_abort only at a rank that
   aborted, cancelled or destroyed with works in flight in that round, its
   origin itself; peer_abort's origin another rank that had failed or
   injected a fault by then; mismatch never (the harness posts no
   mismatched collective; a disagreeing new_group fails its creation, so no
   comm carries it); local never (no local error is injected). A kill is
   seen by a survivor as peer_dead, or before it knows as peer_stuck (no
   answer to a desync query: over TCP death is not certain), deadline (the
   report named the silent ranks, or a survivor that had already stopped
   posting), peer_abort (another survivor's abort frame, which carries no
   set), or peer_left (a survivor that failed and destroyed its comm):
   those are the kinds the rules above admit for a kill-only round. In a
   round whose only fault is one rank's abort of the world (rank-side, no
   driver fault near it), that rank reports app_abort and every other
   rank's peer_abort on the world has it as origin (other comms of the
   round fail by the consequences: ranks that stopped posting, or left).
 - Empty sets are counted per kind; they are allowed where the header says
   the set may be unknown (deadline: "else none"; app_abort, peer_abort,
   local: none) and are `empty_set` elsewhere.
 - Known gaps (found by this checker, in code outside comm/'s fault data:
   the CPU transport and the comm's close path), counted and printed as
   `known` rather than failing the run; CHAOS_STRICT_FAULTS=1 makes them
   violations again:
     empty_peer_dead  peer_dead with an empty set: a connect that failed (a
                      link down) ends the works with EPEER and names no
                      peer (cl_tcp_conn_lost without peer_gone);
     left_named_dead  peer_dead naming a rank that had left (after its
                      own failure): its transport closed without a goodbye
                      before its abort notice reached this rank (over TCP
                      between hosts nothing tells that close from a death);
     left_named_stuck peer_stuck naming a rank that had left: a desync
                      report takes every rank that gave no answer for
                      stuck, also one that destroyed its comm (desync.c,
                      desync_fault; the issue: a peer that leaves is not a
                      suspect).
"""

import os

KINDS = ("none", "peer_dead", "peer_stuck", "deadline", "mismatch", "app_abort", "peer_abort",
         "peer_left", "local")
ADMITS = {
    "peer_dead": {"killed"},
    "peer_stuck": {"killed", "stopped", "partition", "stalled"},
    "deadline": {"killed", "stopped", "partition", "stalled", "faulted", "left", "self"},
    "peer_left": {"left"},
}
EMPTY_OK = ("deadline", "app_abort", "peer_abort", "local")
NO_SET = ("app_abort", "peer_abort", "local")
APP_ABORT_CAUSES = {"abort", "cancel", "destroy", "stall_abort", "stall_cancel"}
SHORT_DEADLINES = {"deadline", "stall_deadline"}
HARMLESS = {"signals"}
STOP_MAX_US = 3_500_000  # a stop lasts up to 3 s (chaos_sched.py)
VIEW_PEER = 1
VIEW_AGREED = 2


class Stats:
    def __init__(self):
        self.by_kind = {}  # kind -> failures
        self.empty = {}  # kind -> failures with an empty set
        self.known = {}  # known gap -> failures (see the notes)

    def add(self, other):
        for k, v in other.by_kind.items():
            self.by_kind[k] = self.by_kind.get(k, 0) + v
        for k, v in other.empty.items():
            self.empty[k] = self.empty.get(k, 0) + v
        for k, v in other.known.items():
            self.known[k] = self.known.get(k, 0) + v

    def text(self):
        t = ", ".join("%s %d (empty %d)" % (k, self.by_kind[k], self.empty.get(k, 0))
                      for k in sorted(self.by_kind)) or "none"
        if self.known:
            t += "; known gaps: " + ", ".join("%s %d" % kv for kv in sorted(self.known.items()))
        return t


def check(reports, killed_us, stops_us, link_down_us, per_node):
    """(violations [(kind, rank, text)], Stats). killed_us {rank: us},
    stops_us {rank: [us]}, link_down_us [us]: when the driver did them."""
    out, stats = [], Stats()
    strict = os.environ.get("CHAOS_STRICT_FAULTS") == "1"
    n = len(reports)
    link_at = min(link_down_us) if link_down_us else None

    def rank_faults(q, rnd):
        return reports[q].round_faults.get(rnd, set()) - HARMLESS

    def reasons(q, f, observer):
        rs = set()
        if q in killed_us and killed_us[q] <= f.t:
            rs.add("killed")
        if any(t <= f.t for t in stops_us.get(q, ())):
            rs.add("stopped")
        if link_at is not None and link_at <= f.t and q // per_node != observer // per_node:
            rs.add("partition")
        if "stall" in rank_faults(q, f.round):
            rs.add("stalled")
        tq = reports[q].round_failed.get(f.round)
        if (tq is not None and tq <= f.t) or rank_faults(q, f.round):
            rs.add("faulted")
        lq = reports[q].left.get((f.round, f.comm))
        if lq is not None and lq <= f.t:
            rs.add("left")
        if q == observer:
            rs.add("self")
        return rs

    def bad(kind, f, text):
        out.append((kind, f.rank, "%s (%s fault of rank %d, r=%d comm=%d: kind=%s view=%d "
                    "origin=%d ranks=%s): %s" % (text, f.src, f.rank, f.round, f.comm, f.kind,
                                                 f.view, f.origin,
                                                 ",".join(map(str, f.ranks)) or "-", f.line)))

    records = [f for rep in reports for f in rep.fault_records]
    for f in records:
        stats.by_kind[f.kind] = stats.by_kind.get(f.kind, 0) + 1
        if not f.ranks and not f.more:
            stats.empty[f.kind] = stats.empty.get(f.kind, 0) + 1
        if f.kind not in KINDS or f.kind == "none":
            bad("fault_kind", f, "not a kind of a failure")
            continue
        if f.t is None:
            bad("bad_fault", f, "no time on the line")
            continue
        if any(q < 0 or q >= n for q in f.ranks) or f.origin < -1 or f.origin >= n:
            bad("fault_set", f, "a rank outside the world")
            continue
        if f.view == VIEW_AGREED or f.status == "COLLIE_ENOTMEMBER":
            # a shrink's decision (it keeps the comm's kind, its set is the
            # ranks left out) and a rank's own exclusion: chaos_elastic.py
            # holds the decisions to the kills and stops
            continue
        observer = f.origin if f.view == VIEW_PEER and f.origin >= 0 else f.rank
        if not f.ranks and not f.more and f.kind not in EMPTY_OK:
            if f.kind == "peer_dead" and not strict:
                stats.known["empty_peer_dead"] = stats.known.get("empty_peer_dead", 0) + 1
            else:
                bad("empty_set", f, "an empty set where the header promises the ranks")
        if f.kind in NO_SET and f.ranks:
            bad("fault_set", f, "a set where the header says none")
        if f.kind in ADMITS:
            anything = f.kind == "deadline" and SHORT_DEADLINES & rank_faults(observer, f.round)
            for q in f.ranks:
                rs = reasons(q, f, observer)
                if f.kind in ("peer_dead", "peer_stuck") and not strict and "left" in rs:
                    gap = "left_named_" + f.kind[5:]
                    stats.known[gap] = stats.known.get(gap, 0) + 1
                    continue
                if not anything and not rs & ADMITS[f.kind]:
                    bad("fault_set", f, "rank %d is named, but it was healthy then (%s)" % (
                        q, ", ".join(sorted(reasons(q, f, observer))) or "no reason at all"))
        if f.kind == "mismatch":
            bad("fault_kind", f, "a mismatch, though the harness posts no mismatched collective")
        elif f.kind == "local":
            bad("fault_kind", f, "a local error, though the harness injects none")
        elif f.kind == "app_abort":
            if f.origin != f.rank:
                bad("fault_kind", f, "app_abort whose origin is not the reporter")
            elif not (APP_ABORT_CAUSES & rank_faults(f.rank, f.round) or
                      f.round in reports[f.rank].cancelled_rounds):
                bad("fault_kind", f, "app_abort at a rank that neither aborted, cancelled nor "
                    "destroyed in that round")
        elif f.kind == "peer_abort":
            o = f.origin
            tq = reports[o].round_failed.get(f.round) if 0 <= o < n else None
            if o == f.rank or o < 0:
                bad("fault_kind", f, "peer_abort without another rank as origin")
            elif not (rank_faults(o, f.round) or (tq is not None and tq <= f.t)):
                bad("fault_kind", f, "peer_abort from rank %d, which had neither failed nor "
                    "injected a fault by then" % o)

    # rounds and their causes
    starts = {}
    for rep in reports:
        for rnd, t in rep.round_start.items():
            starts[rnd] = min(t, starts.get(rnd, t))

    def quiet(rnd, until, allow_kills):
        """no cause in round rnd but the ranks' own (checked by the caller),
        stops and links: none near it; kills only if allowed"""
        if link_at is not None:
            return False
        frm = starts.get(rnd)
        if frm is None:
            return False
        for q, ts in stops_us.items():
            if any(frm - STOP_MAX_US <= t <= until for t in ts):
                return False
        if not allow_kills and any(frm - STOP_MAX_US <= t <= until for t in killed_us.values()):
            return False
        return True

    # the killed rank is named
    for k, tk in sorted(killed_us.items()):
        if not reports[k].round_start:
            continue
        kr = max(reports[k].round_start)
        if any(rank_faults(q, kr) for q in range(n)):
            continue
        for f in records:
            if (f.round != kr or f.comm != 0 or f.rank in killed_us or f.t is None or
                    f.t < tk or f.kind not in ("peer_dead", "peer_stuck", "deadline") or
                    not f.ranks or not quiet(kr, f.t, True)):
                continue
            dead = {q for q, t in killed_us.items() if t <= f.t}
            if not dead & set(f.ranks):
                bad("fault_set", f, "rank %d was killed %.0f ms before, the round had no other "
                    "fault, and the set does not name it" % (k, (f.t - tk) / 1000))

    # a round whose only fault is one rank's abort
    for rnd in sorted(starts):
        own = [(q, k) for q in range(n) for k in rank_faults(q, rnd)]
        if len(own) != 1 or own[0][1] not in ("abort", "stall_abort"):
            continue
        a = own[0][0]
        if reports[a].abort_comms.get(rnd) != {0} and own[0][1] == "abort":
            continue  # not the world, or not said (a callback's)
        if own[0][1] == "stall_abort":
            continue  # the pair's comm: its index is the plan's
        recs = [f for f in records if f.round == rnd and f.t is not None and f.comm == 0]
        until = max([f.t for f in recs] + [starts[rnd]])
        if not quiet(rnd, until, False):
            continue
        if recs and not any(f.rank == a and f.kind == "app_abort" for f in recs):
            out.append(("fault_kind", a, "round %d: rank %d aborted (its only fault), but none of "
                        "its failures is app_abort: %s" % (
                            rnd, a, "; ".join("%s %s" % (f.src, f.kind) for f in recs
                                              if f.rank == a) or "no failure")))
        for f in recs:
            if f.rank != a and f.kind == "peer_abort" and f.origin != a:
                bad("fault_kind", f, "round %d's only fault was rank %d's abort, but the origin "
                    "is another rank" % (rnd, a))
    return out, stats
