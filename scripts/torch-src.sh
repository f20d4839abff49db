#!/usr/bin/env bash
# torch-src.sh DEST FILE... — extract test files of the installed
# python3-torch's own source (e.g. test/distributed/test_c10d_common.py) into
# DEST, which the Debian binary packages do not ship. Fetches the upstream
# tarball with `apt-get source --tar-only` of the exact installed version
# through a private deb-src list built from the machine's own Debian mirror
# (nothing under /etc/apt is changed). Idempotent: files already in DEST are
# kept. Exits 0 when every file is there, 1 (with the reason on stderr) when
# they cannot be had, e.g. without network.
set -uo pipefail
dest=$1; shift
missing=()
for f in "$@"; do [ -s "$dest/$(basename "$f")" ] || missing+=("$f"); done
[ ${#missing[@]} -eq 0 ] && exit 0

version=$(dpkg-query -W -f '${source:Version}' python3-torch 2>/dev/null)
if [ -z "$version" ]; then
  echo "torch-src: python3-torch is not installed" >&2; exit 1
fi
upstream=${version%-*}; upstream=${upstream#*:}
mkdir -p "$dest/apt/lists/partial"
work=$(cd "$dest/apt" && pwd) # absolute: apt-get runs in it

# The mirror this machine installs from (deb822 or one-line sources).
mirror=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
  grep -v '^[[:space:]]*#' | grep -oE 'https?://[^ ]+/debian/?' | head -n 1)
suite=$(. /etc/os-release && echo "$VERSION_CODENAME")
mirror=${mirror:-http://deb.debian.org/debian}
echo "deb-src ${mirror%/} $suite main" > "$work/src.list"
apt_opts=(-o Dir::Etc::SourceList="$work/src.list" -o Dir::Etc::SourceParts=/dev/null
  -o Dir::State::Lists="$work/lists" -o Debug::NoDropPrivs=true -qq)
tarball=$work/pytorch_${upstream}.orig.tar.xz
if [ ! -s "$tarball" ]; then
  if ! timeout 300 apt-get "${apt_opts[@]}" update >"$work/update.log" 2>&1; then
    echo "torch-src: apt-get update of $mirror deb-src failed (see $work/update.log)" >&2; exit 1
  fi
  if ! (cd "$work" && timeout 600 apt-get "${apt_opts[@]}" source --download-only --tar-only \
      "pytorch=$version" >source.log 2>&1); then
    echo "torch-src: apt-get source pytorch=$version failed (see $work/source.log)" >&2; exit 1
  fi
fi
for f in "${missing[@]}"; do
  if ! tar -xJOf "$tarball" --wildcards "pytorch-*/$f" > "$dest/$(basename "$f").tmp" 2>/dev/null; then
    rm -f "$dest/$(basename "$f").tmp"
    echo "torch-src: $f is not in $tarball" >&2; exit 1
  fi
  mv "$dest/$(basename "$f").tmp" "$dest/$(basename "$f")"
done
exit 0
