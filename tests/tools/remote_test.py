"""Tests for tools/benchmark_lib/remote: crossings, shapes and the table
(pure). Servers, the transfer floor and a remote step run in
remote_slow_test.py."""

import dataclasses
import subprocess
import sys
import unittest

from tools import paths
from tools.benchmark_lib import remote
from tools.benchmark_lib import settings


def _Setting(name):
  return settings.ParseSetting(name)


class CrossingsTest(unittest.TestCase):

  def testEachDeviceBoundaryCarriesAnActivationAndAGradientPerMicroBatch(
      self):
    # K=2, one stage per device: one boundary, 2 crossings per micro-batch.
    self.assertEqual(remote.Crossings(_Setting('K2-T8-1f1b-rc')), 16)
    self.assertEqual(remote.Crossings(_Setting('K2-T8-rc')), 16)
    self.assertEqual(remote.Crossings(_Setting('K4-T8-zbh1-rc')), 48)
    # Interleaved, v=2 on K=2: stages 0 1 2 3 on devices 0 1 0 1: every
    # one of the 3 boundaries crosses.
    self.assertEqual(remote.Crossings(_Setting('K2-T4-i2-rc')), 24)
    # ZB-V on K=2: stages 0 1 2 3 on devices 0 1 1 0: stages 1 and 2 share
    # a device, so 2 of the 3 boundaries cross.
    self.assertEqual(remote.Crossings(_Setting('K2-T4-zbv-rc')), 16)

  def testBoundaryShapeIsAMicroBatchOfTheInput(self):
    self.assertEqual(remote.BoundaryShape([64, 1024], 8), [8, 1024])
    self.assertEqual(remote.BoundaryShape([64, 32, 32, 16], 4),
                     [16, 32, 32, 16])
    with self.assertRaisesRegex(ValueError, 'batch 64 .* T=5'):
      remote.BoundaryShape([64, 1024], 5)


class TableTest(unittest.TestCase):

  def testRatioFloorAndExtra(self):
    row = dict(model='dense16', setting='K2-T8-1f1b-rc', shape=[8, 1024],
               local_step_s=0.100, remote_step_s=0.180, crossings=16,
               remote_s=250e-6, local_s=5e-6)
    zb = dict(row, setting='K2-T8-zbh1-rc', remote_step_s=0.171,
              predicted_separate_s=0.095, predicted_transfers_s=0.099)
    lines = remote.Table([dict(row, predicted_separate_s=0.100,
                               predicted_transfers_s=0.110,
                               local_cpu_s=0.190,
                               remote_cpu_s=[0.004, 0.150, 0.160]), zb,
                          dict(zb, model='conv16')]).splitlines()[2:]
    # 16 crossings x 250 us = 4 ms of floor; 80 ms more than in process.
    # CPU: 190 ms in 100 ms of one process (1.90 cores), 314 ms in 180 ms
    # of the client and two servers (1.74).
    self.assertEqual(
        lines[0], '| dense16 | K2-T8-1f1b-rc | 100.0 | 180.0 | 1.80 | '
        '100.0 / 110.0 | 1.000 / 1.000 / 1.000 | 8x1024 | 250 / 5 | 16 | '
        '4.0 | 80.0 | 190.0 / 4.0 + 150.0 + 160.0 | 1.90 / 1.74 |')
    self.assertTrue(lines[1].endswith('| 71.0 |  |  |'), lines[1])
    # ZB-H1 over the same model's 1F1B: 171 / 180, predicted 95 / 100
    # without transfers, 99 / 110 with.
    self.assertIn('| 95.0 / 99.0 | 0.950 / 0.950 / 0.900 | 8x1024 |',
                  lines[1])
    # No 1F1B row of conv16: nothing to compare with.
    self.assertIn('| 95.0 / 99.0 |  | 8x1024 |', lines[2])

  def testMeasuredTransferIsTheProfilesCostPerByte(self):
    # One crossing of a 4-byte boundary in 1 s: the profile's transfer
    # cost becomes 0.25 s per byte, added to each cell that sends or
    # receives one (cost_model.StageCosts); none given: the profile's own.
    from tensorpipe import cost_model  # pylint: disable=g-import-not-at-top
    layer = cost_model.LayerCost(forward=1.0, backward=2.0, input_grad=1.0,
                                 weight_grad=1.0, out_bytes=4.0)
    profile = cost_model.Profile(layers=(layer, layer), micro_batch_rows=4,
                                 input_bytes=4.0)
    setting = _Setting('K2-T2-1f1b-norc')
    cut = [[0, 1], [1, 2]]
    base = remote.SeparatePrediction(setting, profile.ToJson(), cut)
    far = remote.SeparatePrediction(setting, profile.ToJson(), cut,
                                    transfer_s=1.0, boundary_bytes=4.0)
    table = settings.ScheduleTable(setting)
    want = lambda rate: cost_model.Predict(
        table, dataclasses.replace(profile, transfer_s_per_byte=rate),
        [(0, 1), (1, 2)], False, 'separate').step_s
    self.assertEqual(base, want(0.0))
    self.assertEqual(far, want(0.25))
    self.assertGreater(far, base + 1.0)
    with self.assertRaisesRegex(ValueError,
                                'boundary_bytes=0.0 must be > 0'):
      remote.SeparatePrediction(setting, profile.ToJson(), cut,
                                transfer_s=1.0)


class ProcessCpuTest(unittest.TestCase):

  def testAProcessCpuTimeGrowsWithItsWorkAndAMissingOneIsNamed(self):
    from tools.benchmark_lib import runner  # pylint: disable=g-import-not-at-top
    proc = subprocess.Popen(
        [sys.executable, '-c',
         'import sys, time\nt = time.process_time()\n'
         'while time.process_time() - t < 0.3: pass\n'
         'print("done", flush=True)\nsys.stdin.read()'],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
      self.assertEqual(proc.stdout.readline().strip(), 'done')
      self.assertGreaterEqual(runner.ProcessCpuS(proc.pid), 0.29)
    finally:
      proc.kill()
      proc.wait(timeout=30)
    with self.assertRaisesRegex(ValueError,
                                f'process {proc.pid} .*running processes'):
      runner.ProcessCpuS(proc.pid)


class FlagsTest(unittest.TestCase):

  def _Run(self, *flags):
    return subprocess.run(
        [sys.executable, '-m', 'tools.benchmark', '--remote_check', *flags],
        capture_output=True, text=True, timeout=120, cwd=paths.REPO_ROOT,
        check=False)

  def testSettingsWithoutAPipelineAreRefusedBeforeAnythingStarts(self):
    for settings_flag, named in (('--settings=plain', "['plain']"),
                                 ('--settings=K1-T8-rc', "['K1-T8-rc']")):
      proc = self._Run('--models=tiny', settings_flag)
      self.assertEqual(proc.returncode, 1, proc.stderr)
      self.assertIn(f'K >= 2 in --settings (got {named})', proc.stderr)
      self.assertNotIn('Traceback', proc.stderr)

  def testRegistryModelsAreRefused(self):
    proc = self._Run('--models=image.fashion_mnist.ResNet4x8',
                     '--settings=K2-T8-rc')
    self.assertEqual(proc.returncode, 1, proc.stderr)
    self.assertIn("built-in models only, not ['image.fashion_mnist.ResNet4x8"
                  "']", proc.stderr)
    self.assertNotIn('Traceback', proc.stderr)

  def testATThatDoesNotSplitTheBatchIsRefused(self):
    proc = self._Run('--models=tiny', '--settings=K2-T3-1f1b-rc')
    self.assertEqual(proc.returncode, 1, proc.stderr)
    self.assertIn('tiny K2-T3-1f1b-rc: batch 8 is not divisible by T=3; '
                  'use a T that divides the batch', proc.stderr)
    self.assertNotIn('Traceback', proc.stderr)


if __name__ == '__main__':
  unittest.main()
