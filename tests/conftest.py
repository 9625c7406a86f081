"""pytest hooks for the test tree (Bazel does not use this file)."""
import sys
import threading

import pytest

from tests import test_main

_SLOW_SUFFIX = '_slow_test.py'

# The end-to-end tier of the default run (tools/test.sh): slow files that
# also get the marker "e2e", so `pytest -m "not slow or e2e"` is the tier.
E2E_TIER = ('tests/tools/trainer_slow_test.py',
            'tests/tools/multiworker_faults_slow_test.py',
            'tests/tools/multiworker_slow_test.py',
            'tests/inputs/prepared_data_slow_test.py')

# Seconds each long file took in the tier (2 workers on 2 cores, a fresh
# clone's run). Files run longest first: under `-n 2 --dist loadfile
# --no-loadscope-reorder` a free worker takes the next whole file in
# collection order, so the long files do not meet at the end with one
# worker idle. Unlisted files are short and keep their order after these.
# Refresh from `--durations` when a file's time changes a lot.
_MEASURED_S = {
    'tests/tools/trainer_slow_test.py': 344,
    'tests/trainer_lib_test.py': 149,
    'tests/pipeline_ticks_test.py': 124,
    'tests/keras_nested_test.py': 122,
    'tests/keras_schedules_test.py': 112,
    'tests/pipeline_test.py': 110,
    'tests/schedule_engine_test.py': 106,
    'tests/inputs/prepared_data_slow_test.py': 105,
    'tests/pipeline_train_test.py': 104,
    'tests/tools/multiworker_slow_test.py': 101,
    'tests/tools/multiworker_faults_slow_test.py': 88,
    'tests/params/experiments_test.py': 86,
    'tests/models/amoebanet_test.py': 63,
    'tests/keras_graph_test.py': 63,
    'tests/keras_multi_output_test.py': 50,
    'tests/keras_pipeline_test.py': 62,
    'tests/models/transformer_test.py': 61,
    'tests/distribute_test.py': 53,
    'tests/tools/keras_fit_test.py': 43,
    'tests/export_test.py': 42,
    'tests/checkpoint_repartition_test.py': 37,
    'tests/tools/consistency_test.py': 35,
    'tests/pipeline_transparency_test.py': 35,
    'tests/tied_weights_test.py': 31,
    'tests/keras_build_test.py': 29,
    'tests/test_main_test.py': 27,
    'tests/tools/trainer_startup_test.py': 26,
    'tests/weight_op_split_test.py': 26,
    'tests/pipeline_memory_test.py': 25,
    'tests/layers/dropout_test.py': 25,
    'tests/models/resnet_test.py': 21,
    'tests/eval_coverage_test.py': 19,
    'tests/trainer_lib_oracle_test.py': 18,
    'tests/tasks_test.py': 18,
    'tests/decode_metrics_test.py': 17,
    'tests/timeline_test.py': 15,
    'tests/tools/prepare_data_test.py': 14,
    'tests/packaging_test.py': 14,
    'tests/distribute_placement_test.py': 14,
}

# Seconds each other slow file took alone or next to one other job (2-core
# runs, tools/test.sh --slow). `--slow` starts the longest first on its
# lanes (TENSORPIPE_SLOW_JOBS), so the long files do not meet at the end
# with one lane idle; unlisted files run after these, in name order.
SLOW_FILE_S = {
    'tests/pipeline_train_slow_test.py': 2900,
    'tests/keras_hub_backbones_slow_test.py': 1560,
    'tests/keras_applications_slow_test.py': 917,
    'tests/keras_hub_untied_slow_test.py': 797,
    'tests/models/transformer_slow_test.py': 582,
    'tests/models/amoebanet_slow_test.py': 441,
    'tests/params/experiments_slow_test.py': 341,
    'tests/tools/trainer_faults_slow_test.py': 271,
    'tests/tools/trainer_catalogue_slow_test.py': 264,
    'tests/tools/multiworker_bn_slow_test.py': 208,
    'tests/tools/preemption_slow_test.py': 168,
    'tests/models/resnet_slow_test.py': 168,
    'tests/tools/export_slow_test.py': 163,
    'tests/cluster_slow_test.py': 101,
}


def SlowFilesLongestFirst(paths) -> list:
  """`paths` (the other slow files) in the order `--slow` starts them."""
  return sorted(paths, key=lambda p: (-SLOW_FILE_S.get(p, 0), p))


# tf.test.TestCase's test_session placeholder is not collected (it would
# report one skip per test class), as under Bazel (tests/test_main.py).
test_main.DropTfTestSessionPlaceholder()


def _TfDataAutotuneOffWhenAsked() -> None:
  """TENSORPIPE_DATA_AUTOTUNE=0 (tools/test.sh): every tf.data iterator a
  test process makes is untuned, Keras's own included (fit / evaluate /
  predict build theirs from arrays), as tensorpipe/base_input.py does for
  TensorPipe's inputs and the trainers the tests start. Deleting an
  autotuned iterator that sat idle waits out its tuning thread's sleep
  (seconds each, TF 2.21), once per fit and evaluation: keras_nested_test
  took 83 s instead of 144 s. Autotuning sizes buffers and parallelism
  only; the elements and their order are the same.
  """
  from tensorpipe import base_input  # pylint: disable=g-import-not-at-top
  if not base_input.AutotuneOff():
    return
  from tensorflow.python.data.ops import dataset_ops  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  tuned_iter = dataset_ops.DatasetV2.__iter__

  def UntunedIter(dataset):
    return tuned_iter(base_input.WithoutAutotune(dataset))

  dataset_ops.DatasetV2.__iter__ = UntunedIter


_TfDataAutotuneOffWhenAsked()


@pytest.hookimpl(tryfirst=True)  # before -m / -k deselect items
def pytest_collection_modifyitems(config, items):
  """Marks every test in a *_slow_test.py file `slow` (and the end-to-end
  tier's `e2e`), puts the longest files first (_MEASURED_S) and fails a file without
  tests.

  The file name is the one switch for slow tests: build_defs.bzl tags the same
  files "slow" for Bazel, so `bazel test --test_tag_filters=-slow` plus
  `pytest -m slow` (tools/test.sh) run every test exactly once.
  """
  root = config.rootpath
  for item in items:
    if item.path.name.endswith(_SLOW_SUFFIX):
      item.add_marker(pytest.mark.slow)
    if _RelativePath(item, root) in E2E_TIER:
      item.add_marker(pytest.mark.e2e)
  # Stable: the order within a file and among the other files is kept.
  items.sort(key=lambda item: _FileRank(_RelativePath(item, root)))
  _CheckEveryFileHasTests(items, root)


def _RelativePath(item, root) -> str:
  return item.path.relative_to(root).as_posix()


def _FileRank(path: str) -> int:
  return -_MEASURED_S.get(path, 0)


# Test modules collected (pytest_collectreport), to find one without tests.
_MODULES = set()


def pytest_collectreport(report):
  if report.passed and report.nodeid.endswith('_test.py'):
    _MODULES.add(report.nodeid.split('::')[0])


def _CheckEveryFileHasTests(items, root) -> None:
  """A test file that collects no test fails the run (as under Bazel,
  tests/test_main.py): its tests were lost (a class not derived from
  TestCase, every method renamed), not passed. The failure is an item of
  its own, so it is reported under xdist too."""
  with_tests = {_RelativePath(item, root) for item in items}
  session = items[0].session if items else None
  for module in sorted(_MODULES - with_tests):
    if session is not None and (root / module).is_file():
      items.append(_NoTests.from_parent(session, name=f'{module}::no_tests'))


class _NoTests(pytest.Item):
  """Fails: the file named by this item collected no test."""

  def runtest(self):
    raise AssertionError(
        f'{self.name.split("::")[0]}: no test collected; a test file must '
        'hold tests (unittest.TestCase classes with test* methods)')

  def repr_failure(self, excinfo, style=None):
    del style  # one line: the file and the fix
    return str(excinfo.value)

  def reportinfo(self):
    return self.name, None, self.name


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_set_timer(item, settings):
  """pytest-timeout's thread timer, with the test's name in one line first.

  The 'thread' method (pytest.ini) ends a test stuck in a blocking TF call,
  which SIGALRM cannot interrupt: it dumps every thread's stack and ends the
  process with os._exit(1). The line names the test before the stacks.
  """
  if settings.method != 'thread' or not settings.timeout:
    return None  # pytest-timeout's own timer
  import pytest_timeout  # pylint: disable=g-import-not-at-top

  def Fire():
    capman = item.config.pluginmanager.getplugin('capturemanager')
    if capman:
      capman.suspend_global_capture(item)
    sys.stderr.write(f'\nTIMEOUT: {item.nodeid} ran past its '
                     f'{settings.timeout:g} s timeout (pytest-timeout); its '
                     'stacks follow and the pytest process ends\n')
    sys.stderr.flush()
    pytest_timeout.timeout_timer(item, settings)

  timer = threading.Timer(settings.timeout, Fire)
  timer.name = f'pytest_timeout {item.nodeid}'
  timer.daemon = True

  def Cancel():
    timer.cancel()
    timer.join()

  item.cancel_timeout = Cancel
  timer.start()
  return True
