#!/usr/bin/env bash
# faults.sh — how fast collie notices a dead or a hung rank: the median
# detection times of the kill and hang scenarios over several runs, as a
# small table; also written into the "Fault detection" section of
# bench/RESULTS.md (only that section: it sits between two marker comments
# and is replaced in place, or appended when missing).
#
#   bench/faults.sh [--runs N] [--out FILE] [--no-write]
#
# The scenarios are those of tests/test_faults.c (run by its --measure mode):
#   kill  4 ranks (processes) loop allreduces, 4 in flight, op timeout 30 s,
#         the store in a standalone collie-store; rank 2 is SIGKILLed. Run
#         twice: over shared memory (the default CPU backend's choice on one
#         host) and forced onto TCP.
#         Measured: kill → the last pending work of the last survivor failed.
#   hang  the same with a 2 s op timeout; rank 3 SIGSTOPs itself between two
#         allreduces (its sockets stay open). Measured: stop → the last
#         pending work of the last of ranks 0-2 failed.
# Times come from CLOCK_MONOTONIC stamps, which all processes of the host
# share (the work's completion time, collie_work_info().end_ns).
#
# Design notes: the build must exist (`make` and `make tests`: it runs
# build/tests/test_faults and build/bin/collie-store); every run is bounded by
# timeout(1); a failed run stops the script (a scenario that fails is a
# bug, not a data point). The report is rewritten between the markers only,
# so other sections of RESULTS.md (bench/peers.sh) are left alone.
set -euo pipefail

cd "$(dirname "$0")/.."
RUNS=5
OUT=bench/RESULTS.md
WRITE=1
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-write) WRITE=0; shift ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "faults.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
case "$RUNS" in ''|*[!0-9]*|0) echo "faults.sh: --runs needs a count > 0" >&2; exit 2 ;; esac

BUILD=${BUILD:-build}
T=$BUILD/tests/test_faults
for f in "$T" "$BUILD/bin/collie-store"; do
  [ -x "$f" ] || { echo "faults.sh: $f is missing: run 'make && make tests' first" >&2; exit 1; }
done

cmd="bench/faults.sh --runs $RUNS"
start=$(date -u +%Y-%m-%dT%H:%M:%SZ)
load0=$(cut -d' ' -f1-3 /proc/loadavg)

# measure CASE: prints the per-run lines; leaves "median min max" in $stats
measure() {
  local out
  if ! out=$(CLTEST_BUILD_DIR=$BUILD COLLIE_LOG=error timeout $((RUNS * 60 + 60)) \
             "$T" --measure "$1" "$RUNS" ${2:-} 2>/dev/null); then
    echo "faults.sh: the $1 scenario failed:" >&2
    echo "$out" | tail -n 40 >&2
    exit 1
  fi
  runs_list=$(echo "$out" | sed -n 's/^run [0-9]*: \([0-9.]*\) ms$/\1/p' | paste -sd' ')
  stats=$(echo "$out" | sed -n 's/^median \([0-9.]*\) ms, min \([0-9.]*\) ms, max \([0-9.]*\) ms$/\1 \2 \3/p')
  [ -n "$stats" ] || { echo "faults.sh: no result from the $1 scenario" >&2; exit 1; }
}

echo "# kill over shared memory: SIGKILL rank 2 of 4 (op timeout 30 s), $RUNS runs"
measure kill shm
kill_runs=$runs_list; read -r k_med k_min k_max <<< "$stats"
echo "# kill over TCP: SIGKILL rank 2 of 4 (op timeout 30 s), $RUNS runs"
measure kill tcp
killt_runs=$runs_list; read -r kt_med kt_min kt_max <<< "$stats"
echo "# hang: SIGSTOP rank 3 of 4 (op timeout 2 s), $RUNS runs"
measure hang
hang_runs=$runs_list; read -r h_med h_min h_max <<< "$stats"

end=$(date -u +%Y-%m-%dT%H:%M:%SZ)
load1=$(cut -d' ' -f1-3 /proc/loadavg)
over() { awk -v a="$1" 'BEGIN { printf "%+.0f", a - 2000 }'; }

table=$(cat <<EOF
| case | what is measured | median | min | max | required |
|---|---|---|---|---|---|
| kill, shared memory (SIGKILL rank 2 of 4, op timeout 30 s) | kill → every survivor's pending works failed | $k_med ms | $k_min ms | $k_max ms | < 10 ms |
| kill, TCP (the same, ranks forced onto TCP) | kill → every survivor's pending works failed | $kt_med ms | $kt_min ms | $kt_max ms | < 2000 ms |
| hang (SIGSTOP rank 3 of 4, op timeout 2 s) | stop → ranks 0-2 all failed | $h_med ms (timeout $(over "$h_med") ms) | $h_min ms | $h_max ms | < timeout + 1000 ms |
EOF
)
echo
echo "$table"
echo
echo "per run (ms): kill shm: $kill_runs; kill tcp: $killt_runs; hang: $hang_runs"

[ "$WRITE" = 1 ] || exit 0

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain 2>/dev/null | grep -q . && echo " + uncommitted changes" || true)
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
section=$(cat <<EOF
<!-- faults:begin (written by bench/faults.sh; edit the script, not this section) -->
## Fault detection

Written by \`bench/faults.sh\`: median, min and max over $RUNS runs of each scenario.

- **command**: \`$cmd\`
- **date**: $start → $end (UTC)
- **machine**: $(nproc) cores, $cpu, kernel $(uname -r); load average $load0 at the start, $load1 at the end (other work shares the machine)
- **collie**: commit $commit$dirty, \`$T --measure\` (the scenarios of \`tests/test_faults.c\`)
- **setup**: 4 ranks as separate processes on one host, each looping 64-element int32 allreduces with 4 in flight; the store in a standalone \`collie-store\`; default policy (ABORT_COMM). Times are CLOCK_MONOTONIC stamps shared by the processes: the kill or stop instant against each failed work's completion time.

$table

Per run (ms): kill over shared memory: $kill_runs; kill over TCP: $killt_runs; hang: $hang_runs.

How the faults are found. **Kill**: the dead rank's neighbours read EOF or a reset on its connections at once (over shared memory: on the Unix socket beside each ring, the link's doorbell, which the kernel closes with the process; the ring's last bytes are read first) and fail their oldest work with \`COLLIE_EPEER\`; their comms write the abort notice into the store, and every other rank's watch on the control channel delivers it, so all survivors fail with \`COLLIE_EABORTED\` naming rank 2, in about a millisecond, independent of the op timeout. **Hang**: a stopped process keeps its sockets open, so nothing is noticed before the 2 s deadline; the timed-out work then asks every rank for its progress (the desync report) and waits up to 600 ms for the stopped rank's answer, which never comes: hence timeout + ~600 ms.
<!-- faults:end -->
EOF
)

# replace the section between the markers, or append it; written through a
# temporary file and renamed, so a concurrent reader never sees half a file
. bench/results_section.sh
write_results_section faults "$OUT" "$section"
echo "faults.sh: wrote the Fault detection section of $OUT"
