#!/usr/bin/env bash
# The trainer and the tools are clients of the public API (issue 32): no
# file of src/train/ or tools/ includes engine/engine.h, and every
# zpp_engine_* function they call is declared in include/zeropp.h, or in
# the engine's option table (src/engine/options.h), which the config file's
# keys and checks are generated from by design. Checked first on a made-up
# tree that breaks both rules (it must be refused, naming the file, the
# include and the call), then on the real tree.
# Usage: tests/test_engine_api_only.sh SOURCE_DIR
set -euo pipefail
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# check ROOT: prints each breach as "FILE: what", returns 1 when there is one.
check() {
  local root=$1 bad=0 f name
  # Declarations start a line (a type, then the name and its parenthesis):
  # comments, which are indented or start with '*', do not count.
  local declared
  declared=$(grep -hE '^[A-Za-z].*\bzpp_engine_[a-z0-9_]+\(' \
               "$root/include/zeropp.h" "$root/src/engine/options.h" |
             grep -oE '\bzpp_engine_[a-z0-9_]+\(' | tr -d '(' | sort -u)
  while IFS= read -r f; do
    if grep -qE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"engine/engine\.h"' "$f"; then
      echo "${f#$root/}: includes engine/engine.h (use zeropp.h)"
      bad=1
    fi
    for name in $(grep -oE '\bzpp_engine_[a-z0-9_]+\(' "$f" | tr -d '(' | sort -u); do
      if ! grep -qx "$name" <<<"$declared"; then
        echo "${f#$root/}: calls $name, which include/zeropp.h does not declare"
        bad=1
      fi
    done
  done < <(find "$root/src/train" "$root/tools" -name '*.[ch]' | sort)
  return $bad
}

# The made-up tree: the real declarations, a trainer that breaks both rules.
mkdir -p "$tmp/include" "$tmp/src/engine" "$tmp/src/train" "$tmp/tools"
cp "$src/include/zeropp.h" "$tmp/include/"
cp "$src/src/engine/options.h" "$tmp/src/engine/"
printf '#include "engine/engine.h"\nint f(zpp_engine *e) { return zpp_engine_update_with_stats(e, 1); }\n' \
  > "$tmp/src/train/bad.c"
printf '#include "zeropp.h"\nint g(zpp_engine *e) { return zpp_engine_steps_taken(e); }\n' \
  > "$tmp/tools/good.c"
rc=0
out=$(check "$tmp") || rc=$?
if [ "$rc" -eq 0 ] || ! grep -q 'src/train/bad.c: includes engine/engine.h' <<<"$out" ||
   ! grep -q 'src/train/bad.c: calls zpp_engine_update_with_stats,' <<<"$out" || grep -q 'good.c' <<<"$out"; then
  echo "FAIL: the made-up tree was not refused as it should be:"
  echo "$out"
  exit 1
fi

if ! out=$(check "$src"); then
  echo "FAIL: src/train/ or tools/ reach the engine past include/zeropp.h:"
  echo "$out"
  exit 1
fi
echo "ok: src/train/ and tools/ use the engine through include/zeropp.h only"
