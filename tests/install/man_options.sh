#!/usr/bin/env bash
# man_options.sh BIN_DIR MAN_DIR — every long option a tool's --help lists
# is documented in its man page (troff escapes removed before comparing).
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
[ "$bad" -eq 0 ] && echo "man pages: every --help option documented"
exit "$bad"
