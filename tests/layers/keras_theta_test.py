"""A KerasLayer computes with the theta it is given, not its own variables.

FProp(theta, x) maps theta onto the Keras object's weights for that call
(keras.StatelessScope). If a theta entry were dropped, the call would
silently use the layer's own variable: the outputs would still look right.
These tests change theta and check the outputs are those of the changed
weights (a NumPy oracle for Dense; for a CNN with batch norm, a twin layer
whose own variables hold the changed values), every entry reaching the
call, inside a tf.function too, and gradients with respect to theta.
"""

import numpy as np
import tensorflow as tf

from tensorpipe import py_utils
from tensorpipe import test_utils
from tensorpipe.layers import keras_layer
from tensorpipe.nested_map import NestedMap

test_utils.ConfigureTestDevices()

RTOL = test_utils.DEFAULT_RTOL[tf.float64]


def _Dense():
  return keras_layer.KerasLayer.Params().Set(
      name='fc', keras_factory='keras.layers.Dense',
      keras_kwargs=dict(units=3, dtype='float64'),
      input_shape=[4]).Instantiate()


def _Cnn(name='cnn'):
  return keras_layer.KerasLayer.Params().Set(
      name=name, keras_factory='models.keras_models.FashionMnistCnn',
      keras_kwargs=dict(filters=2, hidden_dim=4, dropout_rate=0.0,
                        num_classes=3),
      input_shape=[28, 28, 1]).Instantiate()


def _Changed(theta, seed):
  """theta with every entry changed: new random values of its shape."""
  rng = np.random.RandomState(seed)
  out = NestedMap()
  for key, value in theta.items():
    new = rng.uniform(0.5, 1.5, value.shape) if 'variance' in key else (
        rng.normal(size=value.shape))
    out[key] = tf.constant(new, value.dtype)
  return out


class KerasThetaTest(tf.test.TestCase):

  def testDenseFPropComputesWithTheGivenTheta(self):
    layer = _Dense()
    x = np.random.RandomState(1).normal(size=(5, 4))
    theta = _Changed(layer.theta, seed=2)
    want = x @ theta.kernel.numpy() + theta.bias.numpy()
    own = layer.vars.kernel.numpy()
    test_utils.AssertAllCloseScaled(self, layer.FProp(theta, x), want, RTOL)
    self.assertNotAllClose(layer.FPropDefaultTheta(x), want)
    # The call changed no variable of the layer.
    self.assertAllEqual(layer.vars.kernel.numpy(), own)

  def testThetaIsAnInputOfATracedCall(self):
    layer = _Dense()
    fn = tf.function(layer.FProp, autograph=False)
    x = tf.constant(np.random.RandomState(1).normal(size=(5, 4)))
    for seed in (2, 3):
      theta = _Changed(layer.theta, seed)
      want = x.numpy() @ theta.kernel.numpy() + theta.bias.numpy()
      test_utils.AssertAllCloseScaled(self, fn(theta, x), want, RTOL)
    self.assertEqual(fn.experimental_get_tracing_count(), 1)

  def testGradientsAreWithRespectToTheta(self):
    layer = _Dense()
    x = np.random.RandomState(1).normal(size=(5, 4))
    theta = _Changed(layer.theta, seed=2)
    with tf.GradientTape() as tape:
      tape.watch(list(theta.values()))
      loss = tf.reduce_sum(tf.square(layer.FProp(theta, x)))
    dkernel, dbias = tape.gradient(loss, [theta.kernel, theta.bias])
    y = x @ theta.kernel.numpy() + theta.bias.numpy()
    test_utils.AssertAllCloseScaled(self, dkernel, x.T @ (2 * y), RTOL)
    test_utils.AssertAllCloseScaled(self, dbias, (2 * y).sum(0), RTOL)

  def testEveryEntryOfACnnThetaReachesTheCall(self):
    layer, twin = _Cnn(), _Cnn('twin')
    self.assertEqual(sorted(layer.theta), sorted(twin.theta))
    x = tf.random.stateless_normal([2, 28, 28, 1], [4, 5])
    theta = _Changed(layer.theta, seed=6)
    for key, value in theta.items():
      twin.vars[key].assign(value)
    for mode in (py_utils.EvalMode, lambda: py_utils.TrainingMode(True)):
      with mode(), py_utils.CollectBatchStats():
        want = twin.FPropDefaultTheta(x)
        test_utils.AssertAllCloseScaled(
            self, layer.FProp(theta, x), want, test_utils.DEFAULT_RTOL[
                tf.float32])
    # Each entry alone: changing it changes the eval output (moving
    # statistics included), so none is ignored in favour of the variable.
    with py_utils.EvalMode():
      base = layer.FPropDefaultTheta(x).numpy()
      ignored = []
      for key in layer.theta:
        one = NestedMap(layer.theta)
        one[key] = theta[key]
        if np.allclose(layer.FProp(one, x).numpy(), base, rtol=1e-6,
                       atol=1e-6):
          ignored.append(key)
    self.assertEqual(ignored, [])


if __name__ == '__main__':
  tf.test.main()
