#!/usr/bin/env bash
# side_by_side.sh — two builds of collie on the same machine in one run, for
# "behaviour and speed unchanged" claims: collective latency (4 B and 1 MiB
# allreduce and broadcast, the median of one op posted and waited alone),
# the rate with 16 ops in flight, for 2 and 4 ranks over TCP and over shared
# memory, then the store (get and add, 64 connections, bench/store_load.c)
# against each build's collie-store. The builds alternate (A B, then B A) in
# each of --runs rounds; the table gives medians and the ratio B/A.
#
#   bench/side_by_side.sh A_TREE B_TREE [--runs 3] [--iters 200] [--seconds 2]
#
# A_TREE and B_TREE are source trees built with `make lib tools`
# (build/bin/collie-run, collie-bench, collie-store). Every run is bounded by
# timeout(1); a failed run stops the script. Prints a markdown table.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
A=$(cd "$1" && pwd)
B=$(cd "$2" && pwd)
shift 2
RUNS=3 ITERS=200 SECS=2
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --seconds) SECS=$2; shift 2 ;;
    *) echo "side_by_side.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
for t in "$A" "$B"; do
  for b in collie-run collie-bench collie-store; do
    [ -x "$t/build/bin/$b" ] || { echo "side_by_side.sh: $t/build/bin/$b missing (make lib tools)" >&2; exit 2; }
  done
done
tmp=$(mktemp -d)
cleanup() { [ -n "${spid:-}" ] && kill "$spid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

coll() { # coll TREE LABEL RANKS BACKEND: appends "key value" lines to $tmp/LABEL
  local out
  out=$(COLLIE_LOG=warn timeout 300 "$1/build/bin/collie-run" -n "$3" --timeout 280 -- \
    "$1/build/bin/collie-bench" --backend "$4" --op allreduce,broadcast --sizes 4,1M \
    --iters "$ITERS" --warmup 20 --inflight 16 --csv 2>&1) ||
    { echo "$out" >&2; echo "side_by_side.sh: $1 -n $3 $4 failed" >&2; exit 1; }
  # op,bytes,ranks,lat_us,algbw_GBps,busbw_GBps,ops_per_s (prefixed "[0] ")
  sed -n 's/^\[0\] //p' <<<"$out" | awk -F, -v r="$3" -v be="$4" '
    $1 ~ /^(allreduce|broadcast)$/ {
      print be " " r " " $1 " " $2 " lat_us " $4
      print be " " r " " $1 " " $2 " ops_per_s " $7 }' >> "$tmp/$2"
}

. "$(dirname "$0")/store_lib.sh"
build_store_load "$B" "$tmp/store_load"
store() { # store TREE LABEL
  local port line op
  port=$(free_port)
  COLLIE_LOG=warn "$1/build/bin/collie-store" --port "$port" --bind 127.0.0.1 > "$tmp/store.log" 2>&1 &
  spid=$!
  wait_listening "$port" || { echo "side_by_side.sh: collie-store of $1 did not start" >&2; exit 1; }
  for op in get add; do
    line=$(timeout $((SECS + 30)) "$tmp/store_load" collie 127.0.0.1 "$port" "$op" "$SECS" 64) ||
      { echo "side_by_side.sh: store $op on $1 failed" >&2; exit 1; }
    echo "store 64 $op 8 ops_per_s $(sed -n 's/.*ops_per_s=\([0-9]*\).*/\1/p' <<<"$line")" >> "$tmp/$2"
  done
  kill "$spid"; wait "$spid" 2>/dev/null || true; spid=
}

for i in $(seq 1 "$RUNS"); do
  order="A B"; [ $((i % 2)) -eq 0 ] && order="B A"
  for r in 2 4; do
    for be in tcp shm; do
      for t in $order; do
        if [ "$t" = A ]; then coll "$A" A "$r" "$be"; else coll "$B" B "$r" "$be"; fi
      done
    done
  done
  for t in $order; do if [ "$t" = A ]; then store "$A" A; else store "$B" B; fi; done
  echo "side_by_side.sh: round $i of $RUNS done" >&2
done

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "| case | metric | A median | B median | B/A |"
echo "|---|---|---|---|---|"
cut -d' ' -f1-5 "$tmp/A" | sort -u | sort -k1,1 -k2,2n -k3,3 -k4,4n -k5,5 | while read -r be r op bytes metric; do
  key="$be $r $op $bytes $metric "
  a=$(grep -F "$key" "$tmp/A" | awk '{print $6}' | median)
  b=$(grep -F "$key" "$tmp/B" | awk '{print $6}' | median)
  ratio=$(awk -v a="$a" -v b="$b" 'BEGIN { if (a > 0) printf "%.2f", b / a; else print "-" }')
  if [ "$be" = store ]; then name="store $op, 64 connections"; else name="$be $r ranks $op $bytes B"; fi
  echo "| $name | $metric | $a | $b | $ratio |"
done
