"""Slow tier: one real tick-cost child process (TF start, ten traces)."""

import unittest

from tools import paths
from tools.benchmark_lib import tick_cost


class TickCostChildTest(unittest.TestCase):

  def testChildTimesEveryFunction(self):
    times = tick_cost.RunChild(paths.REPO_ROOT, 2, [2, 4], reps=2)
    for t in (2, 4):
      for name in ('fwd', 'step', 'step_1f1b', 'plain_fwd', 'plain_step'):
        self.assertGreater(times[f'{name}{t}'], 0.0, name)
    self.assertNotIn('consistency_K4_T8', times)


if __name__ == '__main__':
  unittest.main()
