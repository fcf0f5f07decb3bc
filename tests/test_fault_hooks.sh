#!/usr/bin/env bash
# A release library has no fault hooks; a hooks library has them (so the
# first check can fail). tests/fault_hooks.cmake passes both, one of them
# the build's own libzeropp.so, the other linked from the same objects.
#   release: no "ZPP_FAULT" string (no hook can read the variable) and no
#            _exit imported (library code never ends the process);
#   hooks:   both present (save_kill's _exit lives in core/fault_hooks.c).
# The strings are looked for in the library without its debug sections: in
# a -g build (the sanitizer one) those name fault.h's enum constants
# (ZPP_FAULT_NONE, ...), which every call site uses and no code reads.
# Usage: test_fault_hooks.sh RELEASE_LIB HOOKS_LIB
set -euo pipefail
release=$1 hooks=$2
fail=0
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
# (grep reads to the end: with -q and pipefail, the writer's SIGPIPE fails the pipe)
fault_strings() { objcopy --strip-debug "$1" "$tmp" && strings -a "$tmp" | grep ZPP_FAULT; }
has_string() { fault_strings "$1" >/dev/null; }
imports_exit() { nm -D --undefined-only "$1" | grep -w _exit >/dev/null; }
if has_string "$release"; then
  echo "FAIL: $release holds the string ZPP_FAULT: fault-injection code reached a release" \
       "library; keep it in a *_hooks.c file (docs/fault-hooks.md)"
  fault_strings "$release" | sed 's/^/  /'
  fail=1
fi
if imports_exit "$release"; then
  echo "FAIL: $release imports _exit: library code must return a status, not end the process"
  fail=1
fi
if ! has_string "$hooks"; then
  echo "FAIL: $hooks (built with the hooks) has no ZPP_FAULT string: the release check" \
       "above would pass whatever the library held"
  fail=1
fi
if ! imports_exit "$hooks"; then
  echo "FAIL: $hooks (built with the hooks) does not import _exit: save_kill cannot work"
  fail=1
fi
[ "$fail" = 0 ] && echo "ok: $release has no fault hooks; $hooks has them"
exit "$fail"
