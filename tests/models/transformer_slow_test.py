"""Slow Transformer transparency tests: more partitions and micro-batches."""

import tensorflow as tf

from models import transformer
from tensorpipe import test_utils
from tests.models import transformer_testlib as tt

test_utils.ConfigureTestDevices()


class TransformerSlowTest(tt.TransparencyMixin, tf.test.TestCase):

  def testPreLnTranslationK4T4(self):
    layers = transformer.TransformerLayers(
        dropout=0.2, atten_dropout=0.1, relu_dropout=0.1, pre_layer_norm=True,
        shared_embeddings=True, **tt.TINY)
    self.AssertSameLossAndGrads(
        layers, tt.TranslationBatch(seed=3),
        transformer.TranslationInputShapes(tt.BATCH, tt.SRC_LEN, tt.TGT_LEN),
        k=4, t=4)

  def testLmK4T2(self):
    layers = transformer.TransformerLmLayers(
        dropout=0.2, relu_dropout=0.1, pre_layer_norm=False, **tt.TINY)
    self.AssertSameLossAndGrads(
        layers, tt.LmBatch(seed=4), transformer.LmInputShapes(tt.BATCH,
                                                              tt.TGT_LEN),
        k=4, t=2)

  def testTiedLmTwoStagesPerDeviceEqualTheOracle(self):
    # The tied table's owner (stage 0) and reader (stage 3) share device 0
    # under interleaved 1F1B (round robin) and zb_v (a V): still one
    # variable, the reader's gradient added once.
    layers = transformer.TransformerLmLayers(
        tied_embeddings=True, dropout=0.0,
        **dict(tt.TINY, hidden_dim=16, model_dim=8, num_heads=2))
    batch = tt.LmBatch(seed=4, vocab=tt.TINY['vocab_size'])
    tokens = float(tf.reduce_sum(1.0 - batch.paddings))
    for schedule in ('interleaved_1f1b', 'zb_v'):
      with self.subTest(schedule=schedule):
        test_utils.AssertOneFOneBMatchesOracle(
            self, layers, 2, 4, [batch], None,
            lambda out, _: tf.reduce_sum(out.per_example_loss), tokens,
            rtol=1e-12, schedule=schedule, num_stages_per_device=2)


if __name__ == '__main__':
  tf.test.main()
