#!/bin/bash
# ab_pair.sh A_TREE B_TREE [ROUNDS] — a focused A/B of two built trees
# (make lib tools): 2 ranks, allreduce 4 B and 1 MiB, shm and tcp, ROUNDS
# alternating rounds (default 6); prints "A|B backend bytes lat_us ops_per_s".
A=$1; B=$2; N=${3:-6}
for i in $(seq 1 $N); do
  for t in A B; do
    tree=$A; [ $t = B ] && tree=$B
    for be in shm tcp; do
      out=$(COLLIE_LOG=warn timeout 300 $tree/build/bin/collie-run -n 2 --timeout 280 -- $tree/build/bin/collie-bench --backend $be --op allreduce --sizes 4,1M --iters 300 --warmup 20 --inflight 16 --csv 2>&1)
      sed -n 's/^\[0\] //p' <<<"$out" | awk -F, -v t=$t -v be=$be '$1=="allreduce"{print t, be, $2, $4, $7}'
    done
  done
done
