#!/usr/bin/env bash
# Tests cannot pass by skipping:
#   1. the convergence tests' text is in the repository, whole, and no test
#      looks for data outside the source tree;
#   2. scripts/check-skips.sh, which scripts/test.sh (and so CI) runs after
#      the CPU suite, fails on a run where a CPU test skipped or was
#      disabled, passes on one where only tests labelled gpu skipped, and
#      refuses a result file that holds no test. The runs are real ctest
#      runs of a small made-up project, so a change in ctest's JUnit output
#      shows here first.
# Usage (ctest runs it, tests/skips.cmake): test_skip_check.sh SOURCE_DIR CTEST
set -euo pipefail
src=$1 ctest=$2
work=$(mktemp -d /tmp/zpp_test_skip_check_XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "test_skip_check: $*" >&2; exit 1; }
PATH=$(dirname "$ctest"):$PATH # check-skips.sh asks this ctest for labels

# ---- 1. the data ----
text=$src/tests/data/tinyshakespeare.txt
[ -r "$text" ] || fail "$text is missing: the convergence test would have no data"
sum=$(md5sum <"$text" | cut -d' ' -f1)
[ "$sum" = 6fb458f1232090904fb40fe944165e91 ] ||
  fail "$text has md5 $sum, not Tiny Shakespeare's (tests/data/README)"
# (this file names the old places, so it is left out)
if grep -rnE 'shared/data|ZPP_SHARED_DATA' "$src/tests" --exclude="$(basename "$0")"; then
  fail "a test looks for data outside the repository; use zpp_test_data (tests/data)"
fi

# ---- 2. the skip check, on a made-up project ----
proj=$work/proj
mkdir -p "$proj"
cat >"$proj/CTestTestfile.cmake" <<'EOF'
add_test(cpu_pass "true")
add_test(cpu_skip "sh" "-c" "echo '[ RUN  ] cpu_skip'; echo 'SKIP: needs a <thing> & more'; exit 77")
add_test(gpu_skip "sh" "-c" "echo 'SKIP: no GPU is visible'; exit 77")
set_tests_properties(gpu_skip PROPERTIES LABELS "gpu")
add_test(nogpu_skip "sh" "-c" "echo 'SKIP: labelled nogpu, which is not gpu'; exit 77")
set_tests_properties(nogpu_skip PROPERTIES LABELS "nogpu")
add_test(cpu_disabled "true")
set_tests_properties(cpu_disabled PROPERTIES DISABLED TRUE)
set_tests_properties(cpu_skip gpu_skip nogpu_skip PROPERTIES SKIP_RETURN_CODE 77)
EOF
check=$src/scripts/check-skips.sh

# check NAME STATUS CTEST_ARGS...: runs ctest on the project with the
# arguments, then the check; its exit status must be STATUS. Its stderr is
# left in $work/NAME.err.
check() {
  local name=$1 want=$2
  shift 2
  (cd "$proj" && "$ctest" "$@" --output-junit "$work/$name.xml" >"$work/$name.ctest" 2>&1) || true
  local got=0
  "$check" "$proj" "$work/$name.xml" >"$work/$name.out" 2>"$work/$name.err" || got=$?
  [ "$got" = "$want" ] || {
    cat "$work/$name.err" >&2
    fail "$name: check-skips.sh exited $got, expected $want"
  }
}

check only_gpu_skips 0 -R '^(cpu_pass|gpu_skip)$'
grep -q "every CPU test ran" "$work/only_gpu_skips.out" || fail "only_gpu_skips: no summary"
grep -q 'status="notrun"' "$work/only_gpu_skips.xml" ||
  fail "the gpu test did not skip in the made-up run: the check passed without a skip"

check everything 1
err=$work/everything.err
grep -qF "cpu_skip: SKIP: needs a <thing> & more" "$err" || fail "cpu_skip or its reason missing: $(cat "$err")"
grep -qF "nogpu_skip: SKIP: labelled nogpu" "$err" || fail "a label merely containing gpu excused a skip"
grep -qF "cpu_disabled" "$err" || fail "the disabled test was not named"
grep -q "3 CPU test(s) did not run" "$err" || fail "the count: $(head -1 "$err")"
if grep -q "^  gpu_skip:" "$err"; then fail "the gpu test's skip was reported"; fi
if grep -q "cpu_pass" "$err"; then fail "a test that ran was reported"; fi

check one_cpu_skip 1 -R '^(cpu_pass|cpu_skip)$'
check no_tests 2 -R '^nothing-matches$'
got=0
"$check" "$proj" "$work/absent.xml" 2>/dev/null || got=$?
[ "$got" = 2 ] || fail "a missing result file: exit $got, expected 2"
echo "test_skip_check: OK"
