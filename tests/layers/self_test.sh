#!/usr/bin/env bash
# self_test.sh — scripts/check-layers.sh must refuse each way of breaking the
# Layers table of docs/hacking.md, at any depth, and accept a tree that keeps it. Each
# case builds a small tree under a temporary folder; exits non-zero naming
# the case that was not caught. Run by `make check-layers` (and `make test`).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
check=$here/scripts/check-layers.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "check-layers self-test: FAILED: $*" >&2; exit 1; }

# a tree: docs/hacking.md with a table, and one file per folder
tree() {
    rm -rf "$tmp/t" && mkdir -p "$tmp/t"/{docs,include,base,engine,comm,transports/cpu/deep}
    cat >"$tmp/t/docs/hacking.md" <<'MD'
# x
## Layers
| folder | holds | may include from outside itself |
|---|---|---|
| `transports/` | backends | `include/`, `base/` |
| `comm/` | comms | `engine/engine.h`, `include/`, `base/` |
| `engine/` | engine | `include/`, `base/` |
| `base/` | helpers | `include/` |
| `include/` | API | nothing |
## Layout
| `engine/` | not a row of the table | `comm/comm.h` |
MD
    echo '#include <stdio.h>' >"$tmp/t/include/api.h"
    echo '#include "api.h"' >"$tmp/t/base/list.h"
    printf '#include "api.h"\n#include "base/list.h"\n' >"$tmp/t/engine/engine.h"
    echo '#include "engine.h"' >"$tmp/t/engine/engine.c"
    printf '#include "engine/engine.h"\n#include "comm/comm_impl.h"\n' >"$tmp/t/comm/comm.h"
    echo '' >"$tmp/t/comm/comm_impl.h"
    printf '#include "api.h"\n#include <base/list.h>\n#include "transports/cpu/x.h"\n' \
        >"$tmp/t/transports/cpu/deep/y.c"
    echo '' >"$tmp/t/transports/cpu/x.h"
}
expect_ok() {
    "$check" "$tmp/t" >"$tmp/out" 2>&1 || { cat "$tmp/out" >&2; fail "$1: a tree that keeps the table was refused"; }
}
expect_refused() { # expect_refused CASE TEXT
    if "$check" "$tmp/t" >"$tmp/out" 2>&1; then fail "$1: not caught"; fi
    grep -qF -- "$2" "$tmp/out" || { cat "$tmp/out" >&2; fail "$1: the message does not say '$2'"; }
}

tree
expect_ok "the clean tree"

tree # a backend deep down reaching into the engine
echo '#include "engine/engine.h"' >>"$tmp/t/transports/cpu/deep/y.c"
expect_refused "deep upward-private include" "transports/cpu/deep/y.c:4: includes engine/engine.h"

tree # the same through a relative path
echo '#include "../../../engine/engine.h"' >>"$tmp/t/transports/cpu/deep/y.c"
expect_refused "relative path" "includes engine/engine.h"

tree # angle brackets do not hide it
echo '#include <engine/engine.h>' >>"$tmp/t/transports/cpu/deep/y.c"
expect_refused "angle brackets" "includes engine/engine.h"

tree # a private header of a folder below
echo '#include "comm/comm_impl.h"' >>"$tmp/t/transports/cpu/x.h"
expect_refused "private header" "includes comm/comm_impl.h"

tree # upwards
echo '#include "comm/comm.h"' >>"$tmp/t/engine/engine.c"
expect_refused "upward include" "engine/engine.c:2: includes comm/comm.h"

tree # base/ includes a layer
echo '#include "engine/engine.h"' >>"$tmp/t/base/list.h"
expect_refused "base includes a layer" "base/list.h:2: includes engine/engine.h"

# Ways to spell an include that the compiler reads but a line-by-line
# match of `#include "..."` does not (each compiles with the project's flags):
tree # the last line without its newline
printf '#include "engine/engine.h"' >>"$tmp/t/transports/cpu/deep/y.c"
expect_refused "no newline at the end" "transports/cpu/deep/y.c:4: includes engine/engine.h"

tree # a line continuation between the directive and its header
printf '#include \\\n"engine/engine.h"\n' >>"$tmp/t/transports/cpu/deep/y.c"
expect_refused "line continuation" "transports/cpu/deep/y.c:4: includes engine/engine.h"

tree # a comment between # and include
echo '#/**/include "engine/engine.h"' >>"$tmp/t/transports/cpu/deep/y.c"
expect_refused "comment in the directive" "transports/cpu/deep/y.c:4: includes engine/engine.h"

tree # the digraph for #
echo '%:include "engine/engine.h"' >>"$tmp/t/transports/cpu/deep/y.c"
expect_refused "digraph" "transports/cpu/deep/y.c:4: includes engine/engine.h"

tree # a computed include: the header named by a macro
printf '#define H "engine/engine.h"\n#include H\n' >>"$tmp/t/transports/cpu/deep/y.c"
expect_refused "computed include" "transports/cpu/deep/y.c:5: includes H"

tree # a file of another extension, included by a .c of the folder
echo '#include "engine/engine.h"' >"$tmp/t/transports/cpu/z.inc"
echo '#include "z.inc"' >>"$tmp/t/transports/cpu/x.h"
expect_refused "another extension" "transports/cpu/z.inc:1: includes engine/engine.h"

tree # a comment opener inside a string does not hide what follows
printf 'static const char *s = "/*";\n#include "engine/engine.h"\n' >>"$tmp/t/transports/cpu/deep/y.c"
expect_refused "comment opener in a string" "transports/cpu/deep/y.c:5: includes engine/engine.h"

tree # a missing file of the tree
echo '#include "engine/nowhere.h"' >>"$tmp/t/comm/comm.h"
expect_refused "missing header" "includes engine/nowhere.h, which does not exist"

tree # the table itself pointing upwards
sed -i 's/| `engine\/` | engine | `include\/`, `base\/` |/| `engine\/` | engine | `comm\/comm.h`, `include\/` |/' "$tmp/t/docs/hacking.md"
expect_refused "table points up" "engine/ may include comm/comm.h, which is not a folder below it"

tree # no table
printf '# x\n## Layers\nprose only\n' >"$tmp/t/docs/hacking.md"
expect_refused "no table" "has no Layers table"

echo "check-layers self-test: ok (17 cases)"
