"""collie through torch.distributed beside gloo, and the collie Python package
alone: the same loop of `op(t, async_op=True).wait()` per size, ranks as
processes on this host, medians of single ops (as collie-bench's lat_us).

    /usr/bin/python3 bench/torch_bench.py [--ranks 2,4] [--ops allreduce,broadcast,...]
        [--min 4] [--max 64M] [--iters 200] [--out FILE]

Prints a markdown table (median microseconds per op, collie/gloo ratio) and
the glue figure: torch all_reduce of a 4-byte tensor through collie minus
collie-bench's 4-byte allreduce lat_us, measured in the same run.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))


OPS = ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall", "gather",
       "scatter"]


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper().rstrip("B")
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


def sizes(lo, hi):
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 4
    return out


def iters_for(nbytes, base):
    if nbytes >= 16 << 20:
        return max(5, base // 40)
    if nbytes >= 1 << 20:
        return max(10, base // 10)
    return base


def worker(args):
    rank, world = args.rank, args.world
    import numpy as np

    results = {}
    if args.backend == "package":
        import collie

        eng = collie.Engine()
        st = collie.Store(eng, args.store)
        comm = collie.Comm(eng, st, rank, world, name="bench", timeout=120)

        def run(op, n):
            # n bytes per rank's chunk: the input, or each peer's part
            x = np.ones(n // 4, np.float32)
            big = np.ones(n // 4 * world, np.float32)
            if op == "allreduce":
                return lambda: comm.allreduce(x).wait()
            if op == "broadcast":
                return lambda: comm.broadcast(x, root=0).wait()
            if op == "reduce":
                return lambda: comm.reduce(x, root=0).wait()
            if op == "allgather":
                return lambda: comm.allgather(x, big).wait()
            if op == "reduce_scatter":
                return lambda: comm.reduce_scatter(big, x).wait()
            if op == "alltoall":
                out = np.empty_like(big)
                return lambda: comm.alltoall(big, out).wait()
            if op == "gather":
                return lambda: comm.gather(x, big if rank == 0 else None, root=0).wait()
            if op == "scatter":
                return lambda: comm.scatter(big if rank == 0 else None, x, root=0).wait()
            raise SystemExit(f"unknown op {op}")

        barrier = lambda: comm.barrier().wait()  # noqa: E731
    else:
        import torch
        import torch.distributed as dist

        if args.backend == "collie":
            import collie.torch  # noqa: F401
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
        dist.init_process_group(args.backend, rank=rank, world_size=world)

        def run(op, n):
            t = torch.ones(n // 4, dtype=torch.float32)
            big = torch.ones(n // 4 * world, dtype=torch.float32)
            parts = [torch.ones_like(t) for _ in range(world)]
            if op == "allreduce":
                return lambda: dist.all_reduce(t, async_op=True).wait()
            if op == "broadcast":
                return lambda: dist.broadcast(t, 0, async_op=True).wait()
            if op == "reduce":
                return lambda: dist.reduce(t, 0, async_op=True).wait()
            if op == "allgather":
                return lambda: dist.all_gather(parts, t, async_op=True).wait()
            if op == "reduce_scatter":
                return lambda: dist.reduce_scatter_tensor(t, big, async_op=True).wait()
            if op == "alltoall":
                out = torch.empty_like(big)
                return lambda: dist.all_to_all_single(out, big, async_op=True).wait()
            if op == "gather":
                return lambda: dist.gather(t, parts if rank == 0 else None, 0, async_op=True).wait()
            if op == "scatter":
                return lambda: dist.scatter(t, parts if rank == 0 else None, 0, async_op=True).wait()
            raise SystemExit(f"unknown op {op}")

        barrier = dist.barrier
    for op in args.ops.split(","):
        for n in sizes(args.min, args.max):
            fn = run(op, n)
            try:  # an op the backend lacks raises on every rank alike (gloo's checks are local)
                fn()
            except RuntimeError as e:
                print(f"{args.backend}: {op} unsupported: {str(e).splitlines()[0]}", file=sys.stderr)
                results.update({f"{op}:{m}": None for m in sizes(args.min, args.max)})
                break
            it = iters_for(n, args.iters)
            for _ in range(max(3, it // 10)):
                fn()
            barrier()
            times = []
            for _ in range(it):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            results[f"{op}:{n}"] = statistics.median(times) * 1e6
    barrier()
    if rank == 0:
        print("RESULT " + json.dumps(results), flush=True)
    if args.backend == "package":
        comm.destroy()
        st.close()
        eng.close()
    else:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(backend, world, args):
    extra, srv = [], None
    if backend == "package":
        import collie

        eng = collie.Engine()
        srv = collie.StoreServer(eng)
        extra = ["--store", srv.address]
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", "--backend", backend, "--rank", str(r),
             "--world", str(world), "--port", str(port), "--ops", args.ops, "--min", str(args.min),
             "--max", str(args.max), "--iters", str(args.iters)] + extra,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        for r in range(world)
    ]
    res = None
    for p in procs:
        out, _ = p.communicate(timeout=1800)
        for line in out.splitlines():
            if line.startswith("RESULT "):
                res = json.loads(line[7:])
    if srv is not None:
        srv.close()
        eng.close()
    if res is None:
        raise SystemExit(f"{backend} at {world} ranks gave no result")
    return res


def collie_bench_4b():
    out = subprocess.run(
        [os.path.join(ROOT, "build", "bin", "collie-run"), "-n", "2", "--",
         os.path.join(ROOT, "build", "bin", "collie-bench"), "--op", "allreduce", "-b", "4",
         "-e", "4", "-n", "2000", "--csv"],
        capture_output=True, text=True, timeout=600, check=True,
    ).stdout
    for line in out.splitlines():
        line = line.split("] ", 1)[-1]
        if line.startswith("allreduce,4,"):
            return float(line.split(",")[3])
    raise SystemExit("collie-bench printed no 4-byte allreduce row")


def fmt(us):
    return "unsupported" if us is None else f"{us:.1f}"


def human(n):
    for unit, s in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= s:
            return f"{n // s} {unit}"
    return f"{n} B"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--backend", default="collie")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--store", default=None)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--min", type=parse_size, default=4)
    ap.add_argument("--max", type=parse_size, default=64 << 20)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    lines = ["| op | size | ranks | gloo (us) | collie via torch (us) | collie package (us) | collie/gloo |",
             "|---|---|---|---|---|---|---|"]
    glue = None
    for world in [int(w) for w in args.ranks.split(",")]:
        res = {b: launch(b, world, args) for b in ("gloo", "collie", "package")}
        for key in res["gloo"]:
            op, n = key.split(":")
            g, c, p = res["gloo"][key], res["collie"][key], res["package"][key]
            ratio = f"{c / g:.2f}" if g and c else "-"
            lines.append(f"| {op} | {human(int(n))} | {world} | {fmt(g)} | {fmt(c)} | {fmt(p)} | {ratio} |")
        if world == 2 and "allreduce:4" in res["collie"]:
            lat = collie_bench_4b()
            glue = (res["collie"]["allreduce:4"], res["package"]["allreduce:4"], lat)
    text = "\n".join(lines)
    if glue:
        text += (
            f"\n\nGlue at 2 ranks, 4 B allreduce: torch+collie {glue[0]:.1f} us, "
            f"collie package {glue[1]:.1f} us, collie-bench lat_us {glue[2]:.1f} us: "
            f"torch glue {glue[0] - glue[2]:+.1f} us, Python package {glue[1] - glue[2]:+.1f} us\n"
        )
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
