"""tools/keras_benchmark.py on a tiny keras_hub GPT-2, end to end (slow).

One run (K=1, 2; gpipe, 1f1b; one timed step; --w_share): a table row per
setting with a finite positive ratio to K=1 GPipe, and the share of the
weight-gradient FLOPs in zb_v's W cells as a percentage.
"""

import math
import re
import unittest

from tests.tools import tool_testlib

_TINY_GPT2 = ('--models=gpt2', '--gpt2_vocabulary_size=64',
              '--gpt2_num_layers=2', '--gpt2_num_heads=2',
              '--gpt2_hidden_dim=16', '--gpt2_intermediate_dim=32',
              '--gpt2_sequence_length=8', '--batch_size=4',
              '--num_micro_batches=4')


class KerasBenchmarkGpt2Test(unittest.TestCase):

  def testTableRowPerSettingAndWShare(self):
    proc = tool_testlib.RunTool(
        'keras_benchmark', *_TINY_GPT2, '--partitions=1,2',
        '--schedules=gpipe,1f1b', '--steps=1', '--w_share', timeout_s=300)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    header = [l for l in proc.stdout.splitlines()
              if l.startswith('| model |')]
    self.assertEqual(len(header), 1, proc.stdout)
    self.assertIn('| K | schedule |', header[0])
    rows = [[c.strip() for c in l.strip('|').split('|')]
            for l in proc.stdout.splitlines() if l.startswith('| gpt2 |')]
    self.assertEqual([(r[2], r[3]) for r in rows],
                     [('1', 'gpipe'), ('2', 'gpipe'), ('2', '1f1b')],
                     proc.stdout)
    for r in rows:
      ratio = float(r[6])
      self.assertTrue(math.isfinite(ratio) and ratio > 0, r)
      self.assertGreater(float(r[5]), 0, r)  # step ms
    self.assertEqual(rows[0][6], '1.00')
    shares = re.findall(r'^w_share: ([0-9.]+)% of the weight-gradient FLOPs '
                        r'run in W cells', proc.stdout, re.M)
    self.assertEqual(len(shares), 1, proc.stdout)
    self.assertTrue(0 <= float(shares[0]) <= 100, shares)
    # The four stages of zb_v at K=2, one row each.
    self.assertEqual(len(re.findall(r'^\| [0-3] \| \d+ \| \d+ \|',
                                    proc.stdout, re.M)), 4, proc.stdout)


if __name__ == '__main__':
  unittest.main()
