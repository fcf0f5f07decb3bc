#!/usr/bin/env bash
# Fails when a CPU test did not run. A skipped test is not a passed one: a
# test that cannot run says why ("SKIP: ...", exit 77), ctest reports it
# skipped, and this script turns that into a failure unless the test is
# labelled gpu (GPU tests skip where no GPU is visible).
#
# Usage: scripts/check-skips.sh BUILD_DIR JUNIT_XML
#   BUILD_DIR  the ctest build folder, asked which tests carry the label gpu
#   JUNIT_XML  what `ctest --output-junit JUNIT_XML` wrote for the run
# Exit 0: every test in JUNIT_XML ran, or is labelled gpu. Exit 1: the others
# are listed with their SKIP line. Exit 2: bad arguments, or a file that
# holds no test at all (a run that tested nothing is no evidence).
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: scripts/check-skips.sh BUILD_DIR JUNIT_XML" >&2
  exit 2
fi
build=$1 junit=$2
if [ ! -r "$junit" ]; then
  echo "check-skips: cannot read $junit; run ctest with --output-junit $junit first" >&2
  exit 2
fi
if [ ! -d "$build" ]; then
  echo "check-skips: no build folder $build" >&2
  exit 2
fi

# The names of the tests labelled exactly "gpu" (ctest -L takes a regex).
gpu=$(cd "$build" && ctest -N -L '^gpu$' | sed -n 's/^ *Test *#[0-9]*: //p')

# One line per test that did not run: "name<TAB>reason". ctest writes each
# <testcase ...> on one line and escapes "<" in the output it quotes, so a
# line that starts a testcase is one. Status "run" passed, "fail" failed
# (ctest itself fails the run then); anything else ("notrun": skipped or
# not found, "disabled") did not run.
unescape='s/&lt;/</g; s/&gt;/>/g; s/&quot;/"/g; s/&apos;/'"'"'/g; s/&amp;/\&/g'
notrun=$(awk '
  function attr(line, key,   m) {
    if (match(line, key "=\"[^\"]*\"")) return substr(line, RSTART + length(key) + 2, RLENGTH - length(key) - 3)
    return ""
  }
  /^[ \t]*<testcase / {
    if (name != "") print name "\t" reason
    tests++
    status = attr($0, "status")
    name = (status == "run" || status == "fail") ? "" : attr($0, "name")
    reason = status
    next
  }
  name != "" && reason !~ /^SKIP: / && match($0, /SKIP: .*/) {
    reason = substr($0, RSTART, RLENGTH)
    sub(/<\/system-out>.*/, "", reason)
  }
  name != "" && reason !~ /^SKIP: / && /<skipped message="/ { reason = reason ": " attr($0, "message") }
  /<\/testcase>/ { if (name != "") print name "\t" reason; name = "" }
  END { if (name != "") print name "\t" reason; if (tests == 0) exit 3 }
' "$junit" | sed "$unescape") || {
  echo "check-skips: $junit holds no test results (did ctest run any test?)" >&2
  exit 2
}

bad=()
while IFS=$'\t' read -r name reason; do
  [ -n "$name" ] || continue
  if grep -qxF -- "$name" <<<"$gpu"; then continue; fi
  bad+=("  $name: $reason")
done <<<"$notrun"

if [ ${#bad[@]} -gt 0 ]; then
  echo "check-skips: ${#bad[@]} CPU test(s) did not run; a skipped test proves nothing," >&2
  echo "so install what the reason names (scripts/install-deps.sh) or fix the test:" >&2
  printf '%s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check-skips: every CPU test ran"
