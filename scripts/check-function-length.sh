#!/usr/bin/env bash
# Fails when a function in src/ or tools/ is longer than LIMIT lines (120 by
# default): a function that long does several things, and each deserves a
# name (issue 32). Counts from the line that names the function to its
# closing brace, as ctags does.
#
# Usage: scripts/check-function-length.sh [LIMIT] [FILE...]
#   With no FILE, every .c and .cu file under src/ and tools/.
# Exit 0: none over LIMIT. Exit 1: each one over is listed as
# "LINES FILE:LINE NAME". Exit 2: bad arguments.
#
# The counter reads C as this tree writes it: a function's body opens at
# brace depth 0 after a header holding "(" and no "=" (which would make it
# an initialiser), and closes when the depth comes back to 0. Braces inside
# comments, strings and character literals are not counted.
set -euo pipefail
cd "$(dirname "$0")/.."

limit=${1:-120}
case $limit in
  '' | *[!0-9]*) echo "check-function-length: LIMIT must be a whole number, not '$limit'" >&2; exit 2 ;;
esac
shift || true
if [ $# -eq 0 ]; then
  mapfile -t files < <(find src tools -name '*.c' -o -name '*.cu' | sort)
else
  files=("$@")
fi

awk -v limit="$limit" '
FNR == 1 { depth = 0; wrappers = 0; in_comment = 0; header = ""; paren_line = 0 }
{
    # Strip what cannot hold a counted brace: comments, strings, chars.
    line = $0; code = ""
    while (length(line) > 0) {
        if (in_comment) {
            i = index(line, "*/")
            if (i == 0) { line = ""; break }
            line = substr(line, i + 2); in_comment = 0; continue
        }
        c = substr(line, 1, 1); two = substr(line, 1, 2)
        if (two == "//") break
        if (two == "/*") { in_comment = 1; line = substr(line, 3); continue }
        if (c == "\"" || c == "\x27") {
            # Skip to the matching quote, honouring backslash escapes.
            j = 2
            while (j <= length(line)) {
                d = substr(line, j, 1)
                if (d == "\\") { j += 2; continue }
                if (d == c) break
                j++
            }
            line = substr(line, j + 1); code = code " "; continue
        }
        code = code c; line = substr(line, 2)
    }
    if (code ~ /^[ \t]*#/) { if (depth == 0) { header = ""; paren_line = 0 }; next }
    # A header may put its return type on a line of its own; like ctags,
    # count from the line that names the function, where "(" first appears.
    # (A kernel'"'"'s __launch_bounds__(...) is an attribute, not its name.)
    if (depth == 0 && code ~ /[^ \t]/) {
        gsub(/__launch_bounds__\([^)]*\)/, "", code)
        if (paren_line == 0 && code ~ /\(/) paren_line = FNR
        header = header " " code
    }
    n = length(code)
    for (k = 1; k <= n; k++) {
        ch = substr(code, k, 1)
        if (ch == "{") {
            if (depth == 0) {
                pre = header; sub(/\{.*$/, "", pre)
                # extern "C" { and namespace { only wrap functions.
                if (pre ~ /^[ \t]*(extern|namespace)([ \t]|$)/ && pre !~ /\(/) {
                    wrappers++; header = ""; paren_line = 0; continue
                }
                is_fn = (pre ~ /\(/ && pre !~ /=/ && pre !~ /^[ \t]*(typedef|struct|union|enum)[ \t]/)
                if (is_fn) {
                    name = pre; sub(/\(.*$/, "", name); sub(/^.*[^A-Za-z0-9_]/, "", name)
                    start = paren_line
                }
            }
            depth++
        } else if (ch == "}") {
            if (depth == 0 && wrappers > 0) { wrappers--; continue }
            depth--
            if (depth == 0) {
                if (is_fn && FNR - start + 1 > limit) {
                    printf "%d %s:%d %s\n", FNR - start + 1, FILENAME, start, name
                    bad = 1
                }
                is_fn = 0; header = ""; paren_line = 0
            }
        } else if (ch == ";" && depth == 0) {
            header = ""; paren_line = 0
        }
    }
}
END { exit bad ? 1 : 0 }
' "${files[@]}"
