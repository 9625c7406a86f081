"""TensorPipeLayer's warnings for setups that run but silently do less.

  * a layer with batch norm or dropout trained only because no
    TrainingMode / EvalMode block is set (FPropDefaultTheta's Lingvo
    default, while a plain pipe(x) is inference): once per process;
  * batch norm over one example of [N, C] features (T equal to the batch):
    every micro-batch normalises to beta;
  * a device given twice in `devices`: no pipelining between those
    partitions.

Each fires once where it should, and not on the normal path.
"""

from unittest import mock

import numpy as np
import tensorflow as tf

import tensorpipe
from tensorpipe import py_utils
from tensorpipe import test_utils
from tensorpipe.layers import dropout
from tensorpipe.layers import keras_layer
from tensorpipe.layers import keras_rebuild
from tensorpipe.layers import linear
from tensorpipe.layers import normalization

test_utils.ConfigureTestDevices()


def _Fc(name, dim=4):
  return linear.FCLayer.Params().Set(name=name, input_dim=dim, output_dim=dim)


def _Bn(name, dim=4):
  return normalization.BatchNormLayer.Params().Set(name=name, dim=dim)


def _Pipe(partitions, **kwargs):
  return tensorpipe.TensorPipeLayer.Params().Set(
      name='pipe', partitions=partitions, **kwargs).Instantiate()


class _FreshTrainingWarning(tf.test.TestCase):
  """Each test starts as if no training-by-default warning was logged."""

  def setUp(self):
    super().setUp()
    patcher = mock.patch.object(py_utils, '_warned_training_by_default',
                                False)
    patcher.start()
    self.addCleanup(patcher.stop)


class TrainingByDefaultWarningTest(_FreshTrainingWarning):

  def testFPropDefaultThetaWithoutModeBlockWarnsOnceNamingTheBlocks(self):
    pipe = _Pipe([[_Fc('a'), _Bn('bn')], [_Fc('b')]], num_micro_batches=2)
    x = tf.random.stateless_normal([32, 4], [1, 2])
    with self.assertLogs('absl', 'WARNING') as logs:
      pipe.FPropDefaultTheta(x)
    self.assertLen(logs.output, 1)
    self.assertRegex(
        logs.output[0], r"BatchNormLayer '.*bn' runs in training mode .*"
        r'no py_utils.TrainingMode / EvalMode block is set.*plain layer\(x\) '
        r'call is inference.*TrainingMode\(True\).*EvalMode\(\)')
    # It did train: the moving mean moved (the behaviour the warning names).
    bn = pipe.PartitionLayers()[0][1]
    self.assertNotAllClose(np.zeros(4), bn.vars.moving_mean)
    with self.assertNoLogs('absl', 'WARNING'):  # once per process
      pipe.FPropDefaultTheta(x)
      dropout.DropoutLayer.Params().Set(
          name='drop', keep_prob=0.5).Instantiate().FPropDefaultTheta(x)

  def testDropoutWithoutModeBlockWarns(self):
    drop = dropout.DropoutLayer.Params().Set(name='drop',
                                             keep_prob=0.5).Instantiate()
    with self.assertLogs('absl', 'WARNING') as logs:
      drop.FPropDefaultTheta(tf.ones([8, 4]))
    self.assertRegex(logs.output[0], r"DropoutLayer 'drop' runs in training")

  def testNoWarningOnTheNormalPaths(self):
    pipe = _Pipe([[_Fc('a'), _Bn('bn')], [_Fc('b')]], num_micro_batches=2)
    plain = _Pipe([[_Fc('a')], [_Fc('b')]], num_micro_batches=2)
    no_drop = dropout.DropoutLayer.Params().Set(name='d',
                                                keep_prob=1.0).Instantiate()
    x = tf.random.stateless_normal([32, 4], [1, 2])
    with self.assertNoLogs('absl', 'WARNING'):
      with py_utils.TrainingMode(True):
        pipe.FPropDefaultTheta(x)
      with py_utils.EvalMode():
        pipe.FPropDefaultTheta(x)
      pipe(x)  # a plain call is inference
      plain.FPropDefaultTheta(x)  # no mode-dependent layer
      no_drop.FPropDefaultTheta(x)  # keep_prob=1: the same in both modes
      self.assertTrue(py_utils.IsTraining())  # no layer named: no warning
    self.assertFalse(py_utils._warned_training_by_default)  # pylint: disable=protected-access


class OneExampleBatchNormWarningTest(tf.test.TestCase):

  def testOneExampleMicroBatchesOfFeaturesWarnOnce(self):
    pipe = _Pipe([[_Fc('a'), _Bn('bn')], [_Fc('b')]], num_micro_batches=4)
    x = tf.random.stateless_normal([4, 4], [1, 2])
    with py_utils.TrainingMode(True):
      with self.assertLogs('absl', 'WARNING') as logs:
        pipe.FPropDefaultTheta(x)
      self.assertLen(logs.output, 1)
      self.assertRegex(logs.output[0],
                       r"BatchNormLayer '.*bn' normalises each channel over "
                       r'only 1 value.*\[1, 4\].*beta for every input')
      with self.assertNoLogs('absl', 'WARNING'):
        pipe.FPropDefaultTheta(x)

  def testEnoughExamplesOrSpatialPositionsDoNotWarn(self):
    with py_utils.TrainingMode(True), self.assertNoLogs('absl', 'WARNING'):
      _Pipe([[_Fc('a'), _Bn('bn')], [_Fc('b')]],
            num_micro_batches=2).FPropDefaultTheta(
                tf.random.stateless_normal([64, 4], [1, 2]))


class KerasWarningTest(_FreshTrainingWarning):
  """The same two warnings for Keras layers (KerasLayer)."""

  def _KerasBn(self):
    return keras_layer.KerasLayer.Params().Set(
        name='kbn', keras_factory='keras.layers.BatchNormalization',
        input_shape=[4]).Instantiate()

  def testKerasBatchNormTrainingByDefaultAndOnOneExampleWarn(self):
    patcher = mock.patch.object(keras_rebuild, '_FEW_VALUES_WARNING',
                                keras_rebuild._Once())  # pylint: disable=protected-access
    patcher.start()
    self.addCleanup(patcher.stop)
    layer = self._KerasBn()
    with self.assertLogs('absl', 'WARNING') as logs:
      layer.FPropDefaultTheta(tf.ones([1, 4]))
    text = '\n'.join(logs.output)
    self.assertRegex(text, r"KerasLayer 'kbn' runs in training mode")
    self.assertRegex(text, r"Keras BatchNormalization '.*' \(.*said once\) "
                     r'normalises each channel over only 1 value.*'
                     r'LayerNormalization')
    with self.assertNoLogs('absl', 'WARNING'):  # once per process
      self._KerasBn().FPropDefaultTheta(tf.ones([1, 4]))

  def testKerasLayerWithoutModeDependentSublayersDoesNotWarn(self):
    dense = keras_layer.KerasLayer.Params().Set(
        name='fc', keras_factory='keras.layers.Dense',
        keras_kwargs={'units': 4}, input_shape=[4]).Instantiate()
    with self.assertNoLogs('absl', 'WARNING'):
      dense.FPropDefaultTheta(tf.ones([8, 4]))
      with py_utils.TrainingMode(True):
        self._KerasBn().FPropDefaultTheta(tf.ones([64, 4]))


class SharedDeviceWarningTest(tf.test.TestCase):

  def testDeviceGivenTwiceIsNamed(self):
    layers = [[_Fc(f'fc{k}')] for k in range(4)]
    with self.assertLogs('absl', 'WARNING') as logs:
      _Pipe(layers, num_micro_batches=2,
            devices=['/CPU:0', '/CPU:0', '/CPU:1', '/CPU:1'])
    self.assertLen(logs.output, 1)
    self.assertRegex(
        logs.output[0], r"TensorPipeLayer 'pipe': devices=\['/CPU:0', "
        r"'/CPU:0', '/CPU:1', '/CPU:1'\] names a device more than once "
        r'\(/CPU:0 for partitions 0, 1; /CPU:1 for partitions 2, 3\).*no '
        r'pipelining.*Give 4 distinct devices')

  def testDistinctDevicesDoNotWarn(self):
    layers = [[_Fc(f'fc{k}')] for k in range(4)]
    with self.assertNoLogs('absl', 'WARNING'):
      _Pipe(layers, num_micro_batches=2,
            devices=['/CPU:0', '/CPU:1', '/CPU:2', '/CPU:3'])
      _Pipe(layers, num_micro_batches=2)  # the default devices


if __name__ == '__main__':
  tf.test.main()
