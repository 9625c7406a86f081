"""tools/keras_benchmark.py's one-line errors: bad flag values end in one
`keras_benchmark: error:` line, exit 2, no traceback. The tool's run is in
keras_benchmark_slow_test.py (45 s: three pipelines traced and zb_v's).
"""

import unittest

from tests.tools import tool_testlib


class KerasBenchmarkErrorsTest(unittest.TestCase):

  def _AssertOneLineError(self, *args, expected: str) -> None:
    proc = tool_testlib.RunTool('keras_benchmark', '--steps=1',
                                *args, timeout_s=300)
    self.assertEqual(proc.returncode, 2, proc.stderr[-3000:])
    self.assertNotIn('Traceback', proc.stderr)
    lines = [l for l in proc.stderr.splitlines()
             if l.startswith('keras_benchmark: error:')]
    self.assertEqual(len(lines), 1, proc.stderr[-3000:])
    self.assertIn(expected, lines[0])

  def testUnknownModel(self):
    self._AssertOneLineError('--models=gpt2,NoSuchNet',
                             expected="unknown model 'NoSuchNet'")

  def testUnknownScheduleListsTheKnownOnes(self):
    self._AssertOneLineError('--schedules=gpipe,zb_h2',
                             expected="unknown schedule 'zb_h2'; use some of "
                             '1f1b,')


if __name__ == '__main__':
  unittest.main()
