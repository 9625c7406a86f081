"""Tests for tools/benchmark_lib/tick_cost: the arithmetic and the table.

The run of a real child process is in tick_cost_slow_test.py.
"""

import unittest

from tools.benchmark_lib import tick_cost


def _Times(fwd8, fwd32, step8, step32, pfwd8, pfwd32, pstep8, pstep32):
  return {'fwd8': fwd8, 'fwd32': fwd32, 'step8': step8, 'step32': step32,
          'plain_fwd8': pfwd8, 'plain_fwd32': pfwd32,
          'plain_step8': pstep8, 'plain_step32': pstep32}


class TickCostTest(unittest.TestCase):

  def testPerTickIsTheCostOfTheExtraTicksPerPartition(self):
    # K=2, T 8 -> 32: 24 more ticks of each loop, 48 partition-ticks.
    # Forward: 48 partition-ticks cost 4.8 ms -> 100 us; the full step 14.4
    # ms more, so the backward loop 9.6 ms -> 200 us. The unrolled model:
    # forward 0.96 ms (20 us), step 2.4 ms (50 us, the backward's work).
    times = _Times(1e-3, 5.8e-3, 2e-3, 16.4e-3, 1e-4, 1.06e-3, 2e-4, 2.6e-3)
    r = tick_cost.PerTick(times, 2, 8, 32)
    self.assertAlmostEqual(r['forward_us'], 100.0)
    self.assertAlmostEqual(r['backward_us'], 200.0)
    self.assertAlmostEqual(r['work_forward_us'], 20.0)
    self.assertAlmostEqual(r['work_backward_us'], 50.0)
    self.assertAlmostEqual(r['fixed_forward_us'], 80.0)
    self.assertAlmostEqual(r['fixed_backward_us'], 150.0)

  def testOneFOneBTickIsHalfTheStepPerExtraMicroBatch(self):
    # K=2, T 8 -> 32: 48 more ticks of the one 1F1B loop, 96 partition-
    # ticks, costing 9.6 ms -> 100 us each. Its stage work is the mean of a
    # forward cell (20 us) and a recomputing backward cell (50 us): 35 us.
    times = dict(_Times(1e-3, 5.8e-3, 2e-3, 16.4e-3, 1e-4, 1.06e-3, 2e-4,
                        2.6e-3), step_1f1b8=3e-3, step_1f1b32=12.6e-3)
    r = tick_cost.PerTick(times, 2, 8, 32)
    self.assertAlmostEqual(r['tick_1f1b_us'], 100.0)
    self.assertAlmostEqual(r['work_1f1b_us'], 35.0)
    self.assertAlmostEqual(r['fixed_1f1b_us'], 65.0)
    # GPipe's figures are unchanged by the 1F1B times.
    self.assertAlmostEqual(r['fixed_backward_us'], 150.0)
    text = tick_cost.Table({'a': {'K2': dict(r, times={})}}, ks=(2,))
    self.assertIn('| a | 2 | 100.0 | 35.0 | 65.0 |', text)
    # A checkout without 1F1B has no 1F1B table.
    no_1f1b = tick_cost.PerTick(_Times(1e-3, 5.8e-3, 2e-3, 16.4e-3, 1e-4,
                                       1.06e-3, 2e-4, 2.6e-3), 2, 8, 32)
    self.assertNotIn('tick_1f1b_us', no_1f1b)
    self.assertNotIn('1F1B tick', tick_cost.Table(
        {'a': {'K2': dict(no_1f1b, times={})}}, ks=(2,)))

  def testTableNamesEveryCheckoutAndK(self):
    per_k = dict(tick_cost.PerTick(
        _Times(1e-3, 2e-3, 2e-3, 4e-3, 0, 0, 0, 0), 1, 8, 32), times={})
    results = {'a': {'K1': per_k, 'consistency': {
        'K4_T8_s': 3e-3, 'K1_T8_s': 2e-3, 'K4_T8_over_K1_T8': 1.5}},
               'b': {'K1': per_k}}
    text = tick_cost.Table(results, ks=(1,))
    self.assertIn('| a | 1 | 41.7 |', text)
    self.assertIn('| b | 1 | 41.7 |', text)
    self.assertIn('| a | 3.00 | 2.00 | 1.50 |', text)

  def testChildFailureNamesTheCheckout(self):
    with self.assertRaisesRegex(ValueError, 'no_such_checkout'):
      tick_cost.RunChild('/tmp/no_such_checkout', 1, [2], reps=1)


if __name__ == '__main__':
  unittest.main()
