#!/usr/bin/env bash
# memory.sh — the memory targets, measured: peak RSS of a rank
# running 64 MiB allreduces against the buffers it was given, and the heap
# allocations of 50 vs 500 allreduces (valgrind's count: equal totals mean
# no allocation per operation). Prints a markdown section for RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
make -s lib tools >/dev/null
command -v valgrind >/dev/null || apt-get install -y -qq valgrind >/dev/null
mkdir -p build/bench
gcc -std=c11 -D_GNU_SOURCE -O2 -I include bench/memory_bench.c build/lib/libcollie.a \
    -levent -lcrypto -pthread -o build/bench/memory_bench
run=build/bin/collie-run
echo "## Memory"
echo
echo "Command: \`bench/memory.sh\` ($(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD))."
echo
echo "Peak RSS of rank 0 (VmHWM) running ten 64 MiB fp32 allreduces, 2 ranks:"
echo
echo "| buffers | given (KiB) | RSS before them (KiB) | peak RSS (KiB) | peak / given |"
echo "|---|---|---|---|---|"
timeout 300 $run -n 2 -- build/bench/memory_bench rss inplace | sed 's/^\[0\] //'
timeout 300 $run -n 2 -- build/bench/memory_bench rss | sed 's/^\[0\] //'
echo
echo "Heap allocations of a whole rank process (valgrind memcheck totals), 2 ranks. The"
echo "control channel's store watch is re-armed every 5 s whatever the load, so it is"
echo "turned off here (COLLIE_ASYNC_ERROR_HANDLING=none) to count per-operation allocations:"
echo
echo "| allreduce size | 50 ops | 500 ops | difference |"
echo "|---|---|---|---|"
for bytes in 4 4194304; do
  declare -A allocs=()
  for n in 50 500; do
    out=$(COLLIE_ASYNC_ERROR_HANDLING=none COLLIE_SPIN=off timeout 600 $run -n 2 -- valgrind --leak-check=no \
            build/bench/memory_bench ops "$n" "$bytes" 2>&1 | grep '^\[0\].*total heap usage')
    allocs[$n]=$(echo "$out" | sed -E 's/.*usage: ([0-9,]+) allocs.*/\1/' | tr -d ,)
  done
  echo "| $bytes B | ${allocs[50]} | ${allocs[500]} | $(( ${allocs[500]} - ${allocs[50]} )) |"
done
