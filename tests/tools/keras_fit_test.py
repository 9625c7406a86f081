"""tools/keras_fit.py's one-line errors (exit 2, no traceback).

Each bad command ends in one `keras_fit: error:` line naming the flag and its
value; the flag checks run before TensorFlow is imported. Its training run
is tests/tools/keras_fit_slow_test.py.
"""

import tempfile
import unittest

from tests.tools import tool_testlib


class KerasFitErrorsTest(unittest.TestCase):

  def _AssertOneLineError(self, *args, expected: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
      proc = tool_testlib.RunTool('keras_fit', f'--logdir={tmp}/fit',
                                  '--steps_per_epoch=1', *args, timeout_s=300)
    self.assertEqual(proc.returncode, 2, proc.stderr[-3000:])
    self.assertNotIn('Traceback', proc.stderr)
    lines = [l for l in proc.stderr.splitlines()
             if l.startswith('keras_fit: error:')]
    self.assertEqual(len(lines), 1, proc.stderr[-3000:])
    self.assertIn(expected, lines[0])
    return lines[0]

  def testBatchSizeNotAMultipleOfMicroBatches(self):
    line = self._AssertOneLineError(
        '--batch_size=30', '--num_micro_batches=8',
        expected='--batch_size=30 is not a positive multiple of '
        '--num_micro_batches=8')
    self.assertIn('--batch_size=24', line)

  def testZeroPartitionsNamesTheFlag(self):
    line = self._AssertOneLineError('--num_partitions=0',
                                    expected='--num_partitions=0')
    self.assertNotIn('logical CPU', line)

  def testZeroMicroBatchesIsNotADivisionByZero(self):
    line = self._AssertOneLineError('--num_micro_batches=0',
                                    expected='--num_micro_batches=0')
    self.assertNotIn('ZeroDivisionError', line)

  def testMissingDataDir(self):
    self._AssertOneLineError('--data_dir=/nonexistent/tfds',
                             expected='--data_dir=/nonexistent/tfds is not a '
                             'directory')

  def testUnpreparedDataDirNamesThePrepareCommand(self):
    # A directory without the data set: found when the input is built.
    with tempfile.TemporaryDirectory() as empty:
      self._AssertOneLineError(
          f'--data_dir={empty}', '--num_partitions=2',
          '--num_micro_batches=2', '--batch_size=4',
          expected='DataNotPreparedError')


if __name__ == '__main__':
  unittest.main()
