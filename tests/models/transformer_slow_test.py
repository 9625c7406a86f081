"""Slow Transformer transparency tests: more partitions and micro-batches."""

import importlib.util
import os

import tensorflow as tf

from models import transformer
from tensorpipe import test_utils

test_utils.ConfigureTestDevices()

# The fast test module holds the tiny config, batches and the comparison.
_SPEC = importlib.util.spec_from_file_location(
    'transformer_test', os.path.join(os.path.dirname(__file__),
                                     'transformer_test.py'))
transformer_test = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(transformer_test)


class TransformerSlowTest(transformer_test.TransparencyMixin,
                          tf.test.TestCase):

  def testPreLnTranslationK4T4(self):
    tt = transformer_test
    layers = transformer.TransformerLayers(
        dropout=0.2, atten_dropout=0.1, relu_dropout=0.1, pre_layer_norm=True,
        shared_embeddings=True, **tt.TINY)
    self.AssertSameLossAndGrads(
        layers, tt.TranslationBatch(seed=3),
        transformer.TranslationInputShapes(tt.BATCH, tt.SRC_LEN, tt.TGT_LEN),
        k=4, t=4)

  def testLmK4T2(self):
    tt = transformer_test
    layers = transformer.TransformerLmLayers(
        dropout=0.2, relu_dropout=0.1, pre_layer_norm=False, **tt.TINY)
    self.AssertSameLossAndGrads(
        layers, tt.LmBatch(seed=4), transformer.LmInputShapes(tt.BATCH,
                                                              tt.TGT_LEN),
        k=4, t=2)


if __name__ == '__main__':
  tf.test.main()
