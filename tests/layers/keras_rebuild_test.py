"""Tests for tensorpipe.layers.keras_rebuild (a KerasLayer's Keras object).

The rebound calls are tested through KerasLayer in keras_layer_test and
keras_theta_test; these tests pin the module's own functions.
"""

import functools

from absl.testing import absltest
import keras
import tensorflow as tf

from tensorpipe import py_utils
from tensorpipe.layers import keras_layer
from tensorpipe.layers import keras_rebuild


def _Params(**kwargs):
  return keras_layer.KerasLayer.Params().Set(**{'name': 'k', **kwargs})


class ShapesTest(absltest.TestCase):

  def testPerExampleShapeListsOneOrSeveralShapes(self):
    self.assertIsNone(keras_rebuild.PerExampleShape(_Params()))
    self.assertEqual(
        keras_rebuild.PerExampleShape(_Params(input_shape=[28, 28, 1])),
        [[28, 28, 1]])
    self.assertEqual(
        keras_rebuild.PerExampleShape(_Params(input_shape=[[3], (4, 5)])),
        [[3], [4, 5]])

  def testSymbolicInputsAddTheBatchAxis(self):
    one = keras_rebuild.SymbolicInputs([[3, 4]], 'float32')
    self.assertEqual(tuple(one.shape), (None, 3, 4))
    two = keras_rebuild.SymbolicInputs([[3], [5]], 'int32')
    self.assertEqual([tuple(t.shape) for t in two], [(None, 3), (None, 5)])
    self.assertEqual(two[1].dtype, 'int32')

  def testOwnerNamesTheLayer(self):
    self.assertEqual(keras_rebuild.Owner(_Params(name='fc1')),
                     "KerasLayer 'fc1'")


class BuildTest(absltest.TestCase):

  def testBuildKerasObjectBuildsOnInputShape(self):
    p = _Params(keras_factory='keras.layers.Dense',
                keras_kwargs={'units': 3}, input_shape=[5])
    obj = keras_rebuild.BuildKerasObject(p, seed=1)
    self.assertTrue(obj.built)
    self.assertEqual([list(w.shape) for w in obj.weights], [[5, 3], [3]])

  def testBuildKerasObjectRaisesWithoutInputShape(self):
    p = _Params(keras_factory='keras.layers.Dense', keras_kwargs={'units': 3})
    with self.assertRaisesRegex(ValueError, r"KerasLayer 'k': the Keras "
                                r'Dense .* not built and input_shape is not '
                                r'set; set input_shape'):
      keras_rebuild.BuildKerasObject(p, seed=1)

  def testDeriveStateInCallsRebindsNormalizationOnly(self):
    model = keras.Sequential([keras.Input([2]),
                              keras.layers.Normalization(),
                              keras.layers.Dense(1)])
    keras_rebuild.DeriveStateInCalls(model)
    norm, dense = model.layers
    self.assertIsInstance(norm.__dict__.get('call'), functools.partial)
    self.assertNotIn('call', dense.__dict__)


class ModeTest(absltest.TestCase):

  def testModeDependentIsBatchNormOrDropout(self):
    self.assertTrue(keras_rebuild.ModeDependent(keras.Sequential(
        [keras.Input([2]), keras.layers.Dense(2), keras.layers.Dropout(0.5)])))
    self.assertTrue(keras_rebuild.ModeDependent(
        keras.layers.BatchNormalization()))
    self.assertFalse(keras_rebuild.ModeDependent(keras.Sequential(
        [keras.Input([2]), keras.layers.Dense(2)])))

  def testWithModeReplacesARecordedTrainingAndCopies(self):
    recorded = {'training': True, 'mask': None}
    with py_utils.EvalMode():
      kwargs = keras_rebuild.WithMode(recorded, None)
    self.assertEqual(kwargs, {'training': False, 'mask': None})
    self.assertEqual(recorded, {'training': True, 'mask': None})
    with py_utils.TrainingMode(True):
      self.assertEqual(keras_rebuild.WithMode({}, 'x'), {'training': True})


if __name__ == '__main__':
  tf.test.main()
