#!/usr/bin/python3
"""object_bench.py - collie's Comm.broadcast_object against torch's
dist.broadcast_object_list on gloo, side by side in one job.

    bench/object_bench.py [-n 2,4] [--iters 500] [--rounds 4] [--bytes 4096]
        [--python /usr/bin/python3] [--timeout 300]

Starts each world size with collie-run (build/bin): every rank makes a
collie comm (Comm.from_env) and a gloo process group (env://, which
collie-run provides), then broadcasts the same dict from rank 0 both ways.

Design notes
 - The object: a dict of small records whose pickle is about --bytes bytes
   (4 KiB: scheduler metadata broadcast every step); its size is printed.
 - Rounds alternate collie and gloo (noise on a shared machine hits both);
   each round times --iters back-to-back broadcasts after a barrier. An
   iteration's time is the slowest rank's (per-iteration times are combined
   with one MAX allreduce after the round); the figure is the median over
   every round's iterations, with p90 beside it.
 - Every rank checks every object it received against the root's (after
   the timed loop): a wrong object fails the run.
 - Run under Debian's torch 1.13 (/usr/bin/python3) or a torch 2.x venv's
   Python (--python): the collie package is plain ctypes and imports in both.
"""
import argparse
import array
import os
import pickle
import statistics
import subprocess
import sys
import time

ROOT_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def make_object(nbytes):
    d, i = {"step": 12345, "reqs": []}, 0
    while len(pickle.dumps(d, protocol=pickle.HIGHEST_PROTOCOL)) < nbytes:
        d["reqs"].append({"id": i, "tokens": 100 + 7 * i, "prio": i % 5, "name": f"r{i:05d}"})
        i += 1
    return d


def worker(args):
    sys.path.insert(0, os.path.join(ROOT_DIR, "python"))
    import collie
    import torch
    import torch.distributed as dist

    eng = collie.Engine()
    comm = collie.Comm.from_env(eng, timeout=60)
    dist.init_process_group("gloo", init_method="env://")
    rank, n = comm.rank, comm.size
    want = make_object(args.bytes)

    def collie_op():
        return comm.broadcast_object(want if rank == 0 else None, root=0)

    def gloo_op():
        objs = [want if rank == 0 else None]
        dist.broadcast_object_list(objs, src=0)
        return objs[0]

    times = {"collie": [], "gloo": []}
    for r in range(args.rounds):
        for name, op in (("collie", collie_op), ("gloo", gloo_op)) if r % 2 == 0 else (
                ("gloo", gloo_op), ("collie", collie_op)):
            for _ in range(20):  # warm-up
                op()
            got = [None] * args.iters
            t = array.array("d", [0.0] * args.iters)
            comm.barrier().wait()
            dist.barrier()
            for i in range(args.iters):
                t0 = time.perf_counter()
                got[i] = op()
                t[i] = time.perf_counter() - t0
            bad = sum(1 for g in got if g != want)
            if bad:
                raise SystemExit(f"rank {rank}: {name}: {bad} of {args.iters} objects differ")
            comm.allreduce(t, op="max").wait()
            times[name] += list(t)
    if rank == 0:
        size = len(pickle.dumps(want, protocol=pickle.HIGHEST_PROTOCOL))
        row = [f"{n}", f"{size}", torch.__version__]
        for name in ("collie", "gloo"):
            ts = sorted(times[name])
            row += [f"{statistics.median(ts) * 1e6:.1f}", f"{ts[int(len(ts) * 0.9)] * 1e6:.1f}"]
        print(",".join(row), flush=True)
    dist.destroy_process_group()
    comm.destroy()
    eng.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", default="2,4", help="world sizes (comma-separated)")
    ap.add_argument("--iters", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--bytes", type=int, default=4096)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    run = os.path.join(ROOT_DIR, "build", "bin", "collie-run")
    print("ranks,pickle_bytes,torch,collie_median_us,collie_p90_us,gloo_median_us,gloo_p90_us",
          flush=True)
    for n in [int(x) for x in args.n.split(",")]:
        cmd = [run, "-n", str(n), "--timeout", str(args.timeout), args.python,
               os.path.abspath(__file__), "--worker", "--iters", str(args.iters), "--rounds",
               str(args.rounds), "--bytes", str(args.bytes)]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=args.timeout + 30)
        for line in p.stdout.splitlines():
            print(line.split("] ", 1)[-1], flush=True)
        if p.returncode:
            sys.exit(f"object_bench: {n} ranks failed (exit {p.returncode})")


if __name__ == "__main__":
    main()
