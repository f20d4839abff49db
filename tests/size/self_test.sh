#!/usr/bin/env bash
# self_test.sh — scripts/check-size.sh must see every function of the library
# over the budget (80 lines), however it is written, as long as it compiles
# with the project's flags. Each case is a small git tree holding a copy of
# the script and one file; exits non-zero naming the case that was not
# caught. Run by `make check-size`.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "check-size self-test: FAILED: $*" >&2; exit 1; }
command -v ctags >/dev/null || { echo "check-size self-test: skipped (no ctags)"; exit 0; }

# case NAME FILE-CONTENT-GENERATOR: a tree with comm/big.c, which must compile
# (cc -std=c11 -Wall -Wextra -Werror) and must be refused
expect_refused() {
    local name=$1
    rm -rf "$tmp/t" && mkdir -p "$tmp/t/scripts" "$tmp/t/comm"
    cp "$here/scripts/check-size.sh" "$tmp/t/scripts/"
    cat >"$tmp/t/comm/big.c"
    cc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -c "$tmp/t/comm/big.c" -o "$tmp/big.o" ||
        fail "$name: the case does not compile"
    (cd "$tmp/t" && git init -q . && git add -A) || fail "$name: git"
    if "$tmp/t/scripts/check-size.sh" >"$tmp/out" 2>&1; then
        fail "$name: a function of 150 lines was not caught"
    fi
}
body() { for i in $(seq 1 150); do echo "    x += $i;$1"; done; }

{ echo 'int plain(int x);'; echo 'int plain(int x) {'; body ''; echo '    return x;'; echo '}'; } |
    expect_refused "a plain function (control)"

{ echo 'int old_style();'; echo 'int old_style(x)'; echo 'int x;'; echo '{'; body ''; echo '    return x;'
  echo '}'; } | expect_refused "an old-style (K&R) definition"

{ echo '#define DEFINE_BIG(name) int name(int x); int name(int x) { \'; body ' \'
  echo '    return x; }'; echo 'DEFINE_BIG(by_macro)'; } | expect_refused "a function made by a macro"

echo "check-size self-test: ok (3 cases)"
