#!/usr/bin/env bash
# store_bench.sh — collie's store server against Redis under one load shape:
# 64 connections, one request outstanding on each, 8-byte values, 2 s per
# run (bench/store_load.c speaks both protocols from one epoll loop, so the
# client is the same for both). Ops: get, and add (Redis: INCR). Each case
# runs --runs times, interleaved (collie get, redis get, collie add, redis
# add, then again), and the median with its min-max spread is reported,
# with the client's CPU time; the table also goes into the "Store
# throughput" section of bench/RESULTS.md (between two marker comments).
#
#   bench/store_bench.sh [--runs 5] [--seconds 2] [--conns 64] [--out FILE] [--no-write]
#
# Design notes: the servers are collie-store (build/bin) and redis-server
# (Debian's; installed with apt-get when missing and run as root), both on
# 127.0.0.1 with persistence off; both are stopped on exit. Every run is
# bounded by timeout(1); a failed run stops the script.
set -euo pipefail

cd "$(dirname "$0")/.."
RUNS=5
SECS=2
CONNS=64
OUT=bench/RESULTS.md
WRITE=1
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=$2; shift 2 ;;
    --seconds) SECS=$2; shift 2 ;;
    --conns) CONNS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-write) WRITE=0; shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "store_bench.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
for v in "$RUNS" "$SECS" "$CONNS"; do
  case "$v" in ''|*[!0-9]*|0) echo "store_bench.sh: counts must be > 0" >&2; exit 2 ;; esac
done

[ -x build/bin/collie-store ] || { echo "store_bench.sh: build first (make)" >&2; exit 2; }
if ! command -v redis-server >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null
  else
    echo "store_bench.sh: needs redis-server (as root: apt-get install -y redis-server)" >&2
    exit 2
  fi
fi
mkdir -p build/bench
. bench/store_lib.sh
build_store_load . build/bench/store_load
CPORT=$(free_port)
RPORT=$(free_port)
tmp=$(mktemp -d)
cleanup() {
  [ -n "${cpid:-}" ] && kill "$cpid" 2>/dev/null || true
  [ -n "${rpid:-}" ] && kill "$rpid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
COLLIE_LOG=warn build/bin/collie-store --port "$CPORT" --bind 127.0.0.1 > "$tmp/collie.log" 2>&1 &
cpid=$!
redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
  > "$tmp/redis.log" 2>&1 &
rpid=$!
rver=$(redis-server --version | sed -n 's/.*v=\([0-9.]*\).*/\1/p')
wait_listening "$CPORT" "$RPORT" || { echo "store_bench.sh: the servers did not start" >&2; exit 1; }

run() {  # run PROTO PORT OP -> appends "ops cpu" to $tmp/PROTO-OP
  local line
  line=$(timeout $((SECS + 30)) build/bench/store_load "$1" 127.0.0.1 "$2" "$3" "$SECS" "$CONNS") || {
    echo "store_bench.sh: the $1 $3 run failed" >&2; exit 1; }
  echo "$line" | sed -n 's/.*ops_per_s=\([0-9]*\) client_cpu_s=\([0-9.]*\).*/\1 \2/p' >> "$tmp/$1-$3"
}
for i in $(seq 1 "$RUNS"); do
  for op in get add; do
    run collie "$CPORT" "$op"
    run redis "$RPORT" "$op"
  done
  echo "run $i of $RUNS done" >&2
done

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
stats() {  # median, min, max of ops/s; median client CPU us per 1000 ops
  local f="$tmp/$1-$2"
  printf '%s %s %s %s' "$(cut -d' ' -f1 "$f" | median)" "$(cut -d' ' -f1 "$f" | sort -n | head -n 1)" \
    "$(cut -d' ' -f1 "$f" | sort -n | tail -n 1)" \
    "$(awk -v secs="$SECS" '{ printf "%.0f\n", $2 * 1e6 / ($1 * secs / 1000) }' "$f" | median)"
}
rows=""
for op in get add; do
  read -r cm cmin cmax ccpu <<< "$(stats collie "$op")"
  read -r rm rmin rmax rcpu <<< "$(stats redis "$op")"
  ratio=$(awk -v a="$cm" -v b="$rm" 'BEGIN { printf "%.2f", a / b }')
  rop=$op; [ "$op" = add ] && rop=INCR
  rows="$rows| $op (Redis: ${rop^^}) | $cm ($cmin-$cmax) | $rm ($rmin-$rmax) | $ratio | $ccpu | $rcpu |
"
  echo "$op: collie $cm ops/s ($cmin-$cmax), redis $rm ($rmin-$rmax): ratio $ratio; client CPU per 1000 ops: $ccpu us vs $rcpu us"
done

[ "$WRITE" -eq 1 ] || exit 0
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
section=$(cat <<EOS
<!-- storebench:begin (written by bench/store_bench.sh; do not edit by hand) -->
## Store throughput

Written by \`bench/store_bench.sh --runs $RUNS --seconds $SECS --conns $CONNS\` on $(date -u +%Y-%m-%d)
($(nproc) cores, $cpu; collie commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)):
collie-store against redis-server $rver (persistence off), both on 127.0.0.1, driven by
\`bench/store_load.c\` — one epoll loop, $CONNS connections, one request outstanding on
each, 8-byte values, $SECS s per run, each connection its own key. The cases run
interleaved; ops/s is the median of $RUNS runs (min-max in brackets). The client CPU is
the load generator's user+system time per 1000 requests (the same client code for both).

| op | collie ops/s | Redis ops/s | collie / Redis | client CPU us per 1000 ops, collie | same, Redis |
|---|---|---|---|---|---|
$rows
<!-- storebench:end -->
EOS
)
. bench/results_section.sh
write_results_section storebench "$OUT" "$section"
echo "store_bench.sh: wrote the Store throughput section of $OUT"
