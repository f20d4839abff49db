#!/usr/bin/env bash
# run-fuzz.sh MODE FUZZ_DIR TARGET... — run the libFuzzer targets built from
# tests/fuzz/fuzz_<target>.c into FUZZ_DIR (docs/fuzzing.md).
#
#   short  each target replays its committed corpus (tests/fuzz/corpus/<t>)
#          and its crash inputs (tests/fuzz/crashes/<t>: each must now pass),
#          then fuzzes FUZZ_SHORT_S seconds (default 4); the counts go to
#          build/test-results/fuzz.txt for scripts/test-summary.sh (two tests per
#          target: the replay and the fuzzing)
#   long   fuzzes for FUZZ_SECONDS in all, shared by the targets one after the
#          other (one process at a time); prints execs and coverage per target
#   merge  minimises tests/fuzz/corpus/<t> plus what long runs found
#          (FUZZ_DIR/corpus-new/<t>) into tests/fuzz/corpus/<t> (-merge=1)
#   seeds  rewrites tests/fuzz/corpus/<t> from the target's own encoder
#          (COLLIE_FUZZ_SEEDS=dir: the target writes its seeds and exits)
#
# New inputs go to FUZZ_DIR/corpus-new/<t>, crashes to
# FUZZ_DIR/crashes-new/<t>, logs to FUZZ_DIR/logs/<t>.log: nothing under
# tests/ changes except by `merge` and `seeds`.
set -uo pipefail
mode=$1; dir=$2; shift 2
[ $# -gt 0 ] || { echo "run-fuzz.sh: no targets (tests/fuzz/fuzz_*.c)" >&2; exit 2; }
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
mkdir -p "$dir/logs"

files_in() { [ -d "$1" ] && find "$1" -maxdepth 1 -type f | sort; return 0; }
count_in() { files_in "$1" | wc -l; }

# the last coverage line of a libFuzzer log: "cov: N ft: M corp: K/..."
cov_of() { grep -aoE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' "$1" | tail -n 1; }
execs_of() { grep -aoE 'stat::number_of_executed_units: [0-9]+' "$1" | tail -n 1 | awk '{print $2}'; }

# crash reports name the input and the fault; show the part that matters
show_failure() {
  grep -aE 'ERROR: |runtime error|SUMMARY|Test unit written|==[0-9]+==.*(DEADLY|Abort)|Running:' "$1" |
    head -n 12 | sed 's/^/    /'
}

fuzz_args() { # target seconds
  local t=$1 s=$2 extra=()
  [ -f "tests/fuzz/fuzz_$t.dict" ] && extra+=("-dict=tests/fuzz/fuzz_$t.dict")
  mkdir -p "$dir/corpus-new/$t" "$dir/crashes-new/$t" "tests/fuzz/corpus/$t"
  printf '%s\n' -max_total_time="$s" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$dir/crashes-new/$t/" "${extra[@]}" "$dir/corpus-new/$t" "tests/fuzz/corpus/$t"
}

case "$mode" in
short)
  results=build/test-results
  mkdir -p "$results"
  : > "$results/fuzz.txt"
  per=${FUZZ_SHORT_S:-4}
  fail=0
  for t in "$@"; do
    bin=$dir/fuzz_$t log=$dir/logs/$t.log
    start=$(date +%s)
    passed=0 failed=0
    # 1. the committed corpus and every crash input, each run once
    inputs=$(( $(count_in "tests/fuzz/corpus/$t") + $(count_in "tests/fuzz/crashes/$t") ))
    if { files_in "tests/fuzz/corpus/$t"; files_in "tests/fuzz/crashes/$t"; } |
         xargs -r -d '\n' timeout -k 5 120 "$bin" -timeout=10 -rss_limit_mb=2048 > "$log.replay" 2>&1; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1)); fail=1
      echo "[fuzz] $t: replay of the committed inputs FAILED; log $log.replay:"
      show_failure "$log.replay"
    fi
    # 2. a few seconds of fuzzing from there
    mapfile -t args < <(fuzz_args "$t" "$per")
    if timeout -k 5 $((per + 60)) "$bin" "${args[@]}" > "$log" 2>&1; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1)); fail=1
      echo "[fuzz] $t: fuzzing FAILED; log $log:"
      show_failure "$log"
      echo "    the input is in $dir/crashes-new/$t/ (docs/fuzzing.md: reproduce, minimise, keep)"
    fi
    echo "fuzz_$t $passed $failed 0" >> "$results/fuzz.txt"
    [ "$failed" -eq 0 ] &&
      echo "[fuzz] $t: $inputs inputs replayed, ${per}s fuzzed: $(execs_of "$log") execs, $(cov_of "$log") ($(( $(date +%s) - start ))s)"
  done
  exit $fail ;;
long)
  total=${FUZZ_SECONDS:-600}
  per=$(( total / $# )); [ "$per" -ge 1 ] || per=1
  fail=0
  for t in "$@"; do
    bin=$dir/fuzz_$t log=$dir/logs/$t.log
    mapfile -t args < <(fuzz_args "$t" "$per")
    echo "[fuzz] $t: ${per}s (log $log)"
    if ! "$bin" "${args[@]}" > "$log" 2>&1; then
      fail=1
      echo "[fuzz] $t: FAILED:"
      show_failure "$log"
    fi
    echo "[fuzz] $t: $(execs_of "$log") execs in ${per}s, $(cov_of "$log"), $(count_in "$dir/corpus-new/$t") new inputs in $dir/corpus-new/$t"
  done
  echo "[fuzz] to keep what was found: make fuzz-merge (minimises into tests/fuzz/corpus/<target>)"
  [ "$fail" -eq 0 ] || echo "[fuzz] crash inputs are in $dir/crashes-new/<target>/ (docs/fuzzing.md)"
  exit $fail ;;
merge)
  for t in "$@"; do
    bin=$dir/fuzz_$t out=$dir/merged/$t
    rm -rf "$out"; mkdir -p "$out" "$dir/corpus-new/$t" "tests/fuzz/corpus/$t"
    before=$(count_in "tests/fuzz/corpus/$t")
    if ! "$bin" -merge=1 -timeout=10 -rss_limit_mb=2048 "$out" "tests/fuzz/corpus/$t" \
         "$dir/corpus-new/$t" > "$dir/logs/$t.merge.log" 2>&1; then
      echo "[fuzz] $t: merge FAILED (log $dir/logs/$t.merge.log)"; exit 1
    fi
    rm -rf "tests/fuzz/corpus/$t" && mv "$out" "tests/fuzz/corpus/$t"
    rm -rf "$dir/corpus-new/$t"
    echo "[fuzz] $t: corpus $before -> $(count_in "tests/fuzz/corpus/$t") inputs," \
      "$(du -sk "tests/fuzz/corpus/$t" | cut -f1) KiB"
  done ;;
seeds)
  for t in "$@"; do
    rm -rf "tests/fuzz/corpus/$t"; mkdir -p "tests/fuzz/corpus/$t"
    COLLIE_FUZZ_SEEDS="tests/fuzz/corpus/$t" "$dir/fuzz_$t" > "$dir/logs/$t.seeds.log" 2>&1 ||
      { echo "[fuzz] $t: writing seeds FAILED (log $dir/logs/$t.seeds.log)"; exit 1; }
    echo "[fuzz] $t: $(count_in "tests/fuzz/corpus/$t") seed inputs in tests/fuzz/corpus/$t"
  done ;;
*) echo "run-fuzz.sh: unknown mode '$mode' (short, long, merge, seeds)" >&2; exit 2 ;;
esac
