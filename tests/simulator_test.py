"""Tests for tensorpipe.simulator: literal schedules worked out by hand."""

import unittest

from tensorpipe import schedules
from tensorpipe import simulator


def _Cells(res, phase):
  return {(c.t, c.k): (c.start, c.end) for c in res.cells
          if c.phase == phase}


class SimulateTest(unittest.TestCase):

  def testTwoPartitionsTwoMicroBatchesByHand(self):
    # f = 1, b = 2, no recompute:
    #   time   0   1   2   3   4   5   6   7   8   9
    #   k=0    F0  F1          B1......B0......
    #   k=1        F0  F1  B1......B0......
    res = simulator.Simulate([1, 1], [2, 2], 2, recompute=False)
    self.assertEqual(_Cells(res, 'forward'), {
        (0, 0): (0, 1), (1, 0): (1, 2), (0, 1): (1, 2), (1, 1): (2, 3)})
    self.assertEqual(_Cells(res, 'backward'), {
        (1, 1): (3, 5), (0, 1): (5, 7), (1, 0): (5, 7), (0, 0): (7, 9)})
    self.assertEqual(res.step_time, 9)
    self.assertEqual(res.busy, [6, 6])
    self.assertAlmostEqual(res.bubble_fraction, 1 / 3)

  def testRecomputeAddsForwardToEveryBackwardCell(self):
    res = simulator.Simulate([1, 1], [2, 2], 2, recompute=True,
                             fixed_overhead=0.5)
    self.assertEqual(_Cells(res, 'backward'), {
        (1, 1): (3, 6), (0, 1): (6, 9), (1, 0): (6, 9), (0, 0): (9, 12)})
    self.assertEqual(res.step_time, 12.5)
    self.assertEqual([c.recompute for c in res.cells
                      if c.phase == 'backward'], [1.0] * 4)

  def testClockBarrierVersusDataflow(self):
    # f = [1, 2], T = 3. With the tick barrier, (2, 0) waits for the end of
    # tick 1 (t=3, when (0, 1) ends); as dataflow it starts at 2.
    sync = simulator.Simulate([1, 2], [0, 0], 3, recompute=False)
    flow = simulator.Simulate([1, 2], [0, 0], 3, recompute=False,
                              synchronous_ticks=False)
    self.assertEqual(_Cells(sync, 'forward'), {
        (0, 0): (0, 1), (1, 0): (1, 2), (0, 1): (1, 3), (2, 0): (3, 4),
        (1, 1): (3, 5), (2, 1): (5, 7)})
    self.assertEqual(_Cells(flow, 'forward')[(2, 0)], (2, 3))
    self.assertEqual(sync.forward_time, flow.forward_time)

  def testTickOverheadDelaysEveryTick(self):
    # K=1, T=2, f=1, b=1, overhead 0.25 before each of the 4 cells.
    res = simulator.Simulate([1], [1], 2, recompute=False, tick_overhead=0.25)
    self.assertEqual(_Cells(res, 'forward'), {(0, 0): (0.25, 1.25),
                                              (1, 0): (1.5, 2.5)})
    self.assertEqual(res.step_time, 5.0)

  def testSharedCoreSlowsConcurrentCells(self):
    # Two devices on one core: (1, 0) and (0, 1) share it on tick 1.
    res = simulator.Simulate([1, 1], [1, 1], 2, recompute=False, num_cores=1)
    self.assertEqual(_Cells(res, 'forward'), {
        (0, 0): (0, 1), (1, 0): (1, 3), (0, 1): (1, 3), (1, 1): (3, 4)})
    self.assertEqual(res.step_time, 8)  # all 8 units of work, serially

  def testEqualCostsGiveTheScheduleBubble(self):
    for k in (1, 2, 3, 4):
      for t in (1, 2, 4, 8):
        for rc in (True, False):
          res = simulator.Simulate([1.0] * k, [2.0] * k, t, recompute=rc)
          self.assertAlmostEqual(res.bubble_fraction,
                                 schedules.BubbleFraction(k, t), msg=(k, t))
          per_cell = 1.0 + (3.0 if rc else 2.0)
          self.assertAlmostEqual(res.step_time, (t + k - 1) * per_cell)
          self.assertEqual(len(res.cells), 2 * k * t)

  def testCellsRespectDependencies(self):
    res = simulator.Simulate([1.0, 3.0, 2.0], [2.0, 1.0, 4.0], 4,
                             synchronous_ticks=False, num_cores=2)
    fwd, bwd = _Cells(res, 'forward'), _Cells(res, 'backward')
    for (t, k), (start, _) in fwd.items():
      for dep in ((t, k - 1), (t - 1, k)):
        if dep in fwd:
          self.assertGreaterEqual(start, fwd[dep][1])
    last_fwd = max(e for _, e in fwd.values())
    for (t, k), (start, _) in bwd.items():
      self.assertGreaterEqual(start, last_fwd)
      for dep in ((t, k + 1), (t + 1, k)):
        if dep in bwd:
          self.assertGreaterEqual(start, bwd[dep][1])

  def testRejectsBadCosts(self):
    with self.assertRaisesRegex(ValueError, 'one of each per partition'):
      simulator.Simulate([1, 1], [1], 2)
    with self.assertRaisesRegex(ValueError, r'>= 0'):
      simulator.Simulate([1, -1], [1, 1], 2)
    with self.assertRaisesRegex(ValueError, 'num_micro_batches'):
      simulator.Simulate([1], [1], 0)


class CalibrateTest(unittest.TestCase):

  def testRecoversOverheadsOfTheModel(self):
    f, b, o, fixed = 2.0, 3.0, 0.5, 7.0
    runs = []
    for t in (2, 4, 8):
      step = simulator.Simulate([f], [b], t, recompute=True, tick_overhead=o,
                                fixed_overhead=fixed).step_time
      runs.append((t, f, b, step))
    cal = simulator.CalibrateFromK1(runs, recompute=True)
    self.assertAlmostEqual(cal.tick_overhead, o)
    self.assertAlmostEqual(cal.fixed_overhead, fixed)
    self.assertAlmostEqual(cal.residual, 0.0)

  def testOneRunGivesNoTickOverhead(self):
    cal = simulator.CalibrateFromK1([(4, 1.0, 1.0, 10.0)], recompute=False)
    self.assertEqual(cal.tick_overhead, 0.0)
    self.assertAlmostEqual(cal.fixed_overhead, 2.0)


if __name__ == '__main__':
  unittest.main()
