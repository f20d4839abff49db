#!/usr/bin/python3
"""fake_rank.py - a stand-in for chaos_rank that plants one fault, for the
driver's self-test (chaos.py --self-test; part of --suite).

Design notes
 - It speaks the rank program's report format (docs/chaos.md) and its
   arguments, but does no collectives: its "works" are lines with a small
   sleep between them, its round barrier is files in the report directory
   (bounded by CHAOS_ROUND_WAIT_MS, default 5000; a missing peer ends the run with
   `end reason=peer_gone`, as the real program does).
 - CHAOS_FAKE_BUG names what rank 0 (rank 1 for wrong_ok) does wrong, so
   the self-test can check that the driver's oracle notices each kind:
   wrong_ok (a violation line and exit 3), crash (abort()), noend (exit 0
   without the end line), hang (sleeps past the job's timeout), shm (a file
   named collie in /dev/shm), orphan (a child that outlives the job),
   garbled (an unparsable report line), unexplained (every rank's failed
   works end before their deadline, in a run without faults), vacuous (no
   work ends OK), spurious (rank 0 fails a work for nothing first, the
   others' works then run into their deadlines), shrink_healthy (the
   ranks write a shrink decision that leaves out the last rank, which was
   never killed or stopped and began its shrink in time), shrink_split
   (rank 0 takes another new comm from the same shrink). Empty: it
   behaves (its failed works ran into their deadline: a slow machine).
 - It keeps the SIGCONT contract: a work line that spans a SIGCONT has
   stopped=1.
"""

import os
import random
import signal
import sys
import time

OP_SLEEP_S = 0.002


def main():
    a = sys.argv[1:]
    opt = {a[i]: a[i + 1] for i in range(0, len(a) - 1, 2)}
    rank = int(os.environ["COLLIE_RANK"])
    world = int(os.environ["COLLIE_WORLD_SIZE"])
    d = opt["--report"]
    seed = int(opt["--seed"])
    rounds, ops = int(opt.get("--rounds", 4)), int(opt.get("--ops", 200))
    bug = os.environ.get("CHAOS_FAKE_BUG", "")
    conts = [0]
    signal.signal(signal.SIGCONT, lambda s, f: conts.__setitem__(0, conts[0] + 1))
    fd = os.open(os.path.join(d, "rank-%d.log" % rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                 0o644)

    def w(s):
        os.write(fd, (s + "\n").encode())

    w("start rank=%d world=%d pid=%d seed=%d" % (rank, world, os.getpid(), seed))
    rng = random.Random(seed * 1000 + rank)
    works = ok_works = checked = violations = 0
    for r in range(rounds):
        w("round r=%d comm_size=%d inflight=4 ops=%d" % (r, world, ops))
        for q in range(ops):
            c0 = conts[0]
            time.sleep(OP_SLEEP_S)
            ok = rng.random() < 0.8
            if bug == "vacuous":
                ok = False  # nothing ends OK (every failure a slow timeout)
            elif bug == "spurious":  # rank 0 fails one work for nothing, first; the
                ok = (rank == 0 and (r, q) != (0, 0)) or (rank != 0 and r == 0)  # rest time out
            works += 1
            ok_works += ok
            checked += 64 if ok else 0
            # a failed work ran into its deadline (a slow machine), unless
            # the bug is that it failed for nothing
            ms = 2 if ok or bug == "unexplained" else 100
            status = "COLLIE_OK" if ok else "COLLIE_ETIMEDOUT"
            if bug == "spurious" and rank == 0 and not ok:
                status, ms = "COLLIE_EABORTED", 2
            w("work r=%d seq=%d op=allreduce bytes=64 status=%s ms=%d deadline_ms=100 checked=%d "
              "end_us=%d%s msg=%s" % (r, q, status, ms, 64 if ok else 0, int(time.monotonic() * 1e6),
                                 " stopped=1" if conts[0] != c0 else "", "" if ok else "deadline"))
            if bug == "wrong_ok" and rank == 1 and r == 0 and q == 3:
                violations += 1
                w("violation kind=wrong_ok r=0 seq=3 msg=op=allreduce dtype=int32 count=16 "
                  "index=3 expected=7 got=8 (planted by fake_rank)")
            if bug == "garbled" and rank == 0 and r == 0 and q == 3:
                w("work this line is not key=value")
        if bug == "shrink_split" and r == 0:  # rank 0 alone takes a second successor
            t = int(time.monotonic() * 1e6)
            w("shrink_enter r=0 comm=fakew attempt=0 size=%d rank=%d timeout_ms=1000 "
              "start_us=%d" % (world, rank, t))
            w("shrink r=0 status=COLLIE_OK comm=fakew new=fakew.shr0%s attempt=0 size=%d "
              "new_size=%d new_rank=%d members=%s out=- timeout_ms=1000 start_us=%d "
              "end_us=%d ms=1 paused_ms=0" % ("e1" if rank == 0 else "", world, world, rank,
                                              ",".join(map(str, range(world))), t, t + 1000))
        if bug == "shrink_healthy" and r == 0:  # the survivors leave out a rank that came
            t = int(time.monotonic() * 1e6)
            w("shrink_enter r=0 comm=fakew attempt=0 size=%d rank=%d timeout_ms=1000 "
              "start_us=%d" % (world, rank, t))
            if rank != world - 1:
                w("shrink r=0 status=COLLIE_OK comm=fakew new=fakew.shr0 attempt=0 size=%d "
                  "new_size=%d new_rank=%d members=%s out=%d timeout_ms=1000 start_us=%d "
                  "end_us=%d ms=1 paused_ms=0" % (world, world - 1, rank,
                                                  ",".join(map(str, range(world))), world - 1,
                                                  t, t + 1000))
        open(os.path.join(d, "end-%d-%d" % (r, rank)), "w").close()
        until = time.monotonic() + int(os.environ.get("CHAOS_ROUND_WAIT_MS", "5000")) / 1000
        while not all(os.path.exists(os.path.join(d, "end-%d-%d" % (r, k))) for k in range(world)):
            if time.monotonic() > until:
                return finish(w, rank, bug, "peer_gone", works, ok_works, checked, violations)
            time.sleep(0.01)
    return finish(w, rank, bug, "done", works, ok_works, checked, violations)


def finish(w, rank, bug, reason, works, ok_works, checked, violations):
    """The end of the run (whichever way it ends: the planted fault must
    not depend on the timing of a loaded machine)."""
    if rank == 0:
        if bug == "hang":
            time.sleep(3600)
        elif bug == "crash":
            os.abort()
        elif bug == "noend":
            return 0
        elif bug == "shm":
            open("/dev/shm/collie-chaos-selftest-%d" % os.getpid(), "w").close()
        elif bug == "orphan" and os.fork() == 0:
            os.setpgid(0, 0)
            time.sleep(60)
            os._exit(0)
    w("end reason=%s works=%d ok=%d failed=%d bytes_checked=%d violations=%d" %
      (reason, works, ok_works, works - ok_works, checked, violations))
    return 3 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
