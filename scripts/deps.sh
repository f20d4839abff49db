#!/usr/bin/env bash
# deps.sh — make sure the Debian packages collie needs are installed.
#
#   scripts/deps.sh build   what the library, tools and examples need
#   scripts/deps.sh test    that, and what the tests need besides
#
# Called by the Makefile before anything is compiled. As root it installs
# what is missing (apt-get); otherwise it prints the one apt-get line and
# stops.
set -euo pipefail

profile=${1:-build}
# header or tool that proves the package is there -> package name
need=(
  "/usr/include/event2/event.h:libevent-dev"
  "/usr/include/openssl/hmac.h:libssl-dev"
  "/usr/include/jansson.h:libjansson-dev"
  "/usr/bin/g++:g++"
)
# the torch extension is built with `make` wherever Debian's torch is
# installed; scripts/torch_flags.py needs torch.utils.cpp_extension, which
# imports setuptools
torch_ext=("/usr/lib/python3/dist-packages/setuptools/__init__.py:python3-setuptools")
case "$profile" in
  build)
    [ -e /usr/lib/python3/dist-packages/torch/__init__.py ] && need+=("${torch_ext[@]}") ;;
  test)
    need+=(
      "/usr/include/cmocka.h:libcmocka-dev"
      "/usr/bin/pkg-config:pkg-config"
      "/usr/bin/clang-format:clang-format"
      "/usr/bin/clang-14:clang-14"
      "/usr/bin/python3:python3"
      "/usr/sbin/ip:iproute2"
      "/usr/bin/jq:jq"
      "/usr/bin/ctags-universal:universal-ctags"
      "/usr/lib/python3/dist-packages/numpy/__init__.py:python3-numpy"
      "/usr/lib/python3/dist-packages/pytest/__init__.py:python3-pytest"
      "/usr/lib/python3/dist-packages/torch/__init__.py:python3-torch"
      "/usr/include/torch/csrc/distributed/c10d/ProcessGroup.hpp:libtorch-dev"
      "/usr/include/pybind11/pybind11.h:pybind11-dev"
      # make torch2-venv: a virtual environment for torch 2.x from PyPI
      "/usr/lib/python3.11/ensurepip/__init__.py:python3-venv"
      "${torch_ext[@]}"
    ) ;;
  *) echo "deps.sh: unknown profile '$profile' (build or test)" >&2; exit 2 ;;
esac
missing=()
for pair in "${need[@]}"; do
  path=${pair%%:*}; pkg=${pair#*:}
  [ -e "$path" ] || missing+=("$pkg")
done
# sanitizer runtimes ship with gcc; make sure the shared objects are there
if [ "$profile" = test ]; then
  for lib in libasan.so libubsan.so libtsan.so; do
    if ! gcc -print-file-name="$lib" | grep -q /; then missing+=("libgcc-12-dev"); break; fi
  done
  # libFuzzer's runtime for the fuzz targets (make test-fuzz), beside clang-14's
  # sanitizers; its folder is named by clang's full version
  if ! compgen -G "/usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-$(uname -m).a" >/dev/null; then
    missing+=("libclang-rt-14-dev")
  fi
fi

[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "collie: missing packages; install them with: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null; then
  echo "collie: missing packages: ${missing[*]} and no apt-get to install them" >&2
  exit 1
fi
echo "collie: installing missing packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! apt-get update -qq || ! apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
  echo "collie: could not install ${missing[*]} (no network to the Debian mirror?)" >&2
  exit 1
fi
