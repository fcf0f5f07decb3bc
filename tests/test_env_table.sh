#!/usr/bin/env bash
# The environment is read in one place (issue 32): no getenv, setenv or
# unsetenv in src/ or tools/ outside src/core/env.c (and the test builds'
# src/core/fault_hooks.c), and `zeropp help env`
# names every variable of core/env.h's table, with the value when one is set.
# Usage: tests/test_env_table.sh SOURCE_DIR ZEROPP
set -euo pipefail
src=$1 zeropp=$2

# Calls, not words in comments: strip /* */ and // comments first.
strays=$(cd "$src" && for f in $(find src tools -name '*.c' -o -name '*.cu' -o -name '*.h' | sort); do
  # (fault_hooks.c reads ZPP_FAULT: test builds only, see core/env.h)
  [ "$f" = src/core/env.c ] || [ "$f" = src/core/fault_hooks.c ] && continue
  # (Comments become as many empty lines, so the line numbers stay true.)
  sed -e 's://.*$::' "$f" | perl -0pe 's{/\*.*?\*/}{"\n" x ($& =~ tr/\n//)}gse' |
    grep -nE '\b(getenv|setenv|unsetenv|secure_getenv)[[:space:]]*\(' | sed "s|^|$f:|" || true
done)
if [ -n "$strays" ]; then
  echo "FAIL: the environment read outside src/core/env.c (use zpp_env_get, core/env.h):"
  echo "$strays"
  exit 1
fi

names=$(sed -n 's/^ *X(ZPP_ENV_[A-Z0-9_]*, *"\([A-Z0-9_]*\)".*/\1/p' "$src/src/core/env.h")
count=$(echo "$names" | wc -l)
[ "$count" -ge 5 ] || { echo "FAIL: read only $count names from core/env.h"; exit 1; }
value="v$RANDOM$RANDOM"
out=$(ZPP_NCCL_HOSTID_PREFIX=$value "$zeropp" help env)
for n in $names; do
  # (a here-string, not a pipe: grep -q may exit before echo has written, and
  # pipefail would take echo's SIGPIPE for a missing name)
  grep -qE "^  $n(=|\$)" <<< "$out" || { echo "FAIL: zeropp help env does not list $n"; exit 1; }
done
grep -qx "  ZPP_NCCL_HOSTID_PREFIX=$value" <<< "$out" ||
  { echo "FAIL: zeropp help env does not show the value ZPP_NCCL_HOSTID_PREFIX=$value"; exit 1; }
echo "ok: $count variables, each read through core/env.h and listed by zeropp help env"
