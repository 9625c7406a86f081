"""tools/bazel: the launcher's wrapper says to run tools/setup.sh first.

Run against a copy of the wrapper in a temporary clone layout, with a fake
$BAZEL_REAL that echoes its arguments (no Bazel server is started).
"""

import os
import shutil
import stat
import subprocess
import tempfile
import unittest

from tests.tools import tool_testlib

_WRAPPER = os.path.join(tool_testlib.ROOT, 'tools', 'bazel')


class BazelWrapperTest(unittest.TestCase):

  def setUp(self):
    super().setUp()
    self.clone = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.clone)
    os.makedirs(os.path.join(self.clone, 'tools'))
    os.makedirs(os.path.join(self.clone, 'third_party', 'py_toolchain'))
    self.wrapper = os.path.join(self.clone, 'tools', 'bazel')
    shutil.copy(_WRAPPER, self.wrapper)
    os.chmod(self.wrapper, os.stat(self.wrapper).st_mode | stat.S_IXUSR)
    fake = os.path.join(self.clone, 'fake_bazel')
    with open(fake, 'w') as f:
      f.write('#!/bin/sh\necho "real bazel $*"\n')
    os.chmod(fake, 0o755)
    self.env = dict(os.environ, BAZEL_REAL=fake)

  def _Run(self, *args):
    return subprocess.run(['bash', self.wrapper, *args], env=self.env,
                          capture_output=True, text=True, timeout=60,
                          check=False)

  def _WriteToolchain(self, interpreter):
    path = os.path.join(self.clone, 'third_party', 'py_toolchain', 'BUILD')
    with open(path, 'w') as f:
      f.write(f'py_runtime(\n    name = "x",\n'
              f'    interpreter_path = "{interpreter}",\n)\n')

  def testWithoutSetupTestAndRunSayToRunSetup(self):
    for args in (['test', '//tests:x_test'], ['run', '//tools:trainer'],
                 ['--output_base=/tmp/o', 'build', '//...']):
      proc = self._Run(*args)
      self.assertEqual(proc.returncode, 2, args)
      self.assertEqual(proc.stdout, '')
      lines = proc.stderr.splitlines()
      self.assertEqual(len(lines), 1, proc.stderr)
      self.assertRegex(lines[0], r'^bazel: error: tools/setup\.sh has not run'
                       r'.*run `bash tools/setup\.sh` first$')

  def testWithoutSetupCommandsWithoutToolchainRun(self):
    for args in (['shutdown'], ['version'], ['--version']):
      proc = self._Run(*args)
      self.assertEqual(proc.returncode, 0, proc.stderr)
      self.assertEqual(proc.stdout, f'real bazel {" ".join(args)}\n')

  def testToolchainOfAnotherCloneIsNamed(self):
    self._WriteToolchain('/nonexistent/.venv/bin/python3')
    proc = self._Run('test', '//tests:x_test')
    self.assertEqual(proc.returncode, 2)
    self.assertIn('/nonexistent/.venv/bin/python3, which does not exist',
                  proc.stderr)

  def testAfterSetupRunsBazelWithTheSameArguments(self):
    self._WriteToolchain(os.path.realpath(shutil.which('sh')))
    proc = self._Run('test', '--test_output=all', '//tests:x_test')
    self.assertEqual(proc.returncode, 0, proc.stderr)
    self.assertEqual(proc.stdout,
                     'real bazel test --test_output=all //tests:x_test\n')


if __name__ == '__main__':
  unittest.main()
