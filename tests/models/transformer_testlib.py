"""The tiny Transformer, its batches and the pipelined-vs-plain check.

Shared by transformer_test.py and transformer_slow_test.py.
"""

import numpy as np
import tensorflow as tf

import tensorpipe
from models import transformer
from tensorpipe import py_utils
from tensorpipe import test_utils
from tensorpipe.layers import composite
from tensorpipe.nested_map import NestedMap

# Tiny T(L=2, H=32, A=4) with model dim 16 and a vocabulary of 50.
TINY = dict(num_layers=2, hidden_dim=32, num_heads=4, model_dim=16,
            vocab_size=50, max_len=16)
BATCH, SRC_LEN, TGT_LEN = 8, 6, 5


def RandomPaddings(rng, b, length):
  lengths = rng.randint(2, length + 1, size=[b, 1])
  return (np.arange(length)[None] >= lengths).astype(np.float32)


def TranslationBatch(seed=0, b=BATCH, ls=SRC_LEN, lt=TGT_LEN, vocab=50):
  rng = np.random.RandomState(seed)
  return NestedMap(
      src_ids=tf.constant(rng.randint(0, vocab, [b, ls]), tf.int32),
      src_paddings=tf.constant(RandomPaddings(rng, b, ls)),
      tgt_ids=tf.constant(rng.randint(0, vocab, [b, lt]), tf.int32),
      tgt_labels=tf.constant(rng.randint(0, vocab, [b, lt]), tf.int32),
      tgt_paddings=tf.constant(RandomPaddings(rng, b, lt)))


def LmBatch(seed=0, b=BATCH, length=TGT_LEN, vocab=50):
  rng = np.random.RandomState(seed)
  return NestedMap(
      ids=tf.constant(rng.randint(0, vocab, [b, length]), tf.int32),
      labels=tf.constant(rng.randint(0, vocab, [b, length]), tf.int32),
      paddings=tf.constant(RandomPaddings(rng, b, length)))


def LossAndGrads(layer, batch, step_seed=5):
  """Mean token loss and gradients (keyed by layer-path names), training.

  autograph=False: the layers are plain Python; converting them with
  autograph only costs tracing time.
  """
  names = test_utils.VariablesByName(layer)
  variables = list(names.values())

  @tf.function(autograph=False)
  def Step(batch):
    # The pipeline recomputes the forward pass (dropout masks included) in
    # tape.gradient: the step seed must still be set there.
    with py_utils.StepSeed(step_seed):
      with tf.GradientTape() as tape:
        loss = transformer.MeanTokenLoss(layer.FPropDefaultTheta(batch))
      return loss, tape.gradient(loss, variables)
  loss, grads = Step(batch)
  return float(loss), {n: g.numpy() for n, g in zip(names, grads)}


def Sequential(layers):
  return composite.SequentialLayer.Params().Set(
      name='Sequential', sub=layers).Instantiate()


def Pipe(layers, k, t, input_shapes):
  return tensorpipe.TensorPipeLayer.Params().Set(
      name='TensorPipe', layers=layers, num_partitions=k,
      num_micro_batches=t, input_shapes=input_shapes).Instantiate()


class TransparencyMixin:
  """Pipelined vs unpipelined: loss and every gradient."""

  def AssertSameLossAndGrads(self, layers, batch, input_shapes, k, t):
    ref_loss, ref_grads = LossAndGrads(Sequential(layers), batch)
    pipe = Pipe(layers, k, t, input_shapes)
    self.assertLen(pipe.PartitionLayers(), k)
    loss, grads = LossAndGrads(pipe, batch)
    self.assertAllClose(loss, ref_loss, rtol=1e-5, atol=0)
    self.assertEqual(sorted(grads), sorted(ref_grads))
    # Key biases have zero true gradient (softmax is shift invariant): the
    # absolute tolerance covers their rounding noise.
    scale = max(np.abs(g).max() for g in ref_grads.values())
    for name, ref in ref_grads.items():
      self.assertAllClose(grads[name], ref, rtol=1e-5, atol=1e-6 * scale,
                          msg=f'gradient of {name}, K={k}, T={t}')
