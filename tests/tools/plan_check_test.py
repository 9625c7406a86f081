"""tools/benchmark_lib/plan_check: the accuracy summary (pure Python)."""

import unittest

from tools.benchmark_lib import plan_check


def _Row(schedule, v, measured, predicted, cpu, predicted_cpu, tt=4):
  return dict(setting='x', schedule=schedule, v=v, T=tt, measured_s=measured,
              predicted_s=predicted, measured_cpu_s=cpu,
              predicted_cpu_s=predicted_cpu, separate_s=predicted)


_RESULTS = [dict(model='dense16', T=4, pick=['1f1b', 1, 4], load_average=1.0,
                 rows=[_Row('gpipe', 1, 0.100, 0.110, 0.2, 0.2),
                       _Row('1f1b', 1, 0.102, 0.100, 0.2, 0.18),
                       _Row('zb_v', 2, 0.125, 0.100, 0.25, 0.2)])]


class SummaryTest(unittest.TestCase):

  def testErrorsAndPick(self):
    s = plan_check.Summary(_RESULTS)
    # Wall errors +10%, -1.96%, -20%; CPU 0%, -10%, -20%.
    self.assertAlmostEqual(s['wall']['median_abs_error'], 0.1)
    self.assertAlmostEqual(s['wall']['worst_abs_error'], 0.2)
    self.assertAlmostEqual(s['cpu']['median_abs_error'], 0.1)
    # The pick, 1F1B, measured 102 ms against GPipe's 100: +2%.
    self.assertAlmostEqual(s['picks'][0]['over_best']['wall'], 0.02)
    self.assertAlmostEqual(s['picks'][0]['over_best']['cpu'], 0.0)

  def testTable(self):
    text = plan_check.Table(_RESULTS)
    self.assertIn('| dense16 | 4 | zb_v v=2 | 125.0 / 100.0 | -20.0% | '
                  '250.0 / 200.0 | -20.0% | 1.225 | 1.000 | 100.0 |', text)
    self.assertIn('wall: median |error| 10.0%, worst 20.0% over 3 '
                  'predicted rows', text)
    # K other than 2 is named.
    self.assertIn('| dense16 K=4 | 4 | zb_v v=2 | 125.0 / 100.0 |',
                  plan_check.Table([dict(_RESULTS[0], K=4)]))
    self.assertIn('- dense16 T=4 (load 1.0): pick 1f1b v=1 T=4, +2.0% (wall) / '
                  '+0.0% (CPU) over the fastest measured', text)


class CalibrationRowTest(unittest.TestCase):

  def testTheRowTheProfileWasFittedToIsMarkedAndNotCounted(self):
    # 1F1B's row is the calibration step: errors of GPipe (+10%) and ZB-V
    # (-20%) only.
    rows = list(_RESULTS[0]['rows'])
    rows[1] = dict(rows[1], calibration=True)
    res = [dict(_RESULTS[0], rows=rows)]
    s = plan_check.Summary(res)
    self.assertEqual(s['wall']['rows'], 2)
    self.assertAlmostEqual(s['wall']['median_abs_error'], 0.15)
    self.assertIn('| dense16 | 4 | 1f1b v=1 * | 102.0 / 100.0 |',
                  plan_check.Table(res))
    # Nothing predicted (a sweep of one T): no error, no crash.
    only = [dict(_RESULTS[0], rows=[rows[1]])]
    s = plan_check.Summary(only)
    self.assertEqual(s['wall']['rows'], 0)
    self.assertIn('over 0 predicted rows', plan_check.Table(only))


class FitToRoundsTest(unittest.TestCase):

  def testTheCalibrationRowsArePredictedBackExactly(self):
    from tensorpipe import cost_model  # pylint: disable=g-import-not-at-top
    from tensorpipe import schedule_builders  # pylint: disable=g-import-not-at-top
    prof = cost_model.Profile((cost_model.LayerCost(1.0, 2.0, 1.2, 1.0),) * 4,
                              2, tick_s=0.01, num_cores=1)
    cut2, cut4 = [(0, 2), (2, 4)], [(0, 1), (1, 2), (2, 3), (3, 4)]
    measured = {}
    for name, sched, v, rc, cpu in (('a', '1f1b', 1, True, 60.0),
                                    ('b', 'gpipe', 1, True, 80.0),
                                    ('c', 'zb_h1', 1, False, 30.0),
                                    ('d', 'zb_v', 2, False, 99.0)):
      measured[name] = (schedule_builders.Build(sched, 2, 4, v),
                        cut4 if v == 2 else cut2, rc, cpu / 1.5, cpu)
    fitted, pairs = plan_check._FitToRounds(prof, measured, 'a',
                                            max_cores=2)
    # 1F1B fits the cells and the cores; GPipe and ZB-H1 without recompute
    # their modes; ZB-V (v=2) fits nothing: it stays a prediction.
    self.assertEqual(pairs, {('1f1b', True), ('gpipe', True),
                             ('zb_h1', False)})
    self.assertEqual(sorted(dict(fitted.mode_scales)),
                     ['gpipe_rc', 'split_norc'])
    self.assertAlmostEqual(fitted.num_cores, 1.5, delta=0.01)
    for name in 'abc':
      table, cut, rc, _, cpu = measured[name]
      pred = cost_model.Predict(table, fitted, cut, rc, 'shared')
      self.assertAlmostEqual(pred.work_s + pred.ticks * 0.01, cpu)
    # Without modes only the base fit.
    fitted, pairs = plan_check._FitToRounds(prof, measured, 'a', modes=False,
                                            max_cores=2)
    self.assertEqual((pairs, fitted.mode_scales), ({('1f1b', True)}, ()))


class CarriedCalibrationTest(unittest.TestCase):

  def _Run(self, *args, **kw):
    calls = []

    def Child(model, tt, steps, reps, sweep=(), recompute=(True,),
              calibrate=True, calibration=None, num_partitions=2):
      self.assertEqual(num_partitions, 2)
      # What the child passes to the interpolation: [rows, calibration].
      calls.append((model, tt, calibration and [
          (r, c['cell_scale']) for r, c in calibration]))
      return dict(_RESULTS[0], T=tt, profile=dict(micro_batch_rows=64 // tt),
                  calibration=dict(cell_scale=float(tt), num_cores=1.5,
                                   mode_scales=[]))
    real = plan_check.RunChild
    plan_check.RunChild = Child
    try:
      plan_check.Run(*args, log=lambda _: None, **kw)
    finally:
      plan_check.RunChild = real
    return calls

  def testTheFirstTCalibratesAndTheOthersGetItsCalibration(self):
    self.assertEqual(self._Run(['dense16', 'conv16'], [8, 4, 16], 1, 1),
                     [('dense16', 8, None), ('dense16', 4, [(8, 8.0)]),
                      ('dense16', 16, [(8, 8.0)]), ('conv16', 8, None),
                      ('conv16', 4, [(8, 8.0)]), ('conv16', 16, [(8, 8.0)])])
    self.assertEqual([c for _, _, c in self._Run(['dense16'], [8, 4], 1, 1,
                                                  calibrate=False)],
                     [None, None])

  def testTwoCalibratedTPassBothPointsOn(self):
    # T=4 (16 rows) and 16 (4 rows) calibrated; T=8 and 2 get both.
    self.assertEqual(self._Run(['dense16'], [4, 16, 8, 2], 1, 1,
                               calibrate_ts=2),
                     [('dense16', 4, None), ('dense16', 16, None),
                      ('dense16', 8, [(16, 4.0), (4, 16.0)]),
                      ('dense16', 2, [(16, 4.0), (4, 16.0)])])


class RecomputeOffTest(unittest.TestCase):

  def testRowsWithoutRecomputeAreMarkedAndNotPicked(self):
    # The planner plans with recompute: the faster norc GPipe row is not
    # the best the pick is measured against, and norc rows compare with
    # norc 1F1B.
    rows = [_Row('gpipe', 1, 0.100, 0.110, 0.2, 0.2),
            _Row('1f1b', 1, 0.102, 0.100, 0.2, 0.18),
            dict(_Row('gpipe', 1, 0.050, 0.050, 0.1, 0.1), recompute=False),
            dict(_Row('1f1b', 1, 0.040, 0.050, 0.1, 0.1), recompute=False)]
    res = [dict(_RESULTS[0], rows=rows)]
    self.assertAlmostEqual(
        plan_check.Summary(res)['picks'][0]['over_best']['wall'], 0.02)
    text = plan_check.Table(res)
    self.assertIn('| dense16 | 4 | gpipe v=1 norc | 50.0 / 50.0 | +0.0% | '
                  '100.0 / 100.0 | +0.0% | 1.250 | 1.000 |', text)
    self.assertIn('| dense16 | 4 | gpipe v=1 | 100.0 / 110.0 |', text)


class SweepTest(unittest.TestCase):

  def testThePickedTIsComparedWithTheFastestT(self):
    sweep = [dict(model='dense16', T='auto', pick=['1f1b', 1, 2],
                  load_average=1.0,
                  rows=[_Row('1f1b', 1, 0.120, 0.110, 0.2, 0.2, tt=1),
                        _Row('1f1b', 1, 0.100, 0.100, 0.2, 0.2, tt=2),
                        _Row('1f1b', 1, 0.105, 0.120, 0.2, 0.2, tt=4)])]
    s = plan_check.Summary(sweep)
    self.assertAlmostEqual(s['picks'][0]['over_best']['wall'], 0.0)
    sweep[0]['pick'] = ['1f1b', 1, 4]
    self.assertAlmostEqual(plan_check.Summary(sweep)['picks'][0][
        'over_best']['wall'], 0.05)
    self.assertIn('| dense16 | 4 | 1f1b v=1 | 105.0 / 120.0 |',
                  plan_check.Table(sweep))


if __name__ == '__main__':
  unittest.main()
