"""tests/test_main.py, the main of every Bazel test: strict about 0 tests.

Each case writes a small test file into a scratch folder and runs it the way
Bazel does (`python tests/test_main.py <file>`), or under pytest with the
repo's conftest.py.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

_TESTS = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_TESTS)

_TF_TESTS = '''
import tensorflow as tf


class ATest(tf.test.TestCase):

  def testOne(self):
    self.assertEqual(1, 1)


class BTest(tf.test.TestCase):

  def testTwo(self):
    self.assertEqual(2, 2)


if __name__ == '__main__':
  tf.test.main()
'''

_NO_TESTS = '''
import unittest


class Helper:  # not a TestCase: its "tests" never run

  def testNothing(self):
    pass


if __name__ == '__main__':
  unittest.main()
'''

_FAILING = '''
import unittest


class FailTest(unittest.TestCase):

  def testFails(self):
    self.fail('planted')


if __name__ == '__main__':
  unittest.main()
'''

_NO_MAIN = '''
import unittest


class LostTest(unittest.TestCase):

  def testNeverRuns(self):
    pass
'''


class TestMainTest(unittest.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.tmp)

  def _Write(self, name, text):
    path = os.path.join(self.tmp, name)
    with open(path, 'w') as f:
      f.write(textwrap.dedent(text))
    return path

  def _Main(self, path, test_filter=None):
    env = dict(os.environ, PYTHONPATH=_ROOT)
    # Where `bazel test --test_filter=...` puts the filter (absltest reads it).
    env.pop('TESTBRIDGE_TEST_ONLY', None)
    if test_filter:
      env['TESTBRIDGE_TEST_ONLY'] = test_filter
    return subprocess.run(
        [sys.executable, os.path.join(_TESTS, 'test_main.py'), path],
        capture_output=True, text=True, timeout=300, check=False, env=env)

  def testTfTestsRunWithoutThePlaceholderSkips(self):
    proc = self._Main(self._Write('tf_test.py', _TF_TESTS))
    self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
    self.assertIn('Ran 2 tests', proc.stderr)
    self.assertNotIn('skipped', proc.stderr)
    self.assertNotIn('test_session', proc.stderr)

  def testFileThatRunsNoTestFails(self):
    for name, text in (('none_test.py', _NO_TESTS),
                       ('nomain_test.py', _NO_MAIN)):
      with self.subTest(name):
        proc = self._Main(self._Write(name, text))
        self.assertEqual(proc.returncode, 1, proc.stderr[-2000:])
        self.assertIn(f'test_main: error: {name} ran no test', proc.stderr)

  def testFilterMatchingNothingFails(self):
    proc = self._Main(self._Write('tf_test.py', _TF_TESTS),
                      test_filter='NoSuchTest')
    self.assertEqual(proc.returncode, 1, proc.stderr[-2000:])
    self.assertIn('ran no test', proc.stderr)

  def testFailureKeepsItsExitCode(self):
    proc = self._Main(self._Write('fail_test.py', _FAILING))
    self.assertEqual(proc.returncode, 1)
    self.assertIn('planted', proc.stderr)
    self.assertNotIn('ran no test', proc.stderr)

  def testPytestCollectsNoPlaceholder(self):
    os.makedirs(os.path.join(self.tmp, 'tests'))
    for name in ('conftest.py', 'test_main.py'):
      shutil.copy(os.path.join(_TESTS, name), os.path.join(self.tmp, 'tests'))
    shutil.copy(os.path.join(_ROOT, 'pytest.ini'), self.tmp)
    self._Write(os.path.join('tests', 'tf_test.py'), _TF_TESTS)
    proc = subprocess.run(
        [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
         'tests/tf_test.py'], cwd=self.tmp, capture_output=True, text=True,
        timeout=300, check=False)
    self.assertEqual(proc.returncode, 0, proc.stdout[-2000:])
    self.assertRegex(proc.stdout, r'\n2 passed')
    self.assertNotIn('skipped', proc.stdout)


if __name__ == '__main__':
  unittest.main()
