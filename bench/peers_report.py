#!/usr/bin/python3
"""peers_report.py - writes bench/RESULTS.md from the raw files of bench/peers.sh.

Reads <dir>/raw/r<rep>_n<ranks>_<peer>_<tag>.csv (collie-bench's CSV), the
failures (<dir>/failures.tsv: rep, ranks, peer, tag, reason), the iperf3
figures (<dir>/iperf.tsv: rep, streams, GB/s or "failed: ...") and MPICH's
transport log, and writes the side-by-side report: the median over repeats
of every figure, the ratios collie/peer, the tiny-op rates and the fraction
of the loopback ceiling. Called by peers.sh; only the standard library.
"""
import argparse
import csv
import glob
import os
import platform
import re
import statistics
import subprocess

PEERS = ("collie", "collie_tcp", "openmpi", "openmpi_shm", "mpich", "gloo")
NAMES = {"collie": "collie", "collie_tcp": "collie TCP", "openmpi": "Open MPI", "openmpi_shm": "Open MPI shm", "mpich": "MPICH",
         "gloo": "Gloo"}
OPS = ("allreduce", "broadcast", "allgather")


def parse_size(s):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    return int(s[:-1]) * mult[s[-1].lower()] if s[-1].lower() in mult else int(s)


def human(b):
    for unit, sh in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << sh and b % (1 << sh) == 0:
            return "%d %s" % (b >> sh, unit)
    return "%d B" % b


def op_bytes(op, S, n):
    """nccl-tests' size column (collie-bench's bytes) for a requested size."""
    count = S // 4
    if op == "allgather":
        return ((count // n) & ~3) * n * 4
    return count * 4


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True,
                              timeout=20).stdout.strip()
    except Exception:  # noqa: BLE001 - a missing tool only loses a line of the report
        return ""


def fmt_lat(v):
    return "%.2f" % v if v < 10 else "%.1f" % v if v < 1000 else "%.0f" % v


def fmt_bw(v):
    if v == 0:
        return "0"
    if v >= 10:
        return "%.1f" % v
    if v >= 1:
        return "%.2f" % v
    if v >= 0.0001:
        return "%.4f" % v
    return "%.1e" % v


def fmt_rate(v):
    return "%.0f" % v


def fmt_ratio(v):
    return "%.2f" % v


class Data:
    def __init__(self, d, repeats):
        self.repeats = repeats
        self.cells = {}  # (n, peer, op, bytes, metric) -> [values]
        self.rates = {}  # (n, peer, k) -> [ops/s]
        self.fail = {}  # (n, peer, tag) -> [reasons]
        for path in glob.glob(os.path.join(d, "raw", "r*_n*_*.csv")):
            m = re.match(r"r(\d+)_n(\d+)_([a-z_]+)_([a-z]+\d+)\.csv$", os.path.basename(path))
            if not m:
                continue
            n, peer, tag = int(m.group(2)), m.group(3), m.group(4)
            with open(path) as f:
                for row in csv.reader(f):
                    if len(row) != 7 or row[0] not in OPS:
                        continue
                    op, nbytes = row[0], int(row[1])
                    if tag.startswith("rate"):
                        if row[6]:
                            self.rates.setdefault((n, peer, int(tag[4:])), []).append(float(row[6]))
                        continue
                    for metric, col in (("lat", 3), ("busbw", 5)):
                        if row[col]:
                            self.cells.setdefault((n, peer, op, nbytes, metric), []).append(
                                float(row[col]))
        self.notes = {}  # (n, peer, tag) -> [notes]
        fp = os.path.join(d, "notes.tsv")
        if os.path.exists(fp):
            with open(fp) as f:
                for line in f:
                    parts = line.rstrip("\n").split("\t")
                    if len(parts) == 5:
                        self.notes.setdefault((int(parts[1]), parts[2], parts[3]), []).append(
                            parts[4])
        fp = os.path.join(d, "failures.tsv")
        if os.path.exists(fp):
            with open(fp) as f:
                for line in f:
                    parts = line.rstrip("\n").split("\t")
                    if len(parts) == 5:
                        self.fail.setdefault((int(parts[1]), parts[2], parts[3]), []).append(parts[4])

    def value(self, vals):
        return statistics.median(vals) if vals else None

    def cell(self, vals, fmt, n, peer, tag, blank=False):
        """Median with a repeat count when some repeats are missing."""
        if vals:
            s = fmt(statistics.median(vals))
            if len(vals) < self.repeats:
                s += " (%d/%d)" % (len(vals), self.repeats)
            return s
        reasons = self.fail.get((n, peer, tag))
        if reasons:
            r = reasons[0]
            return "failed: " + (r if len(r) <= 90 else r[:89] + "…")
        return "n/a" if blank else "–"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return "–"
    return fmt_ratio(a / b)


def machine():
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = "?"
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem = "%.1f GiB" % (kb / (1 << 20))
    except (OSError, ValueError, IndexError):
        pass
    return cpu, os.cpu_count(), platform.release(), mem


def main():
    p = argparse.ArgumentParser()
    for a in ("dir", "out", "command", "started", "finished", "elapsed", "ranks", "repeats",
              "peers", "tiers", "rate", "check", "timeout", "iperf-secs", "collie-note",
              "collie-rev", "load-start", "load-end"):
        p.add_argument("--" + a, default="")
    a = p.parse_args()
    ranks = [int(x) for x in a.ranks.split(",")]
    repeats = int(a.repeats)
    peers = [x for x in a.peers.split(",") if x]
    others = [x for x in peers if x != "collie"]
    tiers = []
    for t in a.tiers.split(";"):
        sizes, iters, warmup = t.split()
        tiers.append(([parse_size(s) for s in sizes.split(",")], int(iters), int(warmup)))
    sizes = [(S, "sweep%d" % (i + 1)) for i, (ss, _, _) in enumerate(tiers) for S in ss]
    rate_iters, rate_warmup = a.rate.split()
    D = Data(a.dir, repeats)

    out = []
    w = out.append
    cpu, ncpu, kernel, mem = machine()
    w("# collie vs Open MPI vs MPICH vs Gloo on loopback")
    w("")
    w("Written by `bench/peers.sh`. Every figure is the median over %d repeat%s of the "
      "whole run; a cell marked (k/%d) had only k good repeats." % (repeats, "s" * (repeats > 1),
                                                                     repeats))
    w("")
    w("- **command**: `%s`" % a.command)
    w("- **date**: %s → %s (UTC), %s s of runs" % (a.started, a.finished, a.elapsed))
    w("- **machine**: %s cores (`nproc`), %s, kernel %s, %s RAM; load average %s at the start, "
      "%s at the end (other engineers' builds and tests share the machine, so figures are noisy)"
      % (ncpu, cpu, kernel, mem, a.load_start or "?", a.load_end or "?"))
    w("- **collie**: commit %s, `build/bin/collie-bench` (default settings: its default CPU backend puts same-host ranks on shared memory; collie TCP is the same with `--backend tcp`)%s"
      % (a.collie_rev or "?", "; **note**: " + a.collie_note if a.collie_note else ""))
    ompi = sh("ompi_info --version 2>/dev/null | head -n1")
    mpich = sh("mpichversion 2>/dev/null | grep -E 'Version|Device' | tr -s ' \\t' ' ' | "
               "paste -sd ';'")
    ucx = sh("dpkg-query -W -f='${Version}' libucx0 2>/dev/null")
    torch = sh("dpkg-query -W -f='${Version}' python3-torch 2>/dev/null")
    iperf = sh("iperf3 --version 2>/dev/null | head -n1")
    transport = sh("grep -o 'ep_cfg\\[0\\].*' %s 2>/dev/null | head -n1" %
                   os.path.join(a.dir, "mpich-transport.log"))
    w("- **Open MPI**: %s; `mpirun.openmpi --allow-run-as-root --oversubscribe -np N "
      "--bind-to none --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo` running "
      "`bench/mpi_bench.c` built with `mpicc.openmpi` (TCP BTL on lo for every peer, "
      "shared memory excluded; nonblocking collectives from Open MPI's default `coll` "
      "selection, libnbc)" % (ompi or "?"))
    w("- **Open MPI shm**: the same, with `--mca pml ob1 --mca btl vader,self` instead: Open "
      "MPI's shared-memory BTL (vader; single copy through CMA where the kernel allows it) "
      "between the ranks of this host")
    w("- **MPICH**: %s, UCX %s; `mpirun.mpich -n N -genv MPIR_CVAR_NOLOCAL 1 -genv UCX_TLS tcp "
      "-genv UCX_NET_DEVICES lo` running `bench/mpi_bench.c` built with `mpicc.mpich`. Debian "
      "12's MPICH is ch4:ucx; `MPIR_CVAR_NOLOCAL=1` turns off ch4's shared-memory path so local "
      "ranks talk through the netmod, and UCX is limited to its TCP transport on lo. UCX "
      "reported: `%s`" % (mpich or "?", ucx or "?", transport or "(no transport line captured)"))
    w("- **Gloo**: Debian `python3-torch` %s through `/usr/bin/python3` (`bench/gloo_bench.py`): "
      "`torch.distributed` backend gloo, TCPStore rendezvous on 127.0.0.1, "
      "`GLOO_SOCKET_IFNAME=lo` (Gloo's TCP transport), ops posted with `async_op=True` and "
      "completed with `work.wait()`; all_reduce runs in place (torch has no out-of-place "
      "all_reduce), all_gather into a list of views of one buffer" % (torch or "?"))
    w("- **ceiling**: %s, `iperf3 -c 127.0.0.1 -t %s -P 1` and `-P 2` (total of both streams)"
      % (iperf or "iperf3", a.iperf_secs))
    w("")
    w("## Method")
    w("")
    w("The same rules for every peer, all from `collie-bench` (the MPI and Gloo programs "
      "reimplement them): fp32 sum, root 0; sizes as nccl-tests (a size S is S/4 elements; "
      "allgather sends (S/4/N rounded down to 16 bytes) per rank, and the size column is the "
      "op's largest buffer, so allgather of 4 B is 0 B). Per size, after untimed warm-up ops:")
    w("")
    w("- **lat** (µs): `iters` times post one op and poll until it completes; the per-iteration "
      "times are reduced with MAX across ranks after the loop, and the median is reported.")
    w("- **busbw** (GB/s): `iters` ops posted back to back (up to 64 MiB of receive slots, so "
      "one at a time at 64 MiB), per-op mean averaged over ranks = time; algbw = bytes/time; "
      "busbw = algbw × nccl-tests' factor (allreduce 2(N-1)/N, broadcast 1, allgather (N-1)/N).")
    w("- **tiny-op rate** (ops/s): 4-byte allreduces, %s ops (after %s warm-up) with K = 1 or 16 "
      "in flight (post K, post another as the oldest completes); %s ops / the slowest rank's "
      "time." % (rate_iters, rate_warmup, rate_iters))
    w("- Iterations per size tier (identical for all peers): " + "; ".join(
        "%s: %d iters, %d warm-up" % (", ".join(human(S) for S in ss), it, wu)
        for ss, it, wu in tiers) + ".")
    w("- Results are %s. Every run is bounded by `timeout %s`; repeats are interleaved (repeat "
      "1 of every peer, then repeat 2, ...) with the peer order rotated per repeat. Raw CSVs "
      "and logs: `build/bench/raw/` (not committed)."
      % ("checked against a locally computed reference outside the timed loops (`--check`)"
         if a.check == "1" else "not checked (`--no-check`)", a.timeout))
    w("- Ratios are collie ÷ peer: for latency below 1 means collie is faster; for busbw and "
      "rates above 1 means collie is faster.")
    w("")

    # ---- loopback ceiling
    ceil = {}
    ceil_fail = {}
    ip = os.path.join(a.dir, "iperf.tsv")
    if os.path.exists(ip):
        for line in open(ip):
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 3:
                continue
            try:
                ceil.setdefault(int(parts[1]), []).append(float(parts[2]))
            except ValueError:
                ceil_fail.setdefault(int(parts[1]), parts[2])
    c1 = statistics.median(ceil[1]) if ceil.get(1) else None
    c2 = statistics.median(ceil[2]) if ceil.get(2) else None

    # ---- headline
    def med(n, peer, op, S, metric):
        return D.value(D.cells.get((n, peer, op, op_bytes(op, S, n), metric)))

    def rate(n, peer, k):
        return D.value(D.rates.get((n, peer, k)))

    w("## Headline")
    w("")
    w("| ranks | figure | " + " | ".join(NAMES[x] for x in peers) + " | " +
      " | ".join("collie/" + NAMES[x] for x in others) + " |")
    w("|---|---|" + "---|" * (len(peers) + len(others)))
    tag_of = dict(sizes)
    for n in ranks:
        rows = []
        if 4 in tag_of:
            rows.append(("4 B allreduce lat (µs)", "allreduce", 4, "lat", fmt_lat))
        for S in (16 << 20, 64 << 20):
            if S in tag_of:
                rows.append(("%s allreduce busbw (GB/s)" % human(S), "allreduce", S, "busbw",
                             fmt_bw))
        for label, op, S, metric, f in rows:
            vals = {x: med(n, x, op, S, metric) for x in peers}
            cells = [D.cell(D.cells.get((n, x, op, op_bytes(op, S, n), metric)), f, n, x,
                            tag_of[S]) for x in peers]
            w("| %d | %s | %s | %s |" % (n, label, " | ".join(cells), " | ".join(
                ratio(vals.get("collie"), vals[x]) for x in others)))
        for k in (1, 16):
            vals = {x: rate(n, x, k) for x in peers}
            cells = [D.cell(D.rates.get((n, x, k)), fmt_rate, n, x, "rate%d" % k) for x in peers]
            w("| %d | 4 B allreduce rate, %d in flight (ops/s) | %s | %s |" % (
                n, k, " | ".join(cells), " | ".join(ratio(vals.get("collie"), vals[x])
                                                    for x in others)))
    w("")

    w("## Loopback ceiling")
    w("")
    w("| iperf3 on 127.0.0.1 | GB/s |")
    w("|---|---|")
    for k, c in ((1, c1), (2, c2)):
        w("| %d stream%s%s | %s |" % (k, "s" * (k > 1), " (total)" if k > 1 else "",
                                      fmt_bw(c) if c is not None else ceil_fail.get(k, "–")))
    w("")
    if "collie" in peers:
        w("Fraction of the ceiling reached by collie's allreduce busbw (busbw is what each rank "
          "sends and receives per second, so one stream is the natural ceiling; two streams "
          "show what the loopback gives when both directions are busy):")
        w("")
        w("| ranks | size | collie busbw GB/s | of 1 stream | of 2 streams (total) |")
        w("|---|---|---|---|---|")
        for n in ranks:
            for S in (16 << 20, 64 << 20):
                if S not in tag_of:
                    continue
                v = med(n, "collie", "allreduce", S, "busbw")
                w("| %d | %s | %s | %s | %s |" % (
                    n, human(S), fmt_bw(v) if v is not None else "–",
                    "%.0f%%" % (100 * v / c1) if v is not None and c1 else "–",
                    "%.0f%%" % (100 * v / c2) if v is not None and c2 else "–"))
        w("")

    w("## Reading the tables")
    w("")
    w("- The machine is shared with other engineers' builds and tests (see the load average "
      "above): single cells move by tens of percent between runs; trust patterns across sizes "
      "more than one cell.")
    if any(n > (ncpu or n) for n in ranks):
        w("- %s ranks oversubscribe the %s cores. A library that busy-polls then waits for the "
          "scheduler to run the rank it needs, so its small-op latency jumps from µs to ms: "
          "MPICH's UCX progress loop spins (`ucp_worker_progress` → `epoll_wait(..., 0)`, seen "
          "with gdb); Gloo's ranks (Python plus Gloo's worker threads) show a similar jump."
          % ("/".join(str(n) for n in ranks if n > (ncpu or n)), ncpu))
    w("- allgather of 4 B moves 0 bytes per rank (the nccl-tests size rule), so its row is the "
      "cost of an empty op.")
    w("- At 64 MiB the 64 MiB receive arena holds one op, so the back-to-back batch runs one op "
      "at a time for every peer (as collie-bench does); at smaller sizes the batch keeps "
      "min(iters, 64 MiB / size) ops in flight.")
    w("")

    # ---- full tables
    w("## Tiny-op rate (4 B allreduce, ops/s)")
    w("")
    w("| ranks | in flight | " + " | ".join(NAMES[x] for x in peers) + " | " +
      " | ".join("collie/" + NAMES[x] for x in others) + " |")
    w("|---|---|" + "---|" * (len(peers) + len(others)))
    for n in ranks:
        for k in (1, 16):
            vals = {x: rate(n, x, k) for x in peers}
            cells = [D.cell(D.rates.get((n, x, k)), fmt_rate, n, x, "rate%d" % k) for x in peers]
            w("| %d | %d | %s | %s |" % (n, k, " | ".join(cells), " | ".join(
                ratio(vals.get("collie"), vals[x]) for x in others)))
    w("")
    for n in ranks:
        w("## %d ranks" % n)
        w("")
        for op in OPS:
            for metric, title, f in (("lat", "latency, µs (lower is better)", fmt_lat),
                                     ("busbw", "busbw, GB/s (higher is better)", fmt_bw)):
                w("### %s, %d ranks — %s" % (op, n, title))
                w("")
                w("| size | bytes | " + " | ".join(NAMES[x] for x in peers) + " | " +
                  " | ".join("collie/" + NAMES[x] for x in others) + " |")
                w("|---|---|" + "---|" * (len(peers) + len(others)))
                for S, tag in sizes:
                    b = op_bytes(op, S, n)
                    vals = {x: D.value(D.cells.get((n, x, op, b, metric))) for x in peers}
                    cells = [D.cell(D.cells.get((n, x, op, b, metric)), f, n, x, tag,
                                    blank=(b == 0)) for x in peers]
                    w("| %s | %d | %s | %s |" % (human(S), b, " | ".join(cells), " | ".join(
                        ratio(vals.get("collie"), vals[x]) for x in others)))
                w("")

    # ---- failures
    w("## Failed runs")
    w("")
    if not D.fail:
        w("None.")
    else:
        w("| ranks | peer | run | reason (repeats) |")
        w("|---|---|---|---|")
        for (n, peer, tag), reasons in sorted(D.fail.items()):
            uniq = sorted(set(reasons), key=reasons.index)
            w("| %d | %s | %s | %s |" % (n, NAMES.get(peer, peer), tag, "; ".join(
                "%s (%d)" % (r, reasons.count(r)) for r in uniq)))
    if 0 in [op_bytes("allgather", S, n) for S, _ in sizes for n in ranks] and "gloo" in peers:
        w("")
        w("Gloo's allgather of 4 B (0 bytes per rank) is n/a: torch 1.13's Gloo dies of SIGFPE "
          "on empty tensors, so gloo_bench.py skips it.")
    w("")
    w("## Notes on runs")
    w("")
    if not D.notes:
        w("None.")
    else:
        w("| ranks | peer | run | note (repeats) |")
        w("|---|---|---|---|")
        for (n, peer, tag), notes in sorted(D.notes.items()):
            uniq = sorted(set(notes), key=notes.index)
            w("| %d | %s | %s | %s |" % (n, NAMES.get(peer, peer), tag, "; ".join(
                "%s (%d)" % (x, notes.count(x)) for x in uniq)))
        if any(k[1] == "mpich" for k in D.notes):
            w("")
            w("MPICH 4.0.2 on UCX 1.13.1's TCP transport intermittently hangs in `MPI_Finalize` "
              "(seen mostly with 4 ranks): every rank but one waits in the PMI barrier while one "
              "spins in `ucp_worker_progress` flushing its endpoints, which needs progress from "
              "ranks that no longer make any (the UCX TCP cleanup bug, openucx/ucx#8738). "
              "The results had all been printed and checked, so they are kept.")
    w("")
    with open(a.out, "w") as f:
        f.write("\n".join(out))


if __name__ == "__main__":
    main()
