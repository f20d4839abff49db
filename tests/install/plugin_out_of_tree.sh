#!/usr/bin/env bash
# plugin_out_of_tree.sh — the NCCL backend built the way a third party builds
# a plugin: from a `make install` tree alone. transports/nccl/ is copied out
# of the source tree (nothing else of it comes along), compiled with
# `pkg-config --cflags collie-backend` and CUDA's headers, and linked with
# -Wl,--no-undefined and no -lcollie, so a call to any symbol of the core
# (rather than through the services table) fails the link. The plugin is
# then loaded by the installed collie-run/collie-bench and runs a checked
# allreduce on 2 ranks over the CPU double of CUDA and NCCL
# (<build>/tests/cuda_double). Run by tests/test_install.c from the source
# root; exits 77 when CUDA/NCCL or the double are missing, non-zero naming
# the step that failed otherwise.
set -euo pipefail
build=${CLTEST_BUILD_DIR:-build}
cuda=${CUDA_HOME:-/usr/local/cuda}
double=$PWD/$build/tests/cuda_double
[ -f "$cuda/include/nccl.h" ] || [ -f /usr/include/nccl.h ] || { echo "no nccl.h under $cuda"; exit 77; }
[ -f "$double/libnccl.so.2" ] || { echo "the CUDA double is not built ($double)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset COLLIE_PLUGIN_PATH
step() { echo "out-of-tree: $*"; }
die() { echo "out-of-tree: FAILED: $*" >&2; exit 1; }

step "make install DESTDIR=$tmp/root"
make -s --no-print-directory install DESTDIR="$tmp/root" PREFIX=/usr/local > "$tmp/log" 2>&1 ||
  { cat "$tmp/log" >&2; die "make install"; }
root=$tmp/root/usr/local
export PKG_CONFIG_LIBDIR=$root/lib/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=$tmp/root
cflags=$(pkg-config --cflags collie-backend) || die "pkg-config collie-backend"
if pkg-config --libs collie-backend | grep -q lcollie; then die "collie-backend.pc links -lcollie"; fi

step "copy transports/nccl/ alone to $tmp/src"
mkdir -p "$tmp/src/transports" "$tmp/plugin"
cp -r transports/nccl "$tmp/src/transports/"
step "cc $cflags -I src ... -Wl,--no-undefined -lcudart -lnccl"
# shellcheck disable=SC2086 # cflags is a list of flags
cc -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -fPIC -pthread -fvisibility=hidden \
  $cflags -I "$tmp/src" -isystem "$cuda/include" -shared -o "$tmp/plugin/libcollie_nccl.so" \
  "$tmp"/src/transports/nccl/*.c -Wl,--no-undefined -L"$cuda/lib64" -lcudart -lnccl \
  -Wl,-rpath,"$cuda/lib64" -Wl,--enable-new-dtags > "$tmp/log" 2>&1 ||
  { cat "$tmp/log" >&2; die "building the plugin from the install (a symbol of the core, or a header not installed?)"; }
core=$(nm -D --undefined-only "$tmp/plugin/libcollie_nccl.so" | grep -E ' (collie_|cl_)' || true)
[ -z "$core" ] || die "the plugin needs symbols of the core: $core"

step "installed collie-run -n 2 collie-bench --backend nccl --check, on the double"
out=$(LD_LIBRARY_PATH=$double:$root/lib COLLIE_PLUGIN_PATH=$tmp/plugin timeout 120 \
  "$root/bin/collie-run" -n 2 --timeout 90 -- "$root/bin/collie-bench" --backend nccl \
  --op allreduce --sizes 4096 --iters 3 --warmup 0 --check 2>&1) ||
  { echo "$out" >&2; die "the out-of-tree plugin did not run an allreduce"; }
grep -qF "# Out of bounds values : 0 OK" <<<"$out" || { echo "$out" >&2; die "wrong values"; }
step "ok"
