#!/usr/bin/env bash
# check-backend-symbols.sh — a backend reaches the core only through the
# services table of collie_backend.h (docs/hacking.md, Layers): the objects of the
# built-in backends (every transports/ object but the NCCL plugin's),
# linked together with `ld -r`, and each plugin under <build>/lib
# (libcollie_<name>.so) may leave no collie_* or cl_* symbol undefined; a
# call into the core would. Complements scripts/check-layers.sh, which looks
# at #include lines; this looks at what the compiler actually emitted.
#
#   scripts/check-backend-symbols.sh [BUILD [OBJECTS...]]
# (default build, and every transports/ object under it but nccl's; `make
# check-backends` names the objects the library is linked from, so a stale
# object of a renamed file cannot count)
# Prints each offending symbol and exits 1 if there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
if [ $# -gt 0 ]; then
    objs="$*"
else
    objs=$(find "$build/obj/transports" -name '*.o' -not -path '*/nccl/*' | sort)
fi
[ -n "$objs" ] || { echo "check-backend-symbols: no objects under $build/obj/transports (make lib first)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bad=0
# shellcheck disable=SC2086 # a list of paths without spaces
ld -r -o "$tmp/builtin.o" $objs
report() { # report WHAT SYMBOLS
    [ -z "$2" ] && return
    echo "check-backend-symbols: $1 calls into the core directly (use the services table):"
    sed 's/^/    /' <<<"$2"
    bad=1
}
report "the built-in backends ($(wc -w <<<"$objs") objects of transports/)" \
    "$(nm -u "$tmp/builtin.o" | awk '{print $2}' | grep -E '^(collie_|cl_)' || true)"
n=0
for so in "$build"/lib/libcollie_*.so; do
    [ -e "$so" ] || continue
    n=$((n + 1))
    report "$so" "$(nm -D --undefined-only "$so" | awk '{print $2}' | grep -E '^(collie_|cl_)' || true)"
done
[ "$bad" -eq 0 ] && echo "check-backend-symbols: ok (built-in backends and $n plugins)"
exit "$bad"
