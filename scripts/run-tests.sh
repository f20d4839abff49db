#!/usr/bin/env bash
# run-tests.sh SUITE BUILD_DIR TEST_BINARY... — run the test binaries and
# record passed/failed/skipped counts per binary in
# build/test-results/SUITE.txt for scripts/test-summary.sh. Each binary runs
# every test in a child process of its own with a per-test bound
# (tests/runner.h: CLTEST_TEST_TIMEOUT_S, scaled by CLTEST_TIMEOUT_SCALE);
# the bound per binary here is only a backstop. A skipped test says why on
# its log ("SKIPPED: <reason>"); the reasons are repeated here.
set -uo pipefail
suite=$1; build=$2; shift 2
binary_timeout=${CLTEST_BINARY_TIMEOUT:-1800}
results=build/test-results
mkdir -p "$results" "$build/test-logs"
: > "$results/$suite.txt"
fail=0
for t in "$@"; do
  name=$(basename "$t")
  log="$build/test-logs/$name.log"
  start=$(date +%s%N)
  # the bin dir first on PATH so tests can find collie-run/collie-store
  # CLTEST_WRAP: a command prefix, e.g. "setarch x86_64 -R" for TSan
  PATH="$build/bin:$PATH" CLTEST_BUILD_DIR="$build" \
    timeout -k 10 "$binary_timeout" ${CLTEST_WRAP:-} "$t" > "$log" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  secs="$((ms / 1000)).$(( (ms % 1000) / 100 ))"
  passed=$(grep -aoE '^\[  PASSED  \] [0-9]+' "$log" | awk '{s+=$4} END {print s+0}')
  failed=$(grep -aoE '^\[  FAILED  \] [0-9]+' "$log" | awk '{s+=$4} END {print s+0}')
  skipped=$(grep -aoE '^\[  SKIPPED \] [0-9]+' "$log" | awk '{s+=$4} END {print s+0}')
  if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
    failed=1 # crashed, timed out or a sanitizer stopped it
  fi
  echo "$name $passed $failed $skipped" >> "$results/$suite.txt"
  if [ "$rc" -eq 0 ] && [ "$failed" -eq 0 ]; then
    extra=""
    [ "$skipped" -gt 0 ] && extra=", $skipped skipped"
    echo "[$suite] $name: $passed passed$extra (${secs}s)"
    grep -aoE 'SKIPPED: .*' "$log" | sort | uniq -c | sed 's/^ */    /'
  else
    fail=1
    {
      echo "[$suite] $name: FAILED (exit $rc, $passed passed, $failed failed, ${secs}s); log:"
      # each failed test's own output (its last 40 lines), then the summary
      awk '/^\[ RUN      \]/ { n = 0 }
           { block[n++ % 40] = $0 }
           /^\[  FAILED  \] [^0-9]/ && / \([0-9]+ ms\)$/ {
             for (i = (n > 40 ? n - 40 : 0); i < n; i++) print "    " block[i % 40] }' "$log"
      tail -n 12 "$log" | sed 's/^/    /'
      [ "$rc" -eq 124 ] && echo "    (the binary timed out after ${binary_timeout}s)"
    } | tee -a "$results/failures.log"
    # the digest test-summary.sh prints last: each failed test and the two
    # lines before its first error (the check's own message)
    awk -v where="[$suite] $name" \
        '/^\[ RUN      \]/ { a = b = ""; told = 0 }
         /\[  ERROR   \]|\[   LINE   \]/ && !told { told = 1
           print where ": " substr(a, 1, 200); print "    " substr(b, 1, 200)
           print "    " substr($0, 1, 200); next }
         { a = b; b = $0 }
         /^\[  FAILED  \] [^0-9]/ && / \([0-9]+ ms\)$/ && !told { print where ": " $0 " (no error line)" }' \
        "$log" >> "$results/digest.log" || true
  fi
done
exit $fail
