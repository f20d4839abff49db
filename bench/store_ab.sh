#!/usr/bin/env bash
# store_ab.sh — two builds of collie-store side by side under one load shape
# (bench/store_load.c: 64 connections, one request outstanding on each,
# 8-byte values, each connection its own key): "before" and "after" of a
# change, e.g. the commit before it built in a second worktree.
#
#   bench/store_ab.sh BEFORE_COLLIE_STORE AFTER_COLLIE_STORE [--runs 21] [--seconds 2] [--conns 64]
#
# Prints, per op (get, add), the median ops/s of each build with its min-max
# spread, and the median server CPU (user + system, from /proc) per 1000
# requests, with the after/before ratios. On a shared, noisy machine the CPU
# per request moves less than the rate. (bench/side_by_side.sh runs the same
# store load, one server at a time, inside its whole-library comparison;
# this is the store alone, with the server's CPU.)
#
# Design notes: both servers run at once on 127.0.0.1 and the runs
# alternate between them (before first on odd rounds, after first on even
# ones), so load from elsewhere falls on both alike. One client binary,
# built from this tree, drives both (the protocol is the same). Every run
# is bounded by timeout(1); the servers are stopped on exit.
set -euo pipefail

cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: $(sed -n '7s/^# *//p' "$0")" >&2; exit 2; }
BEFORE=$1 AFTER=$2
shift 2
RUNS=21
SECS=2
CONNS=64
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=$2; shift 2 ;;
    --seconds) SECS=$2; shift 2 ;;
    --conns) CONNS=$2; shift 2 ;;
    *) echo "store_ab.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
for v in "$RUNS" "$SECS" "$CONNS"; do
  case "$v" in ''|*[!0-9]*|0) echo "store_ab.sh: counts must be > 0" >&2; exit 2 ;; esac
done
for b in "$BEFORE" "$AFTER"; do
  [ -x "$b" ] || { echo "store_ab.sh: '$b' is not an executable collie-store" >&2; exit 2; }
done
[ -f build/lib/libcollie.a ] || { echo "store_ab.sh: build first (make)" >&2; exit 2; }
mkdir -p build/bench
. bench/store_lib.sh
build_store_load . build/bench/store_load
PB=$(free_port)
PA=$(free_port)
tmp=$(mktemp -d)
cleanup() {
  [ -n "${pb:-}" ] && kill "$pb" 2>/dev/null || true
  [ -n "${pa:-}" ] && kill "$pa" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
COLLIE_LOG=warn "$BEFORE" --port "$PB" --bind 127.0.0.1 > "$tmp/before.log" 2>&1 &
pb=$!
COLLIE_LOG=warn "$AFTER" --port "$PA" --bind 127.0.0.1 > "$tmp/after.log" 2>&1 &
pa=$!
wait_listening "$PB" "$PA" || { echo "store_ab.sh: the servers did not start" >&2; cat "$tmp"/*.log >&2; exit 1; }

hz=$(getconf CLK_TCK)
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
run() {  # run NAME PORT PID OP -> appends "ops_per_s server_cpu_us_per_1000" to $tmp/NAME-OP
  local t0 t1 line
  t0=$(ticks "$3")
  line=$(timeout $((SECS + 30)) build/bench/store_load collie 127.0.0.1 "$2" "$4" "$SECS" "$CONNS") || {
    echo "store_ab.sh: the $1 $4 run failed" >&2; exit 1; }
  t1=$(ticks "$3")
  echo "$line" | sed -n 's/.* ops=\([0-9]*\) ops_per_s=\([0-9]*\).*/\1 \2/p' |
    awk -v d=$((t1 - t0)) -v hz="$hz" '{ printf "%s %.0f\n", $2, d / hz * 1e6 / ($1 / 1000) }' \
    >> "$tmp/$1-$4"
}
for i in $(seq 1 "$RUNS"); do
  for op in get add; do
    if [ $((i % 2)) = 1 ]; then
      run before "$PB" "$pb" "$op"
      run after "$PA" "$pa" "$op"
    else
      run after "$PA" "$pa" "$op"
      run before "$PB" "$pb" "$op"
    fi
  done
done

col() { cut -d' ' -f"$1" "$2" | sort -n; }
median() { awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "store_ab.sh: $RUNS runs of $SECS s per build and op, $CONNS connections"
for op in get add; do
  b=$tmp/before-$op a=$tmp/after-$op
  bm=$(col 1 "$b" | median) am=$(col 1 "$a" | median)
  bc=$(col 2 "$b" | median) ac=$(col 2 "$a" | median)
  printf '%s: ops/s before %s (%s-%s) after %s (%s-%s) after/before %s; server CPU us per 1000 requests before %s after %s after/before %s\n' \
    "$op" "$bm" "$(col 1 "$b" | head -n 1)" "$(col 1 "$b" | tail -n 1)" \
    "$am" "$(col 1 "$a" | head -n 1)" "$(col 1 "$a" | tail -n 1)" \
    "$(awk -v x="$am" -v y="$bm" 'BEGIN { printf "%.3f", x / y }')" "$bc" "$ac" \
    "$(awk -v x="$ac" -v y="$bc" 'BEGIN { printf "%.3f", x / y }')"
done
