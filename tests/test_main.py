"""The main of every Bazel test target: runs one test file, strictly.

build_defs.bzl's tensorpipe_py_tests makes this file the `main` of each
py_test and passes the test file's runfiles path as the first argument. It
runs that file as `__main__` (its own `tf.test.main()` / `unittest.main()`
line runs the tests), with two differences from running it directly:

  * tf.test.TestCase's `test_session` placeholder (a method named test_*
    that only skips) is not collected, so a file's skips are real ones;
  * a file that runs no test fails: unittest exits 0 on "Ran 0 tests", so
    a file whose tests were lost (renamed, deselected by a filter, a class
    not derived from TestCase) would pass.

tests/conftest.py applies the first to pytest too; pytest already fails a
file that collects no test (exit 5; tools/test.sh runs each slow file alone).

  bazel test //tests:grad_sum_test   (nothing changes for the test files)
"""

import os
import runpy
import sys
import unittest

# The placeholder's qualified name in TensorFlow (tf.test.TestCase).
_TF_PLACEHOLDER = 'TensorFlowTestCase.test_session'


def _IsTfPlaceholder(test_case_class, name: str) -> bool:
  if name != 'test_session':
    return False
  method = getattr(test_case_class, name, None)
  return getattr(method, '__qualname__', '') == _TF_PLACEHOLDER


def DropTfTestSessionPlaceholder() -> None:
  """Makes unittest's loader (also absltest's and pytest's, which use it)
  skip tf.test.TestCase.test_session. Idempotent."""
  loader = unittest.TestLoader
  if getattr(loader.getTestCaseNames, '_drops_tf_placeholder', False):
    return
  original = loader.getTestCaseNames

  def GetTestCaseNames(self, test_case_class):
    return [name for name in original(self, test_case_class)
            if not _IsTfPlaceholder(test_case_class, name)]
  GetTestCaseNames._drops_tf_placeholder = True  # pylint: disable=protected-access
  loader.getTestCaseNames = GetTestCaseNames


def _RecordResults() -> list:
  """Every unittest result of this process, appended when its run starts."""
  results = []
  original = unittest.TestResult.startTestRun

  def StartTestRun(self):
    results.append(self)
    return original(self)
  unittest.TestResult.startTestRun = StartTestRun
  return results


def main() -> None:
  if len(sys.argv) < 2 or not sys.argv[1].endswith('.py'):
    sys.exit('test_main: error: the first argument must be the test file '
             '(build_defs.bzl passes it); got ' + repr(sys.argv[1:]))
  path = os.path.abspath(sys.argv.pop(1))
  sys.argv[0] = path
  sys.path[0] = os.path.dirname(path)  # as when the file itself is main
  DropTfTestSessionPlaceholder()
  results = _RecordResults()
  code = 0
  try:
    runpy.run_path(path, run_name='__main__')
  except SystemExit as e:
    code = e.code
  ran = sum(r.testsRun for r in results)
  if code in (0, None, False) and ran == 0:
    print(f'test_main: error: {os.path.basename(path)} ran no test; a test '
          "file must define unittest.TestCase tests and end in `if __name__ "
          "== '__main__': tf.test.main()` (or unittest.main()), and a "
          '--test_filter must match one', file=sys.stderr)
    sys.exit(1)
  sys.exit(code)


if __name__ == '__main__':
  main()
