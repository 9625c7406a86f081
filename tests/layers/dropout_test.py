"""Tests for tensorpipe.layers.dropout."""

import numpy as np
import tensorflow as tf

from tensorpipe import py_utils
from tensorpipe.layers import dropout


def _Dropout(name='dropout', keep_prob=0.75, **kwargs):
  return dropout.DropoutLayer.Params().Set(
      name=name, keep_prob=keep_prob, **kwargs).Instantiate()


class DropoutLayerTest(tf.test.TestCase):

  def testKeepsAboutKeepProbAndScalesKeptValues(self):
    keep_prob = 0.75
    layer = _Dropout(keep_prob=keep_prob)
    x = tf.ones([16, 32, 8])
    out = layer.FPropDefaultTheta(x).numpy()
    kept = out != 0
    # 4096 Bernoulli(0.75) draws: std of the fraction is ~0.007.
    self.assertNear(keep_prob, kept.mean(), 0.04)
    self.assertAllClose(np.full(kept.sum(), 1.0 / keep_prob), out[kept])

  def testOutputIsInputTimesScaledMask(self):
    layer = _Dropout(keep_prob=0.5)
    x = tf.random.stateless_normal([4, 6], [1, 0])
    out = layer.FPropDefaultTheta(x).numpy()
    mask = (layer.FPropDefaultTheta(tf.ones([4, 6])).numpy() != 0)
    self.assertAllClose(x.numpy() * mask / 0.5, out)

  def testEvalAndKeepProbOneAreIdentity(self):
    x = tf.random.stateless_normal([4, 5], [1, 0])
    with py_utils.EvalMode():
      self.assertAllEqual(x, _Dropout(keep_prob=0.5).FPropDefaultTheta(x))
    self.assertAllEqual(x, _Dropout(keep_prob=1.0).FPropDefaultTheta(x))

  def testMicroBatchMaskEqualsRowsOfWholeBatchMask(self):
    layer = _Dropout(keep_prob=0.5)
    x = tf.ones([8, 3, 5])
    with py_utils.StepSeed(7):
      whole = layer.FPropDefaultTheta(x)
      with py_utils.ExampleOffset(4):
        part = layer.FPropDefaultTheta(x[4:])
      with py_utils.ExampleOffset(3):
        odd = layer.FPropDefaultTheta(x[3:4])
    self.assertAllEqual(whole[4:], part)
    self.assertAllEqual(whole[3:4], odd)
    self.assertNotAllEqual(whole[:4], part)

  def testDifferentLayerNamesGiveDifferentMasks(self):
    x = tf.ones([4, 16])
    a = _Dropout(name='dropout_a').FPropDefaultTheta(x)
    b = _Dropout(name='dropout_b').FPropDefaultTheta(x)
    self.assertNotAllEqual(a, b)

  def testSameStepSeedReproducesAndOtherStepSeedDiffers(self):
    layer = _Dropout()
    x = tf.ones([4, 16])
    with py_utils.StepSeed(3):
      first = layer.FPropDefaultTheta(x)
      again = layer.FPropDefaultTheta(x)
    with py_utils.StepSeed(4):
      other = layer.FPropDefaultTheta(x)
    self.assertAllEqual(first, again)
    self.assertNotAllEqual(first, other)

  def testRandomSeedParamChangesMask(self):
    x = tf.ones([4, 16])
    a = _Dropout(random_seed=1).FPropDefaultTheta(x)
    b = _Dropout(random_seed=2).FPropDefaultTheta(x)
    self.assertNotAllEqual(a, b)

  def testBroadcastDimsShareMaskAlongThoseAxes(self):
    layer = _Dropout(keep_prob=0.5, noise_shape_broadcast_dims=[1, 2])
    out = layer.FPropDefaultTheta(tf.ones([4, 3, 5, 8])).numpy()
    self.assertAllEqual(np.broadcast_to(out[:, :1, :1, :], out.shape), out)
    self.assertNotAllEqual(out[0, 0, 0], out[1, 0, 0])

  def testInsideTfFunction(self):
    layer = _Dropout(keep_prob=0.5)
    x = tf.ones([8, 4])
    fn = tf.function(layer.FPropDefaultTheta)
    self.assertAllEqual(layer.FPropDefaultTheta(x), fn(x))

  def testBfloat16(self):
    layer = _Dropout(keep_prob=0.5, fprop_dtype=tf.bfloat16)
    out = layer.FPropDefaultTheta(tf.ones([2, 8]))
    self.assertEqual(tf.bfloat16, out.dtype)
    self.assertAllInSet(tf.cast(out, tf.float32), [0.0, 2.0])

  def testBadParamsRaise(self):
    for bad, pattern in ((dict(keep_prob=0.0), r'keep_prob=0\.0'),
                         (dict(keep_prob=1.5), r'keep_prob=1\.5'),
                         (dict(noise_shape_broadcast_dims=[0, 1]),
                          'batch axis')):
      with self.subTest(**bad):
        with self.assertRaisesRegex(ValueError, pattern):
          dropout.DropoutLayer.Params().Set(name='d', **bad).Instantiate()

  def testFPropMeta(self):
    p = dropout.DropoutLayer.Params().Set(name='d', keep_prob=0.9)
    meta = dropout.DropoutLayer.FPropMeta(p, [2, 3])
    self.assertEqual(tf.TensorShape([2, 3]), meta.out_shapes[0])
    self.assertEqual(0, meta.num_params)
    self.assertGreater(meta.flops, 0)
    self.assertEqual(0, dropout.DropoutLayer.FPropMeta(
        p.Copy().Set(keep_prob=1.0), [2, 3]).flops)


if __name__ == '__main__':
  tf.test.main()
