# results_section.sh — sourced by the bench scripts: replace one section of
# a results file in place (between "<!-- NAME:begin" and "<!-- NAME:end -->")
# or append it, through a temporary file and a rename, so a concurrent
# reader never sees half a file and the other sections are left alone.
#
#   write_results_section NAME FILE SECTION_TEXT
write_results_section() {
  local name=$1 out=$2 tmp
  touch "$out"
  tmp=$(mktemp "$out.XXXXXX")
  chmod --reference="$out" "$tmp"
  SECTION="$3" NAME="$name" awk '
    index($0, "<!-- " ENVIRON["NAME"] ":begin") == 1 {
      if (!done) { print ENVIRON["SECTION"]; done = 1 } skip = 1; next }
    $0 == "<!-- " ENVIRON["NAME"] ":end -->" { skip = 0; next }
    !skip { print }
    END { if (!done) { print ""; print ENVIRON["SECTION"] } }
  ' "$out" > "$tmp"
  mv "$tmp" "$out"
}
