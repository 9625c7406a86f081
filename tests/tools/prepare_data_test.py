"""Runs the tools/prepare_data binary's argument checks (no data is built)."""

import unittest

from tests.tools import tool_testlib


def _Run(*args):
  return tool_testlib.RunTool('prepare_data', *args, timeout_s=300)


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
