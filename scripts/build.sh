#!/usr/bin/env bash
# Configures and builds zeropp into build/ (the command lands at build/zeropp).
# Without the test-only fault hooks, even in a folder scripts/test.sh built
# with them (a later -DZPP_FAULT_HOOKS=ON wins: docs/fault-hooks.md).
# Usage: scripts/build.sh [build-dir] [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DZPP_FAULT_HOOKS=OFF "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
