#!/usr/bin/env bash
# peers.sh — collie against Open MPI, MPICH and Gloo on loopback, with the
# loopback ceiling (iperf3), in one go; writes bench/RESULTS.md.
#
#   bench/peers.sh [--quick] [--ranks 2,4] [--repeats R] [--peers LIST]
#                  [--no-check] [--out FILE] [--report-only]
#
# What runs (every run under timeout(1), one at a time):
#   collie   build/bin/collie-run -n N -- build/bin/collie-bench --csv ...
#              (the default CPU backend: shared memory between ranks of one host)
#   collie_tcp  the same with --backend tcp (ranks forced onto loopback TCP)
#   openmpi  mpirun.openmpi ... --mca pml ob1 --mca btl tcp,self
#              --mca btl_tcp_if_include lo  build/bench/mpi_bench_openmpi ...
#   openmpi_shm  the same program over Open MPI's shared memory:
#              --mca pml ob1 --mca btl vader,self (single copy through CMA)
#   mpich    mpirun.mpich (ch4:ucx) with UCX_TLS=tcp, UCX_NET_DEVICES=lo and
#              MPIR_CVAR_NOLOCAL=1 (no shared memory)  build/bench/mpi_bench_mpich ...
#   gloo     /usr/bin/python3 bench/gloo_bench.py -n N ... (torch.distributed,
#              backend gloo, TCPStore on 127.0.0.1, GLOO_SOCKET_IFNAME=lo)
#   ceiling  iperf3 on 127.0.0.1 with 1 and with 2 parallel streams
# All four benchmarks print collie-bench's CSV (op,bytes,ranks,lat_us,
# algbw_GBps,busbw_GBps,ops_per_s) and follow its rules (see
# tools/bench/bench_row.c: bench/mpi_bench.c is collie-bench's rows on MPI,
# built by make); they get identical options.
#
# Design notes
#  - Sizes are run in tiers, each with its own iteration count (many for
#    small sizes, few for 64 MiB); every peer gets the same tiers. The tiny-op
#    rate is a separate run of 4-byte allreduces with --inflight 1 and 16.
#  - Repeats are interleaved (repeat 1 of everything, then repeat 2, ...)
#    and the peer order rotates per repeat, so slow drifts in the machine's
#    load do not all land on one peer. The report takes the median per cell.
#  - A failing run is recorded (build/bench/failures.tsv) with a reason and
#    never stops the script; its cells say "failed: <reason>". A peer whose
#    run timed out is skipped for the rest of the script, so a hang costs one
#    timeout, not one per run.
#  - A job that printed every row but has not exited EXIT_GRACE seconds
#    later is stopped and its rows kept, with a note in the report (MPICH
#    4.0.2 on UCX 1.13's TCP transport often hangs in MPI_Finalize at 4 ranks).
#  - Nobody is pinned: collie-run does not bind ranks, MPICH's hydra does not
#    by default, and Open MPI gets --bind-to none (it binds to cores by
#    default for 2 ranks).
#  - Raw CSVs and logs go to build/bench/raw (not committed); the report is
#    made by bench/peers_report.py from those files alone.
set -euo pipefail

ROOT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT_DIR"

BB=build/bench
RAW=$BB/raw
PY=/usr/bin/python3
ALL_PEERS=(collie collie_tcp openmpi openmpi_shm mpich gloo)
OPS=allreduce,broadcast,allgather
EXIT_GRACE=10 # seconds a job may take to exit after printing its last row

# tiers: "sizes iters warmup"
FULL_TIERS=("4,64,1K,16K 200 20" "256K,1M 40 5" "4M,16M 12 2" "64M 5 1")
QUICK_TIERS=("4,16K 60 5" "1M 15 2" "16M 5 1")

log() { printf '[peers %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
  log "error: $*"
  exit 2
}

usage() {
  cat <<'EOF'
usage: bench/peers.sh [--quick] [--ranks 2,4] [--repeats R] [--peers LIST] [--no-check]
                      [--out FILE] [--report-only]

Runs collie-bench, Open MPI and MPICH (bench/mpi_bench.c) and Gloo
(bench/gloo_bench.py) on loopback with the same sizes and iteration rules,
plus iperf3 (1 and 2 streams), and writes the side-by-side report.

  --quick        smoke run: 3 sizes, fewer iterations, 1 repeat (ranks 2 unless --ranks)
  --ranks LIST   rank counts (default 2,4)
  --repeats R    runs of the whole thing; each figure is the median (default 3)
  --peers LIST   subset of collie,collie_tcp,openmpi,openmpi_shm,mpich,gloo (default all)
  --no-check     do not pass --check (results are verified outside timing by default)
  --out FILE     report path (default bench/RESULTS.md)
  --report-only  write the report again from the raw files of the last run
Raw CSVs and logs: build/bench/raw/. Installs missing Debian packages (as root).
EOF
}

# ---- options -----------------------------------------------------------------

QUICK=0
RANKS=""
REPEATS=""
PEERS_OPT=""
CHECK=1
REPORT_ONLY=0
OUT=bench/RESULTS.md
COMMAND="bench/peers.sh${*:+ $*}"
while [[ $# -gt 0 ]]; do
  case $1 in
    --quick) QUICK=1 ;;
    --ranks) RANKS=${2:?--ranks needs a list}; shift ;;
    --repeats) REPEATS=${2:?--repeats needs a number}; shift ;;
    --peers) PEERS_OPT=${2:?--peers needs a list}; shift ;;
    --no-check) CHECK=0 ;;
    --report-only) REPORT_ONLY=1 ;;
    --out) OUT=${2:?--out needs a path}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown option '$1'" ;;
  esac
  shift
done

if ((QUICK)); then
  TIERS=("${QUICK_TIERS[@]}")
  RATE_ITERS=300 RATE_WARMUP=30 RUN_TIMEOUT=120 IPERF_SECS=2
  : "${RANKS:=2}" "${REPEATS:=1}"
else
  TIERS=("${FULL_TIERS[@]}")
  RATE_ITERS=1000 RATE_WARMUP=100 RUN_TIMEOUT=240 IPERF_SECS=5
  : "${RANKS:=2,4}" "${REPEATS:=3}"
fi
[[ $RANKS =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--ranks '$RANKS': want a list like 2,4"
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || die "--repeats '$REPEATS': want a positive integer"
IFS=, read -r -a RANK_LIST <<<"$RANKS"
for n in "${RANK_LIST[@]}"; do ((n >= 2)) || die "--ranks: every rank count must be at least 2"; done
if [[ -n $PEERS_OPT ]]; then
  IFS=, read -r -a PEERS <<<"$PEERS_OPT"
  for p in "${PEERS[@]}"; do
    [[ " ${ALL_PEERS[*]} " == *" $p "* ]] || die "--peers: unknown peer '$p' (${ALL_PEERS[*]})"
  done
else
  PEERS=("${ALL_PEERS[@]}")
fi
CHECK_ARG=()
((CHECK)) && CHECK_ARG=(--check)

# peer -> why it cannot run (set by the install and build steps, or by a timeout)
declare -A DISABLED=()

# ---- packages -----------------------------------------------------------------

pkg_installed() {
  [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true) == "install ok installed" ]]
}

install_packages() {
  local -a want=(openmpi-bin libopenmpi-dev mpich libmpich-dev python3-torch iperf3) missing=()
  local p
  for p in "${want[@]}"; do pkg_installed "$p" || missing+=("$p"); done
  if [[ ${#missing[@]} -eq 0 ]]; then
    log "packages: all present (${want[*]})"
    return 0
  fi
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
    log "packages missing and cannot install them (not root or no apt-get): ${missing[*]}"
    return 0
  fi
  log "packages: installing ${missing[*]} (apt-get update first)"
  export DEBIAN_FRONTEND=noninteractive
  if ! timeout 900 apt-get update -qq >"$BB/apt.log" 2>&1 ||
    ! timeout 1800 apt-get install -y -qq "${missing[@]}" >>"$BB/apt.log" 2>&1; then
    log "packages: apt-get failed (see $BB/apt.log); the peers that need them will fail"
  fi
}

# ---- builds -------------------------------------------------------------------

COLLIE_NOTE=""
build_all() {
  local m
  log "build: collie (make tools)"
  if ! make -s tools >"$BB/build-collie.log" 2>&1; then
    if [[ -x build/bin/collie-bench && -x build/bin/collie-run ]]; then
      COLLIE_NOTE="make tools failed (see $BB/build-collie.log); the existing build/bin/collie-bench was used"
      log "build: $COLLIE_NOTE"
    else
      DISABLED[collie]="build failed: make tools (see $BB/build-collie.log)"
      DISABLED[collie_tcp]=${DISABLED[collie]}
    fi
  fi
  for m in openmpi mpich; do
    if ! command -v "mpicc.$m" >/dev/null || ! command -v "mpirun.$m" >/dev/null; then
      DISABLED[$m]="mpicc.$m or mpirun.$m not installed"
      continue
    fi
    log "build: $BB/mpi_bench_$m (make, mpicc.$m)"
    if ! make -s "$BB/mpi_bench_$m" >"$BB/build-$m.log" 2>&1; then
      DISABLED[$m]="build failed: make $BB/mpi_bench_$m (see $BB/build-$m.log)"
    fi
  done
  if ! "$PY" -c 'import torch.distributed as d; assert d.is_available() and d.is_gloo_available()' \
    >"$BB/build-gloo.log" 2>&1; then
    DISABLED[gloo]="$PY cannot import torch.distributed with Gloo (see $BB/build-gloo.log)"
  fi
  [[ -n ${DISABLED[openmpi]:-} ]] && DISABLED[openmpi_shm]=${DISABLED[openmpi]}
  for m in "${!DISABLED[@]}"; do log "peer $m: ${DISABLED[$m]}"; done
}

# ---- runs -----------------------------------------------------------------------

record_failure() { # rep n peer tag reason
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"$BB/failures.tsv"
  log "FAILED r$1 n$2 $3 $4: $5"
}

# A one-line reason from a run's stderr: the last line that looks like an
# error, else the last line.
failure_reason() { # rc errfile
  local rc=$1 err=$2 line
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    echo "timed out after ${RUN_TIMEOUT}s"
    return
  fi
  line=$(grep -v '^[[:space:]]*$' "$err" 2>/dev/null | grep -iE 'error|fail|abort|denied|cannot|refused|signal|killed' | tail -n 1 || true)
  [[ -n $line ]] || line=$(grep -v '^[[:space:]]*$' "$err" 2>/dev/null | tail -n 1 || true)
  line=$(printf '%s' "$line" | tr -d '\r|\t' | cut -c1-400)
  if [[ -n $line ]]; then echo "exit $rc: $line"; else echo "exit $rc"; fi
}

peer_cmd() { # peer n -> fills CMD
  local peer=$1 n=$2
  case $peer in
    collie) CMD=(build/bin/collie-run -n "$n" -- build/bin/collie-bench --csv) ;;
    collie_tcp) CMD=(build/bin/collie-run -n "$n" -- build/bin/collie-bench --csv --backend tcp) ;;
    openmpi)
      CMD=(mpirun.openmpi --allow-run-as-root --oversubscribe -np "$n" --bind-to none
        --mca pml ob1 --mca btl "tcp,self" --mca btl_tcp_if_include lo "$BB/mpi_bench_openmpi" --csv)
      ;;
    openmpi_shm)
      CMD=(mpirun.openmpi --allow-run-as-root --oversubscribe -np "$n" --bind-to none
        --mca pml ob1 --mca btl "vader,self" "$BB/mpi_bench_openmpi" --csv)
      ;;
    mpich)
      CMD=(mpirun.mpich -n "$n" -genv MPIR_CVAR_NOLOCAL 1 -genv UCX_TLS tcp
        -genv UCX_NET_DEVICES lo "$BB/mpi_bench_mpich" --csv)
      ;;
    gloo) CMD=("$PY" bench/gloo_bench.py -n "$n" --timeout "$((RUN_TIMEOUT - 10))" --csv) ;;
  esac
}

# run_peer rep n peer tag expected_rows args... : one bounded run, CSV rows
# (rank 0's, without collie-run's "[0] " prefix) into $RAW/<name>.csv
run_peer() {
  local rep=$1 n=$2 peer=$3 tag=$4 expect=$5
  shift 5
  local name="r${rep}_n${n}_${peer}_${tag}"
  local out="$RAW/$name.csv" err="$RAW/$name.log" rc=0 rows t0=$SECONDS
  if [[ -n ${DISABLED[$peer]:-} ]]; then
    record_failure "$rep" "$n" "$peer" "$tag" "${DISABLED[$peer]}"
    return 0
  fi
  peer_cmd "$peer" "$n"
  CMD+=("$@")
  printf '%q ' timeout -k 5 "$RUN_TIMEOUT" "${CMD[@]}" >"$err"
  printf '\n' >>"$err"
  timeout -k 5 "$RUN_TIMEOUT" "${CMD[@]}" </dev/null >"$out.stdout" 2>>"$err" &
  local pid=$! done_at="" stopped=0
  # A job that printed every row but does not exit (MPICH's UCX TCP
  # transport can hang in MPI_Finalize) is stopped after EXIT_GRACE seconds
  # and its rows are kept; the report says so.
  while kill -0 "$pid" 2>/dev/null; do
    sleep 0.5
    if [[ -z $done_at ]] && (($(count_rows "$out.stdout") >= expect)); then done_at=$SECONDS; fi
    if [[ -n $done_at ]] && ((SECONDS - done_at >= EXIT_GRACE)); then
      kill -TERM "$pid" 2>/dev/null || true
      stopped=1
      break
    fi
  done
  wait "$pid" || rc=$?
  if ((stopped)); then
    rc=0
    printf '%s\t%s\t%s\t%s\t%s\n' "$rep" "$n" "$peer" "$tag" \
      "printed every row but had not exited ${EXIT_GRACE}s later; stopped it" >>"$BB/notes.tsv"
    log "note   r$rep n$n $peer $tag: did not exit ${EXIT_GRACE}s after its last row; stopped it"
  fi
  sed -E -e '/^\[[1-9][0-9]*\] /d' -e 's/^\[0\] //' "$out.stdout" |
    grep -E '^(allreduce|broadcast|allgather),' >"$out" || true
  rows=$(wc -l <"$out")
  if [[ $rc -ne 0 || $rows -ne $expect ]]; then
    local why
    why=$(failure_reason "$rc" "$err")
    [[ $rc -eq 0 ]] && why="$rows of $expect rows printed"
    record_failure "$rep" "$n" "$peer" "$tag" "$why"
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
      DISABLED[$peer]="skipped: an earlier run timed out after ${RUN_TIMEOUT}s"
    fi
  else
    log "ok     r$rep n$n $peer $tag ($((SECONDS - t0))s)"
  fi
}

# rows of op results in a file, without forking (polled while a job runs)
count_rows() {
  local line c=0
  [[ -f $1 ]] || {
    echo 0
    return
  }
  while IFS= read -r line; do
    [[ $line =~ ^(\[0\]\ )?(allreduce|broadcast|allgather), ]] && c=$((c + 1))
  done <"$1"
  echo "$c"
}

free_port() {
  "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# iperf3 on 127.0.0.1; appends "rep streams GB/s" or "rep streams failed: why"
run_iperf() { # rep streams
  local rep=$1 streams=$2 port spid json="$RAW/r${1}_iperf_P${2}.json" gbps rc=0 try
  if ! command -v iperf3 >/dev/null; then
    printf '%s\t%s\tfailed: iperf3 not installed\n' "$rep" "$streams" >>"$BB/iperf.tsv"
    return 0
  fi
  port=$(free_port)
  timeout -k 2 $((IPERF_SECS + 30)) iperf3 -s -1 -B 127.0.0.1 -p "$port" \
    >"$RAW/r${rep}_iperf_P${streams}.server.log" 2>&1 &
  spid=$!
  for try in 1 2 3 4 5; do # the server may not be listening yet
    sleep 0.3
    rc=0
    timeout -k 2 $((IPERF_SECS + 20)) iperf3 -c 127.0.0.1 -p "$port" -t "$IPERF_SECS" \
      -P "$streams" -J >"$json" 2>&1 || rc=$?
    if [[ $rc -ne 0 ]] && grep -q 'unable to connect' "$json" && [[ $try -lt 5 ]]; then continue; fi
    break
  done
  if kill -0 "$spid" 2>/dev/null; then kill "$spid" 2>/dev/null || true; fi
  wait "$spid" 2>/dev/null || true
  gbps=$("$PY" - "$json" <<'EOF' 2>/dev/null || true
import json, sys
d = json.load(open(sys.argv[1]))
if "error" in d:
    print("failed: " + d["error"].replace("\t", " "))
else:
    print("%.4f" % (d["end"]["sum_received"]["bits_per_second"] / 8e9))
EOF
  )
  [[ -n $gbps ]] || gbps="failed: exit $rc, unreadable iperf3 output"
  printf '%s\t%s\t%s\n' "$rep" "$streams" "$gbps" >>"$BB/iperf.tsv"
  log "iperf3 r$rep -P $streams: $gbps GB/s"
}

tier_rows() { # sizes -> rows a sweep prints (3 ops)
  local -a s
  IFS=, read -r -a s <<<"$1"
  echo $((3 * ${#s[@]}))
}

run_repeat() { # rep
  local rep=$1 n i k peer sizes iters warmup
  local -a order=()
  for ((i = 0; i < ${#PEERS[@]}; i++)); do
    order+=("${PEERS[$(((i + rep - 1) % ${#PEERS[@]}))]}")
  done
  log "repeat $rep of $REPEATS (peer order: ${order[*]})"
  run_iperf "$rep" 1
  run_iperf "$rep" 2
  for n in "${RANK_LIST[@]}"; do
    for peer in "${order[@]}"; do
      for ((i = 0; i < ${#TIERS[@]}; i++)); do
        read -r sizes iters warmup <<<"${TIERS[$i]}"
        run_peer "$rep" "$n" "$peer" "sweep$((i + 1))" "$(tier_rows "$sizes")" \
          --op "$OPS" --sizes "$sizes" --iters "$iters" --warmup "$warmup" "${CHECK_ARG[@]}"
      done
      for k in 1 16; do
        run_peer "$rep" "$n" "$peer" "rate$k" 1 --op allreduce --sizes 4 \
          --iters "$RATE_ITERS" --warmup "$RATE_WARMUP" --inflight "$k" "${CHECK_ARG[@]}"
      done
    done
  done
}

# ---- main ---------------------------------------------------------------------------

write_report() {
  local -a args
  [[ -s $BB/report.args ]] || die "no $BB/report.args: run the benchmarks first"
  mapfile -t args <"$BB/report.args"
  "$PY" bench/peers_report.py "${args[@]}" --out "$OUT"
}

main() {
  if ((REPORT_ONLY)); then
    write_report
    log "wrote $OUT from the raw files of the last run"
    return
  fi
  local started load0 rep t0=$SECONDS
  started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  load0=$(cut -d' ' -f1-3 /proc/loadavg)
  mkdir -p "$BB"
  rm -rf "$RAW"
  mkdir -p "$RAW"
  : >"$BB/failures.tsv"
  : >"$BB/iperf.tsv"
  : >"$BB/notes.tsv"
  log "command: $COMMAND"
  log "ranks ${RANKS}, repeats ${REPEATS}, peers ${PEERS[*]}, tiers: ${TIERS[*]}"
  install_packages
  build_all
  # one short run that shows which transport MPICH's UCX picked
  if [[ -z ${DISABLED[mpich]:-} ]]; then
    timeout -k 5 60 mpirun.mpich -n 2 -genv MPIR_CVAR_NOLOCAL 1 -genv UCX_TLS tcp \
      -genv UCX_NET_DEVICES lo -genv UCX_LOG_LEVEL info "$BB/mpi_bench_mpich" --csv \
      --op allreduce --sizes 4 --iters 2 --warmup 1 >"$BB/mpich-transport.log" 2>&1 </dev/null || true
  fi
  for ((rep = 1; rep <= REPEATS; rep++)); do run_repeat "$rep"; done
  local finished elapsed=$((SECONDS - t0))
  finished=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  log "all runs done in ${elapsed}s; writing $OUT"
  local tiers_arg rev
  tiers_arg=$(printf '%s;' "${TIERS[@]}")
  rev=$(git rev-parse --short HEAD 2>/dev/null || echo "?")
  [[ -z $(git status --porcelain --untracked-files=no 2>/dev/null) ]] || rev+=" + uncommitted changes"
  # the report's arguments, one a line, so --report-only can write it again
  printf '%s\n' --dir "$BB" --command "$COMMAND" --started "$started" --finished "$finished" \
    --elapsed "$elapsed" --ranks "$RANKS" --repeats "$REPEATS" \
    --peers "$(
      IFS=,
      echo "${PEERS[*]}"
    )" --tiers "${tiers_arg%;}" --rate "$RATE_ITERS $RATE_WARMUP" --check "$CHECK" \
    --timeout "$RUN_TIMEOUT" --iperf-secs "$IPERF_SECS" --collie-note "$COLLIE_NOTE" \
    --collie-rev "$rev" --load-start "$load0" --load-end "$(cut -d' ' -f1-3 /proc/loadavg)" \
    >"$BB/report.args"
  write_report
  log "wrote $OUT"
}

main
