"""A test that hangs fails with its name (pytest.ini's timeout, conftest.py).

Runs pytest in a subprocess on a scratch tree holding copies of the repo's
pytest.ini and tests/conftest.py (with tests/test_main.py) and one test that sleeps past a 2 s
timeout: the run must end (not hang), fail, and name the test; the test after
it in another process still runs (tools/test.sh --slow runs one file per
process).
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_HANGING_TEST = '''
import time
import unittest


class HangTest(unittest.TestCase):

  def testFast(self):
    pass

  def testHangs(self):
    time.sleep(120)
'''


class PytestTimeoutTest(unittest.TestCase):

  def setUp(self):
    super().setUp()
    self.tree = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.tree)
    os.makedirs(os.path.join(self.tree, 'tests'))
    shutil.copy(os.path.join(_ROOT, 'pytest.ini'), self.tree)
    for name in ('conftest.py', 'test_main.py'):  # conftest imports the latter
      shutil.copy(os.path.join(_ROOT, 'tests', name),
                  os.path.join(self.tree, 'tests'))
    with open(os.path.join(self.tree, 'tests', 'hang_test.py'), 'w') as f:
      f.write(_HANGING_TEST)

  def testPytestIniSetsATimeout(self):
    with open(os.path.join(_ROOT, 'pytest.ini')) as f:
      text = f.read()
    self.assertRegex(text, r'\ntimeout = \d+\n')
    self.assertIn('\ntimeout_method = thread\n', text)

  def testHungTestEndsTheRunAndIsNamed(self):
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
         '--timeout=2', 'tests/hang_test.py'], cwd=self.tree,
        capture_output=True, text=True, timeout=100, check=False)
    self.assertLess(time.monotonic() - start, 60)
    self.assertNotEqual(proc.returncode, 0, proc.stdout)
    out = proc.stdout + proc.stderr
    self.assertIn('TIMEOUT: tests/hang_test.py::HangTest::testHangs ran past '
                  'its 2 s timeout', out)
    self.assertNotIn('TIMEOUT: tests/hang_test.py::HangTest::testFast', out)


if __name__ == '__main__':
  unittest.main()
