"""Tests of models/consistency_cnn.py: the paper's 3x3 conv stack."""

import numpy as np
import tensorflow as tf

from models import consistency_cnn
from tensorpipe import test_utils
from tensorpipe.layers import composite

test_utils.ConfigureTestDevices()


def _Conv3x3Same(x, w):
  """NumPy oracle: 3x3 cross-correlation with zero padding, one channel."""
  b, h, wd = x.shape
  padded = np.pad(x, ((0, 0), (1, 1), (1, 1)))
  out = np.zeros_like(x)
  for i in range(h):
    for j in range(wd):
      out[:, i, j] = np.tensordot(padded[:, i:i + 3, j:j + 3], w,
                                  axes=([1, 2], [0, 1]))
  return out


class ConsistencyCnnTest(tf.test.TestCase):

  def testLayersAreSingleChannel3x3Convolutions(self):
    layer_ps = consistency_cnn.ConsistencyLayers(3)
    self.assertEqual([p.name for p in layer_ps], ['conv0', 'conv1', 'conv2'])
    model = composite.SequentialLayer.Params().Set(
        name='m', sub=[p.Copy().Set(dtype=tf.float64) for p in layer_ps]
    ).Instantiate()
    x = np.random.RandomState(0).randn(2, 8, 8, 1)
    want = x[..., 0]
    for conv in model.children.sub:
      self.assertEqual(sorted(conv.vars), ['w'])     # no bias
      w = conv.vars.w.numpy()[:, :, 0, 0]
      want = np.maximum(_Conv3x3Same(want, w), 0.0)  # ReLU
    self.assertAllClose(model.FPropDefaultTheta(tf.constant(x))[..., 0],
                        want, rtol=1e-12, atol=1e-12)

  def testPipelineSplitsEvenlyAndMatchesTheOracle(self):
    p = consistency_cnn.ConsistencyPipeline(4, num_micro_batches=2,
                                            num_layers=8,
                                            input_shape=(4, 8, 8, 1))
    self.assertEqual([len(part) for part in
                      p.Instantiate().PartitionLayers()], [2, 2, 2, 2])
    x = tf.random.stateless_normal([4, 8, 8, 1], seed=[3, 1])
    test_utils.AssertPipelineMatchesOracle(
        self, consistency_cnn.ConsistencyLayers(8), 4, 2, [x],
        tf.reduce_mean)

  def testBadLayerCountRaises(self):
    with self.assertRaisesRegex(ValueError, 'num_layers=0 must be a positive '
                                'int'):
      consistency_cnn.ConsistencyLayers(0)


if __name__ == '__main__':
  tf.test.main()
