"""Tests for tensorpipe.layers.pooling."""

import numpy as np
import tensorflow as tf

from tensorpipe.layers import pooling


def _Input(shape):
  return tf.random.stateless_normal(shape, [1, 0])


class PoolingLayerTest(tf.test.TestCase):

  def testMatchesTfPoolingAndFPropMetaShapes(self):
    x = _Input([2, 7, 6, 3])
    for pooling_type, tf_pool in (('MAX', tf.nn.max_pool2d),
                                  ('AVG', tf.nn.avg_pool2d)):
      for padding in ('SAME', 'VALID'):
        with self.subTest(pooling_type=pooling_type, padding=padding):
          p = pooling.PoolingLayer.Params().Set(
              name='pool', window_shape=(3, 2), window_stride=(2, 2),
              pooling_type=pooling_type, padding=padding)
          out = p.Instantiate().FPropDefaultTheta(x)
          self.assertAllClose(tf_pool(x, (3, 2), (2, 2), padding), out)
          meta = pooling.PoolingLayer.FPropMeta(p, x.shape)
          self.assertEqual(meta.out_shapes[0], out.shape)
          self.assertEqual(3 * 2 * out.shape.num_elements(), meta.flops)
          self.assertEqual(0, meta.num_params)

  def testAvgMatchesNumpyWindowMean(self):
    x = _Input([1, 4, 4, 2])
    p = pooling.PoolingLayer.Params().Set(name='pool', pooling_type='AVG')
    out = p.Instantiate().FPropDefaultTheta(x)
    expected = x.numpy().reshape(1, 2, 2, 2, 2, 2).mean(axis=(2, 4))
    self.assertAllClose(expected, out)

  def testBadParamsRaise(self):
    for bad in (dict(pooling_type='MIN'), dict(padding='FULL'),
                dict(window_shape=(2,))):
      with self.subTest(**bad):
        with self.assertRaises(ValueError):
          pooling.PoolingLayer.Params().Set(name='pool', **bad).Instantiate()

  def testFPropMetaRaisesOnRank3Input(self):
    p = pooling.PoolingLayer.Params().Set(name='pool')
    with self.assertRaisesRegex(ValueError, 'batch, height, width, channels'):
      pooling.PoolingLayer.FPropMeta(p, [2, 4, 4])

  def testBfloat16(self):
    p = pooling.PoolingLayer.Params().Set(name='pool', pooling_type='AVG',
                                          fprop_dtype=tf.bfloat16)
    out = p.Instantiate().FPropDefaultTheta(_Input([1, 4, 4, 2]))
    self.assertEqual(tf.bfloat16, out.dtype)


class GlobalPoolingLayerTest(tf.test.TestCase):

  def testMatchesNumpyReductions(self):
    x = _Input([2, 3, 5, 4])
    xn = x.numpy()
    for pooling_type, reduce in (('AVG', np.mean), ('MAX', np.max)):
      for keepdims in (False, True):
        with self.subTest(pooling_type=pooling_type, keepdims=keepdims):
          p = pooling.GlobalPoolingLayer.Params().Set(
              name='gp', pooling_type=pooling_type, keepdims=keepdims)
          out = p.Instantiate().FPropDefaultTheta(x)
          self.assertAllClose(reduce(xn, axis=(1, 2), keepdims=keepdims), out)
          meta = pooling.GlobalPoolingLayer.FPropMeta(p, x.shape)
          self.assertEqual(meta.out_shapes[0], out.shape)
          self.assertEqual(x.shape.num_elements(), meta.flops)

  def testBadPoolingTypeRaises(self):
    with self.assertRaisesRegex(ValueError, "pooling_type='SUM'"):
      pooling.GlobalPoolingLayer.Params().Set(
          name='gp', pooling_type='SUM').Instantiate()


if __name__ == '__main__':
  tf.test.main()
