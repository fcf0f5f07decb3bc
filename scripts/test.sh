#!/usr/bin/env bash
# The README's test command: build, then run the whole CPU test suite
# (GPU tests carry the label "gpu" and run with `ctest -L gpu` on a GPU
# machine; the PyTorch parity tests the label "torch", `ctest -L torch`
# where PyTorch is installed), and fail if any of them did not run: a skipped CPU test is not a
# passed one (scripts/check-skips.sh). The build has the test-only fault
# hooks (docs/fault-hooks.md), so the tests that inject faults run;
# scripts/build.sh leaves them out. Usage: scripts/test.sh [build-dir]
# [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
scripts/install-deps.sh
scripts/build.sh "$dir" -DZPP_FAULT_HOOKS=ON "$@"
junit=$(cd "$dir" && pwd)/ctest-junit.xml
rm -f "$junit"
rc=0
(cd "$dir" && ctest -LE 'gpu|torch' --output-on-failure -j2 --output-junit "$junit") || rc=$?
# Checked even after a failure, so one run names both kinds of problem.
scripts/check-skips.sh "$dir" "$junit" || rc=1
exit "$rc"
