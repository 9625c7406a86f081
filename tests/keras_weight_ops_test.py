"""Tests for tensorpipe.keras_weight_ops (Keras kernels as WeightOps).

Each entry of the table, on the pinned Keras: the routed call equals Keras'
own `call` bit for bit (outputs, input gradient, every weight gradient),
and its I-then-W replay equals the unsplit tape bit for bit
(weight_op_testlib). Subclasses, quantized and LoRA layers are not routed;
the calls live on the pipeline's own objects only.
"""

import keras
import tensorflow as tf

from tensorpipe import keras_weight_ops
from tensorpipe import py_utils
from tensorpipe import test_utils
from tensorpipe.layers import keras_layer
from tensorpipe.nested_map import NestedMap
from tests import weight_op_testlib

test_utils.ConfigureTestDevices()


def _Built(layer, input_shape, dtype='float32'):
  """`layer` built and called once on symbolic inputs of `input_shape`."""
  layer(keras.KerasTensor([None] + list(input_shape), dtype=dtype))
  return layer


def _Pipelined(layer):
  """A KerasLayer made from `layer`'s config, holding its weights."""
  tp = keras_layer.KerasLayer.Params().Set(
      name='k', keras_config=keras.saving.serialize_keras_object(
          layer)).Instantiate()
  tp.AssignFromKeras(layer)
  return tp


def _WeightedSum(out):
  """A loss whose gradient differs from element to element."""
  outs = [o for o in tf.nest.flatten(out) if o.dtype.is_floating]
  return tf.add_n([tf.reduce_sum(
      tf.cast(o, tf.float32) * tf.random.stateless_normal(tf.shape(o), [i, 3]))
                   for i, o in enumerate(outs)])


def _KerasCall(layer, flat, x, kwargs):
  """Keras' own call of the user's (unrouted) layer on `flat` weights, as
  KerasLayer.CallKeras makes it: __call__ (autocast included) in a
  StatelessScope."""
  with keras.StatelessScope(state_mapping=list(zip(layer.weights, flat))):
    return layer(x, **kwargs)


class RoutedCallEqualsKerasTest(tf.test.TestCase):

  def _AssertEqualsKeras(self, layer, x, op_weights, kwargs=None):
    """The routed KerasLayer against Keras' own call of `layer` on the
    same tensors: outputs, dx and dw bit for bit; the I/W split of the
    routed call against its unsplit tape."""
    kwargs = kwargs or {}
    tp = _Pipelined(layer)
    self.assertIsNotNone(keras_weight_ops.RoutedCall(tp.keras_object))
    keys = [key for _, key in tp.KerasWeights()]
    flat = [tf.convert_to_tensor(tp.theta[k]) for k in keys]
    floating = x.dtype.is_floating

    def Grads(fn):
      with tf.GradientTape() as tape:
        tape.watch(flat)
        if floating:
          tape.watch(x)
        out = fn()
        loss = _WeightedSum(out)
      return out, tape.gradient(loss, ([x] if floating else []) + flat)

    with py_utils.TrainingMode(True):
      # All weights of these layers are trainable, in `weights` order.
      self.assertLen(layer.trainable_variables, len(flat))
      want_out, want = Grads(lambda: _KerasCall(layer, flat, x, kwargs))
      with py_utils.CollectWeightOps() as calls:
        got_out, got = Grads(lambda: tp.CallKeras(
            NestedMap(zip(keys, flat)), (x,), dict(kwargs)))
      self.assertLen(calls, len(op_weights))
      self.assertAllEqual(want_out, got_out)
      for a, b in zip(want, got):
        if a is None:  # a weight the call does not use
          self.assertIsNone(b)
          continue
        self.assertAllEqual(tf.convert_to_tensor(a), tf.convert_to_tensor(b))
        self.assertGreater(float(tf.reduce_max(tf.abs(
            tf.cast(tf.convert_to_tensor(a), tf.float32)))), 0.0)
      return weight_op_testlib.AssertWeightOpsSplit(
          self, tp, [x], op_weights,
          fprop=lambda theta, x: tp.CallKeras(theta, (x,), dict(kwargs)))

  def testDense(self):
    layer = _Built(keras.layers.Dense(5, activation='gelu'), [3, 4])
    x = tf.random.stateless_normal([6, 3, 4], [1, 2])
    calls = self._AssertEqualsKeras(layer, x, ['kernel'])
    self.assertEqual(calls[0].x.shape, [6, 3, 4])

  def testDenseUnderMixedPrecisionCastsInsideTheOp(self):
    """The weight op gets the float32 theta; Keras' autocast to bfloat16
    happens inside fn, as Keras does it."""
    layer = _Built(keras.layers.Dense(5, dtype='mixed_bfloat16'), [4])
    x = tf.random.stateless_normal([6, 4], [1, 2])
    calls = self._AssertEqualsKeras(layer, tf.cast(x, tf.bfloat16),
                                    ['kernel'])
    self.assertEqual(calls[0].w.dtype, tf.float32)
    self.assertEqual(calls[0].z.dtype, tf.bfloat16)

  def testEinsumDense(self):
    layer = _Built(keras.layers.EinsumDense(
        'abc,cde->abde', output_shape=(None, 2, 3), bias_axes='de'), [5, 4])
    self._AssertEqualsKeras(layer, tf.random.stateless_normal(
        [2, 5, 4], [3, 4]), ['kernel'])

  def testConv1DCausal(self):
    layer = _Built(keras.layers.Conv1D(3, 3, padding='causal',
                                       dilation_rate=2), [7, 2])
    self._AssertEqualsKeras(layer, tf.random.stateless_normal(
        [2, 7, 2], [5, 6]), ['kernel'])

  def testConv2D(self):
    layer = _Built(keras.layers.Conv2D(4, (3, 2), strides=2, padding='same',
                                       activation='relu'), [6, 6, 2])
    self._AssertEqualsKeras(layer, tf.random.stateless_normal(
        [2, 6, 6, 2], [7, 8]), ['kernel'])

  def testConv3D(self):
    layer = _Built(keras.layers.Conv3D(2, 2, use_bias=False), [3, 4, 4, 1])
    self._AssertEqualsKeras(layer, tf.random.stateless_normal(
        [2, 3, 4, 4, 1], [9, 1]), ['kernel'])

  def testReversibleEmbeddingLookup(self):
    layer = _Built(keras.layers.ReversibleEmbedding(11, 4), [5], 'int32')
    ids = tf.random.stateless_uniform([3, 5], [1, 1], maxval=11,
                                      dtype=tf.int32)
    self._AssertEqualsKeras(layer, ids, ['embeddings'])

  def testReversibleEmbeddingReverseTied(self):
    layer = _Built(keras.layers.ReversibleEmbedding(
        11, 4, logit_soft_cap=5.0), [5], 'int32')
    self._AssertEqualsKeras(layer, tf.random.stateless_normal(
        [3, 5, 4], [2, 2]), ['embeddings'], {'reverse': True})

  def testReversibleEmbeddingReverseUntiedInFloat32(self):
    layer = _Built(keras.layers.ReversibleEmbedding(
        11, 4, tie_weights=False, reverse_dtype='float32',
        dtype='mixed_bfloat16'), [5], 'int32')
    calls = self._AssertEqualsKeras(
        layer, tf.cast(tf.random.stateless_normal([3, 5, 4], [2, 2]),
                       tf.bfloat16), ['reverse_embeddings'],
        {'reverse': True})
    self.assertEqual(calls[0].z.dtype, tf.float32)

  def testReversibleEmbeddingBothDirectionsShareTheTable(self):
    """A tied table used twice in one call: both uses are weight ops, so
    the I cell loses no share of its gradient."""
    layer = _Built(keras.layers.ReversibleEmbedding(11, 4), [5], 'int32')
    tp = _Pipelined(layer)
    ids = tf.random.stateless_uniform([3, 5], [1, 1], maxval=11,
                                      dtype=tf.int32)

    def FProp(theta, ids):
      h = tp.CallKeras(theta, (ids,), {})
      return tp.CallKeras(theta, (tf.tanh(h),), {'reverse': True})
    weight_op_testlib.AssertWeightOpsSplit(
        self, tp, [ids], ['embeddings', 'embeddings'], fprop=FProp)


class NotRoutedTest(tf.test.TestCase):

  def testSubclassKeepsKerasCall(self):

    class MyDense(keras.layers.Dense):
      pass

    layer = _Built(MyDense(3), [4])
    self.assertIsNone(keras_weight_ops.RoutedCall(layer))
    self.assertEqual(keras_weight_ops.RouteWeightOps(layer), [])
    self.assertNotIn('call', vars(layer))

  def testQuantizedAndLoraLayersKeepKerasCall(self):
    quantized = _Built(keras.layers.Dense(3), [4])
    quantized.quantize('int8')
    lora = _Built(keras.layers.EinsumDense('ab,bc->ac', output_shape=3),
                  [4])
    lora.enable_lora(2)
    for layer in (quantized, lora):
      self.assertIsNone(keras_weight_ops.RoutedCall(layer), layer.name)
    self.assertIsNotNone(keras_weight_ops.RoutedCall(
        _Built(keras.layers.Dense(3), [4])))

  def testInstalledOnThePipelinesObjectOnly(self):
    """The user's layer and Keras' class keep their call; the KerasLayer's
    own sublayers get the routed one."""
    inp = keras.Input((4,))
    model = keras.Model(inp, keras.layers.Dense(2)(keras.layers.Dense(3)(
        inp)))
    tp = keras_layer.KerasLayer.Params().Set(
        name='m', keras_config=keras.saving.serialize_keras_object(
            model)).Instantiate()
    for layer in model.layers:
      self.assertNotIn('call', vars(layer))
    self.assertEqual(keras.layers.Dense.call.__module__,
                     'keras.src.layers.core.dense')
    dense = [l for l in tp.keras_object.layers
             if isinstance(l, keras.layers.Dense)]
    self.assertLen(dense, 2)
    for layer in dense:
      self.assertIn('call', vars(layer))

  def testPlainKerasCallOutsideStatelessScopeIsKeras(self):
    """Outside a StatelessScope that maps the kernel, the routed call runs
    Keras' own (no weight op)."""
    tp = _Pipelined(_Built(keras.layers.Dense(3), [4]))
    x = tf.ones([2, 4])
    with py_utils.CollectWeightOps() as calls:
      y = tp.keras_object(x)
    self.assertEqual(calls, [])
    self.assertAllEqual(y, tf.matmul(x, tp.vars.kernel) + tp.vars.bias)


if __name__ == '__main__':
  tf.test.main()
