"""Tests for tensorpipe.layers.linear (activations: activations_test.py)."""

import numpy as np
import tensorflow as tf

from tensorpipe.layers import linear
from tests import weight_op_testlib


def _Input(shape):
  return tf.random.stateless_normal(shape, [1, 0])


def _FC(**kwargs):
  p = linear.FCLayer.Params().Set(name='fc', input_dim=4, output_dim=3,
                                  **kwargs)
  layer = p.Instantiate()
  if 'b' in layer.vars:
    layer.vars.b.assign([0.5, -0.5, 0.1])
  return p, layer


class FCLayerTest(tf.test.TestCase):

  def testMatchesNumpyForRank2And3(self):
    p, layer = _FC(activation='RELU')
    w, b = layer.vars.w.numpy(), layer.vars.b.numpy()
    for shape in ([5, 4], [2, 3, 4]):
      with self.subTest(shape=shape):
        x = _Input(shape)
        out = layer.FPropDefaultTheta(x)
        self.assertAllClose(np.maximum(x.numpy() @ w + b, 0.0), out)
        meta = linear.FCLayer.FPropMeta(p, x.shape)
        self.assertEqual(meta.out_shapes[0], out.shape)

  def testNoBiasNoActivationIsMatmul(self):
    _, layer = _FC(bias=False, activation='NONE')
    self.assertNotIn('b', layer.vars)
    x = _Input([3, 4])
    self.assertAllClose(tf.matmul(x, layer.vars.w), layer.FPropDefaultTheta(x))

  def testMatmulIsAWeightOpThatSplitsBitForBit(self):
    _, layer = _FC()
    for shape in ([5, 4], [2, 3, 4]):
      weight_op_testlib.AssertWeightOpsSplit(self, layer, [_Input(shape)],
                                             ['w'])

  def testFPropMetaCountsFlopsAndParams(self):
    p, layer = _FC(activation='NONE')
    meta = linear.FCLayer.FPropMeta(p, [2, 5, 4])
    rows = 2 * 5
    self.assertEqual(2 * rows * 4 * 3 + rows * 3, meta.flops)
    self.assertEqual(sum(int(np.prod(v.shape)) for v in layer.variables),
                     meta.num_params)

  def testInputDimMismatchRaises(self):
    p, layer = _FC()
    with self.assertRaisesRegex(ValueError, "'fc': input has last dim 6 but "
                                'input_dim=4'):
      linear.FCLayer.FPropMeta(p, [2, 6])
    with self.assertRaisesRegex(ValueError, 'input_dim=4'):
      layer.FPropDefaultTheta(tf.zeros([2, 6]))
    with self.assertRaisesRegex(ValueError, 'rank >= 2'):
      linear.FCLayer.FPropMeta(p, [4])

  def testMissingDimsRaise(self):
    with self.assertRaisesRegex(ValueError, 'output_dim=None'):
      linear.FCLayer.Params().Set(name='fc', input_dim=3).Instantiate()

  def testBfloat16ActivationsWithFloat32Weights(self):
    _, layer = _FC(fprop_dtype=tf.bfloat16)
    out = layer.FPropDefaultTheta(_Input([2, 4]))
    self.assertEqual(tf.bfloat16, out.dtype)
    self.assertEqual(tf.float32, layer.vars.w.dtype)


class FlattenLayerTest(tf.test.TestCase):

  def testFlattensAllButBatch(self):
    p = linear.FlattenLayer.Params().Set(name='flat')
    x = _Input([2, 3, 4, 5])
    out = p.Instantiate().FPropDefaultTheta(x)
    self.assertAllEqual(x.numpy().reshape(2, 60), out)
    meta = linear.FlattenLayer.FPropMeta(p, x.shape)
    self.assertEqual(tf.TensorShape([2, 60]), meta.out_shapes[0])
    self.assertEqual(0, meta.num_params)


if __name__ == '__main__':
  tf.test.main()
