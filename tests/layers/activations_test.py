"""Tests for tensorpipe.layers.activations against NumPy formulas."""

import math

import numpy as np
import tensorflow as tf

from tensorpipe.layers import activations


class ActivationsTest(tf.test.TestCase):

  def testNamesMatchNumpyFormulas(self):
    x = np.linspace(-8.0, 8.0, 17).astype(np.float32)
    sigmoid = 1.0 / (1.0 + np.exp(-x))
    erf = np.vectorize(math.erf)
    expected = {'NONE': x, 'RELU': np.maximum(x, 0.0),
                'RELU6': np.clip(x, 0.0, 6.0), 'SIGMOID': sigmoid,
                'TANH': np.tanh(x),
                'GELU': 0.5 * x * (1.0 + erf(x / math.sqrt(2.0))),
                'SWISH': x * sigmoid}
    self.assertCountEqual(expected, activations.NAMES)
    for name, value in expected.items():
      with self.subTest(name=name):
        self.assertAllClose(value, activations.GetActivation(name)(x),
                            atol=1e-6)
        self.assertAllClose(value, activations.GetActivation(name.lower())(x),
                            atol=1e-6)

  def testUnknownNameListsValidNames(self):
    with self.assertRaisesRegex(ValueError, r"'LEAKY'.*'RELU6'"):
      activations.GetActivation('LEAKY')

  def testActivationLayerAndFlops(self):
    p = activations.ActivationLayer.Params().Set(name='act', activation='TANH')
    x = tf.random.stateless_normal([2, 3], [1, 0])
    self.assertAllClose(tf.tanh(x), p.Instantiate().FPropDefaultTheta(x))
    meta = activations.ActivationLayer.FPropMeta(p, x.shape)
    self.assertEqual(6 * activations.ActivationFlops('TANH'), meta.flops)
    self.assertGreater(meta.flops, 0)
    self.assertEqual(0, activations.ActivationFlops('NONE'))


if __name__ == '__main__':
  tf.test.main()
