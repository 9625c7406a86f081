"""Tests for tools/benchmark_lib: settings, tables, targets, one smoke run."""

import json
import os
import tempfile
import unittest

from tools import benchmark_lib


def _Result(model, setting, step, peak=100 * 2**20, costs=None, paired=None,
            activations=None):
  s = benchmark_lib.ParseSetting(setting)
  r = {'model': model, 'setting': setting, 'kind': s.kind,
       'K': s.num_partitions, 'T': s.num_micro_batches,
       'recompute': s.recompute, 'recompute_impl': s.recompute_impl,
       'batch': 64, 'step_time_s': step, 'examples_per_s': 64 / step,
       'memory': {'peak_above_idle_bytes': peak,
                  'tf_allocator': {'activation_peak_bytes': activations}},
       'paired': {b: {'step_time_s': t} for b, t in (paired or {}).items()}}
  if costs:
    r['partition_costs_s'] = {'forward': costs[0], 'backward': costs[1]}
  return r


class SettingsTest(unittest.TestCase):

  def testParsesAllForms(self):
    self.assertEqual(benchmark_lib.ParseSetting('plain').kind, 'plain')
    naive = benchmark_lib.ParseSetting('naive-4')
    self.assertEqual((naive.num_partitions, naive.num_micro_batches,
                      naive.recompute), (4, 1, False))
    s = benchmark_lib.ParseSetting('K2-T8-rc')
    self.assertEqual((s.num_partitions, s.num_micro_batches, s.recompute,
                      s.recompute_impl), (2, 8, True, 'explicit'))
    self.assertFalse(benchmark_lib.ParseSetting('K2-T8-norc').recompute)
    self.assertEqual(benchmark_lib.ParseSetting('K1-T1-rcg').recompute_impl,
                     'tf_recompute_grad')
    self.assertEqual(s.threads, (1, 2))
    serial = benchmark_lib.ParseSetting('naive-4-serial')
    self.assertEqual((serial.num_partitions, serial.num_micro_batches,
                      serial.threads), (4, 1, (1, 1)))
    self.assertEqual(benchmark_lib.ParseSetting('naive-4').threads, (1, 4))
    mb = benchmark_lib.ParseSetting('plain-T8')
    self.assertEqual((mb.kind, mb.num_micro_batches, mb.threads),
                     ('plain', 8, (1, 1)))

  def testRejectsUnknownSetting(self):
    with self.assertRaisesRegex(ValueError, "'K2T8'.*K4-T8-rc"):
      benchmark_lib.ParseSetting('K2T8')
    with self.assertRaisesRegex(ValueError, 'naive-K'):
      benchmark_lib.ParseSetting('naive-0')

  def testGridHasBaselinesAndAllCombinations(self):
    grid = benchmark_lib.GridSettings((1, 2), (1, 4))
    self.assertEqual(grid, ['plain', 'plain-T4', 'naive-2', 'naive-2-serial',
                            'K1-T1-rc',
                            'K1-T1-norc',
                            'K1-T4-rc', 'K1-T4-norc', 'K2-T1-rc',
                            'K2-T1-norc', 'K2-T4-rc', 'K2-T4-norc'])

  def testUnknownModel(self):
    with self.assertRaisesRegex(ValueError, "'no_such_model_key'.*dense16"):
      benchmark_lib.ModelLayers('no_such_model_key')

  def testRegisteredExperimentLayers(self):
    layers, shape = benchmark_lib.ModelLayers('consistency.Consistency16')
    self.assertEqual(len(layers), 18)   # 16 convs, flatten, logits
    self.assertEqual(shape, [16, 8, 8, 1])


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
    benchmark_lib.AddSpeedups(rs, 'plain')
    self.assertAlmostEqual(rs[1]['speedup'], 0.75)
    table = benchmark_lib.MarkdownTable(rs).splitlines()
    self.assertEqual(len(table), 2 + len(rs))
    self.assertTrue(all(line.count('|') == 15 for line in table))
    self.assertIn('| dense16 | K1-T1-norc | 1 | 1 | no | 4000.0 | 16 | '
                  '0.75x | plain | 100 | - |', table[3])
    json.dumps(rs)

  def testPairedBaselineWinsOverSeparateRun(self):
    rs = [_Result('dense16', 'plain', 3.0),
          _Result('dense16', 'K1-T8-rc', 4.0,
                  paired={'plain': 2.0, 'K1-T8-norc': 3.2}),
          _Result('dense16', 'K1-T8-norc', 1.0)]
    benchmark_lib.AddSpeedups(rs, 'plain')
    self.assertAlmostEqual(rs[1]['speedup'], 0.5)     # 2.0 / 4.0, not 3 / 4
    self.assertTrue(rs[1]['speedup_paired'])
    self.assertFalse(rs[2]['speedup_paired'])
    table = benchmark_lib.MarkdownTable(rs)
    self.assertIn('| 0.50x* | plain |', table)
    self.assertIn('same process', table)
    by_name = {r['target']: r for r in benchmark_lib.EvaluateTargets(rs)}
    self.assertAlmostEqual(
        by_name['3. dense16: K1-T8-rc time / plain time']['measured'], 2.0)
    two_b = [v for k, v in by_name.items() if k.startswith('2b. dense16')][0]
    self.assertAlmostEqual(two_b['measured'], 0.8)    # 3.2 / 4.0, not 1 / 4

  def testReportText(self):
    rs = self._Results()
    benchmark_lib.AddSpeedups(rs, 'plain')
    benchmark_lib.AddPredictions(rs, num_cores=2)
    report = {'results': rs, 'targets': benchmark_lib.EvaluateTargets(rs),
              'timelines': [], 'cpu_count': 2, 'load_average_at_start': 0.5,
              'wall_time_s': 12.0}
    text = benchmark_lib.ReportText(report)
    self.assertIn(benchmark_lib.MarkdownTable(rs), text)
    self.assertIn('| 3. dense16: K1-T8-rc time / plain time |', text)
    self.assertIn('Machine: 2 cores; load average at start 0.50; wall time '
                  '12 s.', text)

  def testPairedBaselinesPerSetting(self):
    self.assertEqual(benchmark_lib.PairedBaselines('plain'), [])
    self.assertEqual(benchmark_lib.PairedBaselines('K1-T1-norc'), ['plain'])
    self.assertEqual(benchmark_lib.PairedBaselines('K1-T8-rc'),
                     ['plain', 'plain-T8', 'K1-T8-norc'])
    self.assertEqual(benchmark_lib.PairedBaselines('plain-T8'), ['plain'])
    self.assertEqual(benchmark_lib.PairedBaselines('naive-2'), ['plain'])
    self.assertEqual(benchmark_lib.PairedBaselines('naive-2-serial'),
                     ['plain'])
    self.assertEqual(benchmark_lib.PairedBaselines('K2-T1-rc'), ['plain'])
    self.assertEqual(benchmark_lib.PairedBaselines('K4-T8-rc'),
                     ['plain', 'naive-4'])

  def testPredictionsCalibratedOnK1(self):
    rs = self._Results()
    calib = benchmark_lib.AddPredictions(rs, num_cores=2)
    self.assertAlmostEqual(calib['dense16/rc/isolated']['tick_overhead'], 0.1)
    self.assertAlmostEqual(calib['dense16/rc/isolated']['fixed_overhead'],
                           1.0)
    k1t8 = [r for r in rs if r['setting'] == 'K1-T8-rc'][0]
    self.assertAlmostEqual(k1t8['prediction_error'], 0.0)
    self.assertTrue(k1t8['calibration_run'])
    k2 = [r for r in rs if r['setting'] == 'K2-T4-rc'][0]
    # (T + K - 1) ticks of 0.5 + 0.1 forward, of 1.5 + 0.1 backward, + 1.
    self.assertAlmostEqual(k2['predicted_step_s'], 5 * 0.6 + 5 * 1.6 + 1)
    # Tick overheads count as idle: busy 4 * 0.5 + 4 * 1.5 of a span of 11.
    self.assertAlmostEqual(k2['predicted_bubble_fraction'], 1 - 8 / 11)
    self.assertNotIn('predicted_step_s', rs[0])
    self.assertEqual(k2['prediction_source'], 'isolated')

  def testPipelineCostsPreferredAndFromEvents(self):
    from tensorpipe import timeline  # pylint: disable=g-import-not-at-top
    # Cells of a K=2 run: forward 0.5, recompute 0.6, backward 1.0 per cell
    # (four samples each: the median ignores the slow one; the lower
    # quartile, the cell's work when it had a core alone, is the fast one).
    ev = []
    for k in range(2):
      for i, scale in enumerate((1.0, 0.5, 1.0, 3.0)):
        for phase, d in (('forward', 0.5), ('recompute', 0.6),
                         ('backward', 1.0)):
          ev.append(timeline.Event(phase, k, i, 0.0, d * scale))
    costs = benchmark_lib.StageCostsFromEvents(ev, 2)
    alone = costs.pop('alone')
    self.assertEqual(costs, {'forward': [0.5, 0.5], 'recompute': [0.6, 0.6],
                             'backward': [1.0, 1.0]})
    self.assertEqual(alone, {'forward': [0.25, 0.25],
                             'recompute': [0.3, 0.3], 'backward': [0.5, 0.5]})
    rs = self._Results()
    # K=1 pipeline cells of the same model as the isolated ones (f=1, b=2).
    for r in rs:
      if r['setting'] in ('K1-T4-rc', 'K1-T8-rc'):
        r['stage_costs_s'] = {'forward': [1.0], 'recompute': [1.0],
                              'backward': [2.0]}
    k2 = [r for r in rs if r['setting'] == 'K2-T4-rc'][0]
    k2['stage_costs_s'] = costs
    calib = benchmark_lib.AddPredictions(rs, num_cores=2)
    self.assertAlmostEqual(calib['dense16/rc/pipeline']['tick_overhead'], 0.1)
    self.assertEqual(k2['prediction_source'], 'pipeline')
    # Backward cell = recompute 0.6 + backward 1.0; 5 ticks each way.
    self.assertAlmostEqual(k2['predicted_step_s'],
                           5 * (0.5 + 0.1) + 5 * (1.6 + 0.1) + 1)
    self.assertAlmostEqual(k2['predicted_isolated_step_s'],
                           5 * 0.6 + 5 * 1.6 + 1)
    # K2-T4-rc is off by (12.5 - 10) / 10.
    self.assertAlmostEqual(k2['prediction_error'], 0.25)
    # K1-T1-norc has no K=1 no-recompute loop run to fit overheads: it is
    # predicted without them (3 + 6 vs 4 measured) and says so.
    k1 = [r for r in rs if r['setting'] == 'K1-T1-norc'][0]
    self.assertTrue(k1['prediction_uncalibrated'])
    self.assertAlmostEqual(k1['prediction_error'], 9 / 4 - 1)
    self.assertIn('(no K=1 fit', benchmark_lib.MarkdownTable(rs))
    targets = {t['target'][:3]: t
               for t in benchmark_lib.EvaluateTargets(rs, num_cores=2)}
    # K=1 fit runs are left out of the simulator target.
    self.assertAlmostEqual(targets['6. ']['measured'], 1.25)
    # K=2: K2-T4-rc (0.25) and naive-2 (uncalibrated isolated costs: 6 vs
    # 12 measured).
    self.assertAlmostEqual(targets['6a.']['measured'], 0.5)
    self.assertAlmostEqual(targets['6c.']['measured'], 1.25)
    # No dense32mem or conv16 run: no rows about them.
    self.assertFalse([t for t in targets.values()
                      if 'conv16' in t['target'] or 'dense32mem' in
                      t['target']])

  def testTargets(self):
    rs = self._Results() + [
        _Result('dense32mem', 'plain', 1.0, peak=300, activations=200),
        _Result('dense32mem', 'K1-T8-rc', 1.0, peak=90, activations=50)]
    by_name = {r['target']: r for r in benchmark_lib.EvaluateTargets(rs)}
    one = by_name['1. dense16: K1-T1-norc time / plain time']
    self.assertAlmostEqual(one['measured'], 4 / 3)
    self.assertFalse(one['passed'])
    four = by_name['4. dense16: throughput K2-T8-rc / naive-2']
    self.assertIsNone(four['passed'])   # K2-T8-rc was not run
    mem = [v for k, v in by_name.items() if k.startswith('5. ')][0]
    self.assertAlmostEqual(mem['measured'], 0.25)     # allocator figures
    self.assertTrue(mem['passed'])
    rss = [v for k, v in by_name.items() if k.startswith('5b. ')][0]
    self.assertAlmostEqual(rss['measured'], 0.3)
    table = benchmark_lib.TargetsTable(list(by_name.values()))
    self.assertIn('| pass |', table)
    self.assertIn('| FAIL |', table)
    self.assertIn('| not run |', table)


class UnrolledMicroBatchesTest(unittest.TestCase):

  def testSameOutputsAndGradientsAsPlain(self):
    import numpy as np  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    layer_ps, shape = benchmark_lib.ModelLayers('tiny')
    x = tf.random.stateless_uniform(shape, seed=[3, 4])
    plain = benchmark_lib._BuildLayer(benchmark_lib.ParseSetting('plain'),
                                      layer_ps, shape)
    unrolled = benchmark_lib._BuildLayer(
        benchmark_lib.ParseSetting('plain-T4'), layer_ps, shape)
    for v, w in zip(unrolled.trainable_variables, plain.trainable_variables):
      v.assign(w)
    results = []
    for layer in (plain, unrolled):
      with tf.GradientTape() as tape:
        y = layer.FPropDefaultTheta(x)
        loss = tf.reduce_sum(y * y)
      results.append([y] + list(tape.gradient(loss,
                                              layer.trainable_variables)))
    for a, b in zip(*results):
      np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    with self.assertRaisesRegex(ValueError, 'not divisible by T=3'):
      benchmark_lib._BuildLayer(benchmark_lib.ParseSetting('plain-T3'),
                                layer_ps, shape).FPropDefaultTheta(x)


class SmokeTest(unittest.TestCase):

  def testOneSettingInASubprocess(self):
    r = benchmark_lib.RunSettingSubprocess('tiny', 'K1-T2-rc', steps=2,
                                           warmup=1, timeout_s=300,
                                           pair_with=['plain'])
    self.assertEqual((r['K'], r['T'], r['recompute']), (1, 2, True))
    self.assertEqual(len(r['step_times_s']), 2)
    self.assertGreater(r['examples_per_s'], 0)
    self.assertEqual(r['threads'], {'intra_op': 1, 'inter_op': 1})
    self.assertGreaterEqual(r['memory']['peak_above_idle_bytes'], 0)
    self.assertEqual(len(r['partition_costs_s']['forward']), 1)
    self.assertEqual(list(r['paired']), ['plain'])
    self.assertEqual(len(r['paired']['plain']['step_times_s']), 2)
    alloc = r['memory']['tf_allocator']
    self.assertEqual(alloc['activation_peak_bytes'],
                     alloc['peak'] - alloc['current_before_step'])
    # Cells recorded inside the pipeline: one partition, three phases.
    self.assertEqual(sorted(r['stage_costs_s']), ['alone', 'backward',
                                                  'forward', 'recompute'])
    self.assertGreater(r['stage_costs_s']['forward'][0], 0)
    self.assertGreater(r['recorded_step_time_s'], 0)

  def testGanttPlotWritesPng(self):
    from tensorpipe import timeline  # pylint: disable=g-import-not-at-top
    events = [timeline.Event('forward', 0, 0, 0.0, 1.0),
              timeline.Event('recompute', 0, 0, 2.0, 2.5),
              timeline.Event('backward', 0, 0, 2.5, 4.0)]
    with tempfile.TemporaryDirectory() as d:
      path = os.path.join(d, 'g.png')
      benchmark_lib.PlotGantt(events, 1, {'step_start': 0.0}, path)
      with open(path, 'rb') as f:
        self.assertEqual(f.read(8), b'\x89PNG\r\n\x1a\n')


if __name__ == '__main__':
  unittest.main()
