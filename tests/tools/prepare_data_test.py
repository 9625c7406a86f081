"""Runs the tools/prepare_data binary's argument checks (no data is built)."""

import os
import subprocess
import sys
import unittest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _Run(*args):
  return subprocess.run(
      [sys.executable, '-m', 'tools.prepare_data', *args], cwd=_ROOT,
      capture_output=True, text=True, timeout=300, check=False)


class PrepareDataArgumentsTest(unittest.TestCase):

  def testUnknownDataSetIsNamedWithTheChoices(self):
    proc = _Run('--datasets=fashion_mnist,mnist')
    self.assertNotEqual(proc.returncode, 0)
    self.assertIn("--datasets has unknown names ['mnist']; choose from "
                  "['fashion_mnist', 'bible_parallel', 'brown_corpus']",
                  proc.stderr)
    self.assertNotIn('Traceback', proc.stderr)

  def testPositionalArgumentsAreRefused(self):
    proc = _Run('fashion_mnist')
    self.assertNotEqual(proc.returncode, 0)
    self.assertIn("unexpected arguments: ['fashion_mnist']", proc.stderr)


if __name__ == '__main__':
  unittest.main()
