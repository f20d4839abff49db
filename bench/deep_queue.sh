#!/usr/bin/env bash
# deep_queue.sh — deep queues: 4 ranks (processes, collie-run) keep N 4-byte
# allreduces in flight (collie-bench --inflight N --iters N), for each N;
# reports ops/s, the per-op cost and each rank's peak RSS, as a small table
# also written into the "Deep queues" section of bench/RESULTS.md (between
# two marker comments, replaced in place or appended).
#
#   bench/deep_queue.sh [--sizes "10000 100000"] [--out FILE] [--no-write]
#
# The op deadline (COLLIE_TIMEOUT_MS) is set to 600 s so the deepest queue
# is never cut by it; every run is bounded by timeout(1); a failed run stops
# the script. The build must exist (`make`).
set -euo pipefail

cd "$(dirname "$0")/.."
NS="10000 100000"
OUT=bench/RESULTS.md
WRITE=1
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) NS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-write) WRITE=0; shift ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "deep_queue.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
for n in $NS; do
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
    --timeout-ms 600000 > "$tmp/out" 2>&1 || { cat "$tmp/out" >&2; exit 1; }
  wall=$(( ($(date +%s%N) - start) / 1000000 ))
  ops=$(awk '$2 == "allreduce" { print $9 }' "$tmp/out")
  [ -n "$ops" ] || { cat "$tmp/out" >&2; echo "deep_queue.sh: no result for N=$n" >&2; exit 1; }
  us=$(awk -v o="$ops" 'BEGIN { printf "%.1f", 1e6 / o }')
  rss=$(cat "$tmp"/rss.* | awk '{ if ($2 > m) m = $2 } END { print m }')
  per=$(awk -v r="$rss" -v n="$n" 'BEGIN { printf "%.2f", r / n }')
  rows="$rows| $n | $ops | $us | $rss | $per | $((wall / 1000)).$(( (wall % 1000) / 100 )) |
"
  echo "N=$n: $ops ops/s ($us us per op), peak RSS $rss KiB per rank ($per KiB per work in flight), ${wall} ms"
  rm -rf "$tmp"
done

[ "$WRITE" -eq 1 ] || exit 0
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
section=$(cat <<EOS
<!-- deepqueue:begin (written by bench/deep_queue.sh; do not edit by hand) -->
## Deep queues

Written by \`bench/deep_queue.sh --sizes "$NS"\` on $(date -u +%Y-%m-%d) ($(nproc) cores, $cpu):
4 ranks as processes on one host (collie-run, TCP over loopback), each keeping N 4-byte
allreduces in flight (\`collie-bench --op allreduce --sizes 4 --inflight N --iters N\`),
op deadline 600 s. Peak RSS is the largest of the 4 ranks (whole process, /usr/bin/time).

| N in flight | ops/s (rank 0) | us per op | peak RSS KiB | KiB per work | wall s |
|---|---|---|---|---|---|
$rows
<!-- deepqueue:end -->
EOS
)
touch "$OUT"
tmp=$(mktemp "$OUT.XXXXXX")
chmod --reference="$OUT" "$tmp"
SECTION="$section" awk '
  /^<!-- deepqueue:begin/ { if (!done) { print ENVIRON["SECTION"]; done = 1 } skip = 1; next }
  /^<!-- deepqueue:end -->/ { skip = 0; next }
  !skip { print }
  END { if (!done) { print ""; print ENVIRON["SECTION"] } }
' "$OUT" > "$tmp"
mv "$tmp" "$OUT"
echo "deep_queue.sh: wrote the Deep queues section of $OUT"
