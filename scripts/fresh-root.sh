#!/usr/bin/env bash
# fresh-root.sh [ROOT] — run the README's two commands (`make run`, then
# `make test`) on a clean clone of HEAD inside a fresh Debian 12 root, as a
# new user's machine has it: debootstrap minbase plus build-essential,
# clang, python3, iproute2 (and git, ca-certificates to clone and fetch).
# Everything else must be installed by the commands themselves.
#
# The machines this project runs on boot an image with more installed
# (setuptools, a hosts file without ::1): what only a bare root shows is
# found here. Run as root; needs debootstrap and the Debian mirror. Long
# (the whole suite plus torch's install): `make fresh-root`, never part of
# `make test`.
#
# ROOT (default build/fresh-root) is made once and reused; FRESH_ROOT_NEW=1
# makes it again. The mounts live in a private mount namespace: nothing is
# left mounted when the script ends, whichever way it ends.
set -euo pipefail
top=$(git rev-parse --show-toplevel)
root=$(realpath -m "${1:-$top/build/fresh-root}")
mirror=${FRESH_ROOT_MIRROR:-http://deb.debian.org/debian}

[ "$(id -u)" -eq 0 ] || { echo "fresh-root: run as root (chroot, mounts)" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "fresh-root: needs debootstrap (apt-get install debootstrap)" >&2; exit 2; }

if [ "${FRESH_ROOT_NEW:-0}" = 1 ]; then rm -rf "$root"; fi
if [ ! -x "$root/usr/bin/make" ]; then
  rm -rf "$root"
  debootstrap --variant=minbase --include=build-essential,clang,python3,iproute2,git,ca-certificates \
    bookworm "$root" "$mirror"
fi
# Debian's own hosts file: localhost resolves to ::1 as well as 127.0.0.1
cat > "$root/etc/hosts" <<'HOSTS'
127.0.0.1	localhost
::1		localhost ip6-localhost ip6-loopback
ff02::1		ip6-allnodes
ff02::2		ip6-allrouters
HOSTS
cp /etc/resolv.conf "$root/etc/resolv.conf"

# a clean clone of what is committed, as CI takes it
rm -rf "$root/root/collie"
git clone -q --no-hardlinks "$top" "$root/root/collie"
git -C "$root/root/collie" checkout -q "$(git -C "$top" rev-parse HEAD)"

# proc, sys, dev, a tmpfs /dev/shm and /run (ip netns keeps its files there)
exec unshare --mount --propagation private bash -euo pipefail -c '
  root=$1
  mount -t proc proc "$root/proc"
  mount -t sysfs sys "$root/sys"
  mount --rbind /dev "$root/dev"
  mount -t tmpfs -o mode=1777 shm "$root/dev/shm"
  mount -t tmpfs run "$root/run"
  chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    TERM=dumb LANG=C.UTF-8 bash -c "cd /root/collie && make run && make test"
' fresh-root "$root"
