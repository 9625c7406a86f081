"""Runs the tools/consistency binary: the paper's table for K = 1, 2."""

import unittest

from tests.tools import tool_testlib

_SMALL = ['--num_layers=4', '--batch_size=4', '--num_micro_batches=2',
          '--num_partitions=1,2']


def _Run(*flags):
  return tool_testlib.RunTool('consistency', *flags)


class ConsistencyToolTest(unittest.TestCase):

  def testPipelinedRowsMatchTheUnpipelinedModel(self):
    proc = _Run(*_SMALL)
    self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
    rows = [line for line in proc.stdout.splitlines()
            if line.startswith('| ') and not line.startswith('| model')]
    self.assertEqual([r.split('|')[1:4] for r in rows], [
        [' no pipeline ', ' 1 ', ' 1 '],
        [' pipeline, manual split ', ' 1 ', ' 2 '],
        [' pipeline, automatic split ', ' 1 ', ' 2 '],
        [' pipeline, manual split ', ' 2 ', ' 2 '],
        [' pipeline, automatic split ', ' 2 ', ' 2 ']])
    # At the same T the number of partitions changes nothing, to the bit;
    # micro-batching itself only reorders float32 sums.
    self.assertEqual(len({tuple(r.split('|')[4:6]) for r in rows[1:]}), 1)
    self.assertTrue(all(float(r.split('|')[6]) <= 1e-6 for r in rows))
    self.assertIn('(tolerance 1e-06): PASS', proc.stdout)

  def testExitStatusOneAboveTheTolerance(self):
    proc = _Run(*_SMALL, '--tolerance=-1')
    self.assertEqual(proc.returncode, 1, proc.stderr[-2000:])
    self.assertIn(': FAIL', proc.stdout)

  def testBadPartitionCountIsAFlagError(self):
    proc = _Run('--num_partitions=1,0')
    self.assertNotEqual(proc.returncode, 0)
    self.assertIn('each K must be an int >= 1', proc.stderr)
    self.assertNotIn('Traceback', proc.stderr)


if __name__ == '__main__':
  unittest.main()
