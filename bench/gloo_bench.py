#!/usr/bin/python3
"""gloo_bench.py - the Gloo peer of collie-bench for bench/peers.sh.

Starts N local ranks of itself, each a torch.distributed process group with
backend "gloo" over TCP on 127.0.0.1 (TCPStore rendezvous, GLOO_SOCKET_IFNAME
lo), sweeps message sizes for all_reduce, broadcast and all_gather posted with
async_op=True and completed with work.wait(), and prints collie-bench's CSV:

    /usr/bin/python3 bench/gloo_bench.py -n N [--op LIST|all] [--sizes LIST]
        [--iters N] [--warmup N] [--inflight K] [--check] [--csv]
        [--timeout S]

Design notes
 - Same rules as collie-bench (tools/bench/bench_row.c) and
   bench/mpi_bench.c: fp32 sum, root 0; sizes follow nccl-tests (a size S is S/4 elements; all_gather
   sends base = (S/4/N) rounded down to 16 bytes, receives N*base); "bytes"
   is the op's largest buffer; busbw factors are nccl-tests'.
 - Three timings per size, each after a barrier: batch (iters ops back to
   back, up to one receive slot per op in flight; per-op mean averaged over
   ranks -> algbw, busbw), lat (iters times post one op and wait for it; the
   per-iteration times are combined with one MAX all_reduce after the loop,
   median -> lat_us), inflight (--inflight K: iters ops with K in flight;
   ops_per_s = iters / the slowest rank's elapsed time).
 - Buffers as collie-bench: one send tensor of the largest size, a receive
   arena of max(iters, warmup) slots of the largest size capped at 64 MiB
   (at least one slot); slots are views, built before timing. torch's
   all_reduce is in place, so allreduce runs in place on the slot (the
   others are out of place as in MPI); all_gather takes a list of N views of
   the slot (torch 1.13's Gloo has no all_gather into one tensor).
 - --check: small-integer inputs, exact in fp32, verified after the first
   op; broadcast and all_gather slots are verified again after the timed
   loops (allreduce slots are zeroed before timing instead: in place, they
   would grow without bound).
 - A size whose count is 0 (all_gather of 4 bytes) prints a row without
   figures: torch 1.13's Gloo dies of SIGFPE on empty tensors.
 - The launcher (this file without GLOO_BENCH_RANK) starts the ranks, bounds
   the job with --timeout and stops every rank when one fails. Only rank 0
   prints results. Exit 0 ok, 1 error or check failure, 2 usage.
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import time

OPS = ("allreduce", "broadcast", "allgather")
ROOT = 0
SLOT_ALIGN = 64
ARENA_BYTES = 64 << 20
ES = 4  # fp32


def parse_size(s):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    s = s.strip()
    if s and s[-1].lower() in mult:
        return int(s[:-1]) * mult[s[-1].lower()]
    return int(s)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-n", "--nranks", type=int, default=2)
    p.add_argument("--op", default="all")
    p.add_argument("--sizes", default="4,4096,1048576,16777216")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--inflight", type=int, default=0)
    p.add_argument("--check", action="store_true")
    p.add_argument("--csv", action="store_true")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole job")
    a = p.parse_args(argv)
    try:
        a.sizes = [parse_size(s) for s in a.sizes.split(",")]
    except ValueError:
        p.error("--sizes: want byte counts like 4,4K,1M")
    ops = OPS if a.op == "all" else a.op.split(",")
    bad = [o for o in ops if o not in OPS]
    if bad:
        p.error("unknown --op %s (allreduce, broadcast, allgather, all)" % ",".join(bad))
    a.ops = [o for o in OPS if o in ops]
    if a.iters < 1 or a.warmup < 0 or a.inflight < 0 or a.nranks < 1:
        p.error("--iters >= 1, --warmup >= 0, --inflight >= 0, -n >= 1")
    a.inflight = min(a.inflight, a.iters)
    return a


# ---- launcher ------------------------------------------------------------------


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(a, argv):
    port = free_port()
    procs = []
    for r in range(a.nranks):
        env = dict(os.environ)
        env.update(
            GLOO_BENCH_RANK=str(r),
            GLOO_BENCH_WORLD=str(a.nranks),
            GLOO_BENCH_PORT=str(port),
            GLOO_SOCKET_IFNAME="lo",
            OMP_NUM_THREADS="1",
        )
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv, env=env,
                                      stdout=None if r == 0 else subprocess.DEVNULL))
    deadline = time.monotonic() + a.timeout
    rc = 0
    live = list(procs)
    while live:
        for p in list(live):
            if p.poll() is not None:
                live.remove(p)
                if p.returncode != 0 and rc == 0:
                    rc = 1
                    sys.stderr.write("gloo_bench: rank %d exited with %d; stopping the others\n" %
                                     (procs.index(p), p.returncode))
        if live and (rc != 0 or time.monotonic() > deadline):
            if rc == 0:
                sys.stderr.write("gloo_bench: the job took longer than %g s; stopping it\n" %
                                 a.timeout)
                rc = 1
            for p in live:
                p.send_signal(signal.SIGTERM)
            t = time.monotonic() + 3
            for p in live:
                try:
                    p.wait(max(0.1, t - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            live = []
        time.sleep(0.05)
    return rc


# ---- one rank ------------------------------------------------------------------


def counts_for(op, S, n):
    count = S // ES
    base = (count // n) & ~(16 // ES - 1)
    if op == "allgather":
        param, send, recv = base, base, base * n
    else:
        param, send, recv = count, count, count
    return param, send, recv, max(send, recv) * ES


def busbw_factor(op, n):
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op == "broadcast":
        return 1.0
    return (n - 1) / n


class Rank:
    def __init__(self, a):
        import datetime

        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.a = torch, dist, a
        torch.set_num_threads(1)
        self.rank = int(os.environ["GLOO_BENCH_RANK"])
        self.size = int(os.environ["GLOO_BENCH_WORLD"])
        tmo = datetime.timedelta(seconds=a.timeout)
        store = dist.TCPStore("127.0.0.1", int(os.environ["GLOO_BENCH_PORT"]), self.size,
                              self.rank == 0, timeout=tmo)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.size,
                                timeout=tmo)
        max_bytes = max([SLOT_ALIGN] + a.sizes)
        max_bytes = (max_bytes + SLOT_ALIGN - 1) // SLOT_ALIGN * SLOT_ALIGN
        depth = max(a.iters, a.warmup)
        depth = max(1, min(depth, ARENA_BYTES // max_bytes))
        self.send = torch.zeros(max_bytes // ES, dtype=torch.float32)
        self.arena = torch.zeros(depth * max_bytes // ES, dtype=torch.float32)
        self.lat = torch.zeros(a.iters + 2, dtype=torch.float64)

    # inputs for --check: small integers, exact in fp32
    def vals(self, op, seed, q, n):
        g = self.torch.Generator().manual_seed(seed * 1000003 + q)
        if op == "allreduce":
            return self.torch.randint(-4, 5, (n,), generator=g).float()
        return self.torch.randint(-(1 << 23), 1 << 23, (n,), generator=g).float()

    def expected(self, op, seed, k):
        param, send, recv, _ = k
        if op == "allreduce":
            return sum(self.vals(op, seed, q, recv) for q in range(self.size))
        if op == "broadcast":
            return self.vals(op, seed, ROOT, recv)
        return self.torch.cat([self.vals(op, seed, q, param) for q in range(self.size)])

    def verify(self, op, seed, k, slot, when):
        want = self.expected(op, seed, k)
        got = self.slots[slot][: k[2]]
        if self.torch.equal(got, want):
            return True
        i = int((got != want).nonzero()[0])
        sys.stderr.write("gloo_bench: rank %d: %s of %d bytes, %s: element %d is %g, want %g\n" %
                         (self.rank, op, k[3], when, i, float(got[i]), float(want[i])))
        return False

    def post(self, op, slot):
        d = self.dist
        if op == "allreduce":
            return d.all_reduce(self.views[slot], op=d.ReduceOp.SUM, async_op=True)
        if op == "broadcast":
            return d.broadcast(self.views[slot], src=ROOT, async_op=True)
        return d.all_gather(self.views[slot], self.sendv, async_op=True)

    def ring(self, op, total, depth):
        works = [None] * depth
        posted = done = 0
        t0 = time.perf_counter()
        while done < total:
            while posted < total and posted - done < depth:
                works[posted % depth] = self.post(op, posted % depth)
                posted += 1
            works[done % depth].wait()
            works[done % depth] = None
            done += 1
        return time.perf_counter() - t0

    def one_size(self, op, S, size_idx):
        torch, dist, a, n = self.torch, self.dist, self.a, self.size
        k = counts_for(op, S, n)
        param, send, recv, nbytes = k
        if param == 0:
            # torch 1.13's Gloo dies of SIGFPE on empty tensors: a row
            # without figures says the size was not measured
            if self.rank == 0:
                print("%s,%d,%d,,,," % (op, nbytes, n) if a.csv else
                      "  %14s %13d  (not run: Gloo cannot take empty tensors)" % (op, nbytes),
                      flush=True)
            return True
        seed = (OPS.index(op) * 7919 + size_idx * 104729 + 1) & 0xFFFFFFFF
        slot_bytes = max(SLOT_ALIGN, (recv * ES + SLOT_ALIGN - 1) // SLOT_ALIGN * SLOT_ALIGN)
        nslots = self.arena.numel() * ES // slot_bytes
        batch_depth = min(a.iters, nslots)
        warm_depth = min(a.warmup, nslots)
        infl_depth = min(a.inflight, nslots)
        used = max(batch_depth, warm_depth, infl_depth, 1)
        se = slot_bytes // ES
        self.slots = [self.arena[s * se:s * se + recv] for s in range(used)]
        self.sendv = self.send[:send]
        if op == "allgather":
            self.views = [[sl[q * param:(q + 1) * param] for q in range(n)] for sl in self.slots]
        else:
            self.views = self.slots
        ok = True
        if a.check:
            self.slots[0].fill_(float("nan"))
            if op == "allreduce":
                self.slots[0].copy_(self.vals(op, seed, self.rank, recv))
            elif op == "broadcast":
                if self.rank == ROOT:
                    for sl in self.slots:
                        sl.copy_(self.vals(op, seed, ROOT, recv))
            else:
                self.sendv.copy_(self.vals(op, seed, self.rank, send))
            self.ring(op, 1, 1)
            ok = self.verify(op, seed, k, 0, "after the first op")
            if op == "allreduce":
                self.slots[0].zero_()
        if a.warmup:
            self.ring(op, a.warmup, warm_depth)

        dist.barrier()
        avg = self.ring(op, a.iters, batch_depth) / a.iters

        dist.barrier()
        lat = self.lat
        for i in range(a.iters):
            lat[i] = self.ring(op, 1, 1)

        lat[a.iters] = 0.0
        if a.inflight:
            dist.barrier()
            lat[a.iters] = self.ring(op, a.iters, infl_depth)
        if a.check and op != "allreduce":
            for s in range(used):
                ok = ok and self.verify(op, seed, k, s, "after the timed loops")
        lat[a.iters + 1] = 0.0 if ok else 1.0

        dist.all_reduce(lat, op=dist.ReduceOp.MAX)
        avg_t = torch.tensor([avg], dtype=torch.float64)
        dist.all_reduce(avg_t, op=dist.ReduceOp.SUM)
        avg = float(avg_t[0]) / n
        if lat[a.iters + 1] != 0.0:
            if self.rank == 0:
                sys.stderr.write("gloo_bench: %s of %d bytes: check failed (see the ranks above)\n"
                                 % (op, nbytes))
            return False
        inflight_s = float(lat[a.iters])
        srt = sorted(lat[: a.iters].tolist())
        m = a.iters // 2
        median = srt[m] if a.iters % 2 else (srt[m - 1] + srt[m]) / 2.0
        ops_s = a.iters / inflight_s if inflight_s > 0 else 0.0
        if self.rank == 0:
            self.print_row(op, nbytes, avg, median, ops_s)
        return True

    def print_row(self, op, nbytes, time_s, lat_s, ops_s):
        algbw = nbytes / 1e9 / time_s if time_s > 0 else 0.0
        busbw = algbw * busbw_factor(op, self.size)
        if self.a.csv:
            rate = ("%.1f" % ops_s) if self.a.inflight else ""
            print("%s,%d,%d,%.3f,%.6f,%.6f,%s" % (op, nbytes, self.size, lat_s * 1e6, algbw, busbw,
                                                  rate), flush=True)
        else:
            print("  %14s %13d %10.2f %10.2f %11.3f %11.3f %12.0f" %
                  (op, nbytes, time_s * 1e6, lat_s * 1e6, algbw, busbw, ops_s), flush=True)

    def run(self):
        a = self.a
        if self.rank == 0:
            if a.csv:
                print("op,bytes,ranks,lat_us,algbw_GBps,busbw_GBps,ops_per_s", flush=True)
            else:
                print("# gloo_bench: %d ranks, torch %s, fp32 sum, root %d, iters %d, warmup %d, "
                      "inflight %d" % (self.size, self.torch.__version__, ROOT, a.iters, a.warmup,
                                       a.inflight))
                print("# %14s %13s %10s %10s %11s %11s %12s" %
                      ("op", "bytes", "time_us", "lat_us", "algbw_GBps", "busbw_GBps", "ops_per_s"),
                      flush=True)
        ok = True
        for op in a.ops:
            for i, S in enumerate(a.sizes):
                ok = self.one_size(op, S, i)
                if not ok:
                    break
            if not ok:
                break
        self.dist.barrier()
        self.dist.destroy_process_group()
        return 0 if ok else 1


def main():
    argv = sys.argv[1:]
    a = parse_args(argv)
    if "GLOO_BENCH_RANK" not in os.environ:
        return launch(a, argv)
    return Rank(a).run()


if __name__ == "__main__":
    sys.exit(main())
