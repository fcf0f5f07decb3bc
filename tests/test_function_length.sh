#!/usr/bin/env bash
# scripts/check-function-length.sh on made-up files of known lengths (a
# random length either side of the limit, with braces in comments, strings
# and a kernel attribute that must not confuse it), then on the tree.
# Usage: tests/test_function_length.sh SOURCE_DIR
set -euo pipefail
src=$1
check=$src/scripts/check-function-length.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Writes a C file whose function `f` spans exactly $2 lines (name line to
# closing brace) into $1, with a return type on a line of its own and
# decoys that hold braces.
write_fn() {
  {
    echo '/* a comment with { braces } */'
    echo 'static const int table[] = {1, 2, 3};'
    echo 'extern "C" {'
    echo 'static int'
    echo 'f(int x) {'
    local body=$(($2 - 2)) i
    for ((i = 0; i < body; i++)); do
      case $((i % 3)) in
        0) echo '    x += 1; /* { */' ;;
        1) echo '    if (x == 7) { x = '"'"'}'"'"'; }' ;;
        2) echo '    puts("}{{");' ;;
      esac
    done
    echo '}'
    echo '}'
  } > "$1"
}

limit=$((60 + RANDOM % 100))
write_fn "$tmp/at.c" "$limit"
write_fn "$tmp/over.c" $((limit + 1))
"$check" "$limit" "$tmp/at.c" || { echo "FAIL: a function of exactly $limit lines was refused"; exit 1; }
rc=0
out=$("$check" "$limit" "$tmp/over.c") || rc=$?
if [ "$rc" -ne 1 ] || [ "$out" != "$((limit + 1)) $tmp/over.c:5 f" ]; then
  echo "FAIL: a function of $((limit + 1)) lines (limit $limit): exit $rc, said '$out'"
  exit 1
fi
rc=0
"$check" ten >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 2 ] || { echo "FAIL: a limit that is not a number gave exit $rc, not 2"; exit 1; }

# The tree itself.
"$check" || { echo "FAIL: the functions above are over 120 lines; split them"; exit 1; }
echo "ok: limit $limit caught, and no function in src/ or tools/ over 120 lines"
