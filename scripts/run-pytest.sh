#!/usr/bin/env bash
# run-pytest.sh SUITE DIR [PYTEST ARGS] — run the Python tests under DIR with
# Debian's python3 (PYTHON=... another: the torch 2.x venv's) and record
# their passed/failed/skipped counts in build/test-results/SUITE.txt for
# scripts/test-summary.sh (as run-tests.sh does for the C tests). Skip reasons are repeated here. Bounded: each
# scenario bounds its own waits; the whole run is also under a timeout
# (CLTEST_PYTEST_TIMEOUT, default 1500 s).
set -uo pipefail
suite=$1; dir=$2; shift 2
python=${PYTHON:-/usr/bin/python3}
results=build/test-results
mkdir -p "$results" build/test-logs
log=build/test-logs/$suite.log
start=$(date +%s)
timeout -k 10 "${CLTEST_PYTEST_TIMEOUT:-1500}" "$python" -m pytest -q -rs -p no:cacheprovider \
  "$dir" "$@" > "$log" 2>&1
rc=$?
summary=$(grep -aE '^(=+ )?[0-9]+ (passed|failed|skipped|error)' "$log" | tail -n 1)
count() { echo "$summary" | grep -oE "[0-9]+ $1" | awk '{print $1}' | head -n 1; }
passed=$(count passed); failed=$(count failed); skipped=$(count skipped); errors=$(count error)
passed=${passed:-0}; failed=$(( ${failed:-0} + ${errors:-0} )); skipped=${skipped:-0}
if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ] && [ "$failed" -eq 0 ]; then failed=1; fi
echo "$suite $passed $failed $skipped" > "$results/$suite.txt"
secs=$(( $(date +%s) - start ))
if [ "$failed" -eq 0 ]; then
  extra=""; [ "$skipped" -gt 0 ] && extra=", $skipped skipped"
  echo "[$suite] pytest: $passed passed$extra (${secs}s)"
  grep -aE '^SKIPPED' "$log" | sed 's/^/    /'
  exit 0
fi
echo "[$suite] pytest: FAILED (exit $rc, $passed passed, $failed failed, ${secs}s); log:"
tail -n 60 "$log" | sed 's/^/    /'
exit 1
