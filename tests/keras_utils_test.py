"""Tests for tensorpipe.keras_utils (Keras 3 interop helpers)."""

import random

import keras
import numpy as np
import tensorflow as tf

from tensorpipe import keras_utils


class KerasUtilsTest(tf.test.TestCase):

  def testNoAllocationBuildsWithoutStorageOrPendingVariables(self):
    from keras.src.backend.common import global_state  # pylint: disable=g-import-not-at-top
    before = list(global_state.get_global_attribute(
        'uninitialized_variables', []) or [])
    with keras_utils.NoAllocation():
      model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)])
    self.assertEqual([list(w.shape) for w in model.weights], [[5, 3], [3]])
    self.assertTrue(all(w._value is None for w in model.weights))  # pylint: disable=protected-access
    self.assertEqual(list(global_state.get_global_attribute(
        'uninitialized_variables', []) or []), before)

  def testWeightOrderNamesEachWeightsLayerAndIndex(self):
    inputs = keras.Input((3,))
    shared = keras.layers.Dense(3, name='shared')
    h = shared(keras.layers.Dense(3, use_bias=False, name='first')(inputs))
    outputs = keras.layers.BatchNormalization(name='bn')(shared(h))
    model = keras.Model(inputs, outputs)
    self.assertEqual(keras_utils.WeightOrder(model), [
        ['first', 0], ['shared', 0], ['shared', 1],
        ['bn', 0], ['bn', 1], ['bn', 2], ['bn', 3]])

  def testSeededPythonRandomMakesKerasInitialWeightsReproducible(self):
    random.seed(5)
    state = random.getstate()
    weights = []
    for seed in (1, 1, 2):
      with keras_utils.SeededPythonRandom(seed):
        layer = keras.layers.Dense(4)
      layer.build((None, 3))
      weights.append(layer.kernel.numpy())
    self.assertEqual(random.getstate(), state)
    self.assertAllEqual(weights[0], weights[1])
    self.assertNotAllClose(weights[0], weights[2])

  def testCheckTextValueAcceptsConfigsAndNamesTheBadKey(self):
    layer = keras.layers.Conv2D(2, 3, name='c')
    layer.build((None, 4, 4, 1))
    keras_utils.CheckTextValue('x', 'cfg',
                               keras.saving.serialize_keras_object(layer))
    with self.assertRaisesRegex(TypeError, r"cfg\['a'\]\[1\] holds a .*"
                                'ndarray.*cannot write as text'):
      keras_utils.CheckTextValue('x', 'cfg', {'a': [1, np.zeros(2)]})
    with self.assertRaisesRegex(TypeError, 'not a finite number'):
      keras_utils.CheckTextValue('x', 'v', float('nan'))

  def testResolveFactoryAndKeras2(self):
    self.assertIs(keras_utils.ResolveFactory('x', 'keras.layers.Dense'),
                  keras.layers.Dense)
    with self.assertRaisesRegex(ValueError, 'names nothing importable'):
      keras_utils.ResolveFactory('x', 'keras.layers.Nope')
    import tf_keras  # pylint: disable=g-import-not-at-top
    self.assertTrue(keras_utils.IsKeras2(tf_keras.layers.Dense(2)))
    self.assertTrue(keras_utils.IsKeras2(tf_keras.layers.Dense))
    self.assertFalse(keras_utils.IsKeras2(keras.layers.Dense(2)))


if __name__ == '__main__':
  tf.test.main()
