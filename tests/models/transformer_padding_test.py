"""Transformer padding masks in cross-attention: decoder layer and model.

- A decoder layer with source paddings equals a NumPy decoder built on
  test_utils.NumpyAttention (post-LN and pre-LN).
- Padded source positions get zero attention weight: the decoder's output
  has an exactly zero gradient with respect to them, and changing them
  changes nothing.
- In the pipelined translation model, changing the padded source tokens
  changes no loss; changing a real source token does.
"""

import numpy as np
import tensorflow as tf

import tensorpipe
from models import transformer as transformer_model
from tensorpipe import py_utils
from tensorpipe import test_utils
from tensorpipe.layers import transformer
from tensorpipe.nested_map import NestedMap

test_utils.ConfigureTestDevices()

D, H, A = 8, 16, 2
B, LS, LT = 3, 6, 4


def _Np(theta):
  return tf.nest.map_structure(lambda v: np.asarray(v, np.float64), theta)


def _LayerNorm(t, x, eps=1e-6):
  return ((x - x.mean(-1, keepdims=True)) /
          np.sqrt(x.var(-1, keepdims=True) + eps) * t['scale'] + t['bias'])


def _NumpyDecoderLayer(theta, tgt, tgt_paddings, src, src_paddings, pre_ln):
  """Causal self-attention, cross-attention to src, feed-forward."""
  t = _Np(theta)

  def Block(name, fn, x):
    if pre_ln:
      return x + fn(_LayerNorm(t[name]['ln'], x))
    return _LayerNorm(t[name]['ln'], x + fn(x))

  def FeedForward(x):
    ff = t['ff']
    h = np.maximum(x @ ff['fc1']['w'] + ff['fc1']['b'], 0.0)
    return h @ ff['fc2']['w'] + ff['fc2']['b']

  x = Block('self_atten', lambda q: test_utils.NumpyAttention(
      t['self_atten']['atten'], q, q, tgt_paddings, A, causal=True), tgt)
  x = Block('cross_atten', lambda q: test_utils.NumpyAttention(
      t['cross_atten']['atten'], q, src, src_paddings, A, causal=False), x)
  x = Block('ff', FeedForward, x)
  if 'final_ln' in t:
    x = _LayerNorm(t['final_ln'], x)
  return x


def _DecoderInput(rng):
  src_paddings = np.zeros([B, LS])
  src_paddings[0, 2:] = 1.0   # 2 real source positions
  src_paddings[2, 5:] = 1.0
  tgt_paddings = np.zeros([B, LT])
  tgt_paddings[1, 3:] = 1.0
  return NestedMap(
      src_vecs=tf.constant(rng.normal(size=[B, LS, D])),
      src_paddings=tf.constant(src_paddings),
      tgt_vecs=tf.constant(rng.normal(size=[B, LT, D])),
      tgt_paddings=tf.constant(tgt_paddings))


def _Decoder(rng, **kwargs):
  layer = transformer.TransformerDecoderLayer.Params().Set(
      name='dec', model_dim=D, hidden_dim=H, num_heads=A, dtype=tf.float64,
      **kwargs).Instantiate()
  for var in layer.variables:
    # Non-trivial biases and layer-norm parameters: the oracle sees them.
    var.assign(rng.normal(size=var.shape) * (0.5 if var.shape.rank > 1
                                              else 1.0))
  return layer


class DecoderCrossAttentionTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.rng = np.random.RandomState(0)

  def testDecoderLayerWithSourcePaddingsMatchesNumpy(self):
    for pre_ln in (False, True):
      with self.subTest(pre_ln=pre_ln):
        layer = _Decoder(self.rng, pre_layer_norm=pre_ln,
                         final_layer_norm=pre_ln)
        nm = _DecoderInput(self.rng)
        with py_utils.EvalMode():
          out = layer.FPropDefaultTheta(nm).tgt_vecs.numpy()
        args = (layer.theta, nm.tgt_vecs.numpy(), nm.tgt_paddings.numpy(),
                nm.src_vecs.numpy())
        want = _NumpyDecoderLayer(*args, nm.src_paddings.numpy(), pre_ln)
        # The layer runs in float64 but its attention probabilities are
        # float32 (eps 6e-8): sums of ~100 such terms, so 1e-5 of the
        # outputs' scale.
        test_utils.AssertAllCloseScaled(self, out, want, 1e-5)
        # The source paddings matter here: ignoring them is far off.
        unmasked = _NumpyDecoderLayer(*args, np.zeros([B, LS]), pre_ln)
        self.assertGreater(np.abs(unmasked - want).max(), 1e-2)

  def testPaddedSourcePositionsGetZeroAttentionWeight(self):
    layer = _Decoder(self.rng)
    nm = _DecoderInput(self.rng)
    weights = tf.constant(self.rng.normal(size=[B, LT, D]))

    @tf.function(autograph=False)
    def OutputAndSourceGrad(src_vecs):
      inputs = NestedMap(nm, src_vecs=src_vecs)
      with tf.GradientTape() as tape:
        tape.watch(src_vecs)
        out = layer.FPropDefaultTheta(inputs).tgt_vecs
        loss = tf.reduce_sum(out * weights)
      return out, tape.gradient(loss, src_vecs)

    padded = nm.src_paddings.numpy() > 0
    with py_utils.EvalMode():
      out, grad = OutputAndSourceGrad(nm.src_vecs)
      changed = nm.src_vecs.numpy().copy()
      changed[padded] = 100.0 + self.rng.normal(size=changed[padded].shape)
      out2, _ = OutputAndSourceGrad(tf.constant(changed))
    grad = grad.numpy()
    # Zero weight: no gradient flows to a padded position, exactly...
    self.assertAllEqual(grad[padded], np.zeros_like(grad[padded]))
    self.assertTrue(np.all(np.abs(grad[~padded]).max(-1) > 0))
    # ...and what is there does not change the output (bitwise).
    self.assertAllEqual(out2, out)


def _TranslationBatch(rng, vocab):
  lengths = np.array([2, 6, 4, 1, 5, 3, 6, 2])
  src_paddings = (np.arange(LS)[None] >= lengths[:, None]).astype(np.float32)
  tgt_lengths = rng.randint(1, LT + 1, size=[8, 1])
  tgt_paddings = (np.arange(LT)[None] >= tgt_lengths).astype(np.float32)
  return NestedMap(
      src_ids=rng.randint(3, vocab, [8, LS]).astype(np.int32),
      src_paddings=src_paddings,
      tgt_ids=rng.randint(3, vocab, [8, LT]).astype(np.int32),
      tgt_labels=rng.randint(3, vocab, [8, LT]).astype(np.int32),
      tgt_paddings=tgt_paddings)


class TranslationModelPaddingTest(tf.test.TestCase):

  def testPaddedSourceTokensDoNotChangeThePipelinedModelsLoss(self):
    vocab = 30
    pipe = tensorpipe.TensorPipeLayer.Params().Set(
        name='TensorPipe', num_partitions=2, num_micro_batches=2,
        layers=transformer_model.TransformerLayers(
            num_layers=1, hidden_dim=16, num_heads=2, model_dim=8,
            vocab_size=vocab, max_len=8, dropout=0.1),
        input_shapes=transformer_model.TranslationInputShapes(8, LS, LT)
    ).Instantiate()

    @tf.function(autograph=False)
    def PerExampleLoss(batch):
      with py_utils.TrainingMode(True), py_utils.StepSeed(3):
        return pipe.FPropDefaultTheta(batch).per_example_loss

    rng = np.random.RandomState(4)
    batch = _TranslationBatch(rng, vocab)
    padded = batch.src_paddings > 0
    self.assertTrue(padded.any())

    def LossWithSource(src_ids):
      return PerExampleLoss(tf.nest.map_structure(
          tf.constant, NestedMap(batch, src_ids=src_ids))).numpy()

    loss = LossWithSource(batch.src_ids)
    changed = batch.src_ids.copy()
    changed[padded] = (changed[padded] + 7) % (vocab - 3) + 3
    self.assertTrue(np.all(changed[padded] != batch.src_ids[padded]))
    self.assertAllEqual(LossWithSource(changed), loss)
    # A real source token does change its example's loss (and only that).
    real = batch.src_ids.copy()
    real[0, 0] = (real[0, 0] + 7) % (vocab - 3) + 3
    moved = LossWithSource(real)
    self.assertNotEqual(moved[0], loss[0])
    self.assertAllEqual(moved[1:], loss[1:])


if __name__ == '__main__':
  tf.test.main()
