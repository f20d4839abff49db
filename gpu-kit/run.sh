#!/bin/sh
# run.sh REPORT_DIR [--quick] — the GPU verification kit: finds the host's
# NCCL, says which one, runs collie-gpucheck and leaves host.txt,
# report.txt and report.json in REPORT_DIR. Runs from any directory; needs only the CUDA
# driver (and NCCL) on the host. CLKIT_NCCL_DIR=DIR forces NCCL's folder.
set -u
kit=$(cd "$(dirname "$0")" && pwd)
if [ $# -lt 1 ]; then
  echo "usage: $0 REPORT_DIR [--quick]" >&2
  exit 2
fi
report=$1; shift
mkdir -p "$report" || exit 2

find_nccl() {
  if [ -n "${CLKIT_NCCL_DIR:-}" ]; then echo "$CLKIT_NCCL_DIR"; return; fi
  for d in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /usr/local/lib \
           /usr/local/cuda/lib64 /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib \
           /usr/local/nccl*/lib /opt/nccl*/lib; do
    [ -e "$d/libnccl.so.2" ] && { echo "$d"; return; }
  done
  p=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}')
  [ -n "$p" ] && { dirname "$p"; return; }
  # a Python environment's NCCL (the nvidia-nccl wheel, or one bundled with torch)
  for py in python3 /usr/bin/python3 /usr/local/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    p=$("$py" - <<'PY' 2>/dev/null
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + sys.path
for r in roots:
    for pat in ("nvidia/nccl/lib/libnccl.so.2", "torch/lib/libnccl.so.2"):
        hits = glob.glob(os.path.join(r, pat))
        if hits:
            print(os.path.dirname(hits[0])); raise SystemExit
PY
)
    [ -n "$p" ] && { echo "$p"; return; }
  done
}

nccl_dir=$(find_nccl)
if [ -n "$nccl_dir" ]; then
  echo "run.sh: NCCL from $nccl_dir ($(ls "$nccl_dir"/libnccl.so.2* 2>/dev/null | head -1))"
else
  echo "run.sh: no libnccl.so.2 found (system paths, CUDA toolkit, Python packages);" \
       "set CLKIT_NCCL_DIR" >&2
fi
{
  echo "host: $(uname -srm)"
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version,memory.total \
      --format=csv,noheader 2>/dev/null | sed 's/^/nvidia-smi: /'
  echo "nccl_dir: ${nccl_dir:-none}"
} > "$report/host.txt"
cat "$report/host.txt"
LD_LIBRARY_PATH="${nccl_dir:+$nccl_dir:}$kit/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
COLLIE_PLUGIN_PATH="$kit/lib" \
  "$kit/bin/collie-gpucheck" --report "$report" "$@"
rc=$?
echo "run.sh: report in $report (report.txt, report.json, host.txt)"
exit $rc
