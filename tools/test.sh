#!/usr/bin/env bash
# Runs the TensorPipe test suite; exits non-zero if anything failed.
# Run tools/setup.sh first.
#
#   bash tools/test.sh
#       (a) bazel test //...  except targets tagged "slow" (= *_slow_test.py
#           files, see build_defs.bzl); also builds every other target, so a
#           broken BUILD file or py_binary fails here too;
#       (b) pytest -m slow on the *_slow_test.py files: the slow end-to-end
#           tests (marker set by tests/conftest.py). None at all is a success.
#   bash tools/test.sh --all [pytest args...]
#   TENSORPIPE_TEST_ALL=1 bash tools/test.sh
#       Everything with pytest instead (no Bazel), e.g. `--all -n 2` (xdist)
#       or `--all tests/layers -k conv`.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=.venv/bin/python3

usage="usage: bash tools/test.sh [--all [pytest args...]]"
all="${TENSORPIPE_TEST_ALL:-0}"
case "${1:-}" in
  --all) all=1; shift ;;
  -h|--help) echo "$usage"; exit 0 ;;
esac
if [ "$all" = 0 ] && [ "$#" -gt 0 ]; then
  echo "$usage" >&2
  exit 2
fi

# Runs pytest; sets $result. pytest exit codes: 0 passed, 5 no test collected
# (fine here), anything else a failure.
run_pytest() {
  local rc=0
  "$PY" -m pytest "$@" || rc=$?
  case "$rc" in
    0) result="PASS" ;;
    5) result="PASS (no tests)" ;;
    *) result="FAIL (pytest exit $rc)" ;;
  esac
}

if [ "$all" != 0 ]; then
  echo "test: pytest, all tests"
  run_pytest -q "$@"
  echo "test.sh summary: pytest all: $result (${SECONDS}s)"
  [[ "$result" == PASS* ]]
  exit
fi

# (a) Bazel. Exit codes: 0 passed, 3 a test failed, 4 no test targets.
echo "test: bazel test //... (not slow)"
bazel_rc=0
bazel test --test_tag_filters=-slow -- //... || bazel_rc=$?
case "$bazel_rc" in
  0) bazel_result="PASS" ;;
  4) bazel_result="PASS (no tests)" ;;
  *) bazel_result="FAIL (bazel exit $bazel_rc)" ;;
esac

# (b) pytest, slow tests only: the *_slow_test.py files (named directly, so
# pytest does not import every test module just to deselect it).
mapfile -t slow_files < <(find tests -name '*_slow_test.py' -not -path '*/__pycache__/*' | sort)
if [ "${#slow_files[@]}" -eq 0 ]; then
  slow_result="PASS (no slow tests)"
else
  echo "test: pytest -m slow (${#slow_files[@]} files)"
  run_pytest -q -m slow "${slow_files[@]}"
  slow_result="$result"
fi

echo "test.sh summary: bazel: $bazel_result; pytest slow: $slow_result (${SECONDS}s)"
[[ "$bazel_result" == PASS* && "$slow_result" == PASS* ]]
