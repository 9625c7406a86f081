"""Tests for tensorpipe.layers.dropout."""

import numpy as np
import tensorflow as tf

from tensorpipe import pipeline
from tensorpipe import py_utils
from tensorpipe import test_utils
from tensorpipe.layers import composite
from tensorpipe.layers import dropout
from tensorpipe.layers import linear

test_utils.ConfigureTestDevices()


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
                         (dict(noise_shape_broadcast_dims=[1.5]),
                          r'noise_shape_broadcast_dims=\[1\.5\]')):
      with self.subTest(**bad):
        with self.assertRaisesRegex(ValueError, pattern):
          dropout.DropoutLayer.Params().Set(name='d', **bad).Instantiate()

  def testBroadcastOverTheBatchAxisRaises(self):
    # The batch axis is the context's, known when the layer runs.
    layer = _Dropout(noise_shape_broadcast_dims=[0, 1])
    with self.assertRaisesRegex(ValueError, 'includes the batch axis 0'):
      layer.FPropDefaultTheta(tf.ones([4, 3, 5]))
    with py_utils.BatchAxis(1):
      with self.assertRaisesRegex(ValueError, 'includes the batch axis 1'):
        layer.FPropDefaultTheta(tf.ones([4, 3, 5]))
    with self.assertRaisesRegex(ValueError, 'out of range'):
      _Dropout(noise_shape_broadcast_dims=[3]).FPropDefaultTheta(
          tf.ones([4, 3, 5]))

  def testBatchOnAxis1GetsTheBatchMajorMaskTransposed(self):
    """[time, batch, dim] inputs get, per example, the numbers the same
    example gets in a [batch, time, dim] layout: masks follow the examples,
    not the layout."""
    layer = _Dropout(keep_prob=0.5)
    with py_utils.StepSeed(7):
      batch_major = layer.FPropDefaultTheta(tf.ones([8, 3, 5]))
      with py_utils.BatchAxis(1):
        time_major = layer.FPropDefaultTheta(tf.ones([3, 8, 5]))
        with py_utils.ExampleOffset(4):
          part = layer.FPropDefaultTheta(tf.ones([3, 4, 5]))
        # Broadcasting over time (axis 0) is allowed when the batch is on 1.
        shared = _Dropout(keep_prob=0.5, noise_shape_broadcast_dims=[0])
        per_example = shared.FPropDefaultTheta(tf.ones([3, 8, 5])).numpy()
    self.assertAllEqual(time_major, tf.transpose(batch_major, [1, 0, 2]))
    self.assertAllEqual(time_major[:, 4:], part)
    self.assertAllEqual(np.broadcast_to(per_example[:1], per_example.shape),
                        per_example)

  def testFPropMeta(self):
    p = dropout.DropoutLayer.Params().Set(name='d', keep_prob=0.9)
    meta = dropout.DropoutLayer.FPropMeta(p, [2, 3])
    self.assertEqual(tf.TensorShape([2, 3]), meta.out_shapes[0])
    self.assertEqual(0, meta.num_params)
    self.assertGreater(meta.flops, 0)
    self.assertEqual(0, dropout.DropoutLayer.FPropMeta(
        p.Copy().Set(keep_prob=1.0), [2, 3]).flops)



def _TimeMajorLayers():
  """FC and dropout layers on [time, batch, dim] inputs, float64."""
  fc = lambda name, din, dout, act='RELU': linear.FCLayer.Params().Set(
      name=name, input_dim=din, output_dim=dout, activation=act,
      dtype=tf.float64)
  drop = lambda name, keep: dropout.DropoutLayer.Params().Set(
      name=name, keep_prob=keep, dtype=tf.float64)
  return [fc('fc0', 4, 6), drop('drop0', 0.5), fc('fc1', 6, 6),
          drop('drop1', 0.7), fc('fc2', 6, 3, 'NONE')]


class BatchDim1PipelineTest(tf.test.TestCase):
  """TensorPipeLayer(batch_dim=1) with dropout: the result of the whole batch
  whatever K and T (micro-batches are cut on axis 1, masks follow them)."""

  def _LossAndGrads(self, layer, x):
    variables = test_utils.VariablesByName(layer)
    names = sorted(variables)
    loss_weights = tf.random.stateless_normal([3, 8, 3], [5, 6],
                                              dtype=tf.float64)

    @tf.function(autograph=False)
    def Step(x):
      with tf.GradientTape() as tape:
        with py_utils.StepSeed(11):
          loss = tf.reduce_sum(layer.FPropDefaultTheta(x) * loss_weights)
      return loss, tape.gradient(loss, [variables[n] for n in names])
    loss, grads = Step(x)
    return float(loss), dict(zip(names, grads))

  def testLossAndGradientsIndependentOfKAndTAndEqualUnpipelined(self):
    x = tf.random.stateless_normal([3, 8, 4], [1, 2], dtype=tf.float64)
    plain = composite.SequentialLayer.Params().Set(
        name='plain', sub=_TimeMajorLayers()).Instantiate()
    with py_utils.BatchAxis(1):  # the unpipelined model's layout
      want_loss, want = self._LossAndGrads(plain, x)
    for k in (1, 2):
      for t in (1, 2, 4):
        pipe = pipeline.TensorPipeLayer.Params().Set(
            name='pipe', layers=_TimeMajorLayers(), num_partitions=k,
            num_micro_batches=t, batch_dim=1,
            input_shapes=[[3, 8, 4]]).Instantiate()
        loss, grads = self._LossAndGrads(pipe, x)
        # float64, the same ops: only the sums over micro-batches differ in
        # order (a few ulps of values of order 1).
        self.assertAllClose(loss, want_loss, rtol=1e-12, atol=0,
                            msg=f'K={k} T={t}')
        self.assertEqual(sorted(grads), sorted(want))
        for name in want:
          self.assertAllClose(grads[name], want[name], rtol=1e-12,
                              atol=1e-12, msg=f'K={k} T={t} {name}')
    # The shared micro-batch oracle agrees (it slices on axis 1 itself).
    test_utils.AssertPipelineMatchesOracle(
        self, _TimeMajorLayers(), 2, 4, [x],
        lambda y: tf.reduce_sum(tf.square(y)), batch_dim=1)
    # The masks matter: eval mode (no dropout) gives another loss.
    with py_utils.BatchAxis(1), py_utils.EvalMode():
      self.assertNotAllClose(self._LossAndGrads(plain, x)[0], want_loss)


if __name__ == '__main__':
  tf.test.main()
