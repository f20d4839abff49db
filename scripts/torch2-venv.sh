#!/usr/bin/env bash
# torch2-venv.sh VENV REQUIREMENTS — build a virtual environment at VENV with
# Debian's /usr/bin/python3 and install the pinned torch 2.x of REQUIREMENTS
# (scripts/torch2-requirements.txt: every package at an exact version with
# its sha256) from PyPI. Never touches the system Python.
#
# The wheels are kept in a wheelhouse outside the tree, $COLLIE_WHEELS
# (default ~/.cache/collie/wheels), which persists across clones and
# `rm -rf build`: a build whose wheels are all there installs offline
# (--no-index); otherwise the missing ones are downloaded (hash-checked)
# first. pip's own HTTP cache (~/.cache/pip) is not enough on its own: it
# keeps only responses that carry cache headers, and a proxy that strips
# them (this machine's does) leaves it empty.
#
#   torch2-venv.sh lock TORCH_VERSION [EXTRA...] > REQUIREMENTS
#     resolves torch==TORCH_VERSION (and the extra requirements) for this
#     Python and platform and prints the pinned, hashed requirements.
#
# Writes VENV/.ok (a copy of REQUIREMENTS) last: an interrupted build is
# started over.
set -euo pipefail
wheels=${COLLIE_WHEELS:-$HOME/.cache/collie/wheels}
py=/usr/bin/python3
if [ ! -x $py ] || ! $py -c 'import venv, ensurepip' 2>/dev/null; then
  echo "collie: $py with venv and ensurepip is needed (scripts/deps.sh test installs python3-venv)" >&2
  exit 1
fi
pipq=(--disable-pip-version-check --no-input -q)

if [ "${1:-}" = lock ]; then
  shift
  [ $# -ge 1 ] || { echo "usage: $0 lock TORCH_VERSION [EXTRA...]" >&2; exit 2; }
  version=$1; shift
  mkdir -p "$wheels"
  log=$($py -m pip download --disable-pip-version-check --no-input --only-binary=:all: \
    -d "$wheels" "torch==$version" "$@") || { echo "$log" >&2; exit 1; }
  echo "# torch 2.x for collie's torch2 backend (make torch2-venv): Python 3.11, Linux x86_64."
  echo "# Made by: scripts/torch2-venv.sh lock $version $*"
  # the wheels pip saved or found: name-version-....whl -> name==version --hash
  echo "$log" | sed -nE 's/^ *(Saved|File was already downloaded) //p' | sort -f |
    while read -r whl; do
      base=$(basename "$whl")
      IFS=- read -r name ver _ <<<"$base"
      echo "$name==$ver --hash=sha256:$(sha256sum "$whl" | cut -d' ' -f1)"
    done
  exit 0
fi

[ $# -eq 2 ] || { echo "usage: $0 VENV REQUIREMENTS" >&2; exit 2; }
venv=$1; req=$2
# a venv built from these very requirements (a checkout only made the file
# newer) is kept
if [ -x "$venv/bin/python" ] && cmp -s "$venv/.ok" "$req"; then
  touch "$venv/.ok"
  exit 0
fi
start=$(date +%s)
rm -rf "$venv"
$py -m venv "$venv"
mkdir -p "$wheels"
if ! "$venv/bin/python" -m pip install "${pipq[@]}" --no-index --find-links "$wheels" \
    -r "$req" 2>/dev/null; then
  echo "collie: downloading the wheels of $req into $wheels"
  "$venv/bin/python" -m pip download "${pipq[@]}" --only-binary=:all: -d "$wheels" -r "$req"
  "$venv/bin/python" -m pip install "${pipq[@]}" --no-index --find-links "$wheels" -r "$req"
fi
"$venv/bin/python" -c 'import torch, torch.distributed as d; assert d.is_available(); print("collie: torch", torch.__version__, "in '"$venv"'")'
cp "$req" "$venv/.ok"
echo "collie: $venv built in $(( $(date +%s) - start )) s"
