"""Tests for tools/benchmark_lib: settings, tables, targets, one smoke run."""

import json
import os
import tempfile
import unittest

import numpy as np
import tensorflow as tf

from tensorpipe import test_utils
from tensorpipe import timeline
from tensorpipe.layers import transformer
from tools.benchmark_lib import analysis
from tools.benchmark_lib import plots
from tools.benchmark_lib import report
from tools.benchmark_lib import results
from tools.benchmark_lib import runner
from tools.benchmark_lib import settings
from tools.benchmark_lib import spawn
from tools.benchmark_lib import targets

test_utils.ConfigureTestDevices()


def _Result(model, setting, step, peak=100 * 2**20, costs=None, paired=None,
            activations=None):
  return results.Result(
      model=model, setting=settings.ParseSetting(setting), batch=64,
      step_time_s=step,
      memory=results.Memory(
          idle_rss_bytes=0, peak_rss_bytes=peak, peak_above_idle_bytes=peak,
          peak_reset=True,
          tf_allocator={'activation_peak_bytes': activations}),
      paired={b: results.StepTimes(t) for b, t in (paired or {}).items()},
      partition_costs_s=results.PhaseCosts(*costs) if costs else None)


def _Find(rs, setting):
  return [r for r in rs if r.setting.name == setting][0]


class SettingsTest(unittest.TestCase):

  def testParsesAllForms(self):
    self.assertEqual(settings.ParseSetting('plain').kind, 'plain')
    naive = settings.ParseSetting('naive-4')
    self.assertEqual((naive.num_partitions, naive.num_micro_batches,
                      naive.recompute), (4, 1, False))
    s = settings.ParseSetting('K2-T8-rc')
    self.assertEqual((s.num_partitions, s.num_micro_batches, s.recompute,
                      s.recompute_impl), (2, 8, True, 'explicit'))
    self.assertFalse(settings.ParseSetting('K2-T8-norc').recompute)
    self.assertEqual(settings.ParseSetting('K1-T1-rcg').recompute_impl,
                     'tf_recompute_grad')
    self.assertEqual(s.threads, (1, 2))
    serial = settings.ParseSetting('naive-4-serial')
    self.assertEqual((serial.num_partitions, serial.num_micro_batches,
                      serial.threads), (4, 1, (1, 1)))
    self.assertEqual(settings.ParseSetting('naive-4').threads, (1, 4))
    mb = settings.ParseSetting('plain-T8')
    self.assertEqual((mb.kind, mb.num_micro_batches, mb.threads),
                     ('plain', 8, (1, 1)))

  def testRejectsUnknownSetting(self):
    with self.assertRaisesRegex(ValueError, "'K2T8'.*K4-T8-rc"):
      settings.ParseSetting('K2T8')
    with self.assertRaisesRegex(ValueError, 'naive-K'):
      settings.ParseSetting('naive-0')

  def testGridHasBaselinesAndAllCombinations(self):
    grid = settings.GridSettings((1, 2), (1, 4))
    self.assertEqual(grid, ['plain', 'plain-T4', 'naive-2', 'naive-2-serial',
                            'K1-T1-rc',
                            'K1-T1-norc',
                            'K1-T4-rc', 'K1-T4-norc', 'K2-T1-rc',
                            'K2-T1-norc', 'K2-T4-rc', 'K2-T4-norc'])

  def testUnknownModel(self):
    with self.assertRaisesRegex(ValueError, "'no_such_model_key'.*dense16"):
      runner.ModelLayers('no_such_model_key')

  def testTaperedModelsChainTheirWidths(self):
    layers, shape = runner.ModelLayers('taper16')
    self.assertEqual(shape, [64, 256])
    self.assertEqual([(lp.input_dim, lp.output_dim) for lp in layers[:2]],
                     [(256, 304), (304, 352)])
    self.assertEqual(layers[-1].output_dim, 1024)
    self.assertTrue(all(a.output_dim == b.input_dim
                        for a, b in zip(layers, layers[1:])))
    layers, shape = runner.ModelLayers('taperconv16')
    self.assertEqual(shape, [64, 32, 32, 8])
    self.assertEqual([lp.filter_shape for lp in (layers[0], layers[-1])],
                     [(3, 3, 8, 10), (3, 3, 30, 32)])
    # The untapered models keep one width.
    layers, _ = runner.ModelLayers('dense16')
    self.assertEqual({(lp.input_dim, lp.output_dim) for lp in layers},
                     {(1024, 1024)})

  def testRegisteredExperimentLayers(self):
    layers, shape = runner.ModelLayers('consistency.Consistency4x8')
    self.assertEqual(len(layers), 18)   # 16 convs, flatten, logits
    self.assertEqual(shape, [16, 8, 8, 1])


class BuiltinTransformerTest(tf.test.TestCase):

  def testPipelineEqualsTheOracle(self):
    layer_ps, shape = runner.ModelLayers('xfmr8')
    self.assertEqual(shape, [32, 32, 128])
    self.assertEqual([p.cls for p in layer_ps],
                     [runner.SequenceIn] +
                     [transformer.TransformerEncoderLayer] * 8 +
                     [runner.SequenceOut])
    # Two of its encoder layers, cut between them (a NestedMap crosses the
    # cut), on a smaller batch and sequence than the benchmark's.
    x = tf.random.stateless_normal([4, 6, 128], seed=[5, 6])
    test_utils.AssertPipelineMatchesOracle(
        self, layer_ps[:3] + layer_ps[-1:], 2, 2, [x],
        lambda y: tf.reduce_sum(y * y))


class ReportTest(unittest.TestCase):

  def _Results(self):
    # K=1 runs built from the simulator's own model (f=1, b=2, o=0.1, F=1), so
    # the calibration recovers it and K=2 predictions are exact.
    rs = [_Result('dense16', 'plain', 3.0),
          _Result('dense16', 'K1-T1-norc', 4.0, costs=([3.0], [6.0])),
          _Result('dense16', 'K1-T4-rc', 4 * 4 + 8 * 0.1 + 1,
                  costs=([1.0], [2.0])),
          _Result('dense16', 'K1-T8-rc', 8 * 4 + 16 * 0.1 + 1,
                  costs=([1.0], [2.0])),
          _Result('dense16', 'K2-T4-rc', 10.0, costs=([0.5, 0.5], [1, 1])),
          _Result('dense16', 'naive-2', 12.0, costs=([1, 1], [2, 2]))]
    return rs

  def testSpeedupsAndTable(self):
    rs = self._Results()
    analysis.AddSpeedups(rs, 'plain')
    self.assertAlmostEqual(rs[1].speedup.value, 0.75)
    table = report.MarkdownTable(rs).splitlines()
    self.assertEqual(len(table), 2 + len(rs))
    self.assertTrue(all(line.count('|') == 15 for line in table))
    self.assertIn('| dense16 | K1-T1-norc | 1 | 1 | no | 4000.0 | 16 | '
                  '0.75x | plain | 100 | - |', table[3])
    json.dumps([r.ToJson() for r in rs])

  def testPairedBaselineWinsOverSeparateRun(self):
    rs = [_Result('dense16', 'plain', 3.0),
          _Result('dense16', 'K1-T8-rc', 4.0,
                  paired={'plain': 2.0, 'K1-T8-norc': 3.2}),
          _Result('dense16', 'K1-T8-norc', 1.0)]
    analysis.AddSpeedups(rs, 'plain')
    self.assertAlmostEqual(rs[1].speedup.value, 0.5)  # 2.0 / 4.0, not 3 / 4
    self.assertTrue(rs[1].speedup.paired)
    self.assertFalse(rs[2].speedup.paired)
    table = report.MarkdownTable(rs)
    self.assertIn('| 0.50x* | plain |', table)
    self.assertIn('same process', table)
    by_name = {r.target: r for r in targets.EvaluateTargets(rs)}
    self.assertAlmostEqual(
        by_name['3. dense16: K1-T8-rc time / plain time'].measured, 2.0)
    two_b = [v for k, v in by_name.items() if k.startswith('2b. dense16')][0]
    self.assertAlmostEqual(two_b.measured, 0.8)    # 3.2 / 4.0, not 1 / 4

  def testReportText(self):
    rs = self._Results()
    analysis.AddSpeedups(rs, 'plain')
    analysis.AddPredictions(rs, num_cores=2)
    rep = results.Report(load_average_at_start=0.5, cpu_count=2,
                         wall_time_s=12.0, results=rs,
                         targets=targets.EvaluateTargets(rs))
    text = report.ReportText(rep)
    self.assertIn(report.MarkdownTable(rs), text)
    self.assertIn('| 3. dense16: K1-T8-rc time / plain time |', text)
    self.assertIn('Machine: 2 cores; load average at start 0.50; wall time '
                  '12 s.', text)

  def testPairedBaselinesPerSetting(self):
    self.assertEqual(settings.PairedBaselines('plain'), [])
    self.assertEqual(settings.PairedBaselines('K1-T1-norc'), ['plain'])
    self.assertEqual(settings.PairedBaselines('K1-T8-rc'),
                     ['plain', 'plain-T8', 'K1-T8-norc'])
    self.assertEqual(settings.PairedBaselines('plain-T8'), ['plain'])
    self.assertEqual(settings.PairedBaselines('naive-2'), ['plain'])
    self.assertEqual(settings.PairedBaselines('naive-2-serial'),
                     ['plain'])
    self.assertEqual(settings.PairedBaselines('K2-T1-rc'), ['plain'])
    self.assertEqual(settings.PairedBaselines('K4-T8-rc'),
                     ['plain', 'naive-4'])

  def testPredictionsCalibratedOnK1(self):
    rs = self._Results()
    calib = analysis.AddPredictions(rs, num_cores=2)
    self.assertAlmostEqual(calib['dense16/rc/isolated'].tick_overhead, 0.1)
    self.assertAlmostEqual(calib['dense16/rc/isolated'].fixed_overhead, 1.0)
    k1t8 = _Find(rs, 'K1-T8-rc').prediction
    self.assertAlmostEqual(k1t8.error, 0.0)
    self.assertTrue(k1t8.calibration_run)
    k2 = _Find(rs, 'K2-T4-rc').prediction
    # (T + K - 1) ticks of 0.5 + 0.1 forward, of 1.5 + 0.1 backward, + 1.
    self.assertAlmostEqual(k2.step_s, 5 * 0.6 + 5 * 1.6 + 1)
    # Tick overheads count as idle: busy 4 * 0.5 + 4 * 1.5 of a span of 11.
    self.assertAlmostEqual(k2.bubble_fraction, 1 - 8 / 11)
    self.assertIsNone(rs[0].prediction)       # plain: nothing to predict
    self.assertNotIn('predicted_step_s', rs[0].ToJson())
    self.assertEqual(k2.source, 'isolated')

  def testPipelineCostsPreferredAndFromEvents(self):
    # Cells of a K=2 run: forward 0.5, recompute 0.6, backward 1.0 per cell
    # (four samples each: the median ignores the slow one; the lower
    # quartile, the cell's work when it had a core alone, is the fast one).
    ev = []
    for k in range(2):
      for i, scale in enumerate((1.0, 0.5, 1.0, 3.0)):
        for phase, d in (('forward', 0.5), ('recompute', 0.6),
                         ('backward', 1.0)):
          ev.append(timeline.Event(phase, k, i, 0.0, d * scale))
    costs = results.StageCosts.FromEvents(ev, 2)
    self.assertEqual(costs.median, results.PhaseCosts(
        forward=[0.5, 0.5], recompute=[0.6, 0.6], backward=[1.0, 1.0]))
    self.assertEqual(costs.alone, results.PhaseCosts(
        forward=[0.25, 0.25], recompute=[0.3, 0.3], backward=[0.5, 0.5]))
    rs = self._Results()
    # K=1 pipeline cells of the same model as the isolated ones (f=1, b=2).
    k1_cells = results.PhaseCosts(forward=[1.0], recompute=[1.0],
                                  backward=[2.0])
    for r in rs:
      if r.setting.name in ('K1-T4-rc', 'K1-T8-rc'):
        r.stage_costs_s = results.StageCosts(k1_cells, k1_cells)
    k2 = _Find(rs, 'K2-T4-rc')
    k2.stage_costs_s = costs
    calib = analysis.AddPredictions(rs, num_cores=2)
    self.assertAlmostEqual(calib['dense16/rc/pipeline'].tick_overhead, 0.1)
    self.assertEqual(k2.prediction.source, 'pipeline')
    # Backward cell = recompute 0.6 + backward 1.0; 5 ticks each way.
    self.assertAlmostEqual(k2.prediction.step_s,
                           5 * (0.5 + 0.1) + 5 * (1.6 + 0.1) + 1)
    self.assertAlmostEqual(k2.prediction.isolated_step_s,
                           5 * 0.6 + 5 * 1.6 + 1)
    # K2-T4-rc is off by (12.5 - 10) / 10.
    self.assertAlmostEqual(k2.prediction.error, 0.25)
    # K1-T1-norc has no K=1 no-recompute loop run to fit overheads: it is
    # predicted without them (3 + 6 vs 4 measured) and says so.
    k1 = _Find(rs, 'K1-T1-norc').prediction
    self.assertTrue(k1.uncalibrated)
    self.assertAlmostEqual(k1.error, 9 / 4 - 1)
    self.assertIn('(no K=1 fit', report.MarkdownTable(rs))
    rows = {t.target[:3]: t
            for t in targets.EvaluateTargets(rs, num_cores=2)}
    # K=1 fit runs are left out of the simulator target.
    self.assertAlmostEqual(rows['6. '].measured, 1.25)
    # K=2: K2-T4-rc (0.25) and naive-2 (uncalibrated isolated costs: 6 vs
    # 12 measured).
    self.assertAlmostEqual(rows['6a.'].measured, 0.5)
    self.assertAlmostEqual(rows['6c.'].measured, 1.25)
    # No dense32mem or conv16 run: no rows about them.
    self.assertFalse([t for t in rows.values()
                      if 'conv16' in t.target or 'dense32mem' in t.target])

  def testTargets(self):
    rs = self._Results() + [
        _Result('dense32mem', 'plain', 1.0, peak=300, activations=200),
        _Result('dense32mem', 'K1-T8-rc', 1.0, peak=90, activations=50)]
    by_name = {r.target: r for r in targets.EvaluateTargets(rs)}
    one = by_name['1. dense16: K1-T1-norc time / plain time']
    self.assertAlmostEqual(one.measured, 4 / 3)
    self.assertFalse(one.passed)
    four = by_name['4. dense16: throughput K2-T8-rc / naive-2']
    self.assertIsNone(four.passed)   # K2-T8-rc was not run
    mem = [v for k, v in by_name.items() if k.startswith('5. ')][0]
    self.assertAlmostEqual(mem.measured, 0.25)     # allocator figures
    self.assertTrue(mem.passed)
    rss = [v for k, v in by_name.items() if k.startswith('5b. ')][0]
    self.assertAlmostEqual(rss.measured, 0.3)
    table = report.TargetsTable(list(by_name.values()))
    self.assertIn('| pass |', table)
    self.assertIn('| FAIL |', table)
    self.assertIn('| not run |', table)

  def testTargetTablesNameValidSettings(self):
    for t in targets.SPEED_TARGETS:
      settings.ParseSetting(t.setting)
      settings.ParseSetting(t.baseline)
      self.assertIn('{model}', t.text)
    for t in targets.MEMORY_TARGETS:
      settings.ParseSetting(t.setting)
      settings.ParseSetting(t.baseline)
    # Targets have a comparison and a limit; explanatory ratios neither.
    for t in targets.SPEED_TARGETS:
      self.assertEqual(t.op is None, t.limit is None, t.text)


# Every key a result of results.json can have (a recompute setting with
# cells, paired baselines, a timeline, a speed-up and a prediction).
_FULL_RESULT_JSON = {
    'model': 'dense16', 'setting': 'K2-T4-rc', 'kind': 'pipe', 'K': 2,
    'T': 4, 'recompute': True, 'recompute_impl': 'explicit', 'batch': 64,
    'threads': {'intra_op': 1, 'inter_op': 2}, 'steps': 2, 'warmup': 1,
    'step_times_s': [0.5, 0.25], 'step_time_s': 0.375,
    'examples_per_s': 64 / 0.375, 'trace_s': 1.5, 'warmup_s': 0.75,
    'paired': {'plain': {'step_time_s': 0.5, 'step_times_s': [0.5, 0.5]}},
    'memory': {'idle_rss_bytes': 100, 'peak_rss_bytes': 300,
               'peak_above_idle_bytes': 200, 'peak_reset': True,
               'tf_allocator': {'current': 5, 'peak': 9,
                                'current_before_step': 4,
                                'activation_peak_bytes': 5}},
    'timeline': {'chrome_trace': '/t.json', 'png': '/t.png',
                 'breakdown_s': {'forward': 0.25, 'step': 0.5},
                 'num_events': 1,
                 'events': [{'phase': 'forward', 'k': 0, 't': 0,
                             'start': 0.0, 'end': 0.25}],
                 'marks': {'step_start': 0.0, 'step_end': 0.5}},
    'partition_costs_s': {'forward': [0.5, 0.5], 'backward': [1.0, 1.0]},
    'stage_costs_s': {'alone': {'forward': [0.25, 0.25],
                                'recompute': [0.25, 0.25],
                                'backward': [0.5, 0.5]},
                      'forward': [0.5, 0.5], 'recompute': [0.5, 0.5],
                      'backward': [1.0, 1.0]},
    'recorded_step_time_s': 0.5, 'cpu_s': 0.7, 'pid_cpu_s': [0.3, 0.4],
    'speedup_vs': 'plain', 'speedup': 4 / 3, 'speedup_paired': True,
    'predicted_step_s': 0.5, 'predicted_isolated_step_s': 0.625,
    'predicted_ideal_step_s': 0.5, 'predicted_bubble_fraction': 0.25,
    'predicted_busy_s': [0.25, 0.25], 'prediction_uncalibrated': True,
    'calibration_run': False, 'prediction_source': 'pipeline',
    'prediction_error': 0.0, 'prediction_error_isolated': 2 / 3,
}


class ResultsJsonTest(unittest.TestCase):

  def testEveryKeySurvivesTheRoundTrip(self):
    r = results.Result.FromJson(_FULL_RESULT_JSON)
    self.assertEqual(r.ToJson(), _FULL_RESULT_JSON)
    self.assertEqual(r.memory.activation_peak_bytes, 5)
    self.assertEqual(r.PairedTime('plain'), 0.5)
    self.assertEqual(r.prediction.source, 'pipeline')
    self.assertEqual((r.cpu_s, r.pid_cpu_s), (0.7, [0.3, 0.4]))

  def testUnpipelinedResultHasNoPredictionKeys(self):
    plain = {k: v for k, v in _FULL_RESULT_JSON.items()
             if not k.startswith(('predict', 'calibration', 'timeline',
                                  'partition', 'stage', 'recorded', 'cpu',
                                  'pid_cpu'))}
    plain.update(setting='plain', kind='plain', K=1, T=1, recompute=False,
                 threads={'intra_op': 1, 'inter_op': 1})
    r = results.Result.FromJson(plain)
    self.assertIsNone(r.prediction)
    self.assertEqual(r.ToJson(), plain)

  def testReportRoundTrip(self):
    d = {'load_average_at_start': 0.5, 'cpu_count': 2, 'wall_time_s': 3.0,
         'results': [_FULL_RESULT_JSON],
         'calibration': {'dense16/rc/pipeline': {
             'tick_overhead': 0.1, 'fixed_overhead': 1.0, 'residual': 0.0}},
         'targets': [{'target': '1. x', 'measured': 1.0, 'limit': '<= 2',
                      'passed': True},
                     {'target': '3a. y', 'measured': None, 'limit': '-',
                      'passed': None, 'info': True}],
         'plots': ['/a.png'], 'timelines': [_FULL_RESULT_JSON]}
    rep = results.Report.FromJson(d)
    self.assertEqual(rep.ToJson(), d)
    self.assertEqual(rep.calibration['dense16/rc/pipeline'].tick_overhead,
                     0.1)
    self.assertIn('Timeline dense16 K2-T4-rc (step 500.0 ms): /t.png, '
                  '/t.json', report.ReportText(rep))

  def testNotAReportRaises(self):
    with self.assertRaises(KeyError):
      results.Report.FromJson({'results': []})
    with self.assertRaisesRegex(ValueError, 'unknown benchmark setting'):
      results.Result.FromJson(dict(_FULL_RESULT_JSON, setting='K2'))


class UnrolledMicroBatchesTest(unittest.TestCase):

  def testSameOutputsAndGradientsAsPlain(self):
    layer_ps, shape = runner.ModelLayers('tiny')
    x = tf.random.stateless_uniform(shape, seed=[3, 4])
    plain = runner.BuildLayer(settings.ParseSetting('plain'), layer_ps,
                              shape)
    unrolled = runner.BuildLayer(
        settings.ParseSetting('plain-T4'), layer_ps, shape)
    for v, w in zip(unrolled.trainable_variables, plain.trainable_variables):
      v.assign(w)
    outs = []
    for layer in (plain, unrolled):
      with tf.GradientTape() as tape:
        y = layer.FPropDefaultTheta(x)
        loss = tf.reduce_sum(y * y)
      outs.append([y] + list(tape.gradient(loss, layer.trainable_variables)))
    for a, b in zip(*outs):
      np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    with self.assertRaisesRegex(ValueError, 'not divisible by T=3'):
      runner.BuildLayer(settings.ParseSetting('plain-T3'), layer_ps,
                        shape).FPropDefaultTheta(x)


class SmokeTest(unittest.TestCase):

  def testOneSettingInASubprocess(self):
    result = spawn.RunSettingSubprocess('tiny', 'K1-T2-rc', steps=2,
                                        warmup=1, timeout_s=300,
                                        pair_with=['plain'])
    r = result.ToJson()         # the results.json entry
    self.assertEqual((r['K'], r['T'], r['recompute']), (1, 2, True))
    self.assertEqual(len(r['step_times_s']), 2)
    self.assertGreater(r['examples_per_s'], 0)
    self.assertEqual(r['threads'], {'intra_op': 1, 'inter_op': 1})
    self.assertEqual(len(r['partition_costs_s']['forward']), 1)
    self.assertEqual(list(r['paired']), ['plain'])
    self.assertEqual(len(r['paired']['plain']['step_times_s']), 2)
    alloc = r['memory']['tf_allocator']
    self.assertEqual(alloc['activation_peak_bytes'],
                     alloc['peak'] - alloc['current_before_step'])
    # (The RSS above idle is clipped at 0, so >= 0 would test nothing.) A
    # step holds at least one set of weight gradients above what was
    # allocated before it: 4 layers of an 8x8 matrix and 8 biases, float32.
    self.assertGreaterEqual(alloc['activation_peak_bytes'], 4 * (64 + 8) * 4)
    # Cells recorded inside the pipeline: one partition, three phases.
    self.assertEqual(sorted(r['stage_costs_s']), ['alone', 'backward',
                                                  'forward', 'recompute'])
    self.assertGreater(r['stage_costs_s']['forward'][0], 0)
    self.assertGreater(r['recorded_step_time_s'], 0)

  def testGanttPlotWritesPng(self):
    events = [timeline.Event('forward', 0, 0, 0.0, 1.0),
              timeline.Event('recompute', 0, 0, 2.0, 2.5),
              timeline.Event('backward', 0, 0, 2.5, 4.0)]
    with tempfile.TemporaryDirectory() as d:
      path = os.path.join(d, 'g.png')
      plots.PlotGantt(events, 1, {'step_start': 0.0}, path)
      with open(path, 'rb') as f:
        self.assertEqual(f.read(8), b'\x89PNG\r\n\x1a\n')


if __name__ == '__main__':
  unittest.main()
