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


class ScaleLayer(base_layer.BaseLayer):
  """x -> x * w + (mean over the batch axis): a batch-dependent output."""

  def __init__(self, params):
    super().__init__(params)
    self.CreateVariable('w', base_layer.WeightParams([3]))

  def FProp(self, theta, x):
    return x * theta.w + tf.reduce_mean(x, axis=1, keepdims=True)


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


if __name__ == '__main__':
  tf.test.main()
