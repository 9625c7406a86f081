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


if __name__ == '__main__':
  tf.test.main()
