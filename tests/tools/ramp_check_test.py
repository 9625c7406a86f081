"""Tests for tools/benchmark_lib/ramp_check: which settings it takes, how
many ticks their ramps hold, and its rows and table from a result."""

import unittest

from tools.benchmark_lib import ramp_check
from tools.benchmark_lib import results as results_lib
from tools.benchmark_lib import settings


class RampCheckTest(unittest.TestCase):

  def testRampTicksOfKnownTables(self):
    # 1F1B, K=2, T=8: 2 (T + K - 1) = 18 ticks, steady from 2K - 1 = 3 to
    # 2T - 1 = 15 (pipeline_train_test: testLoopsCoverEveryTick...): 3 ramp
    # ticks before, 3 after.
    self.assertEqual(
        ramp_check.RampTicks(settings.ParseSetting('K2-T8-1f1b-rc')),
        [6, 18])
    # ZB-V, K=2, T=8: 19 of its 49 ticks are outside the steady loop.
    self.assertEqual(
        ramp_check.RampTicks(settings.ParseSetting('K2-T8-zbv-rc')),
        [19, 49])

  def testSettingsWithoutRampsToFixAreRefused(self):
    for name in ('K2-T8-rc', 'K2-T8-1f1b-norc', 'plain'):
      with self.assertRaisesRegex(ValueError, f"{name!r} is not one.*"
                                  'K2-T8-1f1b-rc'):
        ramp_check.CheckSetting(settings.ParseSetting(name))
    ramp_check.CheckSetting(settings.ParseSetting('K2-T8-i2-rc'))

  def testRowAndTableFromAResultThroughJson(self):
    twin = results_lib.StepTimes(4e-3, [4e-3, 4.2e-3])
    before = results_lib.StepTimes(3.2e-3, [3.2e-3, 3.3e-3])
    r = results_lib.Result(
        model='tiny', setting=settings.ParseSetting('K2-T8-zbv-rc'),
        batch=8, step_time_s=3e-3, memory=results_lib.Memory(0, 0, 0, True),
        trace_s=1.5, paired={ramp_check.SWITCHING_RAMPS: twin,
                             ramp_check.INLINE_CELLS: before},
        paired_trace_s={ramp_check.SWITCHING_RAMPS: 2.5,
                        ramp_check.INLINE_CELLS: 2.0})
    r = results_lib.Result.FromJson(r.ToJson())
    row = ramp_check.Row('tiny', r, [19, 49])
    self.assertAlmostEqual(row['ratio'], 0.75)
    self.assertAlmostEqual(row['isolation'], 1.25)
    self.assertAlmostEqual(row['over_before'], 0.9375)
    self.assertEqual(row['trace_switching_s'], 2.5)
    self.assertEqual(
        ramp_check.Table([row]).splitlines()[-1],
        '| tiny | K2-T8-zbv-rc | 19 / 49 | 3.00 | 4.00 | 3.20 | 0.750 | '
        '1.250 | 0.938 | 1.5 / 2.5 |')


if __name__ == '__main__':
  unittest.main()
