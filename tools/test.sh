#!/usr/bin/env bash
# Runs the TensorPipe test suite; exits non-zero if anything failed.
# Run tools/setup.sh first.
#
#   bash tools/test.sh
#       (a) bazel test //...  except targets tagged "slow" (= *_slow_test.py
#           files, see build_defs.bzl); also builds every other target, so a
#           broken BUILD file or py_binary fails here too;
#       (b) pytest on the end-to-end tier $E2E_TESTS (a subset of the
#           *_slow_test.py files): the trainer binary on real Fashion-MNIST
#           (train; SIGKILL, SIGTERM, a kill inside a checkpoint write, each
#           resumed to identical weights; K=1 vs K=4 losses), 2 workers (a
#           lone worker's bounded start-up error; a worker killed mid-run and
#           the relaunch) and the prepared real data sets.
#   bash tools/test.sh --slow
#       (a), then every *_slow_test.py file, each in a pytest process of its
#       own (also the big-model transparency checks, the experiments and the
#       benchmark binary; ~20 more minutes).
#   Under pytest every test fails after pytest.ini's timeout (pytest-timeout),
#   naming itself, so no run can hang.
#   bash tools/test.sh --all [pytest args...]
#   TENSORPIPE_TEST_ALL=1 bash tools/test.sh
#       Everything with pytest instead (no Bazel), e.g. `--all -n 2` (xdist)
#       or `--all tests/layers -k conv`.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=.venv/bin/python3

# The end-to-end tier of the default run.
E2E_TESTS=(tests/tools/trainer_slow_test.py
           tests/tools/multiworker_slow_test.py
           tests/tools/multiworker_faults_slow_test.py
           tests/inputs/prepared_data_slow_test.py)

usage="usage: bash tools/test.sh [--slow | --all [pytest args...]]"
all="${TENSORPIPE_TEST_ALL:-0}"
every_slow=0
case "${1:-}" in
  --all) all=1; shift ;;
  --slow) every_slow=1; shift ;;
  -h|--help) echo "$usage"; exit 0 ;;
esac
if [ "$all" = 0 ] && [ "$#" -gt 0 ]; then
  echo "$usage" >&2
  exit 2
fi

# Real-data tests fail instead of skipping when the data is missing
# (tensorpipe/test_utils.CheckPrepared): a suite that skipped them did not test.
export TENSORPIPE_REQUIRE_DATA=1

# Runs pytest; sets $result. pytest exit codes: 0 passed, 5 no test collected
# (a failure: the tier named files, so zero tests means they were lost),
# anything else a failure.
run_pytest() {
  local rc=0
  "$PY" -m pytest "$@" || rc=$?
  case "$rc" in
    0) result="PASS" ;;
    5) result="FAIL (no tests collected)" ;;
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

# (a) Bazel. Exit codes: 0 passed, 3 a test failed, 4 no test targets (a
# failure: the suite was lost). --nocache_test_results: a pass cached by an
# earlier run (another commit's sources are keyed, but not the CPU it ran on)
# does not count; TF_ENABLE_ONEDNN_OPTS and TENSORPIPE_REQUIRE_DATA reach the
# tests through --test_env in .bazelrc.
echo "test: bazel test //... (not slow)"
bazel_rc=0
bazel test --nocache_test_results --test_tag_filters=-slow -- //... \
  || bazel_rc=$?
case "$bazel_rc" in
  0) bazel_result="PASS" ;;
  4) bazel_result="FAIL (no test targets)" ;;
  *) bazel_result="FAIL (bazel exit $bazel_rc)" ;;
esac

# (b) pytest, slow tests only: the *_slow_test.py files (named directly, so
# pytest does not import every test module just to deselect it).
if [ "$every_slow" = 1 ]; then
  mapfile -t slow_files < <(find tests -name '*_slow_test.py' -not -path '*/__pycache__/*' | sort)
else
  slow_files=("${E2E_TESTS[@]}")
fi
if [ "${#slow_files[@]}" -eq 0 ]; then
  slow_result="FAIL (no slow test files found)"
elif [ "$every_slow" = 1 ]; then
  # One pytest process per file: a file cannot leave servers, remote devices
  # or threads behind for the next (cross_host_slow_test then
  # trainer_slow_test in one process hung), and a test past pytest.ini's
  # timeout ends only its own file's process. A file that collects no test
  # fails (pytest exit 5).
  echo "test: pytest -m slow, each of ${#slow_files[@]} files in its own process"
  failed=()
  for f in "${slow_files[@]}"; do
    echo "test: pytest -m slow $f"
    start=$SECONDS
    run_pytest -q -m slow "$f"
    echo "test: $f: $result ($((SECONDS - start))s)"
    [[ "$result" == PASS* ]] || failed+=("$f: $result")
  done
  if [ "${#failed[@]}" -eq 0 ]; then
    slow_result="PASS"
  else
    list="$(printf '%s; ' "${failed[@]}")"
    slow_result="FAIL (${#failed[@]} of ${#slow_files[@]} files: ${list%; })"
  fi
else
  echo "test: pytest -m slow (${#slow_files[@]} files, 2 xdist workers)"
  # Two workers, each taking whole files (--dist loadfile: trainer_slow_test
  # trains its uninterrupted reference run once per class): the tier's
  # trainer subprocesses use about one core each, so two at a time fill the
  # 2 cores of CI (381 s -> 252 s on a 2-core Xeon). --durations: each
  # end-to-end test's time, for the tier's budget.
  run_pytest -q -m slow -n 2 --dist loadfile --durations=0 "${slow_files[@]}"
  slow_result="$result"
fi

echo "test.sh summary: bazel: $bazel_result; pytest slow: $slow_result (${SECONDS}s)"
[[ "$bazel_result" == PASS* && "$slow_result" == PASS* ]]
