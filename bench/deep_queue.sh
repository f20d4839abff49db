#!/usr/bin/env bash
# deep_queue.sh — deep queues: 4 ranks (processes, collie-run) keep N 4-byte
# allreduces in flight (collie-bench --inflight N --iters N), for each N;
# reports ops/s, the per-op cost and each rank's peak RSS. Then, for each
# size of --fault-sizes, the same queue with rank 2 killed (SIGKILL) or
# stopped (SIGSTOP, sockets left open) once half of its works completed
# (bench/deep_fault.c): on every survivor, how long after the fault the
# first work failed, when every work had ended, and how far past its own
# deadline any work stayed pending. Both tables are written into the "Deep
# queues" section of bench/RESULTS.md (between two marker comments,
# replaced in place or appended).
#
#   bench/deep_queue.sh [--sizes "10000 100000 1000000"]
#                       [--fault-sizes "10000 100000 1000000"] [--out FILE] [--no-write]
#
# The op deadline (COLLIE_TIMEOUT_MS) is 600 s for the healthy runs and the
# kill (so the deepest queue is never cut by it: the fault is what ends it)
# and 10 s for the stop (the deadline is what ends it). Every run is bounded
# by timeout(1); a failed run stops the script. The build must exist (`make`).
set -euo pipefail

cd "$(dirname "$0")/.."
NS="10000 100000 1000000"
FNS="10000 100000 1000000"
OUT=bench/RESULTS.md
WRITE=1
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) NS=$2; shift 2 ;;
    --fault-sizes) FNS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-write) WRITE=0; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "deep_queue.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
for n in $NS $FNS; do
  case "$n" in ''|*[!0-9]*|0) echo "deep_queue.sh: sizes must be counts > 0" >&2; exit 2 ;; esac
done

command -v /usr/bin/time >/dev/null || { echo "deep_queue.sh: needs /usr/bin/time (apt-get install time)" >&2; exit 2; }
[ -x build/bin/collie-bench ] || { echo "deep_queue.sh: build first (make)" >&2; exit 2; }

rows=""
for n in $NS; do
  tmp=$(mktemp -d)
  start=$(date +%s%N)
  COLLIE_TIMEOUT_MS=600000 timeout 900 build/bin/collie-run -n 4 --timeout 850 -- \
    /usr/bin/time -f "maxrss_kib %M" -o "$tmp/rss.%p" \
    build/bin/collie-bench --op allreduce --sizes 4 --inflight "$n" --iters "$n" --warmup 1 \
    --timeout-ms 600000 --csv > "$tmp/out" 2>&1 || { cat "$tmp/out" >&2; exit 1; }
  wall=$(( ($(date +%s%N) - start) / 1000000 ))
  ops=$(awk -F, '$1 ~ /allreduce$/ { printf "%.0f", $7 }' "$tmp/out")
  [ -n "$ops" ] || { cat "$tmp/out" >&2; echo "deep_queue.sh: no result for N=$n" >&2; exit 1; }
  us=$(awk -v o="$ops" 'BEGIN { printf "%.1f", 1e6 / o }')
  rss=$(cat "$tmp"/rss.* | awk '{ if ($2 > m) m = $2 } END { print m }')
  per=$(awk -v r="$rss" -v n="$n" 'BEGIN { printf "%.2f", r / n }')
  rows="$rows| $n | $ops | $us | $rss | $per | $((wall / 1000)).$(( (wall % 1000) / 100 )) |
"
  echo "N=$n: $ops ops/s ($us us per op), peak RSS $rss KiB per rank ($per KiB per work in flight), ${wall} ms"
  rm -rf "$tmp"
done

# ---- faults in a deep queue -------------------------------------------------
mkdir -p build/bench
cc -std=c11 -D_GNU_SOURCE -O2 -I include bench/deep_fault.c build/lib/libcollie.a \
  -levent -lcrypto -pthread -o build/bench/deep_fault
frows=""
for mode in kill stop; do
  for n in $FNS; do
    tmp=$(mktemp -d)
    ms=600000
    [ "$mode" = stop ] && ms=10000
    COLLIE_TIMEOUT_MS=$ms COLLIE_LOG=error timeout 900 build/bin/collie-run -n 4 --keep-going \
      --timeout 850 -- build/bench/deep_fault "$mode" "$n" 2 "$tmp/fault" > "$tmp/out" 2>&1 &
    runner=$!
    if [ "$mode" = stop ]; then  # the victim stays stopped: end it once the survivors report
      for _ in $(seq 1 6000); do
        [ "$(grep -c ' RESULT ' "$tmp/out" || true)" -ge 3 ] && break
        kill -0 "$runner" 2>/dev/null || break
        sleep 0.1
      done
      [ -f "$tmp/fault.pid" ] && kill -KILL "$(cat "$tmp/fault.pid")" 2>/dev/null || true
    fi
    wait "$runner" || true  # rank 2's end is reported as a failure by collie-run
    res=$(grep ' RESULT ' "$tmp/out" || true)
    if [ "$(echo "$res" | grep -c RESULT)" -ne 3 ] || echo "$res" | grep -q 'pending=[1-9]'; then
      cat "$tmp/out" >&2; echo "deep_queue.sh: the $mode run with N=$n failed" >&2; exit 1
    fi
    field() { echo "$res" | sed -n "s/.* $1=\([-0-9.]*\).*/\1/p" | sort -g | tail -n 1; }
    first=$(field first_ms); all=$(field all_ms); gone=$(field gone_ms); late=$(field late_ms)
    failed=$(echo "$res" | sed -n 's/.* failed=\([0-9]*\).*/\1/p' | awk '{ s += $1 } END { print s }')
    st=$(echo "$res" | sed -n 's/.* status=\(COLLIE_[A-Z]*\).*/\1/p' | sort -u | paste -sd/)
    [ "$mode" = stop ] && gone="-"
    frows="$frows| $mode | $n | $gone | $first | $all | $late | $failed | $st |
"
    echo "$mode N=$n: dead (sockets closed) ${gone} ms; first failure ${first} ms, all ended ${all} ms after the fault; worst past deadline ${late} ms; $failed works failed on the survivors ($st)"
    rm -rf "$tmp"
  done
done

[ "$WRITE" -eq 1 ] || exit 0
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
section=$(cat <<EOS
<!-- deepqueue:begin (written by bench/deep_queue.sh; do not edit by hand) -->
## Deep queues

Written by \`bench/deep_queue.sh --sizes "$NS" --fault-sizes "$FNS"\` on $(date -u +%Y-%m-%d) ($(nproc) cores, $cpu):
4 ranks as processes on one host (collie-run, TCP over loopback), each keeping N 4-byte
allreduces in flight (\`collie-bench --op allreduce --sizes 4 --inflight N --iters N\`),
op deadline 600 s. Peak RSS is the largest of the 4 ranks (whole process, /usr/bin/time).

| N in flight | ops/s (rank 0) | us per op | peak RSS KiB | KiB per work | wall s |
|---|---|---|---|---|---|
$rows
A fault in the queue (\`bench/deep_fault.c\`): the same N allreduces posted at once, rank 2
SIGKILLed (op deadline 600 s: the death is what ends the queue) or SIGSTOPped (sockets
left open; op deadline 10 s: the deadline is what ends it) once half of its own works
completed. Times are from the fault instant (written by rank 2 just before it raises the
signal; CLOCK_MONOTONIC, shared by the processes), the largest over the 3 survivors;
"sockets closed" is when the kernel reported rank 2's process gone (a pidfd), which is
when its connections close and anyone can first learn of the death: the kernel frees
the dead rank's memory first, which takes longer the deeper its queue.

| fault | N | sockets closed ms | first work failed ms | every work ended ms | most past own deadline ms | works failed (3 survivors) | status of the first |
|---|---|---|---|---|---|---|---|
$frows
<!-- deepqueue:end -->
EOS
)
. bench/results_section.sh
write_results_section deepqueue "$OUT" "$section"
echo "deep_queue.sh: wrote the Deep queues section of $OUT"
