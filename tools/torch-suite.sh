#!/usr/bin/env bash
# torch-suite.sh — `make test-torch`: PyTorch 1.13's whole
# DistributedTest._DistTestBase for gloo and collie side by side at world
# sizes 2 and 3 (tests/torch_suite/dist_suite.py), logs in
# build/torch-suite/, then tests/torch_suite/compare.py: every test gloo
# passes must pass with collie, except the named list in
# tests/torch_suite/known_differences.txt. Long (tens of minutes on 2 cores).
set -uo pipefail
python=${PYTHON:-/usr/bin/python3}
out=build/torch-suite
mkdir -p "$out"
status=0
for ws in ${TORCH_SUITE_WORLDS:-2 3}; do
  for b in gloo collie; do
    echo "== $b, world size $ws"
    BACKEND=$b WORLD_SIZE=$ws timeout -k 10 "${TORCH_SUITE_TIMEOUT:-5400}" \
      "$python" -m pytest -p no:cacheprovider -v -rA tests/torch_suite/dist_suite.py \
      > "$out/$b-$ws.log" 2>&1
    tail -n 1 "$out/$b-$ws.log"
  done
  echo "== world size $ws: gloo against collie"
  "$python" tests/torch_suite/compare.py "$out/gloo-$ws.log" "$out/collie-$ws.log" \
    tests/torch_suite/known_differences.txt || status=1
done
exit $status
