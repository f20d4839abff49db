#!/usr/bin/env bash
# check-size.sh — the size budget (issue 30): no .c/.h file of the library,
# tools, GPU kit or examples over MAX_FILE lines, no function over MAX_FUNC lines
# (universal-ctags' start and end lines; a #define counts as a function:
# a macro may define one).
#
# Measured: base/ engine/ work/ store/ comm/ transports/ include/ tools/
# gpu-kit/ examples/. Not measured: tests/ and bench/ (test programs and fixtures),
# python/ (not C).
#
# scripts/size-budget.txt lists what is over the budget today, each with the
# size it has now ("file PATH LINES" / "func PATH NAME LINES"): such an entry
# may shrink but not grow, and one that comes within the budget must be
# removed from the list (so the list only ever gets shorter). Anything over
# the budget and not listed fails. `scripts/check-size.sh --report` prints the
# current overruns in the list's format (to start or shorten it).
set -euo pipefail
cd "$(dirname "$0")/.."
MAX_FILE=700
MAX_FUNC=80
dirs=(base engine work store comm transports include tools gpu-kit examples)
budget=scripts/size-budget.txt
command -v ctags >/dev/null || { echo "check-size: ctags (universal-ctags) is not installed" >&2; exit 2; }

current() {
    local f
    while IFS= read -r f; do
        local n
        n=$(wc -l <"$f")
        [ "$n" -gt "$MAX_FILE" ] && echo "file $f $n"
    done < <(git ls-files "${dirs[@]/%//*.c}" "${dirs[@]/%//*.h}" 2>/dev/null || true)
    git ls-files "${dirs[@]/%//*.c}" "${dirs[@]/%//*.h}" |
        ctags -x --_xformat='%F %N %n %{end}' --kinds-C=fd -L - 2>/dev/null |
        awk -v max="$MAX_FUNC" '$4 != "" { n = $4 - $3 + 1; if (n > max) print "func " $1 " " $2 " " n }'
}

if [ "${1:-}" = "--report" ]; then
    current | sort
    exit 0
fi

bad=0
declare -A allowed=()
if [ -f "$budget" ]; then
    while read -r kind path rest; do
        case "$kind" in "" | \#*) continue ;; esac
        if [ "$kind" = func ]; then
            read -r name lines <<<"$rest"
            allowed["func $path $name"]=$lines
        else
            allowed["file $path"]=$rest
        fi
    done <"$budget"
fi
declare -A seen=()
while read -r kind path rest; do
    if [ "$kind" = func ]; then
        read -r name lines <<<"$rest"
        key="func $path $name" what="function $name ($path)" max=$MAX_FUNC
    else
        lines=$rest key="file $path" what="$path" max=$MAX_FILE
    fi
    seen[$key]=1
    if [ -z "${allowed[$key]:-}" ]; then
        echo "check-size: $what has $lines lines (budget $max): split it"
        bad=1
    elif [ "$lines" -gt "${allowed[$key]}" ]; then
        echo "check-size: $what grew to $lines lines; $budget allows it ${allowed[$key]} (budget $max): shrink it, never raise the list"
        bad=1
    elif [ "$lines" -lt "${allowed[$key]}" ]; then
        echo "check-size: $what shrank to $lines lines: lower its entry in $budget to $lines"
        bad=1
    fi
done < <(current)
for key in "${!allowed[@]}"; do
    [ -n "${seen[$key]:-}" ] && continue
    echo "check-size: '$key' is within the budget now (or gone): remove it from $budget"
    bad=1
done
if [ "$bad" -eq 0 ]; then
    echo "check-size: ok (files <= $MAX_FILE lines, functions <= $MAX_FUNC; ${#allowed[@]} listed overruns in $budget)"
fi
exit "$bad"
