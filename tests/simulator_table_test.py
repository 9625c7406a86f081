"""Tests for simulator.SimulateSchedule: every schedule from its table."""

import os
import unittest

from tensorpipe import schedule_builders
from tensorpipe import schedules
from tensorpipe import simulator

_FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                         'testdata', 'torch_schedules')


def _Step(name, kk, tt, v, recompute=True, **kw):
  """Step time with t_F = t_I = t_W = 1 per device (b = t_I + t_W = 2)."""
  table = schedule_builders.Build(name, kk, tt, v)
  ss = kk * v
  return simulator.SimulateSchedule(table, [1.0 / v] * ss, [2.0 / v] * ss,
                                    recompute=recompute, **kw)


class IdealRatioTest(unittest.TestCase):
  """Dataflow steps at t_F = t_I = t_W against the closed forms."""

  def testOneFOneBIsGPipesForwardPlusBackward(self):
    # (T + K - 1)(f + r + b) for both, with recompute (r = f).
    for kk, tt in [(2, 4), (2, 8), (4, 8), (3, 5)]:
      for name in ('gpipe', '1f1b'):
        self.assertEqual(_Step(name, kk, tt, 1).step_time, (tt + kk - 1) * 4)

  def testInterleavedDividesTheBubbleByV(self):
    # Work 4T per device; bubble (K - 1)(f + r + b) / v.
    for kk, tt, v in [(2, 4, 2), (2, 8, 2), (4, 8, 2), (2, 6, 3)]:
      self.assertAlmostEqual(_Step('interleaved_1f1b', kk, tt, v).step_time,
                             4 * tt + (kk - 1) * 4 / v)

  def testZeroBubbleH1Bubble(self):
    # (K - 1)(t_F + t_B - 2 t_W) with t_B = (r + t_I) + t_W = 3, t_W = 1.
    for kk, tt in [(2, 4), (2, 8), (3, 6), (4, 8)]:
      self.assertEqual(_Step('zb_h1', kk, tt, 1).step_time,
                       4 * tt + (kk - 1) * 2)

  def testIssueIdealsAtKTwo(self):
    # Issue 22's ideals over 1F1B with recompute: T=4 0.900 / 0.900 / 0.850,
    # T=8 0.944 / 0.944 / 0.917 (interleaved v=2, ZB-H1, ZB-V).
    for tt, want in [(4, (0.900, 0.900, 0.850)), (8, (0.944, 0.944, 0.917))]:
      base = _Step('1f1b', 2, tt, 1).step_time
      got = tuple(round(_Step(n, 2, tt, v).step_time / base, 3)
                  for n, v in [('interleaved_1f1b', 2), ('zb_h1', 1),
                               ('zb_v', 2)])
      self.assertEqual(got, want)

  def testZeroBubbleVBubbleDoesNotGrowWithT(self):
    for kk in (2, 3):
      bubbles = {_Step('zb_v', kk, tt, 2).step_time - 4 * tt
                 for tt in range(2 * kk - 1, 2 * kk + 6)}
      self.assertEqual(len(bubbles), 1, bubbles)

  def testSplittingBackwardHelpsOnlyWithTheTable(self):
    # With the same work per cell, the lock-step loop (one tick in flight)
    # makes ZB-H1 slower than its dataflow, as the issue warns.
    lock = _Step('zb_h1', 2, 4, 1, synchronous_ticks=True).step_time
    flow = _Step('zb_h1', 2, 4, 1).step_time
    self.assertGreater(lock, flow)


class MemoryTest(unittest.TestCase):

  def testZeroBubbleH1KeepsOneFOneBsBoundaryInputs(self):
    for kk, tt in [(2, 4), (3, 3), (4, 8)]:
      zb, ofob = _Step('zb_h1', kk, tt, 1), _Step('1f1b', kk, tt, 1)
      self.assertEqual(zb.max_in_flight, ofob.max_in_flight)
      self.assertEqual(zb.max_in_flight,
                       [min(kk - k, tt) for k in range(kk)])
      # The stash: device k holds k + 1 I-to-W pairs (W delayed k steps).
      self.assertEqual(zb.max_stash, [min(k + 1, tt) for k in range(kk)])
      self.assertEqual(ofob.max_stash, [0] * kk)

  def testSimulatedHoldingsAreWithinTheTablesSlots(self):
    for name, kk, tt, v in [('zb_h1', 4, 8, 1), ('zb_v', 3, 6, 2),
                            ('interleaved_1f1b', 2, 4, 2), ('1f1b', 4, 8, 1)]:
      table = schedule_builders.Build(name, kk, tt, v)
      res = _Step(name, kk, tt, v)
      for held, slots in zip(res.max_in_flight, table.SlotsPerDevice()):
        self.assertLessEqual(held, slots, name)


class ConsistencyTest(unittest.TestCase):

  def testATorchFixtureSimulates(self):
    with open(os.path.join(_FIXTURES, 'ZBVZeroBubble_ranks2_stages4_mb4.csv'),
              newline='') as f:
      table = schedules.Schedule.FromCsv(f.read()).Validate()
    res = simulator.SimulateSchedule(table, [0.5] * 4, [1.0] * 4)
    self.assertEqual(res.step_time, _Step('zb_v', 2, 4, 2).step_time)
    self.assertEqual(len(res.cells), 3 * 4 * 4)

  def testRefusesRunSettingsNoLoopHas(self):
    table = schedule_builders.Build('1f1b', 2, 4)
    for kw, regex in [(dict(num_cores=0), r'num_cores=0 must be > 0'),
                      (dict(ticks_in_flight=0), r'ticks_in_flight=0 must be'),
                      (dict(tick_overhead=-1.0), r'tick_overhead=-1.0 must'),
                      (dict(fixed_overhead=-1.0), r'fixed_overhead=-1.0')]:
      with self.assertRaisesRegex(ValueError, regex):
        simulator.SimulateSchedule(table, [1.0] * 2, [2.0] * 2, **kw)

  def testRefusesCostsPerDeviceForAVirtualStageTable(self):
    with self.assertRaisesRegex(
        ValueError, r"forward_costs has 2 entries but schedule 'zb_v' has 4 "
        r'stages; give one per stage'):
      simulator.SimulateSchedule(schedule_builders.Build('zb_v', 2, 4, 2),
                                 [1.0, 1.0], [2.0] * 4)


if __name__ == '__main__':
  unittest.main()
