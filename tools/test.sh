#!/usr/bin/env bash
# Runs the TensorPipe test suite; exits non-zero if anything failed.
# Run tools/setup.sh first.
#
#   bash tools/test.sh
#       (a) bazel build //...: every BUILD file, py_binary and test target
#           builds; `bazel test //tests:test_main_test` runs Bazel's test
#           path (tests/test_main.py, the main of every test target);
#       (b) pytest on 2 xdist workers, each taking whole files: every unit
#           test (the files not named *_slow_test.py) and the end-to-end
#           tier (tests/conftest.py E2E_TIER, marker "e2e"): the trainer
#           binary on real Fashion-MNIST (train; SIGKILL inside a
#           checkpoint write, SIGTERM, each resumed to identical weights;
#           K=1 vs K=4 losses), 2 workers (a lone worker's bounded start-up
#           error; a worker killed mid-run and the relaunch) and the
#           prepared real data sets. One TF import per worker instead of one
#           per Bazel target (110 targets took 912 s, about 40% of it
#           process start and imports). What had made later tests in a
#           worker slow (a pure-Python test took 113 s against 0.5 s
#           alone): the garbage collector freeing tf.data iterators, each
#           deletion waiting out the autotuning thread's sleep (seconds per
#           iterator); the tier turns autotuning off (same batches, see
#           TENSORPIPE_DATA_AUTOTUNE below).
#   bash tools/test.sh --slow
#       (a) and (b), then every other *_slow_test.py file, each in a pytest
#       process of its own, two files at a time (TENSORPIPE_SLOW_JOBS; the
#       big-model transparency checks, the experiments, the keras_hub fits,
#       the benchmark binary and more; about 1.5 more hours on 2 cores).
#   Under pytest every test fails after pytest.ini's timeout (pytest-timeout),
#   naming itself, so no run can hang; a test file that collects no test
#   fails (tests/conftest.py).
#   bash tools/test.sh --all [pytest args...]
#   TENSORPIPE_TEST_ALL=1 bash tools/test.sh
#       Everything with pytest, no Bazel, e.g. `--all -n 2` (xdist) or
#       `--all tests/layers -k conv`.
#   bazel test //tests:pipeline_test
#       One test file as a Bazel target (each *_test.py file is one).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=.venv/bin/python3

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
lanes="${TENSORPIPE_SLOW_JOBS:-2}"
if ! [[ "$lanes" =~ ^[1-9][0-9]*$ ]]; then
  echo "test: TENSORPIPE_SLOW_JOBS=$lanes must be a positive integer" \
    "(how many slow files --slow runs at once, e.g. 1 or 2)" >&2
  exit 2
fi

# Real-data tests fail instead of skipping when the data is missing
# (tensorpipe/test_utils.CheckPrepared): a suite that skipped them did not test.
export TENSORPIPE_REQUIRE_DATA=1
# tf.data autotuning off for TensorPipe's inputs (tensorpipe/base_input.py,
# same batches): deleting an idle autotuned iterator waits out its tuning
# thread's sleep, up to seconds per trainer a test process frees
# (trainer_lib_test took 77 s instead of 135 s).
export TENSORPIPE_DATA_AUTOTUNE=0

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

# (a) Bazel: the build, and its test path on one target. Exit codes: 0
# passed, anything else a failure. --nocache_test_results: a pass cached by
# an earlier run does not count; TF_ENABLE_ONEDNN_OPTS and
# TENSORPIPE_REQUIRE_DATA reach the tests through --test_env in .bazelrc.
echo "test: bazel build //... and bazel test //tests:test_main_test"
bazel_result="PASS"
bazel build -- //... || bazel_result="FAIL (bazel build exit $?)"
if [[ "$bazel_result" == PASS* ]]; then
  bazel test --nocache_test_results //tests:test_main_test \
    || bazel_result="FAIL (bazel test exit $?)"
fi

# (b) pytest: the unit tests and the end-to-end tier on two workers, each
# taking whole files (--dist loadfile: trainer_slow_test trains its
# uninterrupted reference run once per class). tests/conftest.py puts the
# longest files first; --no-loadscope-reorder keeps that order (xdist's
# default reorders files by their number of tests, not their time).
# --durations: the slowest tests, for the budget.
# One intra-op thread per TensorFlow process: two workers (and the
# trainers they start) on two cores would each start an intra-op pool as
# wide as the machine, whose idle threads spin while the other process
# waits for a core. Results do not depend on it: the bitwise tests compare
# runs in one process, and tolerances come from the arithmetic.
export TF_NUM_INTRAOP_THREADS=1
echo "test: pytest -m 'not slow or e2e' (2 xdist workers)"
run_pytest -q -m 'not slow or e2e' -n 2 --dist loadfile --no-loadscope-reorder \
  --durations=25 tests
tier_result="$result"

# (c) --slow: every other slow file, each in a pytest process of its own: a
# file cannot leave servers, remote devices or threads behind for the next
# (cross_host_slow_test then trainer_slow_test in one process hung), and a
# test past pytest.ini's timeout ends only its own file's process. A file
# that collects no test fails (pytest exit 5). The files run on
# TENSORPIPE_SLOW_JOBS lanes (default 2), longest first
# (tests/conftest.py SLOW_FILE_S): most keep about one core busy (one
# intra-op thread), so two lanes take about half the time on 2 cores. Each
# file's output is printed whole when it ends, then its result line.
slow_result="not run (--slow)"
if [ "$every_slow" = 1 ]; then
  mapfile -t slow_files < <("$PY" -c '
import glob
from tests import conftest
files = [f for f in glob.glob("tests/**/*_slow_test.py", recursive=True)
         if f not in conftest.E2E_TIER]
print("\n".join(conftest.SlowFilesLongestFirst(files)))')
  logs="$(mktemp -d)"
  trap 'kill $(jobs -rp) 2>/dev/null || true; rm -rf "$logs"' EXIT
  failed=()
  count=0
  reported=0
  # Prints each file that ended since the last call (its output, then its
  # result line), in the order they ended; adds each failure to $failed.
  report_ended() {
    local done_file f rc took
    for done_file in $(ls -tr "$logs"/*.rc 2>/dev/null); do
      [ -e "$done_file.seen" ] && continue
      touch "$done_file.seen"
      read -r f rc took < "$done_file"
      cat "${done_file%.rc}.log"
      case "$rc" in
        0) result="PASS" ;;
        5) result="FAIL (no tests collected)" ;;
        *) result="FAIL (pytest exit $rc)" ;;
      esac
      echo "test: $f: $result (${took}s)"
      [[ "$result" == PASS* ]] || failed+=("$f: $result")
      reported=$((reported + 1))
    done
  }
  for f in "${slow_files[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$lanes" ]; do
      wait -n || true
      report_ended
    done
    count=$((count + 1))
    echo "test: pytest -m slow $f (starts at ${SECONDS}s)"
    (
      start=$SECONDS
      rc=0
      "$PY" -m pytest -q -m slow "$f" > "$logs/$count.log" 2>&1 || rc=$?
      echo "$f $rc $((SECONDS - start))" > "$logs/$count.tmp"
      mv "$logs/$count.tmp" "$logs/$count.rc"
    ) &
  done
  wait
  report_ended
  if [ "$count" -eq 0 ]; then
    slow_result="FAIL (no slow test files found)"
  elif [ "$reported" -ne "$count" ]; then
    slow_result="FAIL ($((count - reported)) of $count files left no result)"
  elif [ "${#failed[@]}" -eq 0 ]; then
    slow_result="PASS ($count files on $lanes lanes)"
  else
    list="$(printf '%s; ' "${failed[@]}")"
    slow_result="FAIL (${#failed[@]} of $count files: ${list%; })"
  fi
fi

echo "test.sh summary: bazel: $bazel_result; pytest units + end-to-end:" \
  "$tier_result; other slow files: $slow_result (${SECONDS}s)"
[[ "$bazel_result" == PASS* && "$tier_result" == PASS* ]] || exit 1
[[ "$every_slow" = 0 || "$slow_result" == PASS* ]]
