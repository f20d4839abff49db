"""chaos_elastic.py - an elastic run's shrinks and grows, held to what the
driver did (chaos_elastic.c writes the lines; docs/chaos.md, "Shrink and
grow").

Design notes
 - A shrink decision is the set of world ids one collie_comm_shrink of a
   comm (its name) left out; its `shrink` lines (status COLLIE_OK) on every
   member that took it carry `members=` (the old comm's, world ids),
   `out=` (the decision), `new=` and the call's clock (`start_us`,
   `end_us`: the host's monotonic clock, the driver's time.monotonic).
   Lines of one comm and one new comm are one decision:
     shrink_disagree  two members of one new comm with different `out=`
                      or `members=`; a rank that got ENOTMEMBER from a
                      shrink of a comm whose decisions all keep it;
     shrink_set       a rank killed before the first member began that
                      shrink and not left out (it could never take part);
                      or a rank left out without a reason: it was not
                      killed, never stopped, not across a downed link
                      (before the decision's last line), and it had begun
                      its own shrink of that comm before the decision's
                      deadline (first start + timeout_ms; one that comes
                      later is left out by contract: counted `late`).
     shrink_split     two members of one old comm took different new comms
                      from it (a comm has one successor: an attempt whose
                      new comm was made for some member is made for all).
 - A grow: its `grow` lines (OK) of one old comm name one new comm of one
   size (`grow_disagree` otherwise); a replacement's `join` OK names a comm
   some member's grow made (`join_unknown` otherwise).
 - Counted (Stats, the summary's "elastic" line): decisions, ranks left
   out, excused late arrivals, shrink calls by status, ranks that ended
   excluded, grows and joins by status.
"""


def _ids(text):
    if not text or text == "-":
        return set()
    try:
        return {int(x) for x in text.split(",")}
    except ValueError:
        return set()


def _int(f, k, d=None):
    try:
        return int(f[k])
    except (KeyError, ValueError):
        return d


class Stats:
    def __init__(self):
        self.t = {}

    def inc(self, k, n=1):
        self.t[k] = self.t.get(k, 0) + n

    def add(self, other):
        for k, v in other.t.items():
            self.inc(k, v)

    def text(self):
        return ", ".join("%s %d" % kv for kv in sorted(self.t.items())) or "none"


def check(reports, killed_us, stops_us, link_down_us):
    """(violations [(kind, rank, text)], Stats)."""
    out, stats = [], Stats()
    link_at = min(link_down_us) if link_down_us else None
    decisions = {}  # (old comm, new comm) -> [(rank, fields)]
    starts = {}  # old comm -> {rank: [start_us of its shrink_enter lines]}
    for rep in reports:
        for f in rep.shrink_enters:
            starts.setdefault(f.get("comm"), {}).setdefault(rep.rank, []).append(
                _int(f, "start_us", 0))
        for f in rep.shrinks:
            stats.inc("shrink_" + f.get("status", "?").replace("COLLIE_", "").lower())
            if f.get("status") == "COLLIE_OK":
                decisions.setdefault((f.get("comm"), f.get("new")), []).append((rep.rank, f))
        if rep.end is not None and (rep.shrink_enters or rep.joins) and rep.end.get(
                "reason", "done") != "done":
            stats.inc("ended_" + rep.end.get("reason", "?"))  # excluded, lost, join_failed
        for f in rep.grows:
            stats.inc("grow_" + f.get("status", "?").replace("COLLIE_", "").lower())
        for f in rep.joins:
            stats.inc("join_" + f.get("status", "?").replace("COLLIE_", "").lower())

    successors = {}  # old comm -> {new comm: a rank that took it}
    for (old, new), lines in decisions.items():
        successors.setdefault(old, {})[new] = lines[0][0]
    for old, news in sorted(successors.items()):
        if len(news) > 1:
            out.append(("shrink_split", min(news.values()), "comm %s has %d successors: %s" % (
                old, len(news), ", ".join("%s (rank %d)" % kv for kv in sorted(news.items())))))
    kept = {}  # old comm -> ranks some decision of it kept
    for (old, new), lines in sorted(decisions.items()):
        stats.inc("decisions")
        r0, f0 = lines[0]
        outs, members = _ids(f0.get("out")), _ids(f0.get("members"))
        kept.setdefault(old, set()).update(members - outs)
        for r, f in lines[1:]:
            if _ids(f.get("out")) != outs or _ids(f.get("members")) != members:
                out.append(("shrink_disagree", r, "ranks %d and %d took comm %s from %s with "
                            "different decisions: %s / %s" % (r0, r, new, old, f0["line"],
                                                              f["line"])))
        t_first = min(_int(f, "start_us", 0) for _, f in lines)
        t_last = max(_int(f, "end_us", 0) for _, f in lines)
        deadline = t_first + 1000 * max(_int(f, "timeout_ms", 0) for _, f in lines)
        stats.inc("left_out", len(outs))
        for k, tk in sorted(killed_us.items()):
            if k in members and tk < t_first and k not in outs:
                out.append(("shrink_set", r0, "rank %d was killed %.0f ms before the shrink of "
                            "%s began, and the decision keeps it: %s" % (
                                k, (t_first - tk) / 1000, old, f0["line"])))
        for q in sorted(outs):
            why = []
            if q in killed_us and killed_us[q] <= t_last:
                why.append("killed")
            if any(t <= t_last for t in stops_us.get(q, ())):
                why.append("stopped")
            if link_at is not None and link_at <= t_last:
                why.append("partition")
            came = [t for t in starts.get(old, {}).get(q, []) if t <= deadline]
            if not why and not came:
                why.append("late")
                stats.inc("late")
            if not why:
                out.append(("shrink_set", r0, "rank %d was left out of %s, but it was never "
                            "killed or stopped, and it began its shrink before the deadline: %s"
                            % (q, old, f0["line"])))
    for rep in reports:
        for f in rep.shrinks:
            old = f.get("comm")
            if f.get("status") == "COLLIE_ENOTMEMBER" and rep.rank in kept.get(old, ()):
                out.append(("shrink_disagree", rep.rank, "rank %d was told it is left out of %s, "
                            "but the decisions of its survivors keep it: %s" % (
                                rep.rank, old, f["line"])))

    grown = {}  # old comm -> (new, new_size)
    for rep in reports:
        for f in rep.grows:
            if f.get("status") != "COLLIE_OK":
                continue
            got = (f.get("new"), f.get("new_size"))
            was = grown.setdefault(f.get("comm"), got)
            if was != got:
                out.append(("grow_disagree", rep.rank, "the grow of %s gave %s here, %s to "
                            "another member: %s" % (f.get("comm"), got, was, f["line"])))
    made = {new for new, _ in grown.values()}
    for rep in reports:
        for f in rep.joins:
            if f.get("status") == "COLLIE_OK" and f.get("comm") not in made:
                out.append(("join_unknown", rep.rank, "joined comm %s, which no member's grow "
                            "made: %s" % (f.get("comm"), f["line"])))
    return out, stats
