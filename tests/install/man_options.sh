#!/usr/bin/env bash
# man_options.sh BIN_DIR MAN_DIR — every long option a tool's --help lists
# is documented in its man page (troff escapes removed before comparing),
# and collie(3) names nothing the public headers do not declare.
# Prints each one missing and exits 1 if there is one.
set -euo pipefail
bin=$1 man=$2
bad=0
for tool in "$bin"/collie-*; do
    name=$(basename "$tool")
    page="$man/$name.1"
    if [ ! -f "$page" ]; then
        echo "$name: no man page $page"
        bad=1
        continue
    fi
    text=$(sed 's/\\//g' "$page")
    opts=$("$tool" --help 2>&1 | { grep -oE -- '--[a-z][a-z0-9-]*' || true; } | sort -u)
    for o in $opts; do
        grep -qF -- "$o" <<<"$text" || { echo "$name: $o is not in $page"; bad=1; }
    done
done
# collie(3) names only functions and types the public headers declare
api="$man/collie.3"
if [ -f "$api" ]; then
    hdrs=$(cat "$(dirname "$0")/../../include/"*.h)
    for name in $(sed 's/\\//g' "$api" | grep -oE 'collie_[a-z0-9_]+' | sort -u); do
        grep -qw -- "$name" <<<"$hdrs" || { echo "collie.3: $name is not in include/"; bad=1; }
    done
fi
[ "$bad" -eq 0 ] && echo "man pages: every --help option documented"
exit "$bad"
