#!/usr/bin/env bash
# torch2-stage.sh — make test's torch 2.x stage (docs/torch2.md): build
# the torch 2.x venv when it is missing (make torch2-venv: from the
# wheelhouse, ~/.cache/collie/wheels, when the pinned wheels are there,
# else downloaded from PyPI), the extension against it (make torch2), then
# run collie.torch's torch 2.x tests (tests/python/test_torch2*.py, and
# test_torch.py's scenarios and assertions again under torch 2.x) and the
# curated part of torch 2.x's own distributed suite
# (tests/torch_suite/curated2.txt) under the venv's Python.
#
# A venv that cannot be had (no PyPI and no wheelhouse) is one skipped test
# that says why; COLLIE_TORCH2=0 skips the stage on purpose. A venv that
# was built but an extension that does not build is a failure: that is
# collie's own code.
set -uo pipefail
results=build/test-results
mkdir -p "$results" build/test-logs
venv=build/torch2-venv
skip() {
  echo "[torch2] skipped: $1"
  echo "torch2 0 0 1" > "$results/torch2.txt"
  exit 0
}
[ "${COLLIE_TORCH2:-1}" = 0 ] && skip "COLLIE_TORCH2=0"
start=$(date +%s)
if ! make --no-print-directory torch2-venv > build/test-logs/torch2-venv.log 2>&1; then
  tail -n 5 build/test-logs/torch2-venv.log | sed 's/^/    /'
  skip "the torch 2.x venv could not be built (PyPI unreachable and the wheels not in the wheelhouse?); log: build/test-logs/torch2-venv.log"
fi
echo "[torch2] venv ready ($(( $(date +%s) - start ))s)"
if ! make --no-print-directory torch2 > build/test-logs/torch2-build.log 2>&1; then
  echo "[torch2] FAILED: the extension does not build against the venv's torch; log:"
  tail -n 40 build/test-logs/torch2-build.log | sed 's/^/    /'
  echo "torch2 0 1 0" > "$results/torch2.txt"
  exit 1
fi
status=0
scripts/run-pytest.sh torch2 tests/python/test_torch2*.py tests/python/test_torch.py -k torch2 || status=1
curated=tests/torch_suite/curated2.txt
if [ -f "$curated" ]; then
  PYTHON=$venv/bin/python BACKEND=collie WORLD_SIZE=2 TORCH_SUITE_START=fork \
    scripts/run-pytest.sh torch2-suite \
    $(grep -v '^#' "$curated" | sed 's|^|tests/torch_suite/dist_suite.py::TestDistBackendWithSpawn::|') \
    || status=1
fi
exit $status
