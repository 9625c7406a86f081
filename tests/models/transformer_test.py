"""Tests of the Transformer models: tiny T(2, 32, 4), pipelined = plain."""

import numpy as np
import tensorflow as tf

from models import transformer
from tensorpipe import test_utils
from tests.models import transformer_testlib as testlib

test_utils.ConfigureTestDevices()


class TransformerModelTest(testlib.TransparencyMixin, tf.test.TestCase):

  def testLayerListShape(self):
    layers = transformer.TransformerLayers(**testlib.TINY)
    self.assertLen(layers, 2 * 2 + 2)
    self.assertEqual([p.name for p in layers],
                     ['emb', 'enc0', 'enc1', 'dec0', 'dec1', 'softmax'])
    lm = transformer.TransformerLmLayers(**testlib.TINY)
    self.assertEqual([p.name for p in lm], ['emb', 'dec0', 'dec1', 'softmax'])

  def testForwardBackwardGivesFiniteLossAndGradients(self):
    layers = transformer.TransformerLayers(dropout=0.1, **testlib.TINY)
    loss, grads = testlib.LossAndGrads(testlib.Sequential(layers),
                                       testlib.TranslationBatch())
    # Untrained: the loss is near log(V) = 3.9.
    self.assertBetween(loss, 0.5 * np.log(50), 2.0 * np.log(50))
    self.assertLen(grads, 87)  # shared source / target table
    for name, g in grads.items():
      self.assertTrue(np.all(np.isfinite(g)), msg=name)
      if not name.endswith('/bk'):
        self.assertGreater(np.abs(g).max(), 0.0, msg=name)

  def testPipelinedEqualsUnpipelinedWithDropout(self):
    layers = transformer.TransformerLayers(
        dropout=0.2, atten_dropout=0.1, relu_dropout=0.1,
        shared_embeddings=False, **testlib.TINY)
    self.AssertSameLossAndGrads(
        layers, testlib.TranslationBatch(seed=1),
        transformer.TranslationInputShapes(testlib.BATCH, testlib.SRC_LEN,
                                           testlib.TGT_LEN), k=2, t=2)

  def testLmPipelinedEqualsUnpipelinedWithDropout(self):
    layers = transformer.TransformerLmLayers(dropout=0.2, atten_dropout=0.1,
                                             **testlib.TINY)
    self.AssertSameLossAndGrads(
        layers, testlib.LmBatch(seed=2),
        transformer.LmInputShapes(testlib.BATCH, testlib.TGT_LEN), k=2, t=4)

  def testPipelineParamsBuildAndPutEmbeddingFirstSoftmaxLast(self):
    p = transformer.TransformerPipeline(
        num_partitions=2, num_micro_batches=2, batch_size=testlib.BATCH,
        src_len=testlib.SRC_LEN, tgt_len=testlib.TGT_LEN, **testlib.TINY)
    parts = p.Instantiate().PartitionLayers()
    self.assertEqual(parts[0][0].layer_name, 'emb')
    self.assertEqual(parts[-1][-1].layer_name, 'softmax')

  def testBadArgumentsRaise(self):
    with self.assertRaisesRegex(ValueError, 'num_heads=3'):
      transformer.TransformerLayers(num_layers=1, hidden_dim=8, num_heads=3,
                                    model_dim=16, vocab_size=10)
    with self.assertRaisesRegex(ValueError, 'num_layers=0'):
      transformer.TransformerLmLayers(num_layers=0)


if __name__ == '__main__':
  tf.test.main()
