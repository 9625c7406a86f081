"""tensorpipe.cost_model: step predictions of hand-made profiles."""

import dataclasses
import os
import tempfile
import unittest

from tensorpipe import cost_model
from tensorpipe import schedule_builders

LayerCost = cost_model.LayerCost


def _Profile(n=2, fwd=1.0, bwd=2.0, i=1.0, w=1.0, out_bytes=0.0, tick=0.0,
             rate=0.0, cores=2):
  return cost_model.Profile(
      layers=tuple(LayerCost(fwd, bwd, i, w, out_bytes) for _ in range(n)),
      micro_batch_rows=4, tick_s=tick, transfer_s_per_byte=rate,
      input_bytes=out_bytes, num_cores=cores)


class PredictTest(unittest.TestCase):

  def testSharedGPipeIsWorkOverCoresPlusTicks(self):
    # K=2, T=2, one layer per stage, f=1, b=2, recompute: 4 F cells of 1
    # and 4 B cells of 1 + 2: work 16; on 2 cores 8. The critical path
    # (cells at half cost: f 0.5, B 1.5) is 1.5 forward + 4.5 backward = 6
    # < 8. The table has 6 ticks of 0.1.
    table = schedule_builders.Build('gpipe', 2, 2)
    pred = cost_model.Predict(table, _Profile(tick=0.1), [(0, 1), (1, 2)],
                              recompute=True, regime='shared')
    self.assertEqual(pred.ticks, 6)
    self.assertAlmostEqual(pred.work_s, 16.0)
    self.assertAlmostEqual(pred.critical_s, 6.0)
    self.assertAlmostEqual(pred.step_s, 8.6)

  def testSeparateGPipeIsTheDataflowWithBubbles(self):
    # Forward: device 0 F0 [0, 1], F1 [1, 2]; device 1 [1, 2], [2, 3].
    # Backward (after the whole forward, from 3): B(1, stage 1) [3, 6],
    # then B(0, 1) and B(1, 0) [6, 9], B(0, 0) [9, 12].
    table = schedule_builders.Build('gpipe', 2, 2)
    pred = cost_model.Predict(table, _Profile(), [(0, 1), (1, 2)],
                              recompute=True, regime='separate')
    self.assertAlmostEqual(pred.step_s, 12.0)
    # A tick cost of 0.1 delays the start of every cell: 3 cells on the
    # longest chain of each pass (F00, F10, F11; B11, B10, B00).
    pred = cost_model.Predict(table, _Profile(tick=0.1), [(0, 1), (1, 2)],
                              recompute=True, regime='separate')
    self.assertAlmostEqual(pred.step_s, 12.6)

  def testTheUpdateIsWorkInASharedPoolAndEachDevicesOwnTimeApart(self):
    # testSharedGPipe... with updates of 1 (layer 0) and 3 (layer 1): work
    # 16 + 4 = 20, over 2 cores 10; the critical path 6 + 4 / 2 = 8.
    # Separate: the dataflow's 12 plus the slower device's update, 3.
    table = schedule_builders.Build('gpipe', 2, 2)
    prof = _Profile(tick=0.1)
    prof = dataclasses.replace(prof, layers=(
        dataclasses.replace(prof.layers[0], update=1.0),
        dataclasses.replace(prof.layers[1], update=3.0)))
    pred = cost_model.Predict(table, prof, [(0, 1), (1, 2)],
                              recompute=True, regime='shared')
    self.assertAlmostEqual(pred.update_s, 4.0)
    self.assertAlmostEqual(pred.work_s, 20.0)
    self.assertAlmostEqual(pred.critical_s, 8.0)
    self.assertAlmostEqual(pred.step_s, 10.6)
    pred = cost_model.Predict(table, dataclasses.replace(prof, tick_s=0.0),
                              [(0, 1), (1, 2)], recompute=True,
                              regime='separate')
    self.assertAlmostEqual(pred.step_s, 15.0)
    # Both layers on one device (K=1): one update of 4 after the cells.
    one = schedule_builders.Build('gpipe', 1, 2)
    pred = cost_model.Predict(one, dataclasses.replace(prof, tick_s=0.0),
                              [(0, 2)], recompute=False, regime='separate')
    self.assertAlmostEqual(pred.step_s, 2 * 2.0 + 2 * 4.0 + 4.0)

  def testWithoutRecomputeBackwardCellsDoNotRedoTheForward(self):
    table = schedule_builders.Build('gpipe', 2, 2)
    pred = cost_model.Predict(table, _Profile(), [(0, 1), (1, 2)],
                              recompute=False, regime='shared')
    self.assertAlmostEqual(pred.work_s, 4 * 1.0 + 4 * 2.0)
    self.assertAlmostEqual(pred.step_s, 6.0)

  def testSplitTablesCostTheMeasuredInputAndWeightGradients(self):
    # ZB-H1 with t_B = 2, t_I = 3, t_W = 1.5: b = I + W = 4.5, w = 1.5;
    # per (micro-batch, stage) F 1 + I (1 + 3) + W 1.5 = 6.5 against
    # 1F1B's F 1 + B (1 + 2) = 4: the split costs what it measured.
    table = schedule_builders.Build('zb_h1', 2, 2)
    prof = _Profile(i=3.0, w=1.5)
    f, b, w = cost_model.StageCosts(table, prof, [(0, 1), (1, 2)])
    self.assertEqual((f, b, w), ([1.0, 1.0], [4.5, 4.5], [1.5, 1.5]))
    pred = cost_model.Predict(table, prof, [(0, 1), (1, 2)],
                              recompute=True, regime='shared')
    self.assertAlmostEqual(pred.work_s, 26.0)
    # Without the split W is 0 and B the measured 2.
    table = schedule_builders.Build('1f1b', 2, 2)
    self.assertEqual(cost_model.StageCosts(table, _Profile(i=3.0),
                                           [(0, 1), (1, 2)])[1:],
                     ([2.0, 2.0], [0.0, 0.0]))

  def testCriticalPathBoundsASharedStepOnManyCores(self):
    # 1 layer per stage on 64 cores: work 16 / 64 = 0.25, but the chain of
    # the table at 1/64 of the costs is 12 / 64 = 0.1875 (the separate
    # dataflow scaled): the larger, 0.25, is the step.
    table = schedule_builders.Build('gpipe', 2, 2)
    pred = cost_model.Predict(table, _Profile(cores=64), [(0, 1), (1, 2)],
                              recompute=True, regime='shared')
    self.assertAlmostEqual(pred.critical_s, 0.1875)
    self.assertAlmostEqual(pred.step_s, 0.25)
    # On one core the work is all: 16.
    pred = cost_model.Predict(table, _Profile(cores=1), [(0, 1), (1, 2)],
                              recompute=True, regime='shared')
    self.assertAlmostEqual(pred.step_s, 16.0)

  def testTransfersCostOnlyBetweenDevices(self):
    # zb_v places stages 0, 1, 2, 3 on devices 0, 1, 1, 0: F of stages 0
    # and 2 send 100 B at 0.01 s/B (+1); stages 1 and 3 receive theirs in
    # B (+1); stage 2's input comes from its own device.
    table = schedule_builders.Build('zb_v', 2, 3, 2)
    f, b, w = cost_model.StageCosts(
        table, _Profile(n=4, out_bytes=100, rate=0.01),
        [(0, 1), (1, 2), (2, 3), (3, 4)])
    self.assertEqual(f, [2.0, 1.0, 2.0, 1.0])
    self.assertEqual(b, [2.0, 3.0, 2.0, 3.0])
    self.assertEqual(w, [1.0, 1.0, 1.0, 1.0])   # 2 x 1 / (1 + 1)

  def testStagesSumTheirLayers(self):
    table = schedule_builders.Build('1f1b', 2, 2)
    prof = cost_model.Profile(
        tuple(LayerCost(x, 2 * x, x, x) for x in (1.0, 2.0, 3.0)), 4)
    f, b, w = cost_model.StageCosts(table, prof, [(0, 2), (2, 3)])
    self.assertEqual((f, b, w), ([3.0, 3.0], [6.0, 6.0], [0.0, 0.0]))

  def testBadInputsNameTheValue(self):
    table = schedule_builders.Build('1f1b', 2, 2)
    with self.assertRaisesRegex(ValueError, "regime='both'"):
      cost_model.Predict(table, _Profile(), [(0, 1), (1, 2)], True, 'both')
    with self.assertRaisesRegex(ValueError, r'boundaries=\[\(0, 2\)\]'):
      cost_model.Predict(table, _Profile(), [(0, 2)], True, 'shared')


class ProfileTest(unittest.TestCase):

  def testScaledIsLinearInRows(self):
    prof = _Profile(out_bytes=8.0).Scaled(8)
    self.assertEqual(prof.micro_batch_rows, 8)
    self.assertEqual(prof.layers[0], LayerCost(2.0, 4.0, 2.0, 2.0, 16.0))
    self.assertEqual(prof.input_bytes, 16.0)

  def testScaledFollowsTheMeasuredCurve(self):
    # Measured at 4 rows (f=1, b=2, i=1, w=1, 8 bytes) and at 16 rows
    # (f=2, b=4, i=2, w=2, 32 bytes): a 4x bigger micro-batch only twice
    # the time (weight-bound). 10 rows lie halfway: every field halfway.
    at16 = cost_model.Profile((LayerCost(2.0, 4.0, 2.0, 2.0, 32.0),) * 2,
                              16, input_bytes=32.0)
    prof = dataclasses.replace(_Profile(out_bytes=8.0), points=(at16,))
    self.assertEqual(prof.measured_rows, (4, 16))
    mid = prof.Scaled(10)
    self.assertEqual(mid.layers[0], LayerCost(1.5, 3.0, 1.5, 1.5, 20.0))
    self.assertEqual((mid.micro_batch_rows, mid.input_bytes, mid.points),
                     (10, 20.0, ()))
    # A measured size is taken as measured; the tick and cores stay.
    self.assertEqual(prof.Scaled(16).layers, at16.layers)
    self.assertEqual(prof.Scaled(16).num_cores, prof.num_cores)
    # Outside, the nearest measured size scales with the rows.
    self.assertEqual(prof.Scaled(32).layers[0],
                     LayerCost(4.0, 8.0, 4.0, 4.0, 64.0))
    self.assertEqual(prof.Scaled(2).layers[0],
                     LayerCost(0.5, 1.0, 0.5, 0.5, 4.0))
    bad = dataclasses.replace(prof, points=(_Profile(n=3),))
    with self.assertRaisesRegex(ValueError, 'same 2 layers'):
      bad.Scaled(8)

  def testCalibratedFitsTheMeasuredStepAndKeepsTheShape(self):
    # testSharedGPipe...'s profile (cells 16, 6 ticks of 0.1) with an
    # update of 2 per layer (work 20), measured at 10.6 s of CPU and 6.6 s
    # of wall: the work is 10.6 - 0.6 = 10 of CPU, half the predicted 20
    # (k = 0.5), and 10 over 6.6 - 0.6 = 6 s is 5/3 cores.
    table = schedule_builders.Build('gpipe', 2, 2)
    cut = [(0, 1), (1, 2)]
    prof = _Profile(tick=0.1)
    prof = dataclasses.replace(
        prof, layers=tuple(dataclasses.replace(c, update=2.0)
                           for c in prof.layers),
        points=(_Profile(fwd=3.0),))
    got = prof.Calibrated(table, cut, True, wall_s=6.6, cpu_s=10.6,
                          max_cores=2)
    self.assertAlmostEqual(got.cell_scale, 0.5)
    self.assertAlmostEqual(got.num_cores, 10.0 / 6.0)
    self.assertEqual(got.layers[0], LayerCost(0.5, 1.0, 0.5, 0.5, 0.0, 1.0))
    self.assertEqual(got.points[0].layers[0].forward, 1.5)
    self.assertEqual((got.tick_s, got.micro_batch_rows), (0.1, 4))
    # Predicted again, the measured table is the measured step.
    pred = cost_model.Predict(table, got, cut, True, 'shared')
    self.assertAlmostEqual(pred.work_s + 0.6, 10.6)
    self.assertAlmostEqual(pred.step_s, 6.6)
    # The cores stay within [0.05, max_cores]; a step the ticks alone
    # exceed leaves the profile as it was.
    self.assertEqual(
        prof.Calibrated(table, cut, True, 1.0, 10.6, 2).num_cores, 2.0)
    self.assertIs(prof.Calibrated(table, cut, True, 0.5, 0.5, 2), prof)
    # A profile that holds mode factors is fitted as if it held none, and
    # loses them (they were relative to its old cells).
    moded = dataclasses.replace(prof, mode_scales=(('gpipe_rc', 3.0),))
    refit = moded.Calibrated(table, cut, True, wall_s=6.6, cpu_s=10.6,
                             max_cores=2)
    self.assertEqual(refit.mode_scales, ())
    self.assertAlmostEqual(refit.cell_scale, 0.5)
    # The factor survives Scaled and the JSON round trip.
    self.assertEqual(got.Scaled(8).cell_scale, 0.5)
    self.assertEqual(cost_model.Profile.FromJson(got.ToJson()), got)

  def testModeFactorsFitEachModesStepAndTravelToOtherSizes(self):
    table = schedule_builders.Build('gpipe', 2, 2)
    cut = [(0, 1), (1, 2)]
    self.assertEqual(cost_model.Mode(table, True), 'gpipe_rc')
    self.assertEqual(cost_model.Mode(schedule_builders.Build('zb_h1', 2, 2),
                                     False), 'split_norc')
    self.assertEqual(cost_model.Mode(schedule_builders.Build('1f1b', 2, 2),
                                     True), 'inside_rc')
    # GPipe without recompute: cells 2 x (F 1 + B 2) x 2 = 12 of work, 6
    # ticks of 0.1 and updates of 0.5 per layer; measured at 19.6 s of CPU:
    # the cells took 19.6 - 0.6 - 1 = 18, 1.5x the prediction.
    prof = _Profile(tick=0.1)
    prof = dataclasses.replace(prof, layers=tuple(
        dataclasses.replace(c, update=0.5) for c in prof.layers))
    self.assertAlmostEqual(
        cost_model.Predict(table, prof, cut, False, 'shared').work_s, 13.0)
    got = prof.WithMode(table, cut, False, cpu_s=19.6)
    self.assertEqual(got.mode_scales[0][0], 'gpipe_norc')
    self.assertAlmostEqual(got.mode_scales[0][1], 1.5)
    pred = cost_model.Predict(table, got, cut, False, 'shared')
    self.assertAlmostEqual(pred.work_s + 0.6, 19.6)
    # Other modes are not touched; measuring the mode again replaces it.
    self.assertAlmostEqual(
        cost_model.Predict(table, got, cut, True, 'shared').work_s, 17.0)
    again = got.WithMode(table, cut, False, cpu_s=13.6)
    self.assertEqual(len(again.mode_scales), 1)
    self.assertAlmostEqual(again.mode_scales[0][1], 1.0)
    # Applied: another size's raw profile takes the factor, cores and modes.
    raw = _Profile(fwd=3.0)
    moved = raw.Applied(0.5, 1.25, got.mode_scales)
    self.assertEqual(moved.layers[0].forward, 1.5)
    self.assertEqual((moved.num_cores, moved.cell_scale), (1.25, 0.5))
    self.assertEqual(moved.mode_scales, got.mode_scales)
    self.assertEqual(cost_model.Profile.FromJson(got.ToJson()), got)

  def testFlopProfile(self):
    prof = cost_model.FlopProfile([2e12, 4e12], [10, 20], 4)
    self.assertEqual(prof.source, 'flops')
    self.assertEqual(prof.layers[1], LayerCost(4.0, 8.0, 4.0, 4.0, 20))

  def testSaveLoadRoundTrip(self):
    prof = dataclasses.replace(_Profile(tick=0.25, rate=1e-9),
                               points=(_Profile(n=2, fwd=3.0),))
    with tempfile.TemporaryDirectory() as d:
      path = os.path.join(d, 'profile.json')
      prof.Save(path)
      self.assertEqual(cost_model.Profile.Load(path), prof)
      with open(path, 'w') as f:
        f.write('{"layers": 3}')
      with self.assertRaisesRegex(ValueError, 'tools/benchmark --profile'):
        cost_model.Profile.Load(path)


class InterpolatedCalibrationTest(unittest.TestCase):

  def testLinearInLogRowsBetweenAndNearestOutside(self):
    at4 = dict(cell_scale=0.8, num_cores=1.6,
               mode_scales=[['inside_norc', 1.0], ['gpipe_rc', 1.2]])
    at16 = dict(cell_scale=1.0, num_cores=2.0,
                mode_scales=[['inside_norc', 0.8]])
    pts = [(16, at16), (4, at4)]
    mid = cost_model.InterpolatedCalibration(pts, 8)   # halfway in log
    self.assertAlmostEqual(mid['cell_scale'], 0.9)
    self.assertAlmostEqual(mid['num_cores'], 1.8)
    self.assertEqual([m for m, _ in mid['mode_scales']],
                     ['gpipe_rc', 'inside_norc'])
    self.assertAlmostEqual(dict(mid['mode_scales'])['inside_norc'], 0.9)
    # A mode one point lacks takes the other's factor.
    self.assertAlmostEqual(dict(mid['mode_scales'])['gpipe_rc'], 1.2)
    self.assertAlmostEqual(
        cost_model.InterpolatedCalibration(pts, 2)['cell_scale'], 0.8)
    self.assertAlmostEqual(
        cost_model.InterpolatedCalibration(pts, 64)['cell_scale'], 1.0)
    self.assertEqual(cost_model.InterpolatedCalibration([(8, at4)], 2),
                     dict(at4, mode_scales=[['gpipe_rc', 1.2],
                                            ['inside_norc', 1.0]]))
    # What Applied takes.
    prof = cost_model.Profile((cost_model.LayerCost(1.0, 2.0, 1.0, 1.0),),
                              8).Applied(**mid)
    self.assertAlmostEqual(prof.layers[0].forward, 0.9)

  def testNoPointsIsRefused(self):
    with self.assertRaisesRegex(ValueError, r'points=\[\] must be one or '
                                'more'):
      cost_model.InterpolatedCalibration([], 8)
    with self.assertRaisesRegex(ValueError, r'points=\[0\]'):
      cost_model.InterpolatedCalibration([(0, {})], 8)


if __name__ == '__main__':
  unittest.main()
