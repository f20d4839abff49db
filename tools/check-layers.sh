#!/usr/bin/env bash
# check-layers.sh — list #include lines that cross folders the wrong way.
#
# The layers, bottom to top: base < engine < work < store < comm < transports.
# A file may include, from a folder other than its own, only that folder's
# public header (engine/engine.h, work/work.h, store/store.h, comm/comm.h),
# and only from a folder below it; base/ (header-only helpers: the intrusive
# list, hash map, dtype sizes and names) is open to every layer and includes
# no other folder (the public API in include/ aside).
# include/ (the public API) is open to all;
# tests/, tools/, bench/ and examples/ sit on top and may include anything.
# Prints each offending line and exits 1 if there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
layers=(base engine work store comm transports)
rank() {
    local i
    for i in "${!layers[@]}"; do [ "${layers[$i]}" = "$1" ] && { echo "$i"; return; }; done
    echo -1
}
bad=0
for dir in "${layers[@]}"; do
    from=$(rank "$dir")
    while IFS= read -r hit; do
        file=${hit%%:*}
        rest=${hit#*:}; line=${rest%%:*}
        inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"${rest#*:}")
        top=${inc%%/*}
        [ "$inc" = "$top" ] && continue # include/*.h: the public API
        [ "$top" = "$dir" ] && continue # inside its own folder
        [ "$top" = base ] && continue   # header-only helpers, below every layer
        to=$(rank "$top")
        if [ "$to" -lt 0 ]; then
            echo "$file:$line: includes $inc, outside the library's layers"
            bad=1
        elif [ "$to" -ge "$from" ]; then
            echo "$file:$line: includes $inc: $top is not below $dir"
            bad=1
        elif [ "$inc" != "$top/$top.h" ]; then
            echo "$file:$line: includes $inc: only $top/$top.h is public outside $top/"
            bad=1
        fi
    done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include "' "$dir" --include='*.c' --include='*.h' || true)
done
[ "$bad" -eq 0 ] && echo "check-layers: ok (${layers[*]})"
exit "$bad"
