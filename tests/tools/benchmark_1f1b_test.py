"""tools/benchmark_lib with the 1F1B schedule: settings, step, targets."""

import unittest

import numpy as np
import tensorflow as tf

from tensorpipe import pipeline_train
from tensorpipe import schedule_builders
from tensorpipe import schedule_engine
from tensorpipe import simulator
from tensorpipe import test_utils
from tools.benchmark_lib import analysis
from tools.benchmark_lib import report
from tools.benchmark_lib import results
from tools.benchmark_lib import runner
from tools.benchmark_lib import settings
from tools.benchmark_lib import spawn
from tools.benchmark_lib import targets

test_utils.ConfigureTestDevices()


def _Result(model, setting, step, activations=None, paired=None,
            stage_costs=None):
  return results.Result(
      model=model, setting=settings.ParseSetting(setting), batch=64,
      step_time_s=step,
      memory=results.Memory(
          idle_rss_bytes=0, peak_rss_bytes=100, peak_above_idle_bytes=100,
          peak_reset=True,
          tf_allocator={'activation_peak_bytes': activations}),
      paired={b: results.StepTimes(t) for b, t in (paired or {}).items()},
      stage_costs_s=stage_costs)


class SettingsTest(unittest.TestCase):

  def testOneFOneBSettings(self):
    s = settings.ParseSetting('K2-T32-1f1b-rc')
    self.assertEqual((s.num_partitions, s.num_micro_batches, s.recompute,
                      s.schedule, s.threads), (2, 32, True, '1f1b', (1, 2)))
    norc = settings.ParseSetting('K4-T8-1f1b-norc')
    self.assertEqual((norc.recompute, norc.schedule), (False, '1f1b'))
    self.assertEqual(settings.ParseSetting('K2-T8-rc').schedule, 'gpipe')
    with self.assertRaisesRegex(ValueError, r"'K2-T8-1f1b-rcg'.*1f1b-<rc"):
      settings.ParseSetting('K2-T8-1f1b-rcg')
    # Paired with GPipe with recompute in the same process.
    self.assertEqual(settings.PairedBaselines('K2-T32-1f1b-rc'),
                     ['plain', 'naive-2', 'K2-T32-rc'])
    self.assertEqual(settings.PairedBaselines('K1-T8-1f1b-rc'),
                     ['plain', 'plain-T8', 'K1-T8-rc'])

  def testInterleavedSettings(self):
    s = settings.ParseSetting('K2-T8-i2-rc')
    self.assertEqual((s.num_partitions, s.num_micro_batches, s.recompute,
                      s.schedule, s.num_stages_per_device, s.threads),
                     (2, 8, True, 'interleaved_1f1b', 2, (1, 2)))
    self.assertFalse(settings.ParseSetting('K4-T8-i3-norc').recompute)
    self.assertEqual(settings.ParseSetting('K2-T8-rc').num_stages_per_device,
                     1)
    for bad in ('K2-T8-i1-rc', 'K2-T8-i2-rcg', 'K2-T8-i2'):
      with self.assertRaisesRegex(ValueError, f"'{bad}'.*i<v>"):
        settings.ParseSetting(bad)
    for name, schedule, v in (('K2-T8-zbh1-rc', 'zb_h1', 1),
                              ('K2-T8-zbv-norc', 'zb_v', 2)):
      z = settings.ParseSetting(name)
      self.assertEqual((z.schedule, z.num_stages_per_device), (schedule, v))
    # Paired with its GPipe and 1F1B twins in the same process.
    self.assertEqual(settings.PairedBaselines('K2-T8-i2-rc'),
                     ['plain', 'naive-2', 'K2-T8-rc', 'K2-T8-1f1b-rc'])
    self.assertEqual(settings.PairedBaselines('K2-T8-zbv-rc'),
                     ['plain', 'naive-2', 'K2-T8-rc', 'K2-T8-1f1b-rc'])
    # The layer the benchmark builds places v stages per device.
    layer_ps, input_shape = runner.BuiltinLayers('tiny')
    layer = runner.BuildLayer(s, layer_ps, input_shape)
    self.assertEqual((layer.num_partitions, layer.num_stages,
                      layer.params.schedule), (2, 4, 'interleaved_1f1b'))

  def testUnrollTicksSuffix(self):
    s = settings.ParseSetting('K8-T32-rc-u1')
    self.assertEqual((s.num_partitions, s.num_micro_batches, s.recompute,
                      s.schedule, s.unroll_ticks), (8, 32, True, 'gpipe', 1))
    self.assertIsNone(settings.ParseSetting('K8-T32-rc').unroll_ticks)
    for bad in ('K2-T8-1f1b-rc-u2', 'K2-T8-rc-u0', 'K2-T8-rc-u'):
      with self.assertRaisesRegex(ValueError, f"'{bad}'.*-u<n>"):
        settings.ParseSetting(bad)
    layer_ps, shape = runner.ModelLayers('tiny')
    for name, want in (('K2-T4-norc-u3', 3), ('K2-T4-norc', 2)):
      layer = runner.BuildLayer(settings.ParseSetting(name), layer_ps, shape)
      self.assertEqual(layer.params.unroll_ticks, want, name)

  def testTargetsNameValidSettings(self):
    for t in (targets.ONE_F_ONE_B_MEMORY_TARGETS +
              targets.ONE_F_ONE_B_SPEED_TARGETS):
      self.assertEqual(settings.ParseSetting(t.setting).schedule, '1f1b')
      self.assertEqual(settings.ParseSetting(t.baseline).schedule, 'gpipe')

  def testFailureReasonIsTheChildsLastErrorLine(self):
    err = RuntimeError(
        "benchmark setting 'K2-T4-1f1b-norc' of 'tiny' failed (exit 1):\n"
        'Traceback (most recent call last):\n  File "x.py", line 3\n'
        "ValueError: TensorPipeLayer 'TensorPipe': schedule='1f1b' needs "
        'recompute=True (...); set recompute=True\n')
    self.assertEqual(spawn.FailureReason(err),
                     "ValueError: TensorPipeLayer 'TensorPipe': "
                     "schedule='1f1b' needs recompute=True (...); set "
                     'recompute=True')
    self.assertEqual(spawn.FailureReason(RuntimeError('timed out\n')),
                     'timed out')


class StepTest(tf.test.TestCase):

  def testOneFOneBStepHasTheGPipeLossAndGradients(self):
    # The benchmark's 1F1B step computes the mean of the output inside the
    # pipeline (FPropLoss); it must train the same loss as GPipe's
    # reduce_mean under a tape.
    layer_ps, shape = runner.ModelLayers('tiny')
    x = tf.random.stateless_uniform(shape, seed=[5, 6])
    out = []
    for name in ('K2-T4-rc', 'K2-T4-1f1b-rc'):
      layer = runner.BuildLayer(settings.ParseSetting(name), layer_ps, shape)
      if out:
        for v, w in zip(layer.trainable_variables, first.trainable_variables):
          v.assign(w)
      else:
        first = layer
      with tf.GradientTape() as tape:
        loss = runner._MeanLoss(layer, x)  # pylint: disable=protected-access
      grads = tape.gradient(loss, layer.trainable_variables)
      out.append([loss] + list(grads))
    self.assertEqual(first.params.schedule, 'gpipe')
    self.assertEqual(layer.params.schedule, '1f1b')
    # float32 sums over micro-batches in another order.
    test_utils.AssertAllCloseScaled(
        self, out[1], out[0], test_utils.DEFAULT_RTOL[tf.float32],
        scale=test_utils.MaxAbs(out[0]))

  def testTicksInFlightAreTheLoops(self):
    self.assertEqual(analysis.TICKS_IN_FLIGHT, {
        'gpipe': pipeline_train.GPIPE_PARALLEL_ITERATIONS,
        '1f1b': schedule_engine.PARALLEL_ITERATIONS})


class AnalysisTest(unittest.TestCase):

  def testOneFOneBPredictedWithItsScheduleFromItsCells(self):
    # Unequal partitions, where 1F1B with two ticks in flight (26) and
    # GPipe (29) differ.
    cells = results.PhaseCosts(forward=[2.0, 1.0], recompute=[2.0, 1.0],
                               backward=[1.0, 3.0])
    k1 = results.PhaseCosts(forward=[1.0], recompute=[1.0], backward=[2.0])
    rs = [_Result('conv16', 'K1-T2-rc', 8.0 + 1.0,
                  stage_costs=results.StageCosts(k1, k1)),
          _Result('conv16', 'K2-T4-1f1b-rc', 20.0,
                  stage_costs=results.StageCosts(cells, cells))]
    rs[0].recorded_step_time_s = 9.0
    rs[1].recorded_step_time_s = 25.0
    analysis.AddPredictions(rs, num_cores=2)
    pred = rs[1].prediction
    # K=1 fit: T (f + r + b) = 8 and one K=1 run: no tick overhead, fixed 1.
    want = simulator.SimulateSchedule(
        schedule_builders.Build('1f1b', 2, 4), [2.0, 1.0], [1.0, 3.0],
        recompute=True, fixed_overhead=1.0, synchronous_ticks=True,
        ticks_in_flight=2).step_time
    self.assertEqual(want, 26.0)
    self.assertEqual(simulator.SimulateSchedule(
        schedule_builders.Build('gpipe', 2, 4), [2.0, 1.0], [1.0, 3.0],
        fixed_overhead=1.0, synchronous_ticks=True).step_time, 29.0)
    self.assertEqual(pred.source, 'pipeline')
    self.assertAlmostEqual(pred.step_s, want)
    # Compared with the wall time of the recorded steps its cells came from.
    self.assertAlmostEqual(pred.error, want / 25.0 - 1)
    self.assertFalse(pred.calibration_run)

  def testOneFOneBRunsOfOnePartitionCalibrateOneFOneB(self):
    # K=1 fits: GPipe's fixed overhead 1, 1F1B's 3 (T (f + r + b) = 8).
    k1 = results.PhaseCosts(forward=[1.0], recompute=[1.0], backward=[2.0])
    cells = results.PhaseCosts(forward=[2.0, 1.0], recompute=[2.0, 1.0],
                               backward=[1.0, 3.0])
    rs = [_Result('conv16', name, step, stage_costs=results.StageCosts(c, c))
          for name, step, c in (('K1-T2-rc', 9.0, k1),
                                ('K1-T2-1f1b-rc', 11.0, k1),
                                ('K2-T4-rc', 30.0, cells),
                                ('K2-T4-1f1b-rc', 30.0, cells))]
    for r in rs:
      r.recorded_step_time_s = r.step_time_s
    calib = analysis.AddPredictions(rs, num_cores=2)
    self.assertAlmostEqual(calib['conv16/rc/pipeline'].fixed_overhead, 1.0)
    self.assertAlmostEqual(calib['conv16/1f1b-rc/pipeline'].fixed_overhead,
                           3.0)
    self.assertTrue(rs[1].prediction.calibration_run)
    self.assertAlmostEqual(rs[2].prediction.step_s, 29.0)   # GPipe, + 1
    self.assertAlmostEqual(rs[3].prediction.step_s, 28.0)   # 1F1B 25, + 3

  def testOneFOneBWithoutRecomputeIsDataflow(self):
    # The unrolled no-recompute schedule has no loop and no tick barrier.
    cells = results.PhaseCosts(forward=[1.0, 1.0], recompute=[0.0, 0.0],
                               backward=[2.0, 2.0])
    r = _Result('conv16', 'K2-T2-1f1b-norc', 10.0,
                stage_costs=results.StageCosts(cells, cells))
    r.recorded_step_time_s = 10.0
    analysis.AddPredictions([r], num_cores=2)
    # By hand (simulator_test): 9 as dataflow, 10 in lock step; no K=1
    # no-recompute fit, so no overheads.
    self.assertAlmostEqual(r.prediction.step_s, 9.0)
    self.assertTrue(r.prediction.uncalibrated)
    self.assertAlmostEqual(r.prediction.error, -0.1)


class TargetsTest(unittest.TestCase):

  def testOneFOneBRowsOnlyWhenOneWasRun(self):
    gpipe_only = [_Result('dense32mem', 'K2-T32-rc', 1.0, activations=100)]
    self.assertFalse([r for r in targets.EvaluateTargets(gpipe_only)
                      if '1f1b' in r.target])
    rs = gpipe_only + [
        _Result('dense32mem', 'K2-T32-1f1b-rc', 1.0, activations=40),
        _Result('conv16', 'K2-T32-1f1b-rc', 0.5,
                paired={'K2-T32-rc': 0.6}),
    ]
    rows = {r.target.split(':')[0]: r for r in targets.EvaluateTargets(rs)}
    self.assertAlmostEqual(rows['7. dense32mem'].measured, 0.4)
    self.assertTrue(rows['7. dense32mem'].passed)
    self.assertEqual(rows['7. dense32mem'].limit, '< 1.0')
    self.assertAlmostEqual(rows['8. conv16'].measured, 1.2)   # throughput
    self.assertTrue(rows['8. conv16'].info)
    # The no-recompute rows: not run (the engine builds 1F1B with
    # recompute only).
    self.assertIsNone(rows['8a. conv16'].passed)
    self.assertIsNone(rows['8b. conv16'].passed)
    self.assertIn('| not run |', report.TargetsTable(list(rows.values())))

  def testReportListsSettingsNotRun(self):
    rep = results.Report(
        load_average_at_start=0.0, cpu_count=2, wall_time_s=1.0, results=[],
        not_run=[{'model': 'conv16', 'setting': 'K2-T32-1f1b-norc',
                  'reason': 'ValueError: needs recompute=True'}])
    text = report.ReportText(rep)
    self.assertIn('- conv16 K2-T32-1f1b-norc: ValueError: needs '
                  'recompute=True', text)
    self.assertEqual(results.Report.FromJson(rep.ToJson()).not_run,
                     rep.not_run)


if __name__ == '__main__':
  unittest.main()
