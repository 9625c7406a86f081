"""Tests for tensorpipe.layers.normalization."""

import numpy as np
import tensorflow as tf

from tensorpipe import py_utils
from tensorpipe.layers import normalization


def _Input(shape, seed=1, shift=2.0):
  return tf.random.stateless_normal(shape, [seed, 0], mean=shift, stddev=3.0)


def _BatchNorm(dim=3, **kwargs):
  p = normalization.BatchNormLayer.Params().Set(name='bn', dim=dim, **kwargs)
  layer = p.Instantiate()
  layer.vars.gamma.assign(np.linspace(0.5, 1.5, dim))
  layer.vars.beta.assign(np.linspace(-1.0, 1.0, dim))
  return layer


def _NumpyNormalize(x, mean, var, gamma, beta, epsilon):
  return (x - mean) / np.sqrt(var + epsilon) * gamma + beta


class BatchNormLayerTest(tf.test.TestCase):

  def testTrainingNormalizesWithThisBatchStatistics(self):
    layer = _BatchNorm(decay=0.9)
    for shape in ([6, 3], [2, 3, 4, 3]):
      with self.subTest(shape=shape):
        x = _Input(shape)
        with py_utils.CollectBatchStats():
          out = layer.FPropDefaultTheta(x)
        xn = x.numpy()
        axes = tuple(range(len(shape) - 1))
        expected = _NumpyNormalize(xn, xn.mean(axes), xn.var(axes),
                                   layer.vars.gamma.numpy(),
                                   layer.vars.beta.numpy(), 1e-3)
        self.assertAllClose(expected, out, atol=1e-5)

  def testReportsSufficientStatisticsUnderCollector(self):
    layer = _BatchNorm()
    x = _Input([2, 4, 5, 3])
    with py_utils.CollectBatchStats() as collected:
      layer.FPropDefaultTheta(x)
    self.assertLen(collected, 1)
    reporter, stats = collected[0]
    self.assertIs(layer, reporter)
    xn = x.numpy().reshape(-1, 3)
    self.assertEqual(tf.float32, stats.count.dtype)
    self.assertEqual(0, stats.count.shape.rank)
    self.assertAllClose(40.0, stats.count)
    self.assertAllClose(xn.sum(0), stats.total, rtol=1e-5)
    self.assertAllClose((xn**2).sum(0), stats.total_sq, rtol=1e-5)
    # Collected, not applied: moving stats are still the initial ones.
    self.assertAllClose(np.zeros(3), layer.vars.moving_mean)
    self.assertAllClose(np.ones(3), layer.vars.moving_variance)

  def testFloat64BatchNormComputesInFloat64(self):
    # Values 1e4 with a spread of 1e-3: float32 statistics would lose it.
    p = normalization.BatchNormLayer.Params().Set(name='bn', dim=3,
                                                  dtype=tf.float64)
    layer = p.Instantiate()
    layer.vars.gamma.assign(np.linspace(0.5, 1.5, 3))
    layer.vars.beta.assign(np.linspace(-1.0, 1.0, 3))
    x = 1e4 + tf.random.stateless_normal([16, 3], [3, 4],
                                         dtype=tf.float64) * 1e-3
    with py_utils.TrainingMode(True), py_utils.CollectBatchStats() as got:
      out = layer.FPropDefaultTheta(x)
    xn = x.numpy()
    expected = _NumpyNormalize(xn, xn.mean(0), xn.var(0),
                               layer.vars.gamma.numpy(),
                               layer.vars.beta.numpy(), 1e-3)
    self.assertEqual(out.dtype, tf.float64)
    self.assertAllClose(out, expected, rtol=1e-9, atol=1e-9)
    stats = got[0][1]
    self.assertEqual([t.dtype for t in stats.Flatten()], [tf.float64] * 3)
    self.assertAllClose(stats.total, xn.sum(0), rtol=1e-14, atol=0)
    # Eval: the moving statistics in float64.
    layer.vars.moving_mean.assign(xn.mean(0))
    layer.vars.moving_variance.assign(xn.var(0))
    with py_utils.EvalMode():
      self.assertAllClose(layer.FPropDefaultTheta(x), expected, rtol=1e-9,
                          atol=1e-9)
    ln = normalization.LayerNormLayer.Params().Set(
        name='ln', dim=16, dtype=tf.float64).Instantiate()
    xt = 5.0 + (xn.T - 1e4)  # ~5, spread 1e-3: float32 would err by ~1e-3
    y = ln.FPropDefaultTheta(tf.constant(xt))
    self.assertEqual(y.dtype, tf.float64)
    self.assertAllClose(y, (xt - xt.mean(-1, keepdims=True)) / np.sqrt(
        xt.var(-1, keepdims=True) + 1e-6), rtol=1e-7, atol=1e-7)

  def testStatisticsAreFloat32ForBfloat16Activations(self):
    layer = normalization.BatchNormLayer.Params().Set(
        name='bn', dim=3, fprop_dtype=tf.bfloat16).Instantiate()
    x = tf.cast(_Input([8, 3]), tf.bfloat16)
    with py_utils.CollectBatchStats() as collected:
      out = layer.FPropDefaultTheta(x)
    self.assertEqual(tf.bfloat16, out.dtype)
    stats = collected[0][1]
    self.assertEqual(tf.float32, stats.total.dtype)
    xn = tf.cast(x, tf.float32).numpy()
    self.assertAllClose(xn.sum(0), stats.total, rtol=1e-5)

  def testStatisticsCarryNoGradient(self):
    layer = _BatchNorm()
    x = _Input([4, 3])
    with tf.GradientTape() as tape:
      tape.watch(x)
      with py_utils.CollectBatchStats() as collected:
        layer.FPropDefaultTheta(x)
      total = collected[0][1].total
    self.assertIsNone(tape.gradient(total, x))

  def testUpdateMovingStatsAppliesDecay(self):
    decay = 0.9
    layer = _BatchNorm(decay=decay)
    layer.vars.moving_mean.assign([1.0, 2.0, 3.0])
    layer.vars.moving_variance.assign([2.0, 2.0, 2.0])
    x = _Input([5, 2, 3])
    with py_utils.CollectBatchStats() as collected:
      layer.FPropDefaultTheta(x)
    layer.UpdateMovingStats(collected[0][1])
    xn = x.numpy().reshape(-1, 3)
    self.assertAllClose(decay * np.array([1.0, 2.0, 3.0]) +
                        (1 - decay) * xn.mean(0), layer.vars.moving_mean,
                        rtol=1e-5)
    self.assertAllClose(decay * 2.0 + (1 - decay) * xn.var(0),
                        layer.vars.moving_variance, rtol=1e-4)

  def testMergedMicroBatchStatsEqualWholeBatchUpdate(self):
    whole, split = _BatchNorm(decay=0.5), _BatchNorm(decay=0.5)
    x = _Input([8, 3])
    with py_utils.CollectBatchStats() as collected:
      split.FPropDefaultTheta(x[:4])
      split.FPropDefaultTheta(x[4:])
    merged = collected[0][1].Merge(collected[1][1])
    split.UpdateMovingStats(merged)
    whole.FPropDefaultTheta(x)  # no collector: updates at once
    self.assertAllClose(whole.vars.moving_mean, split.vars.moving_mean)
    self.assertAllClose(whole.vars.moving_variance, split.vars.moving_variance,
                        rtol=1e-5)

  def testWithoutCollectorUpdatesAtOnce(self):
    layer = _BatchNorm(decay=0.8)
    x = _Input([6, 3])
    layer.FPropDefaultTheta(x)
    xn = x.numpy()
    self.assertAllClose(0.2 * xn.mean(0), layer.vars.moving_mean, rtol=1e-5)
    self.assertAllClose(0.8 + 0.2 * xn.var(0), layer.vars.moving_variance,
                        rtol=1e-5)

  def testEvalUsesMovingStatsAndReportsNothing(self):
    layer = _BatchNorm()
    mean, var = np.array([0.5, -1.0, 2.0]), np.array([0.25, 4.0, 1.0])
    layer.vars.moving_mean.assign(mean)
    layer.vars.moving_variance.assign(var)
    x = _Input([4, 3])
    with py_utils.EvalMode(), py_utils.CollectBatchStats() as collected:
      out = layer.FPropDefaultTheta(x)
    self.assertEmpty(collected)
    expected = _NumpyNormalize(x.numpy(), mean, var, layer.vars.gamma.numpy(),
                               layer.vars.beta.numpy(), 1e-3)
    self.assertAllClose(expected, out, atol=1e-5)

  def testMovingAvgInTrainingNormalizesWithMovingStats(self):
    layer = _BatchNorm(use_moving_avg_in_training=True)
    layer.vars.moving_mean.assign([1.0, 1.0, 1.0])
    x = _Input([4, 3])
    with py_utils.CollectBatchStats() as collected:
      out = layer.FPropDefaultTheta(x)
    self.assertLen(collected, 1)
    expected = _NumpyNormalize(x.numpy(), 1.0, 1.0, layer.vars.gamma.numpy(),
                               layer.vars.beta.numpy(), 1e-3)
    self.assertAllClose(expected, out, atol=1e-5)

  def testWarnsOnceWhenTooFewValuesPerChannel(self):
    layer = _BatchNorm(dim=4)
    with py_utils.TrainingMode(True):
      with self.assertLogs('absl', 'WARNING') as logs:
        out = layer.FPropDefaultTheta(_Input([1, 4]))
      self.assertLen(logs.output, 1)
      self.assertRegex(
          logs.output[0], r"BatchNormLayer 'bn' normalises each channel over "
          r'only 1 value.*\[1, 4\].*beta for every input.*fewer '
          r'num_micro_batches or a larger batch.*use_moving_avg_in_training')
      # One value per channel: (x - mean) is 0, the output is beta.
      self.assertAllClose(layer.vars.beta.numpy()[None], out)
      with self.assertNoLogs('absl', 'WARNING'):  # once per layer
        layer.FPropDefaultTheta(_Input([2, 4]))

  def testNoWarningWithEnoughValuesOrOutsideTraining(self):
    n = normalization.MIN_VALUES_PER_CHANNEL
    with py_utils.TrainingMode(True), self.assertNoLogs('absl', 'WARNING'):
      _BatchNorm(dim=4).FPropDefaultTheta(_Input([n, 4]))
      # Spatial positions count: one example of 4x4 positions is enough.
      _BatchNorm(dim=4).FPropDefaultTheta(_Input([1, 4, 4, 4]))
      _BatchNorm(dim=4, use_moving_avg_in_training=True).FPropDefaultTheta(
          _Input([1, 4]))
    with py_utils.EvalMode(), self.assertNoLogs('absl', 'WARNING'):
      _BatchNorm(dim=4).FPropDefaultTheta(_Input([1, 4]))
    with py_utils.TrainingMode(True), self.assertLogs('absl', 'WARNING'):
      _BatchNorm(dim=4).FPropDefaultTheta(_Input([n - 1, 4]))

  def testWarnsAtTraceTimeInsideTfFunction(self):
    layer = _BatchNorm(dim=4)
    fn = tf.function(layer.FPropDefaultTheta, autograph=False)
    with py_utils.TrainingMode(True):
      with self.assertLogs('absl', 'WARNING'):
        fn(_Input([2, 4]))
      with self.assertNoLogs('absl', 'WARNING'):
        fn(_Input([2, 4], seed=2))

  def testVariablesAndTrainability(self):
    p = normalization.BatchNormLayer.Params().Set(name='bn', dim=4,
                                                  gamma_init=0.0)
    layer = p.Instantiate()
    self.assertCountEqual(['beta', 'gamma'],
                          [v.name.split(':')[0]
                           for v in layer.trainable_variables])
    self.assertAllEqual(np.zeros(4), layer.vars.gamma)
    meta = normalization.BatchNormLayer.FPropMeta(p, [2, 5, 4])
    self.assertEqual(sum(int(np.prod(v.shape)) for v in layer.variables),
                     meta.num_params)
    self.assertEqual(tf.TensorShape([2, 5, 4]), meta.out_shapes[0])

  def testChannelMismatchRaises(self):
    p = normalization.BatchNormLayer.Params().Set(name='bn1', dim=4)
    with self.assertRaisesRegex(ValueError, "'bn1': input has 3 channels"):
      normalization.BatchNormLayer.FPropMeta(p, [2, 3])
    with self.assertRaisesRegex(ValueError, 'input has 3 channels'):
      p.Instantiate().FPropDefaultTheta(tf.zeros([2, 3]))

  def testBadParamsRaise(self):
    for bad in (dict(dim=None), dict(dim=3, decay=1.5),
                dict(dim=3, epsilon=0.0)):
      with self.subTest(**bad):
        with self.assertRaises(ValueError):
          normalization.BatchNormLayer.Params().Set(
              name='bn', **bad).Instantiate()


class MovingAverageDecayTest(tf.test.TestCase):

  def _Model(self):
    from models import resnet  # pylint: disable=g-import-not-at-top
    from tensorpipe import pipeline  # pylint: disable=g-import-not-at-top
    return pipeline.TensorPipeLayer.Params().Set(
        name='pipe', layers=resnet.SmallResNetLayers(4, 1),
        num_partitions=1, num_micro_batches=1)

  def testSetBatchNormDecayReachesTemplatesInLayerLists(self):
    p = self._Model()
    n = normalization.SetBatchNormDecay(p, 0.97)
    decays = {line.split(' : ')[1] for line in p.ToText().splitlines()
              if line.split(' : ')[0].endswith('.decay')}
    self.assertEqual(decays, {'0.97'})
    self.assertGreaterEqual(n, 9)  # stem, 3 x 2 branch convs, 2 downsamples
    with self.assertRaisesRegex(ValueError, r'decay=1\.5 must be a number '
                                r'in \[0, 1\]'):
      normalization.SetBatchNormDecay(p, 1.5)

  def testWarnsWhenTheInitialValuesOutliveTheRun(self):
    p = self._Model()
    layer = p.Instantiate()
    # decay 0.999: 0.999^936 = 39% of the initial values left.
    (message,) = normalization.MovingAverageWarnings(layer, 936)
    self.assertIn('decay=0.999', message)
    self.assertIn('still hold 39% of their initial values', message)
    # 0.01^(1/936) = 0.99509...: rounded down, so it meets the 1% bound.
    self.assertIn('Set decay <= 0.995 ', message)
    self.assertLessEqual(0.995 ** 936, normalization.MAX_INITIAL_SHARE)
    self.assertEmpty(normalization.MovingAverageWarnings(layer, 10000))
    normalization.SetBatchNormDecay(p, 0.99)
    self.assertEmpty(normalization.MovingAverageWarnings(p.Instantiate(),
                                                         936))
    # A model without batch norm: nothing to say.
    fc = normalization.LayerNormLayer.Params().Set(name='ln', dim=3)
    self.assertEmpty(normalization.MovingAverageWarnings(fc.Instantiate(),
                                                         5))


class LayerNormLayerTest(tf.test.TestCase):

  def testMatchesNumpy(self):
    p = normalization.LayerNormLayer.Params().Set(name='ln', dim=5)
    layer = p.Instantiate()
    layer.vars.scale.assign(np.linspace(0.5, 2.0, 5))
    layer.vars.bias.assign(np.linspace(-1.0, 1.0, 5))
    x = _Input([2, 3, 5])
    xn = x.numpy()
    expected = _NumpyNormalize(xn, xn.mean(-1, keepdims=True),
                               xn.var(-1, keepdims=True),
                               layer.vars.scale.numpy(),
                               layer.vars.bias.numpy(), 1e-6)
    self.assertAllClose(expected, layer.FPropDefaultTheta(x), atol=1e-5)
    meta = normalization.LayerNormLayer.FPropMeta(p, x.shape)
    self.assertEqual(10, meta.num_params)
    self.assertEqual(x.shape, meta.out_shapes[0])

  def testBfloat16OutputCloseToFloat32(self):
    p = normalization.LayerNormLayer.Params().Set(name='ln', dim=8)
    x = _Input([4, 8])
    ref = p.Instantiate().FPropDefaultTheta(x)
    out = p.Copy().Set(fprop_dtype=tf.bfloat16).Instantiate().FPropDefaultTheta(
        tf.cast(x, tf.bfloat16))
    self.assertEqual(tf.bfloat16, out.dtype)
    self.assertAllClose(ref, tf.cast(out, tf.float32), atol=0.05, rtol=0.02)


if __name__ == '__main__':
  tf.test.main()
