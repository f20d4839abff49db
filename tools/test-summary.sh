#!/usr/bin/env bash
# test-summary.sh DIR — add up the per-suite counts written by run-tests.sh.
set -euo pipefail
dir=$1
cat "$dir"/*.txt | awk '{p+=$2; f+=$3; s+=$4} END {printf "%d passed, %d failed, %d skipped\n", p, f, s; exit (f > 0)}'
