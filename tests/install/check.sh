#!/usr/bin/env bash
# check.sh — install collie into a temporary DESTDIR and use it the way an
# outside project would: pkg-config for the flags, tests/hosts/plugin_host.c
# as the program (it loads the dummy backend plugin and checks
# collie_version() against the headers it was compiled with), linked
# against the shared library and against the static archive, run with no
# COLLIE_PLUGIN_PATH (the plugin must be found beside libcollie), then the
# install moved elsewhere (relocated), then `make uninstall`. Run by
# tests/test_install.c from the source root; exits non-zero naming the step
# that failed.
set -euo pipefail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset COLLIE_PLUGIN_PATH
step() { echo "install-check: $*"; }
die() { echo "install-check: FAILED: $*" >&2; exit 1; }

step "make install DESTDIR=$tmp/root PREFIX=/usr/local"
make -s --no-print-directory install DESTDIR="$tmp/root" PREFIX=/usr/local > "$tmp/log" 2>&1 ||
  { cat "$tmp/log" >&2; die "make install"; }
root=$tmp/root/usr/local
version=$(awk '/^#define COLLIE_VERSION_(MAJOR|MINOR|PATCH) /{v = v s $3; s = "."} END {print v}' \
  include/collie.h)
for f in "lib/libcollie.so.$version" lib/libcollie.so.0 lib/libcollie.so lib/libcollie.a \
         lib/collie/libcollie_dummy.so lib/pkgconfig/collie.pc include/collie.h \
         include/collie_store.h include/collie_comm.h \
         include/collie_backend.h include/collie/base/list.h lib/pkgconfig/collie-backend.pc \
         bin/collie-run bin/collie-bench share/man/man1/collie-store.1; do
  [ -e "$root/$f" ] || die "$f was not installed"
done
[ "$(readlink "$root/lib/libcollie.so.0")" = "libcollie.so.$version" ] || die "libcollie.so.0 link"
soname=$(readelf -d "$root/lib/libcollie.so.$version" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$soname" = libcollie.so.0 ] || die "soname is '$soname', not libcollie.so.0"

# pkg-config sees only the install (PKG_CONFIG_LIBDIR replaces the system's
# search path; the sysroot prefixes -I and -L with the DESTDIR)
export PKG_CONFIG_LIBDIR=$root/lib/pkgconfig:/usr/lib/x86_64-linux-gnu/pkgconfig:/usr/lib/pkgconfig:/usr/share/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=$tmp/root
[ "$(pkg-config --modversion collie)" = "$version" ] || die "pkg-config --modversion collie"
cflags=$(pkg-config --cflags collie)
libs=$(pkg-config --libs collie)
step "cc \$(pkg-config --cflags collie) ... \$(pkg-config --libs collie): $cflags ... $libs"
mkdir -p "$tmp/app"
cc -std=c11 -Wall -Werror $cflags tests/hosts/plugin_host.c -o "$tmp/app/host_shared" $libs ||
  die "building against the shared library"
LD_LIBRARY_PATH=$root/lib "$tmp/app/host_shared" shared || die "the shared-linked program"
# (output captured first: `ldd | grep -q` under pipefail fails whenever grep
# exits before ldd has written everything and ldd dies of SIGPIPE)
loaded=$(LD_LIBRARY_PATH=$root/lib ldd "$tmp/app/host_shared")
grep -qF "libcollie.so.0 => $root/lib/" <<<"$loaded" ||
  die "the program did not load libcollie.so.0 from the install: $loaded"

static_libs=$(pkg-config --static --libs collie | sed 's/-lcollie\b//')
step "static: cc ... -Wl,-Bstatic -lcollie -Wl,-Bdynamic $static_libs"
cc -std=c11 -Wall -Werror $cflags tests/hosts/plugin_host.c -o "$root/bin/host_static" \
  -L"$root/lib" -Wl,-Bstatic -lcollie -Wl,-Bdynamic $static_libs || die "building against libcollie.a"
dynamic=$(readelf -d "$root/bin/host_static")
if grep -q libcollie <<<"$dynamic"; then die "host_static needs libcollie.so"; fi
"$root/bin/host_static" static || die "the statically linked program (plugins from ../lib/collie)"
rm "$root/bin/host_static"

step "relocated: the install moved to $tmp/moved"
mv "$root" "$tmp/moved"
LD_LIBRARY_PATH=$tmp/moved/lib "$tmp/app/host_shared" relocated || die "the relocated install"
mv "$tmp/moved" "$root"

step "make install PREFIX=/opt/other: the .pc files follow the new prefix"
make -s --no-print-directory install DESTDIR="$tmp/other" PREFIX=/opt/other > "$tmp/log" 2>&1 ||
  { cat "$tmp/log" >&2; die "make install PREFIX=/opt/other"; }
for pc in collie collie-backend; do
  grep -qx 'prefix=/opt/other' "$tmp/other/opt/other/lib/pkgconfig/$pc.pc" ||
    die "$pc.pc kept an earlier install's prefix: $(head -n 1 "$tmp/other/opt/other/lib/pkgconfig/$pc.pc")"
done

step "make uninstall"
make -s --no-print-directory uninstall DESTDIR="$tmp/root" PREFIX=/usr/local > "$tmp/log" 2>&1 ||
  { cat "$tmp/log" >&2; die "make uninstall"; }
left=$(find "$tmp/root" -type f -o -type l)
[ -z "$left" ] || die "make uninstall left: $left"
step "ok"
