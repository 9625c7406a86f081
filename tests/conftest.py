"""pytest hooks for the test tree (Bazel does not use this file)."""
import sys
import threading

import pytest

from tests import test_main

_SLOW_SUFFIX = '_slow_test.py'

# tf.test.TestCase's test_session placeholder is not collected (it would
# report one skip per test class), as under Bazel (tests/test_main.py).
test_main.DropTfTestSessionPlaceholder()


def pytest_collection_modifyitems(config, items):
  """Marks every test in a *_slow_test.py file `slow`.

  The file name is the one switch for slow tests: build_defs.bzl tags the same
  files "slow" for Bazel, so `bazel test --test_tag_filters=-slow` plus
  `pytest -m slow` (tools/test.sh) run every test exactly once.
  """
  del config  # unused
  for item in items:
    if item.path.name.endswith(_SLOW_SUFFIX):
      item.add_marker(pytest.mark.slow)


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
