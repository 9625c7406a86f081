"""tensorpipe.schedule_plan and model_analysis --schedules: every schedule."""

from absl import app
from absl import flags
import tensorflow as tf

from tensorpipe import model_analysis
from tensorpipe import schedule_plan
from tensorpipe.layers import linear
from tools import model_analysis as model_analysis_tool


def _FcLayers(n=4, dim=8):
  return [linear.FCLayer.Params().Set(name=f'fc{i}', input_dim=dim,
                                      output_dim=dim) for i in range(n)]


def _Rows(num_layers=4, kk=2, tt=4, recompute=True):
  report = model_analysis.AnalyzeLayers(
      _FcLayers(num_layers), [[2 * tt, 8]], num_partitions=kk,
      num_micro_batches=tt)
  rows = schedule_plan.CompareSchedules(report, recompute=recompute)
  return report, {r.name: r for r in rows}


class CompareSchedulesTest(tf.test.TestCase):

  def testMemoryByHand(self):
    # 4 FC layers 8 -> 8, T=4 micro-batches of 2, float32: a layer's input
    # or output for one micro-batch is 2 x 8 x 4 = 64 B.
    report, rows = _Rows()
    # GPipe and 1F1B: model_analysis' own columns (stages of 2 layers).
    self.assertEqual(list(rows['gpipe'].activation_bytes),
                     [r.activation_bytes_recompute for r in report.partitions])
    self.assertEqual(list(rows['1f1b'].activation_bytes),
                     [r.activation_bytes_1f1b_recompute
                      for r in report.partitions])
    self.assertEqual(rows['1f1b'].activation_bytes, (2 * 64 + 128, 64 + 128))
    # ZB-H1: 1F1B's inputs plus a stash of k + 1 micro-batches' outputs.
    self.assertEqual(rows['zb_h1'].stash_bytes, (128, 2 * 128))
    self.assertEqual(rows['zb_h1'].activation_bytes,
                     (2 * 64 + 128 + 128, 64 + 128 + 256))
    # Interleaved v=2: one layer per stage, stages 0, 2 on device 0 keep
    # 4 and 2 inputs, stages 1, 3 on device 1 keep 3 and 1.
    self.assertEqual(rows['interleaved_1f1b'].activation_bytes,
                     ((4 + 2) * 64 + 64, (3 + 1) * 64 + 64))
    self.assertEqual(rows['gpipe'].stash_bytes, (0, 0))

  def testWithoutRecomputeEveryHeldInputKeepsItsOutputs(self):
    report, rows = _Rows(recompute=False)
    self.assertEqual(list(rows['1f1b'].activation_bytes),
                     [r.activation_bytes_1f1b_no_recompute
                      for r in report.partitions])

  def testStepRatiosAreTheSimulatorsIdeals(self):
    # Equal layers: t_F = t_I = t_W per device, as in the ideals.
    _, rows = _Rows()
    self.assertEqual({n: round(r.ratio_to_1f1b, 3) for n, r in rows.items()},
                     {'gpipe': 1.0, '1f1b': 1.0, 'interleaved_1f1b': 0.9,
                      'zb_h1': 0.9, 'zb_v': 0.85})
    self.assertAlmostEqual(rows['gpipe'].bubble, 1 / 5)

  def testRefusedSchedulesSayWhy(self):
    _, rows = _Rows(tt=3)
    self.assertIn('multiple of num_devices=2, got 3',
                  rows['interleaved_1f1b'].refused)
    self.assertFalse(rows['zb_v'].refused)
    _, rows = _Rows(num_layers=2, tt=4)
    self.assertEqual(rows['zb_v'].refused, 'K*v = 4 stages need at least 4 '
                     'layers, the model has 2')
    self.assertFalse(rows['zb_h1'].refused)


class ToolTest(tf.test.TestCase):

  def _Run(self, *argv):
    fv = flags.FlagValues()
    model_analysis_tool.DefineFlags(fv)
    fv(['model_analysis'] + list(argv))
    return model_analysis_tool.Run(fv)

  def testSchedulesAll(self):
    text = self._Run('--model=consistency', '--num_partitions=2',
                     '--num_micro_batches=4', '--batch_size=8',
                     '--schedules=all')
    self.assertIn('Schedules side by side (K=2, T=4, recompute', text)
    for name in ('gpipe', '1f1b', 'interleaved_1f1b', 'zb_h1', 'zb_v'):
      self.assertRegex(text, rf'\n{name} +[12] ')

  def testSaysEveryScheduleRunsInTheLayer(self):
    text = self._Run('--model=consistency', '--num_partitions=2',
                     '--num_micro_batches=4', '--batch_size=8',
                     '--schedules=gpipe,zb_v')
    self.assertNotIn('Only gpipe and 1f1b run', text)
    self.assertIn('Every schedule here trains in TensorPipeLayer '
                  "(schedule='<name>', num_stages_per_device=v)", text)

  def testUnknownScheduleIsRefused(self):
    fv = flags.FlagValues()
    model_analysis_tool.DefineFlags(fv)
    fv(['model_analysis', '--model=consistency', '--schedules=zb_h2'])
    with self.assertRaisesRegex(app.UsageError, r"'zb_h2' is not one of"):
      model_analysis_tool.main(['model_analysis'], flag_values=fv)


if __name__ == '__main__':
  tf.test.main()
