#!/usr/bin/env bash
# test-summary.sh DIR — add up the per-suite counts written by run-tests.sh.
set -euo pipefail
dir=$1
# the failures again, last, where a log's tail shows them
if [ -s "$dir/failures.log" ] || [ -s "$dir/failed-stages" ]; then
  echo "==== what failed ===="
  cat "$dir/failed-stages" 2>/dev/null || true
  tail -n 150 "$dir/failures.log" 2>/dev/null || true
  if [ -s "$dir/digest.log" ]; then
    echo "==== in short: each failed test and its check's message ===="
    tail -n 40 "$dir/digest.log"
  fi
fi
# a stage that failed without a failed test (format-check, say) counts as one
stages=0
if [ -f "$dir/failed-stages" ]; then stages=$(wc -l < "$dir/failed-stages"); fi
cat "$dir"/*.txt /dev/null 2>/dev/null |
  awk -v stages="$stages" '{p+=$2; f+=$3; s+=$4}
    END {if (f == 0) f = stages; printf "%d passed, %d failed, %d skipped\n", p, f, s; exit (f > 0)}'
