#!/usr/bin/env bash
# check-layers.sh — enforce the "Layers" table of docs/hacking.md on every #include.
#
# The rule lives in one place, docs/hacking.md: its Layers section holds a table,
# one row per library folder from top to bottom, whose last column lists what
# a file of that folder may include from outside its own folder: a header
# (`engine/engine.h`) or a whole folder (`include/`, `base/`). This script
# reads that table and checks every .c and .h under each folder, at any
# depth, against its row:
#   - directives are read as the compiler reads them: backslash-newlines
#     joined, comments dropped (also "#/**/include"), the digraph %: taken
#     for #, a last line without its newline kept; every file of a folder is
#     read, whatever its extension (a .inc may be included); a computed
#     include ("#include MACRO") is refused, as the check cannot follow it;
#   - an include is resolved the way the compiler does here (the including
#     file's folder, then -I . and -I include), for "..." and <...> alike, so
#     a relative "engine.h" cannot hide where it points; one that names a file
#     of the source tree that does not exist is reported too;
#   - a file of the folder itself is always allowed; anything else must be
#     listed in the folder's row;
#   - the table itself must point only downwards: a row may list only folders
#     (or their headers) that stand below it.
# tests/, tools/, gpu-kit/, bench/, examples/, scripts/ and python/ sit on top and
# are not checked.
# Usage: check-layers.sh [ROOT] (default: this source tree; tests/layers/
# self_test.sh gives it small trees that break each rule). Prints each
# offending line and exits 1 if there is one.
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"

# ---- the table -------------------------------------------------------------
# rows between the "## Layers" heading and the next heading, of the shape
#   | `folder/` | what it holds | `a/b.h`, `c/` |
folders=()
declare -A allowed
while IFS= read -r row; do
    IFS='|' read -r _ col_folder _ col_allowed _ <<<"$row"
    folder=$(grep -oE '`[a-z_]+/`' <<<"$col_folder" | tr -d '`' || true)
    [ -n "$folder" ] || continue
    folder=${folder%/}
    folders+=("$folder")
    allowed[$folder]=$(grep -oE '`[a-z_]+/[^`]*`' <<<"$col_allowed" | tr -d '`' | tr '\n' ' ' || true)
done < <(awk '/^## Layers/ {on = 1; next} on && /^## / {exit} on && /^\|/' docs/hacking.md)
if [ "${#folders[@]}" -lt 2 ]; then
    echo "check-layers: docs/hacking.md has no Layers table (| \`folder/\` | holds | may include |)"
    exit 1
fi

bad=0
position() { # row index of a folder in the table (0 = top), -1 if absent
    local i
    for i in "${!folders[@]}"; do [ "${folders[$i]}" = "$1" ] && { echo "$i"; return; }; done
    echo -1
}

# the table points downwards only
for i in "${!folders[@]}"; do
    for a in ${allowed[${folders[$i]}]}; do
        j=$(position "${a%%/*}")
        if [ "$j" -le "$i" ]; then
            echo "docs/hacking.md Layers: ${folders[$i]}/ may include $a, which is not a folder below it"
            bad=1
        fi
    done
done

# where an include resolves, relative to the source root ("" if nowhere in the tree)
resolve() {
    local from_dir=$1 inc=$2 p
    for p in "$from_dir/$inc" "$inc" "include/$inc"; do
        if [ -f "$p" ]; then
            realpath -m --relative-to=. "$p"
            return
        fi
    done
    echo ""
}

permitted() { # permitted FOLDER PATH: is PATH in FOLDER's allowed list?
    local a
    for a in ${allowed[$1]}; do
        case "$a" in
        */) [[ "$2" == "$a"* ]] && return 0 ;;
        *) [ "$2" = "$a" ] && return 0 ;;
        esac
    done
    return 1
}

# The directives of a file as the compiler sees them, one per output line
# "LINE<TAB>DIRECTIVE" (LINE: where it starts): backslash-newlines joined,
# comments gone (also between # and include, and across lines), the digraph
# %: read as #, and a last line without its newline kept.
directives() {
    awk '
    function flush() {
        if (buf ~ /^[ \t]*(#|%:)/) { sub(/^[ \t]*%:/, "#", buf); printf "%d\t%s\n", start, buf }
        buf = ""; start = 0
    }
    {
        line = $0; sub(/\r$/, "", line)
        if (start == 0) start = NR
        out = ""; len = length(line)
        for (k = 1; k <= len; k++) { # string and character literals kept whole
            c = substr(line, k, 1); c2 = substr(line, k, 2)
            if (incomment) { if (c2 == "*/") { incomment = 0; k++; out = out " " } continue }
            if (quote != "") {
                out = out c
                if (c == "\\") { k++; out = out substr(line, k, 1) } else if (c == quote) quote = ""
                continue
            }
            if (c2 == "/*") { incomment = 1; k++; continue }
            if (c2 == "//") break
            if (c == "\"" || c == "\047") quote = c
            out = out c
        }
        quote = "" # a literal never spans lines (but through a backslash-newline: rare)
        if (out ~ /\\$/) { buf = buf substr(out, 1, length(out) - 1); next }
        buf = buf out
        flush()
    }
    END { if (start) flush() }' "$1"
}

checked=0
for folder in "${folders[@]}"; do
    [ -d "$folder" ] || { echo "docs/hacking.md Layers: $folder/ is not a folder"; bad=1; continue; }
    # every file, whatever its name: any of them may be #included
    while IFS= read -r -d '' file; do
        checked=$((checked + 1))
        while IFS=$'\t' read -r n line; do
            [[ "$line" =~ ^[[:space:]]*#[[:space:]]*(include_next|include|import)(.*)$ ]] || continue
            rest=${BASH_REMATCH[2]}
            [[ "$rest" =~ ^[[:alnum:]_] ]] && continue # another directive (#include_x)
            if ! [[ "$rest" =~ ^[[:space:]]*[\"\<]([^\"\>]+)[\"\>] ]]; then
                rest=${rest#"${rest%%[![:space:]]*}"}
                echo "$file:$n: includes $rest, which names no header the check can follow (a computed include): name the header"
                bad=1
                continue
            fi
            inc=${BASH_REMATCH[1]}
            path=$(resolve "$(dirname "$file")" "$inc")
            if [ -z "$path" ]; then
                # not a file of the tree: a system header, unless it names one of ours
                if [ "$(position "${inc%%/*}")" -ge 0 ] && [[ "$inc" == */* ]]; then
                    echo "$file:$n: includes $inc, which does not exist"
                    bad=1
                fi
                continue
            fi
            [[ "$path" == "$folder/"* ]] && continue # its own folder
            if ! permitted "$folder" "$path"; then
                echo "$file:$n: includes $path: $folder/ may include only ${allowed[$folder]:-nothing} from outside itself (docs/hacking.md, Layers)"
                bad=1
            fi
        done < <(directives "$file")
    done < <(find "$folder" -type f -print0)
done

[ "$bad" -eq 0 ] && echo "check-layers: ok ($checked files; ${folders[*]})"
exit "$bad"
