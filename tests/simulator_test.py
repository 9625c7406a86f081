"""Tests for tensorpipe.simulator: literal schedules worked out by hand."""

import unittest

from tensorpipe import schedule_builders
from tensorpipe import simulator


def _Simulate(forward_costs, backward_costs, num_micro_batches,
              schedule='gpipe', synchronous_ticks=True, **kwargs):
  """SimulateSchedule of a built-in table, in the loop's lock step by
  default (one cost per device)."""
  table = schedule_builders.Build(schedule, len(forward_costs),
                                  num_micro_batches)
  return simulator.SimulateSchedule(table, forward_costs, backward_costs,
                                    synchronous_ticks=synchronous_ticks,
                                    **kwargs)


def _GPipe(num_devices, num_micro_batches):
  return schedule_builders.Build('gpipe', num_devices, num_micro_batches)


def _Cells(res, phase):
  return {(c.t, c.k): (c.start, c.end) for c in res.cells
          if c.phase == phase}


class SimulateTest(unittest.TestCase):

  def testTwoPartitionsTwoMicroBatchesByHand(self):
    # f = 1, b = 2, no recompute:
    #   time   0   1   2   3   4   5   6   7   8   9
    #   k=0    F0  F1          B1......B0......
    #   k=1        F0  F1  B1......B0......
    res = _Simulate([1, 1], [2, 2], 2, recompute=False)
    self.assertEqual(_Cells(res, 'forward'), {
        (0, 0): (0, 1), (1, 0): (1, 2), (0, 1): (1, 2), (1, 1): (2, 3)})
    self.assertEqual(_Cells(res, 'backward'), {
        (1, 1): (3, 5), (0, 1): (5, 7), (1, 0): (5, 7), (0, 0): (7, 9)})
    self.assertEqual(res.step_time, 9)
    self.assertEqual(res.busy, [6, 6])
    self.assertAlmostEqual(res.bubble_fraction, 1 / 3)

  def testRecomputeAddsForwardToEveryBackwardCell(self):
    res = _Simulate([1, 1], [2, 2], 2, recompute=True,
                    fixed_overhead=0.5)
    self.assertEqual(_Cells(res, 'backward'), {
        (1, 1): (3, 6), (0, 1): (6, 9), (1, 0): (6, 9), (0, 0): (9, 12)})
    self.assertEqual(res.step_time, 12.5)
    self.assertEqual([c.recompute for c in res.cells
                      if c.phase == 'backward'], [1.0] * 4)

  def testClockBarrierVersusDataflow(self):
    # f = [1, 2], T = 3. With the tick barrier, (2, 0) waits for the end of
    # tick 1 (t=3, when (0, 1) ends); as dataflow it starts at 2.
    sync = _Simulate([1, 2], [0, 0], 3, recompute=False)
    flow = _Simulate([1, 2], [0, 0], 3, recompute=False,
                     synchronous_ticks=False)
    self.assertEqual(_Cells(sync, 'forward'), {
        (0, 0): (0, 1), (1, 0): (1, 2), (0, 1): (1, 3), (2, 0): (3, 4),
        (1, 1): (3, 5), (2, 1): (5, 7)})
    self.assertEqual(_Cells(flow, 'forward')[(2, 0)], (2, 3))
    self.assertEqual(sync.forward_time, flow.forward_time)

  def testTickOverheadDelaysEveryTick(self):
    # K=1, T=2, f=1, b=1, overhead 0.25 before each of the 4 cells.
    res = _Simulate([1], [1], 2, recompute=False, tick_overhead=0.25)
    self.assertEqual(_Cells(res, 'forward'), {(0, 0): (0.25, 1.25),
                                              (1, 0): (1.5, 2.5)})
    self.assertEqual(res.step_time, 5.0)

  def testSharedCoreSlowsConcurrentCells(self):
    # Two devices on one core: (1, 0) and (0, 1) share it on tick 1.
    res = _Simulate([1, 1], [1, 1], 2, recompute=False, num_cores=1)
    self.assertEqual(_Cells(res, 'forward'), {
        (0, 0): (0, 1), (1, 0): (1, 3), (0, 1): (1, 3), (1, 1): (3, 4)})
    self.assertEqual(res.step_time, 8)  # all 8 units of work, serially

  def testEqualCostsGiveTheScheduleBubble(self):
    for k in (1, 2, 3, 4):
      for t in (1, 2, 4, 8):
        for rc in (True, False):
          res = _Simulate([1.0] * k, [2.0] * k, t, recompute=rc)
          self.assertAlmostEqual(res.bubble_fraction,
                                 (k - 1) / (t + k - 1), msg=(k, t))
          per_cell = 1.0 + (3.0 if rc else 2.0)
          self.assertAlmostEqual(res.step_time, (t + k - 1) * per_cell)
          self.assertEqual(len(res.cells), 2 * k * t)

  def testCellsRespectDependencies(self):
    res = _Simulate([1.0, 3.0, 2.0], [2.0, 1.0, 4.0], 4,
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
    with self.assertRaisesRegex(ValueError, "backward_costs has 1 entries "
                                "but schedule 'gpipe' has 2 stages"):
      _Simulate([1, 1], [1], 2)
    with self.assertRaisesRegex(ValueError, r'>= 0'):
      _Simulate([1, -1], [1, 1], 2)
    with self.assertRaisesRegex(ValueError, 'num_micro_batches'):
      _Simulate([1], [1], 0)


class OneFOneBTest(unittest.TestCase):
  """schedule='1f1b': literal cases and its relation to GPipe."""

  def testTwoPartitionsTwoMicroBatchesAsDataflowByHand(self):
    # f = 1, b = 2, no recompute, no clock barrier. Device order (schedule):
    # k=0: F0 F1 B0 B1; k=1: F0 B0 F1 B1.
    #   time   0   1   2   3   4   5   6   7   8   9
    #   k=0    F0  F1          B0......    B1......
    #   k=1        F0  B0......F1  B1......
    res = _Simulate([1, 1], [2, 2], 2, recompute=False,
                    synchronous_ticks=False, schedule='1f1b')
    self.assertEqual(_Cells(res, 'forward'), {
        (0, 0): (0, 1), (1, 0): (1, 2), (0, 1): (1, 2), (1, 1): (4, 5)})
    self.assertEqual(_Cells(res, 'backward'), {
        (0, 1): (2, 4), (0, 0): (4, 6), (1, 1): (5, 7), (1, 0): (7, 9)})
    self.assertEqual(res.step_time, 9)   # = GPipe's (T + K - 1)(f + b)
    self.assertEqual(res.schedule, '1f1b')
    self.assertEqual(res.forward_time, 5)
    self.assertEqual(res.backward_time, 4)

  def testTwoPartitionsTwoMicroBatchesInLockStepByHand(self):
    # With the clock barrier tick 3 runs B0 on k=0 and F1 on k=1 and lasts
    # max(f, b) = 2:
    #   tick   0    1    2     3     4     5
    #   time   0-1  1-2  2-4   4-6   6-8   8-10
    #   k=0    F0   F1         B0          B1
    #   k=1         F0   B0    F1    B1
    res = _Simulate([1, 1], [2, 2], 2, recompute=False,
                    schedule='1f1b')
    self.assertEqual(_Cells(res, 'forward'), {
        (0, 0): (0, 1), (1, 0): (1, 2), (0, 1): (1, 2), (1, 1): (4, 5)})
    self.assertEqual(_Cells(res, 'backward'), {
        (0, 1): (2, 4), (0, 0): (4, 6), (1, 1): (6, 8), (1, 0): (8, 10)})
    self.assertEqual(res.step_time, 10)
    self.assertGreater(res.step_time, _Simulate(
        [1, 1], [2, 2], 2, recompute=False).step_time)

  def testTwoTicksInFlightLetCellsOverlapTheBarrier(self):
    # parallel_iterations=2: tick c waits only for all of tick c - 2. In the
    # case above tick 4 (B1 on k=1) no longer waits for B0 on k=0 (tick 3):
    # the step takes the dataflow 9 instead of the lock-step 10.
    res = _Simulate([1, 1], [2, 2], 2, recompute=False,
                    schedule='1f1b', ticks_in_flight=2)
    flow = _Simulate([1, 1], [2, 2], 2, recompute=False,
                     schedule='1f1b', synchronous_ticks=False)
    self.assertEqual(res.step_time, 9)
    self.assertEqual(res.cells, flow.cells)
    # GPipe with one tick in flight is unchanged by the parameter's default.
    self.assertEqual(
        _Simulate([1, 2], [0, 0], 3, recompute=False).cells,
        _Simulate([1, 2], [0, 0], 3, recompute=False,
                  ticks_in_flight=1).cells)
    with self.assertRaisesRegex(ValueError, 'ticks_in_flight=0'):
      _Simulate([1], [1], 2, ticks_in_flight=0)

  def testUniformCellCostsGiveGPipeMakespanInTheTickModel(self):
    # Every cell costs the same (f = r + b): both schedules take their
    # 2 (T + K - 1) ticks of one cell each, with or without recompute.
    for k in (1, 2, 3, 4):
      for t in (1, 2, 4, 8):
        for rc, b in ((False, 1.0), (True, 0.0)):
          gpipe = _Simulate([1.0] * k, [b] * k, t, recompute=rc)
          ofob = _Simulate([1.0] * k, [b] * k, t, recompute=rc,
                           schedule='1f1b')
          self.assertEqual(ofob.step_time, 2 * (t + k - 1), (k, t, rc))
          self.assertEqual(ofob.step_time, gpipe.step_time)
          self.assertAlmostEqual(ofob.bubble_fraction,
                                 (k - 1) / (t + k - 1))
          self.assertEqual(len(ofob.cells), 2 * k * t)

  def testEqualStagesAsDataflowGiveGPipeMakespan(self):
    # Without the barrier, equal stages and any f, b: (T + K - 1)(f + r + b).
    for k in (1, 2, 3, 4):
      for t in (1, 2, 4, 8):
        for rc in (True, False):
          ofob = _Simulate([1.0] * k, [2.0] * k, t, recompute=rc,
                           synchronous_ticks=False, schedule='1f1b')
          self.assertEqual(ofob.step_time,
                           (t + k - 1) * (1.0 + (3.0 if rc else 2.0)),
                           (k, t, rc))

  def testOnePartitionCostsItsCellsPlusTickOverheads(self):
    # K=1, T=2: F0 B0 F1 B1, each cell delayed by the tick overhead, as the
    # K=1 GPipe calibration assumes (2 T overheads per step).
    res = _Simulate([1], [1], 2, recompute=True, tick_overhead=0.25,
                    fixed_overhead=1.0, schedule='1f1b')
    self.assertEqual(_Cells(res, 'forward'), {(0, 0): (0.25, 1.25),
                                              (1, 0): (3.75, 4.75)})
    self.assertEqual(_Cells(res, 'backward'), {(0, 0): (1.5, 3.5),
                                               (1, 0): (5.0, 7.0)})
    self.assertEqual(res.step_time, 8.0)
    self.assertEqual(res.step_time, _Simulate(
        [1], [1], 2, recompute=True, tick_overhead=0.25,
        fixed_overhead=1.0).step_time)
    self.assertEqual([c.recompute for c in res.cells
                      if c.phase == 'backward'], [1.0, 1.0])

  def testCellsRespectTheScheduleDependencies(self):
    res = _Simulate([1.0, 3.0, 2.0], [2.0, 1.0, 4.0], 5,
                    synchronous_ticks=False, num_cores=2,
                    schedule='1f1b')
    fwd, bwd = _Cells(res, 'forward'), _Cells(res, 'backward')
    self.assertEqual(len(fwd) + len(bwd), 2 * 3 * 5)
    for (t, k), (start, _) in fwd.items():
      if k > 0:
        self.assertGreaterEqual(start, fwd[(t, k - 1)][1])
    for (t, k), (start, _) in bwd.items():
      dep = bwd[(t, k + 1)] if k < 2 else fwd[(t, k)]
      self.assertGreaterEqual(start, dep[1])
    # Cells of one device never overlap and follow the table's order.
    orders = schedule_builders.Build('1f1b', 3, 5).Orders()
    for k in range(3):
      mine = sorted((c for c in res.cells if c.k == k),
                    key=lambda c: c.start)
      for a, b in zip(mine, mine[1:]):
        self.assertGreaterEqual(b.start, a.end)
      self.assertEqual([(c.phase[0].upper(), c.t) for c in mine],
                       [(a.op, a.micro_batch) for a in orders[k]])

  def testInFlightMicroBatchesKVersusT(self):
    for k in (1, 2, 3, 4):
      for t in (1, 2, 4, 8):
        for sync in (True, False):
          gpipe = _Simulate([1.0] * k, [2.0] * k, t,
                            synchronous_ticks=sync)
          ofob = _Simulate([1.0] * k, [2.0] * k, t,
                           synchronous_ticks=sync, schedule='1f1b')
          self.assertEqual(gpipe.max_in_flight, [t] * k)
          self.assertEqual(ofob.max_in_flight,
                           [min(k - j, t) for j in range(k)], (k, t, sync))

  def testActivationPeakOfKVersusTMicroBatches(self):
    # K=2, T=8; per micro-batch: boundary input 4 B, layer outputs 10 B.
    gpipe = _Simulate([1, 1], [2, 2], 8).max_in_flight     # [8, 8]
    ofob = _Simulate([1, 1], [2, 2], 8,
                     schedule='1f1b').max_in_flight        # [2, 1]
    peak = lambda n, rc: simulator.ActivationPeak(n, [4, 4], [10, 10], rc)
    self.assertEqual(peak(gpipe, True), [8 * 4 + 10, 8 * 4 + 10])
    self.assertEqual(peak(ofob, True), [2 * 4 + 10, 1 * 4 + 10])
    self.assertEqual(peak(gpipe, False), [8 * 14, 8 * 14])
    self.assertEqual(peak(ofob, False), [2 * 14, 1 * 14])
    with self.assertRaisesRegex(ValueError, 'one of each per partition'):
      simulator.ActivationPeak([1, 1], [4], [10, 10], True)


class CalibrateTest(unittest.TestCase):

  def testRecoversOverheadsOfTheModel(self):
    f, b, o, fixed = 2.0, 3.0, 0.5, 7.0
    runs = []
    for t in (2, 4, 8):
      step = _Simulate([f], [b], t, recompute=True, tick_overhead=o,
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
