"""Tests of MultiHeadedAttention against a NumPy oracle, with masks."""

import numpy as np
import tensorflow as tf

from tensorpipe import py_utils
from tensorpipe import test_utils
from tensorpipe.layers import attention
from tests import weight_op_testlib


NumpyAttention = test_utils.NumpyAttention


def Layer(causal=False, dim=8, heads=2, **kw):
  return attention.MultiHeadedAttention.Params().Set(
      name='atten', input_dim=dim, num_heads=heads, causal=causal,
      **kw).Instantiate()


def RandomBiases(layer, seed=0):
  """Non-zero biases so that the oracle checks them too."""
  rng = np.random.RandomState(seed)
  for name in ('bq', 'bk', 'bv', 'bo'):
    var = layer.vars[name]
    var.assign(rng.normal(size=var.shape).astype(np.float32))


class MultiHeadedAttentionTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.rng = np.random.RandomState(1)

  def _Inputs(self, b=3, lq=5, lk=4, d=8):
    query = self.rng.normal(size=[b, lq, d]).astype(np.float32)
    source = self.rng.normal(size=[b, lk, d]).astype(np.float32)
    paddings = np.zeros([b, lk], np.float32)
    paddings[0, 2:] = 1.0
    paddings[2, 3:] = 1.0
    return query, source, paddings

  def testSelfAttentionWithPaddingsMatchesNumpy(self):
    layer = Layer()
    RandomBiases(layer)
    x, _, _ = self._Inputs(lq=4)
    paddings = np.zeros([3, 4], np.float32)
    paddings[1, 1:] = 1.0
    out = layer.FPropDefaultTheta(tf.constant(x), None, tf.constant(paddings))
    ref = NumpyAttention(layer.theta, x, x, paddings, 2, causal=False)
    self.assertAllClose(out, ref, rtol=1e-5, atol=1e-5)

  def testCrossAttentionWithPaddingsMatchesNumpy(self):
    layer = Layer(heads=4)
    RandomBiases(layer, seed=2)
    q, s, paddings = self._Inputs()
    out = layer.FPropDefaultTheta(tf.constant(q), tf.constant(s),
                                  tf.constant(paddings))
    ref = NumpyAttention(layer.theta, q, s, paddings, 4, causal=False)
    self.assertAllClose(out, ref, rtol=1e-5, atol=1e-5)

  def testCausalSelfAttentionMatchesNumpy(self):
    layer = Layer(causal=True)
    RandomBiases(layer, seed=3)
    x, _, _ = self._Inputs(lq=6)
    paddings = np.zeros([3, 6], np.float32)
    paddings[0, 4:] = 1.0
    out = layer.FPropDefaultTheta(tf.constant(x), None, tf.constant(paddings))
    ref = NumpyAttention(layer.theta, x, x, paddings, 2, causal=True)
    self.assertAllClose(out, ref, rtol=1e-5, atol=1e-5)

  def testFloat64LayerComputesInFloat64(self):
    """A float64 layer's logits and softmax are float64 (rtol 1e-12 of a
    float64 NumPy oracle; float32 logits are off by ~1e-7); a float32
    layer keeps float32 ones."""
    layer = Layer(causal=True, dtype=tf.float64)
    rng = np.random.RandomState(4)
    for var in layer.vars.Flatten():
      var.assign(rng.normal(size=var.shape))
    x, _, _ = self._Inputs(lq=6)
    x = x.astype(np.float64) + 1e-3 * rng.normal(size=x.shape)
    paddings = np.zeros([3, 6])
    paddings[1, 3:] = 1.0
    out = layer.FPropDefaultTheta(tf.constant(x), None, tf.constant(paddings))
    self.assertEqual(out.dtype, tf.float64)
    ref = NumpyAttention(layer.theta, x, x, paddings, 2, causal=True)
    self.assertAllClose(out, ref, rtol=1e-12, atol=1e-12)

  def testCausalOutputIgnoresFutureTokens(self):
    layer = Layer(causal=True)
    x, _, _ = self._Inputs(lq=6)
    changed = x.copy()
    changed[:, 3:] = self.rng.normal(size=changed[:, 3:].shape)
    out = layer.FPropDefaultTheta(tf.constant(x)).numpy()
    out2 = layer.FPropDefaultTheta(tf.constant(changed)).numpy()
    self.assertAllClose(out[:, :3], out2[:, :3], rtol=1e-6, atol=1e-6)
    # The later positions do see the change (the test can fail).
    self.assertGreater(np.abs(out[:, 3:] - out2[:, 3:]).max(), 1e-3)

  def testPaddedSourcePositionsDoNotMatter(self):
    layer = Layer()
    q, s, paddings = self._Inputs()
    changed = s.copy()
    changed[paddings > 0] = 100.0
    out = layer.FPropDefaultTheta(tf.constant(q), tf.constant(s),
                                  tf.constant(paddings))
    out2 = layer.FPropDefaultTheta(tf.constant(q), tf.constant(changed),
                                   tf.constant(paddings))
    self.assertAllClose(out, out2, rtol=1e-6, atol=1e-6)

  def testAttentionDropoutIsPerExample(self):
    layer = Layer(atten_dropout_prob=0.5)
    q, s, paddings = self._Inputs(b=4)
    q, s, paddings = tf.constant(q), tf.constant(s), tf.constant(paddings)
    with py_utils.StepSeed(7):
      full = layer.FPropDefaultTheta(q, s, paddings)
      halves = []
      for offset in (0, 2):
        with py_utils.ExampleOffset(offset):
          halves.append(layer.FPropDefaultTheta(
              q[offset:offset + 2], s[offset:offset + 2],
              paddings[offset:offset + 2]))
      with py_utils.EvalMode():
        no_dropout = layer.FPropDefaultTheta(q, s, paddings)
    self.assertAllClose(full, tf.concat(halves, 0), rtol=1e-6, atol=1e-6)
    self.assertGreater(float(tf.reduce_max(tf.abs(full - no_dropout))), 1e-3)

  def testProjectionsAreWeightOpsThatSplitBitForBit(self):
    """The four projections go through py_utils.WeightOp (zero-bubble I/W):
    each the same 2-D matmul as before; I then W gives the tape's bits."""
    layer = Layer()
    RandomBiases(layer)
    q, s, paddings = map(tf.constant, self._Inputs())
    calls = weight_op_testlib.AssertWeightOpsSplit(
        self, layer, [q, s, paddings], ['wq', 'wk', 'wv', 'wo'])
    for call, x, w in zip(calls, (q, s, s), ('wq', 'wk', 'wv')):
      self.assertAllEqual(call.z, tf.matmul(tf.reshape(x, [-1, 8]),
                                            layer.vars[w]))

  def testFPropMetaMatchesLayer(self):
    p = attention.MultiHeadedAttention.Params().Set(
        name='atten', input_dim=8, num_heads=2, hidden_dim=12)
    layer = p.Instantiate()
    meta = p.cls.FPropMeta(p, tf.TensorShape([3, 5, 8]),
                           tf.TensorShape([3, 4, 8]), tf.TensorShape([3, 4]))
    num_vars = sum(int(np.prod(v.shape)) for v in layer.trainable_variables)
    self.assertEqual(meta.num_params, num_vars)
    q, s, paddings = self._Inputs()
    out = layer.FPropDefaultTheta(tf.constant(q), tf.constant(s),
                                  tf.constant(paddings))
    self.assertEqual(meta.out_shapes[0].as_list(), out.shape.as_list())
    # Dominant terms: projections 2*(15*8*12*2 + 12*8*12*2) and attention.
    self.assertGreater(meta.flops, 2 * (15 + 12) * 8 * 12 * 2)

  def testRejectsHeadsNotDividingHiddenDim(self):
    with self.assertRaisesRegex(ValueError, r'num_heads=3'):
      Layer(dim=8, heads=3)

  def testCausalCrossAttentionWithOtherLengthRaises(self):
    layer = Layer(causal=True)
    q, s, _ = self._Inputs(lq=5, lk=4)
    with self.assertRaisesRegex(ValueError, 'causal=True'):
      layer.FPropDefaultTheta(tf.constant(q), tf.constant(s))


if __name__ == '__main__':
  tf.test.main()
