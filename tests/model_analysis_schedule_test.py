"""tensorpipe.model_analysis: 1F1B's activation memory next to GPipe's."""

from absl import flags
import tensorflow as tf

from tensorpipe import model_analysis
from tensorpipe.layers import linear
from tools import model_analysis as model_analysis_tool


def _FcLayers(n=4, dim=8):
  return [linear.FCLayer.Params().Set(name=f'fc{i}', input_dim=dim,
                                      output_dim=dim) for i in range(n)]


class ScheduleMemoryTest(tf.test.TestCase):

  def testTwoPartitionsEightMicroBatchesByHand(self):
    # 4 FC layers 8 -> 8, batch 16 in T=8 micro-batches of 2, float32: one
    # micro-batch's partition input is 2 x 8 x 4 = 64 B and each
    # partition's two layer outputs 2 x 64 = 128 B. GPipe holds T=8
    # micro-batches on both partitions, 1F1B min(K - k, T) = 2 and 1.
    report = model_analysis.AnalyzeLayers(_FcLayers(), [[16, 8]],
                                          num_partitions=2,
                                          num_micro_batches=8)
    rows = report.partitions
    self.assertEqual([r.max_in_flight_1f1b for r in rows], [2, 1])
    self.assertEqual([r.activation_bytes_recompute for r in rows],
                     [8 * 64 + 128] * 2)
    self.assertEqual([r.activation_bytes_1f1b_recompute for r in rows],
                     [2 * 64 + 128, 1 * 64 + 128])
    self.assertEqual([r.activation_bytes_no_recompute for r in rows],
                     [8 * (64 + 128)] * 2)
    self.assertEqual([r.activation_bytes_1f1b_no_recompute for r in rows],
                     [2 * (64 + 128), 1 * (64 + 128)])
    text = report.ToText()
    self.assertIn('Activation memory per partition, GPipe vs 1F1B (K=2, T=8',
                  text)
    # k=0: 8 vs 2 in flight; 640 B vs 256 B with recompute, 1.5 KiB vs 384 B
    # without.
    self.assertRegex(text, r'\n +0 +8 +2 +640 B +256 B +1\.5 KiB +384 B\n')
    self.assertRegex(text, r'\n +1 +8 +1 +640 B +192 B +1\.5 KiB +192 B\n')

  def testFewerMicroBatchesThanPartitions(self):
    report = model_analysis.AnalyzeLayers(_FcLayers(), [[4, 8]],
                                          num_partitions=4,
                                          num_micro_batches=2)
    self.assertEqual([r.max_in_flight_1f1b for r in report.partitions],
                     [2, 2, 2, 1])
    # Where 1F1B holds all T micro-batches it needs what GPipe needs.
    for r in report.partitions[:3]:
      self.assertEqual(r.activation_bytes_1f1b_recompute,
                       r.activation_bytes_recompute)
      self.assertEqual(r.activation_bytes_1f1b_no_recompute,
                       r.activation_bytes_no_recompute)
    last = report.partitions[3]
    self.assertLess(last.activation_bytes_1f1b_recompute,
                    last.activation_bytes_recompute)

  def testOneFOneBNeverHoldsMoreThanGPipe(self):
    for k, t in ((1, 1), (1, 4), (2, 2), (2, 16), (4, 4), (4, 16)):
      report = model_analysis.AnalyzeLayers(_FcLayers(), [[32, 8]],
                                            num_partitions=k,
                                            num_micro_batches=t)
      for r in report.partitions:
        self.assertLessEqual(r.activation_bytes_1f1b_recompute,
                             r.activation_bytes_recompute)
        self.assertLessEqual(r.activation_bytes_1f1b_no_recompute,
                             r.activation_bytes_no_recompute)
        self.assertEqual(r.max_in_flight_1f1b, min(k - r.index, t))

  def testToolPrintsTheScheduleTable(self):
    fv = flags.FlagValues()
    model_analysis_tool.DefineFlags(fv)
    fv(['model_analysis', '--model=consistency', '--num_partitions=4',
        '--num_micro_batches=8', '--batch_size=16'])
    text = model_analysis_tool.Run(fv)
    self.assertIn('GPipe vs 1F1B (K=4, T=8', text)
    self.assertRegex(text, r'\n +3 +8 +1 ')


if __name__ == '__main__':
  tf.test.main()
