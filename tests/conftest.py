"""pytest hooks for the test tree (Bazel does not use this file)."""
import pytest

_SLOW_SUFFIX = '_slow_test.py'


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
