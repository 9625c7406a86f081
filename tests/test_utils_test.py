"""Tests of tensorpipe/test_utils.py: the oracle and tolerance helpers."""

import os
import tempfile
import unittest
from unittest import mock

import numpy as np
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import test_utils
from tensorpipe.layers import composite
from tensorpipe.layers import linear

test_utils.ConfigureTestDevices()


class ScaleLayer(base_layer.BaseLayer):
  """x -> x * w + (mean over the batch axis): a batch-dependent output."""

  def __init__(self, params):
    super().__init__(params)
    self.CreateVariable('w', base_layer.WeightParams([3]))

  def FProp(self, theta, x):
    return x * theta.w + tf.reduce_mean(x, axis=1, keepdims=True)


def _Fcs(n=4, dim=3, first=0):
  return [linear.FCLayer.Params().Set(name=f'fc{i}', input_dim=dim,
                                      output_dim=dim, activation='TANH')
          for i in range(first, first + n)]


class _CenterLayer(base_layer.BaseLayer):
  """y = x - mean(x over the batch): depends on which examples are together."""

  def FProp(self, theta, x):
    del theta
    return x - tf.reduce_mean(x, axis=0, keepdims=True)


class _NoisyLayer(base_layer.BaseLayer):
  """Adds unseeded (stateful) noise: the pipeline cannot reproduce it."""

  def FProp(self, theta, x):
    del theta
    return x + tf.random.uniform(tf.shape(x), dtype=x.dtype)

  @classmethod
  def FPropMeta(cls, p, x_shape):
    return base_layer.FPropMetaResult(0, x_shape, 0)


class AssertAllCloseScaledTest(tf.test.TestCase):

  def testToleranceIsRelativeToTheLargestMagnitude(self):
    big = np.array([1e3, -2e3, 1.0])
    test_utils.AssertAllCloseScaled(self, big + 1e-4, big, rtol=1e-6)
    with self.assertRaises(AssertionError):
      test_utils.AssertAllCloseScaled(self, big + [0, 0, 1e-2], big,
                                      rtol=1e-6)

  def testScaleIsAFloorForNearZeroTensors(self):
    noise = np.array([1e-18, -2e-18])
    with self.assertRaises(AssertionError):
      test_utils.AssertAllCloseScaled(self, -noise, noise, rtol=1e-9)
    test_utils.AssertAllCloseScaled(self, -noise, noise, rtol=1e-9, scale=1.0)


class MicroBatchOracleTest(tf.test.TestCase):

  def testSlicesOnTheBatchAxis(self):
    layer = composite.SequentialLayer.Params().Set(
        name='seq', sub=[ScaleLayer.Params().Set(name='s')]).Instantiate()
    # Batch on axis 1: [3 features, 4 examples, 3 channels].
    x = tf.reshape(tf.range(36, dtype=tf.float32), [3, 4, 3])
    out, _, _ = test_utils.MicroBatchOracle(layer, 2, tf.reduce_sum, x,
                                            batch_dim=1)
    w = layer.theta.sub[0].w
    expected = tf.concat(
        [x[:, :2] * w + tf.reduce_mean(x[:, :2], 1, keepdims=True),
         x[:, 2:] * w + tf.reduce_mean(x[:, 2:], 1, keepdims=True)], axis=1)
    self.assertAllClose(out, expected)

  def testRejectsIndivisibleBatch(self):
    layer = composite.SequentialLayer.Params().Set(
        name='seq', sub=[ScaleLayer.Params().Set(name='s')]).Instantiate()
    with self.assertRaisesRegex(ValueError, 'batch 5 .* num_micro_batches=2'):
      test_utils.MicroBatchOracle(layer, 2, tf.reduce_sum, tf.ones([5, 3]))


class CheckPreparedTest(tf.test.TestCase):

  def _Check(self, require: bool):
    env = {'TENSORPIPE_DATA_DIR': tempfile.mkdtemp(dir=self.get_temp_dir()),
           test_utils.REQUIRE_DATA_ENV: '1' if require else '0'}
    with mock.patch.dict(os.environ, env):
      test_utils.CheckPrepared(tf.test.TestCase(), 'fashion_mnist')

  def testMissingDataSkipsByDefault(self):
    with self.assertRaisesRegex(unittest.SkipTest, 'prepare_data.sh'):
      self._Check(require=False)

  def testMissingDataFailsWhenRequired(self):
    with self.assertRaisesRegex(AssertionError, 'prepare_data.sh'):
      self._Check(require=True)


class MicroBatchOracleCheckTest(tf.test.TestCase):

  def testRunsTheLayerOnEachMicroBatch(self):
    layer = _CenterLayer.Params().Set(name='c').Instantiate()
    x = np.random.RandomState(0).randn(6, 2)
    out, loss, grads = test_utils.MicroBatchOracle(
        layer, 3, tf.reduce_sum, tf.constant(x))
    want = np.concatenate([p - p.mean(0) for p in np.split(x, 3)])
    self.assertAllClose(out, want, rtol=1e-12, atol=1e-12)
    self.assertAllClose(loss, want.sum(), atol=1e-12)
    self.assertEmpty(grads)             # the layer has no weights

  def testInputsWithDifferentBatchSizesRaise(self):
    layer = _CenterLayer.Params().Set(name='c').Instantiate()
    with self.assertRaisesRegex(ValueError, r'disagree .*\[4, 6\]'):
      test_utils.MicroBatchOracle(layer, 2, tf.reduce_sum, tf.zeros([4, 2]),
                                  tf.zeros([6, 2]))


class AssertPipelineMatchesOracleTest(tf.test.TestCase):

  def testPassesForPureLayersAndMatchesVariablesByName(self):
    x = tf.random.stateless_normal([4, 3], seed=[1, 2])
    pipe = test_utils.AssertPipelineMatchesOracle(
        self, _Fcs(), 2, 2, [x], tf.reduce_sum)
    self.assertEqual(sorted(test_utils.VariablesByName(pipe)),
                     [f'fc{i}/{v}' for i in range(4) for v in ('b', 'w')])

  def testFailsWhenThePipelineComputesSomethingElse(self):
    x = tf.random.stateless_normal([4, 3], seed=[1, 2])
    layers = (_Fcs(2) + [_NoisyLayer.Params().Set(name='noise')] +
              _Fcs(1, first=2))
    with self.assertRaisesRegex(AssertionError, '(?s)Not equal.*outputs'):
      test_utils.AssertPipelineMatchesOracle(self, layers, 2, 2, [x],
                                             tf.reduce_sum)


class VariablesByNameTest(tf.test.TestCase):

  def testVariablesByNameSkipsContainers(self):
    seq = composite.SequentialLayer.Params().Set(
        name='seq', sub=_Fcs(2)).Instantiate()
    self.assertEqual(sorted(test_utils.VariablesByName(seq)),
                     ['fc0/b', 'fc0/w', 'fc1/b', 'fc1/w'])


if __name__ == '__main__':
  tf.test.main()
