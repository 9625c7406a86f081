"""Tests of the Transformer layers (encoder, decoder, embedding, softmax)."""

import numpy as np
import tensorflow as tf

from tensorpipe import py_utils
from tensorpipe import test_utils
from tensorpipe.layers import embedding
from tensorpipe.layers import transformer
from tensorpipe.nested_map import NestedMap
from tests import weight_op_testlib

D, H, A = 8, 16, 2


NumpyAttention = test_utils.NumpyAttention


def Np(theta):
  return tf.nest.map_structure(lambda v: np.asarray(v, np.float64), theta)


def NumpyLayerNorm(t, x, eps=1e-6):
  mean = x.mean(-1, keepdims=True)
  var = x.var(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * t['scale'] + t['bias']


def NumpyFeedForward(t, x):
  h = np.maximum(x @ t['fc1']['w'] + t['fc1']['b'], 0.0)
  return h @ t['fc2']['w'] + t['fc2']['b']


def NumpyEncoderLayer(theta, x, paddings, pre_ln):
  """Reference encoder layer: self-attention + feed-forward, residual."""
  t = Np(theta)

  def Residual(block, fn):
    if pre_ln:
      return lambda v: v + fn(NumpyLayerNorm(t[block]['ln'], v))
    return lambda v: NumpyLayerNorm(t[block]['ln'], v + fn(v))

  def Atten(v):
    return NumpyAttention(t['self_atten']['atten'], v, v,
                                         paddings, A, causal=False)
  x = Residual('self_atten', Atten)(x)
  x = Residual('ff', lambda v: NumpyFeedForward(t['ff'], v))(x)
  if 'final_ln' in t:
    x = NumpyLayerNorm(t['final_ln'], x)
  return x


def LayerParams(cls, **kw):
  return cls.Params().Set(name='layer', model_dim=D, hidden_dim=H,
                          num_heads=A, **kw)


def Seq2SeqMap(rng, b=3, ls=5, lt=4):
  src_pad = np.zeros([b, ls], np.float32)
  src_pad[0, 3:] = 1.0
  tgt_pad = np.zeros([b, lt], np.float32)
  tgt_pad[1, 2:] = 1.0
  return NestedMap(
      src_vecs=tf.constant(rng.normal(size=[b, ls, D]), tf.float32),
      src_paddings=tf.constant(src_pad),
      tgt_vecs=tf.constant(rng.normal(size=[b, lt, D]), tf.float32),
      tgt_paddings=tf.constant(tgt_pad),
      tgt_labels=tf.constant(rng.randint(0, 7, size=[b, lt]), tf.int32))


def NumVars(layer):
  return sum(int(np.prod(v.shape)) for v in layer.variables)


class EncoderDecoderLayerTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.rng = np.random.RandomState(0)

  def _RandomizeNorms(self, layer):
    """LayerNorm scales and biases away from 1 / 0 so the oracle sees them."""
    for var in layer.variables:
      # Variables are named by path ('enc/ln/scale:0'): the last part.
      if var.name.split(':')[0].rsplit('/', 1)[-1] in ('scale', 'bias', 'b'):
        var.assign(self.rng.normal(size=var.shape).astype(np.float32))

  def _CheckEncoder(self, pre_ln, final_ln):
    layer = LayerParams(transformer.TransformerEncoderLayer,
                        pre_layer_norm=pre_ln,
                        final_layer_norm=final_ln).Instantiate()
    self._RandomizeNorms(layer)
    nm = Seq2SeqMap(self.rng)
    out = layer.FPropDefaultTheta(nm)
    ref = NumpyEncoderLayer(layer.theta, nm.src_vecs.numpy(),
                            nm.src_paddings.numpy(), pre_ln)
    self.assertAllClose(out.src_vecs, ref, rtol=1e-4, atol=1e-4)
    # Other keys travel through unchanged.
    for key in ('tgt_vecs', 'tgt_paddings', 'tgt_labels', 'src_paddings'):
      self.assertAllEqual(out[key], nm[key])

  def testPostLnEncoderMatchesNumpy(self):
    self._CheckEncoder(pre_ln=False, final_ln=False)

  def testPreLnEncoderWithFinalLnMatchesNumpy(self):
    self._CheckEncoder(pre_ln=True, final_ln=True)

  def testDecoderOutputIgnoresFutureTargets(self):
    for cross in (True, False):
      layer = LayerParams(transformer.TransformerDecoderLayer,
                          has_cross_attention=cross).Instantiate()
      nm = Seq2SeqMap(self.rng, lt=6)
      changed = NestedMap(nm)
      future = nm.tgt_vecs.numpy()
      future[:, 4:] += 3.0
      changed.tgt_vecs = tf.constant(future)
      out = layer.FPropDefaultTheta(nm).tgt_vecs.numpy()
      out2 = layer.FPropDefaultTheta(changed).tgt_vecs.numpy()
      self.assertAllClose(out[:, :4], out2[:, :4], rtol=1e-5, atol=1e-5)
      self.assertGreater(np.abs(out[:, 4:] - out2[:, 4:]).max(), 1e-3)

  def testDecoderAttendsToEncoderOutput(self):
    layer = LayerParams(transformer.TransformerDecoderLayer).Instantiate()
    nm = Seq2SeqMap(self.rng)
    changed = NestedMap(nm)
    changed.src_vecs = nm.src_vecs + 1.0
    out = layer.FPropDefaultTheta(nm).tgt_vecs
    out2 = layer.FPropDefaultTheta(changed).tgt_vecs
    self.assertGreater(float(tf.reduce_max(tf.abs(out - out2))), 1e-3)
    self.assertAllEqual(layer.FPropDefaultTheta(nm).src_vecs, nm.src_vecs)

  def testDropoutMasksDoNotDependOnBatchSplit(self):
    layer = LayerParams(transformer.TransformerDecoderLayer,
                        residual_dropout_prob=0.3, atten_dropout_prob=0.2,
                        relu_dropout_prob=0.4).Instantiate()
    nm = Seq2SeqMap(self.rng, b=4)
    with py_utils.StepSeed(3):
      full = layer.FPropDefaultTheta(nm).tgt_vecs
      parts = []
      for start in (0, 1, 3):
        end = {0: 1, 1: 3, 3: 4}[start]
        with py_utils.ExampleOffset(start):
          part = tf.nest.map_structure(lambda x, s=start, e=end: x[s:e], nm)
          parts.append(layer.FPropDefaultTheta(part).tgt_vecs)
      with py_utils.EvalMode():
        no_dropout = layer.FPropDefaultTheta(nm).tgt_vecs
    self.assertAllClose(full, tf.concat(parts, 0), rtol=1e-6, atol=1e-6)
    self.assertGreater(float(tf.reduce_max(tf.abs(full - no_dropout))), 1e-2)

  def testFPropMetaMatchesLayers(self):
    nm = Seq2SeqMap(self.rng)
    shapes = tf.nest.map_structure(lambda x: x.shape, nm)
    for cls, kw in ((transformer.TransformerEncoderLayer, {}),
                    (transformer.TransformerEncoderLayer,
                     dict(pre_layer_norm=True, final_layer_norm=True)),
                    (transformer.TransformerDecoderLayer, {}),
                    (transformer.TransformerDecoderLayer,
                     dict(has_cross_attention=False))):
      p = LayerParams(cls, **kw)
      layer = p.Instantiate()
      meta = cls.FPropMeta(p, shapes)
      self.assertEqual(meta.num_params, NumVars(layer), msg=(cls, kw))
      out = layer.FPropDefaultTheta(nm)
      self.assertEqual(
          {k: v.as_list() for k, v in meta.out_shapes[0].items()},
          {k: v.shape.as_list() for k, v in out.items()})
      self.assertGreater(meta.flops, 2 * 3 * 5 * D * H)

  def testEveryWeightMatmulIsAWeightOp(self):
    """A decoder layer's 10 weight matmuls (self- and cross-attention
    projections, the feed-forward's two FC layers) go through
    py_utils.WeightOp; I then W gives the tape's bits (LayerNorm weights and
    biases in I)."""
    layer = LayerParams(transformer.TransformerDecoderLayer).Instantiate()
    self._RandomizeNorms(layer)
    weight_op_testlib.AssertWeightOpsSplit(
        self, layer, [Seq2SeqMap(self.rng)],
        [f'{block}.atten.{w}' for block in ('self_atten', 'cross_atten')
         for w in ('wq', 'wk', 'wv', 'wo')] + ['ff.fc1.w', 'ff.fc2.w'])

  def testMissingKeysRaise(self):
    layer = LayerParams(transformer.TransformerDecoderLayer).Instantiate()
    nm = Seq2SeqMap(self.rng)
    del nm['src_vecs']
    with self.assertRaisesRegex(ValueError, 'src_vecs'):
      layer.FPropDefaultTheta(nm)


class EmbeddingTest(tf.test.TestCase):

  def testPositionalEncodingFormula(self):
    pe = embedding.PositionalEncoding(7, 6)
    pos, i = 5, 2
    self.assertAllClose(pe[pos, 2 * i], np.sin(pos / 10000**(2 * i / 6)))
    self.assertAllClose(pe[pos, 2 * i + 1], np.cos(pos / 10000**(2 * i / 6)))
    self.assertAllClose(pe[0, 1::2], np.ones(3))

  def testEmbeddingScalesAndHasDenseGradient(self):
    p = embedding.EmbeddingLayer.Params().Set(name='emb', vocab_size=5,
                                              embedding_dim=4)
    layer = p.Instantiate()
    ids = tf.constant([[1, 3, 1]])
    with tf.GradientTape() as tape:
      theta = layer.theta
      y = layer.FProp(theta, ids)
      loss = tf.reduce_sum(y)
    table = layer.vars.emb.numpy()
    self.assertAllClose(y[0], table[[1, 3, 1]] * 2.0)
    grad = tape.gradient(loss, layer.vars.emb)
    self.assertIsInstance(grad, tf.Tensor)  # dense, not IndexedSlices
    expected = np.zeros([5, 4])
    expected[1], expected[3] = 4.0, 2.0
    self.assertAllClose(grad, expected)

  def testTransformerEmbeddingLayer(self):
    for shared, mode in ((True, 'seq2seq'), (False, 'seq2seq'),
                         (False, 'lm')):
      p = embedding.TransformerEmbeddingLayer.Params().Set(
          name='emb', vocab_size=11, model_dim=D, mode=mode,
          shared_embeddings=shared, max_len=8)
      layer = p.Instantiate()
      if mode == 'lm':
        batch = NestedMap(ids=tf.constant([[1, 2, 3]]),
                          labels=tf.constant([[2, 3, 4]]),
                          paddings=tf.constant([[0., 0., 1.]]))
      else:
        batch = NestedMap(src_ids=tf.constant([[1, 2]]),
                          src_paddings=tf.constant([[0., 0.]]),
                          tgt_ids=tf.constant([[1, 2, 3]]),
                          tgt_labels=tf.constant([[2, 3, 4]]),
                          tgt_paddings=tf.constant([[0., 0., 1.]]))
      out = layer.FPropDefaultTheta(batch)
      shapes = tf.nest.map_structure(lambda x: x.shape, batch)
      meta = p.cls.FPropMeta(p, shapes)
      self.assertEqual(meta.num_params, NumVars(layer))
      self.assertEqual(sorted(meta.out_shapes[0]), sorted(out))
      table = layer.theta.emb.emb if shared else layer.theta.tgt_emb.emb
      expected = (table.numpy()[[1, 2, 3]] * np.sqrt(D) +
                  embedding.PositionalEncoding(3, D))
      self.assertAllClose(out.tgt_vecs[0], expected, rtol=1e-5, atol=1e-5)
      self.assertEqual(out.tgt_labels.dtype, tf.int32)

  def testTooLongInputRaises(self):
    p = embedding.TransformerEmbeddingLayer.Params().Set(
        name='emb', vocab_size=11, model_dim=D, mode='lm', max_len=2)
    with self.assertRaisesRegex(ValueError, 'max_len=2'):
      p.cls.FPropMeta(p, dict(ids=[1, 3], labels=[1, 3], paddings=[1, 3]))


class SequenceSoftmaxLayerTest(tf.test.TestCase):

  def testLabelSmoothedLossOverRealTokensMatchesNumpy(self):
    rng = np.random.RandomState(5)
    v, s = 7, 0.1
    p = transformer.SequenceSoftmaxLayer.Params().Set(
        name='softmax', input_dim=D, vocab_size=v, label_smoothing=s)
    layer = p.Instantiate()
    nm = Seq2SeqMap(rng)
    out = layer.FPropDefaultTheta(nm)
    t = Np(layer.theta)
    logits = nm.tgt_vecs.numpy() @ t['logits']['w'] + t['logits']['b']
    logits -= logits.max(-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    targets = np.eye(v)[nm.tgt_labels.numpy()] * (1 - s) + s / v
    xent = -(targets * log_probs).sum(-1)
    weights = 1.0 - nm.tgt_paddings.numpy()
    self.assertAllClose(out.per_example_loss, (xent * weights).sum(1),
                        rtol=1e-5)
    self.assertAllClose(out.per_example_tokens, weights.sum(1))
    nll = -np.take_along_axis(log_probs, nm.tgt_labels.numpy()[..., None],
                              -1)[..., 0]
    self.assertAllClose(out.per_example_log_pplx, (nll * weights).sum(1),
                        rtol=1e-5)
    self.assertNotAllClose(out.per_example_log_pplx, out.per_example_loss)
    correct = (log_probs.argmax(-1) == nm.tgt_labels.numpy()) * weights
    self.assertAllClose(out.per_example_correct, correct.sum(1))
    self.assertAllClose(transformer.MeanTokenLoss(out),
                        (xent * weights).sum() / weights.sum(), rtol=1e-5)
    meta = p.cls.FPropMeta(p, tf.nest.map_structure(lambda x: x.shape, nm))
    self.assertEqual(meta.num_params, NumVars(layer))
    self.assertEqual(meta.out_shapes[0].per_example_loss.as_list(), [3])

  def testFloat64LossMatchesNumpyInFloat64(self):
    # float32 logits or sums would be off by ~1e-7 relative, 1e3 times the
    # tolerance.
    rng = np.random.RandomState(6)
    v, s = 7, 0.2
    layer = transformer.SequenceSoftmaxLayer.Params().Set(
        name='softmax', input_dim=D, vocab_size=v, label_smoothing=s,
        dtype=tf.float64).Instantiate()
    nm = Seq2SeqMap(rng)
    nm.tgt_vecs = tf.constant(rng.normal(size=[3, 4, D]) * 3.0)
    out = layer.FPropDefaultTheta(nm)
    self.assertEqual({k: t.dtype for k, t in out.items()},
                     {k: tf.float64 for k in out})
    t = Np(layer.theta)
    logits = nm.tgt_vecs.numpy() @ t['logits']['w'] + t['logits']['b']
    logits -= logits.max(-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    labels = nm.tgt_labels.numpy()
    targets = np.eye(v)[labels] * (1 - s) + s / v
    weights = 1.0 - nm.tgt_paddings.numpy().astype(np.float64)
    want = (-(targets * log_probs).sum(-1) * weights).sum(1)
    rtol = 1e-10
    test_utils.AssertAllCloseScaled(self, out.per_example_loss, want, rtol)
    nll = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    test_utils.AssertAllCloseScaled(self, out.per_example_log_pplx,
                                    (nll * weights).sum(1), rtol)
    self.assertAllEqual(out.per_example_tokens, weights.sum(1))
    test_utils.AssertAllCloseScaled(
        self, transformer.MeanTokenLoss(out), want.sum() / weights.sum(), rtol)
    # A float32 layer's sums stay float32.
    out32 = transformer.SequenceSoftmaxLayer.Params().Set(
        name='softmax', input_dim=D, vocab_size=v).Instantiate(
        ).FPropDefaultTheta(Seq2SeqMap(rng))
    self.assertEqual({k: t.dtype for k, t in out32.items()},
                     {k: tf.float32 for k in out32})


if __name__ == '__main__':
  tf.test.main()
