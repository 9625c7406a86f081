"""Tests for tools/benchmark_lib: settings, tables, targets, one smoke run."""

import json
import os
import tempfile
import unittest

from tools import benchmark_lib


def _Result(model, setting, step, peak=100 * 2**20, costs=None):
  s = benchmark_lib.ParseSetting(setting)
  r = {'model': model, 'setting': setting, 'kind': s.kind,
       'K': s.num_partitions, 'T': s.num_micro_batches,
       'recompute': s.recompute, 'recompute_impl': s.recompute_impl,
       'batch': 64, 'step_time_s': step, 'examples_per_s': 64 / step,
       'memory': {'peak_above_idle_bytes': peak}}
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

  def testRejectsUnknownSetting(self):
    with self.assertRaisesRegex(ValueError, "'K2T8'.*K4-T8-rc"):
      benchmark_lib.ParseSetting('K2T8')
    with self.assertRaisesRegex(ValueError, 'naive-K'):
      benchmark_lib.ParseSetting('naive-0')

  def testGridHasBaselinesAndAllCombinations(self):
    grid = benchmark_lib.GridSettings((1, 2), (1, 4))
    self.assertEqual(grid, ['plain', 'naive-2', 'K1-T1-rc', 'K1-T1-norc',
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
    self.assertTrue(all(line.count('|') == 13 for line in table))
    self.assertIn('| dense16 | K1-T1-norc | 1 | 1 | no | 4000.0 | 16 | '
                  '0.75x | plain | 100 |', table[3])
    json.dumps(rs)

  def testPredictionsCalibratedOnK1(self):
    rs = self._Results()
    calib = benchmark_lib.AddPredictions(rs, num_cores=2)
    self.assertAlmostEqual(calib['dense16/rc']['tick_overhead'], 0.1)
    self.assertAlmostEqual(calib['dense16/rc']['fixed_overhead'], 1.0)
    k1t8 = [r for r in rs if r['setting'] == 'K1-T8-rc'][0]
    self.assertAlmostEqual(k1t8['prediction_error'], 0.0)
    self.assertTrue(k1t8['calibration_run'])
    k2 = [r for r in rs if r['setting'] == 'K2-T4-rc'][0]
    # (T + K - 1) ticks of 0.5 + 0.1 forward, of 1.5 + 0.1 backward, + 1.
    self.assertAlmostEqual(k2['predicted_step_s'], 5 * 0.6 + 5 * 1.6 + 1)
    # Tick overheads count as idle: busy 4 * 0.5 + 4 * 1.5 of a span of 11.
    self.assertAlmostEqual(k2['predicted_bubble_fraction'], 1 - 8 / 11)
    self.assertNotIn('predicted_step_s', rs[0])

  def testTargets(self):
    rs = self._Results() + [
        _Result('dense32mem', 'plain', 1.0, peak=300),
        _Result('dense32mem', 'K1-T8-rc', 1.0, peak=90)]
    by_name = {r['target']: r for r in benchmark_lib.EvaluateTargets(rs)}
    one = by_name['1. dense16: K1-T1-norc time / plain time']
    self.assertAlmostEqual(one['measured'], 4 / 3)
    self.assertFalse(one['passed'])
    four = by_name['4. dense16: throughput K2-T8-rc / naive-2']
    self.assertIsNone(four['passed'])   # K2-T8-rc was not run
    mem = by_name['5. dense32mem: peak memory K1-T8-rc / plain']
    self.assertAlmostEqual(mem['measured'], 0.3)
    self.assertTrue(mem['passed'])
    table = benchmark_lib.TargetsTable(list(by_name.values()))
    self.assertIn('| pass |', table)
    self.assertIn('| FAIL |', table)
    self.assertIn('| not run |', table)


class SmokeTest(unittest.TestCase):

  def testOneSettingInASubprocess(self):
    r = benchmark_lib.RunSettingSubprocess('tiny', 'K1-T2-rc', steps=2,
                                           warmup=1, timeout_s=300)
    self.assertEqual((r['K'], r['T'], r['recompute']), (1, 2, True))
    self.assertEqual(len(r['step_times_s']), 2)
    self.assertGreater(r['examples_per_s'], 0)
    self.assertEqual(r['threads'], {'intra_op': 1, 'inter_op': 1})
    self.assertGreaterEqual(r['memory']['peak_above_idle_bytes'], 0)
    self.assertEqual(len(r['partition_costs_s']['forward']), 1)

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
