#!/usr/bin/env bash
# The README's test command: build, then run the whole CPU test suite
# (GPU tests carry the label "gpu" and run with `ctest -L gpu` on a GPU
# machine). The build has the test-only fault hooks (docs/fault-hooks.md),
# so the tests that inject faults run; scripts/build.sh leaves them out.
# Usage: scripts/test.sh [build-dir] [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
scripts/install-deps.sh
scripts/build.sh "$dir" -DZPP_FAULT_HOOKS=ON "$@"
cd "$dir"
ctest -LE gpu --output-on-failure -j2
