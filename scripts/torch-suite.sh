#!/usr/bin/env bash
# torch-suite.sh [1|2] — PyTorch's whole DistributedTest._DistTestBase for
# gloo and collie side by side at world sizes 2 and 3
# (tests/torch_suite/dist_suite.py), then tests/torch_suite/compare.py:
# every test gloo passes must pass with collie, except the named list.
#   1 (default): Debian's torch 1.13 (/usr/bin/python3 -m pytest), logs in
#     build/torch-suite/{gloo,collie}-WS.log, known differences in
#     tests/torch_suite/known_differences.txt (`make test-torch`);
#   2: torch 2.x from build/torch2-venv with build/torch2/_C.so (make
#     torch2-venv torch2), logs in build/torch-suite/torch2/, known
#     differences in tests/torch_suite/known_differences_2x.txt (`make
#     test-torch2-suite`; `make test-torch` runs it after 1.13 when the venv
#     and the extension are there).
# TORCH_SUITE_MODES: "gated" (the suite as shipped) and/or "opened"
# (OPEN_GATES=1: its gates by backend name opened to collie, harness.py);
# default "gated" on 1.13, "gated opened" on 2.x; logs of opened runs end
# in -opened.log. TORCH_SUITE_WORLDS (default "2 3"), TORCH_SUITE_TIMEOUT
# (a whole run, s), DISTRIBUTED_TESTS_DEFAULT_TIMEOUT (one test, s; torch's
# harness fails a test past it; default 300 on 1.13, 180 on 2.x),
# TORCH_SUITE_START (spawn or fork: how torch's harness starts the ranks;
# default spawn on 1.13, fork on 2.x).
# Long: 5-15 minutes a run on 2 cores.
set -uo pipefail
torch=${1:-1}
if [ "$torch" = 2 ]; then
  python=${TORCH2_PYTHON:-build/torch2-venv/bin/python}
  out=build/torch-suite/torch2
  known=tests/torch_suite/known_differences_2x.txt
  modes=${TORCH_SUITE_MODES:-gated opened}
  export DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=${DISTRIBUTED_TESTS_DEFAULT_TIMEOUT:-180}
  # ranks forked, not spawned (harness.py): spawning took ~30 s a test on
  # this loaded 2-core machine (a run would take hours), forking ~1 s
  export TORCH_SUITE_START=${TORCH_SUITE_START:-fork}
  # dist_suite.py under unittest, printing pytest-style lines (harness.run;
  # written before the venv had pytest, the counts in RESULTS come from it)
  cmd=("$python" tests/torch_suite/dist_suite.py)
else
  python=${PYTHON:-/usr/bin/python3}
  out=build/torch-suite
  known=tests/torch_suite/known_differences.txt
  modes=${TORCH_SUITE_MODES:-gated}
  cmd=("$python" -m pytest -p no:cacheprovider -v -rA tests/torch_suite/dist_suite.py)
fi
mkdir -p "$out"
status=0
for mode in $modes; do
  suffix=""; gates=0
  [ "$mode" = opened ] && { suffix=-opened; gates=1; }
  for ws in ${TORCH_SUITE_WORLDS:-2 3}; do
    for b in gloo collie; do
      echo "== torch $torch, $b, world size $ws, gates $mode"
      start=$(date +%s)
      BACKEND=$b WORLD_SIZE=$ws OPEN_GATES=$gates timeout -k 10 "${TORCH_SUITE_TIMEOUT:-5400}" \
        "${cmd[@]}" > "$out/$b-$ws$suffix.log" 2>&1
      echo "$(tail -n 1 "$out/$b-$ws$suffix.log") ($(( $(date +%s) - start )) s)"
    done
    echo "== torch $torch, world size $ws, gates $mode: gloo against collie"
    "$python" tests/torch_suite/compare.py "$out/gloo-$ws$suffix.log" "$out/collie-$ws$suffix.log" \
      "$known" || status=1
  done
done
exit $status
