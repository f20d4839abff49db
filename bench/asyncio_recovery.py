"""asyncio_recovery.py — the event loop through a kill and re-create
(issue 32): runs examples/asyncio_recovery.py under collie-run, 4 ranks on
this host, RUNS times in each mode, and prints the survivors' numbers:

  replace          a rank SIGKILLed and restarted by collie-run (--restarts 1);
                   destroy_async + create_async
  replace-blocking the same with the blocking destroy() and Comm(...) (the
                   comparison: what the loop saw before)
  never            nobody comes back (--keep-going): the create is cancelled
                   after ASYNC_RECOVERY_CREATE_S=1 s

Per run, "lag" is the largest lag of the survivors' 1 ms heartbeat task
while they serve: the steady state (which includes detecting the fault),
the recovery (destroy and re-create, or the cancelled create) and after it
(the startup before the first comm is excluded: it makes the engine and
store with blocking calls); "recovery lag" is that of the recovery phase
alone, and "steady lag" that of serving before the fault (the control:
what this machine's scheduling costs the loop with no recovery at all).
The table gives the median over runs and the largest of all.
The example checks the bytes of every allreduce that returned OK.

    /usr/bin/python3 bench/asyncio_recovery.py [RUNS]
"""

import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
EXAMPLE = os.path.join(ROOT, "examples", "asyncio_recovery.py")
COLLIE_RUN = os.path.join(ROOT, "build", "bin", "collie-run")

MODES = {
    "replace": (["--restarts", "1"], {}),
    "replace-blocking": (["--restarts", "1"], {"ASYNC_RECOVERY_BLOCKING": "1"}),
    "never": (["--keep-going"], {"ASYNC_RECOVERY_CREATE_S": "1"}),
}


def run_once(mode):
    args, extra = MODES[mode]
    env = dict(os.environ, **extra)
    p = subprocess.run([COLLIE_RUN, "-n", "4", "--timeout", "120"] + args + ["--", sys.executable, EXAMPLE],
                       capture_output=True, text=True, timeout=180, env=env)
    reps = []
    for line in p.stdout.splitlines():
        body = line.split("] ", 1)[-1]
        if body.startswith("{"):
            reps.append(json.loads(body))
    survivors = [r for r in reps if r["result"] in ("recovered", "gave_up")]
    want = "gave_up" if mode == "never" else "recovered"
    if len(survivors) != 3 or any(r["result"] != want for r in survivors):
        raise SystemExit(f"{mode}: a run did not end as expected:\n{p.stdout[-4000:]}\n{p.stderr[-2000:]}")
    return survivors


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    print("| mode | runs | lag median (ms) | lag max (ms) | recovery lag median (ms) | recovery lag max (ms) "
          "| steady lag median (ms) | steady lag max (ms) | destroy (ms) | create / give up (ms) "
          "| fault to ready (ms) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for mode in MODES:
        lags, rlags, slags, destroys, creates, readies = [], [], [], [], [], []
        for _ in range(runs):
            surv = run_once(mode)
            lags.append(max(v for r in surv for k, v in r["lag_ms"].items() if k != "startup"))
            rlags.append(max(r["lag_ms"].get("recovery", 0.0) for r in surv))
            slags.append(max(r["lag_ms"].get("steady", 0.0) for r in surv))
            for r in surv:
                destroys.append(r["ms"]["destroy"])
                creates.append(r["ms"].get("create", r["ms"].get("gave_up_after", float("nan"))))
                if "fault_to_ready" in r["ms"]:
                    readies.append(r["ms"]["fault_to_ready"])
        ready = f"{med(readies):.1f}" if readies else "-"
        print(f"| {mode} | {runs} | {med(lags):.2f} | {max(lags):.2f} | {med(rlags):.2f} | {max(rlags):.2f} "
              f"| {med(slags):.2f} | {max(slags):.2f} "
              f"| {med(destroys):.1f} | "
              f"{med(creates):.1f} | {ready} |", flush=True)


if __name__ == "__main__":
    main()
