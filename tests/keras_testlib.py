"""Keras models, layers and the plain-Keras oracle shared by the Keras tests.

The oracle runs the user's own `keras.Sequential` unpipelined, layer by layer
with Keras' `layer(x, training=True)`, on the same T micro-batches a
pipeline makes (GPipe's semantics: batch norm normalises each micro-batch
with its own statistics). Two things a plain Keras run does differently are
written out here instead of being taken from the code under test:

  * Dropout: the mask of example n is the one `py_utils.StatelessUniform`
    gives example n (layer seed, step seed, example index), the mask every
    TensorPipe dropout draws; Keras' own SeedGenerator would draw another.
  * Moving statistics: updated once per step from the inputs of all
    micro-batches (NumPy mean and variance of the concatenated inputs),
    moving = momentum * moving + (1 - momentum) * statistic; a plain Keras
    run would update them once per micro-batch.
"""

from typing import Any, Dict, List, NamedTuple

import keras
import numpy as np
import tensorflow as tf

from tensorpipe import py_utils

INPUT_SHAPE = (6, 6, 2)
NUM_CLASSES = 3
MOMENTUM = 0.8  # far from 1, so that one update moves the averages visibly


def MakeSequential(dtype: str = 'float64', seed: int = 0,
                   dropout: float = 0.25) -> keras.Sequential:
  """Conv2D + BatchNormalization + Dense + Dropout + BatchNormalization.

  Weights are seeded (so two calls give the same model); the batch-norm
  scales and offsets start away from 1 and 0 so that their gradients and
  the normalisation are not trivial.
  """
  def Init(i):
    return keras.initializers.GlorotUniform(seed=seed * 100 + i)

  def Gamma(i):
    return keras.initializers.RandomUniform(0.5, 1.5, seed=seed * 100 + i)

  def Beta(i):
    return keras.initializers.RandomUniform(-0.5, 0.5, seed=seed * 100 + i)

  kw = dict(dtype=dtype)
  return keras.Sequential([
      keras.Input(INPUT_SHAPE, dtype=dtype),
      keras.layers.Conv2D(4, 3, padding='same', kernel_initializer=Init(1),
                          bias_initializer=Beta(2), name='conv', **kw),
      keras.layers.BatchNormalization(
          momentum=MOMENTUM, gamma_initializer=Gamma(3),
          beta_initializer=Beta(4), name='bn1', **kw),
      keras.layers.ReLU(name='relu', **kw),
      keras.layers.Flatten(name='flat', **kw),
      keras.layers.Dense(12, activation='tanh', kernel_initializer=Init(5),
                         bias_initializer=Beta(6), name='fc1', **kw),
      keras.layers.Dropout(dropout, name='drop', **kw),
      keras.layers.BatchNormalization(
          momentum=MOMENTUM, gamma_initializer=Gamma(7),
          beta_initializer=Beta(8), name='bn2', **kw),
      keras.layers.Dense(NUM_CLASSES, kernel_initializer=Init(9),
                         bias_initializer=Beta(10), name='logits', **kw),
  ], name='net')


def Batch(n: int, seed: int = 0, dtype=np.float64):
  """(images [n, 6, 6, 2], labels [n]) of fixed random values.

  The images are float32 values (in `dtype`): Keras' array adapter casts
  float arrays to float32 (floatx), which then changes nothing.
  """
  rng = np.random.RandomState(seed)
  x = rng.normal(size=(n,) + INPUT_SHAPE).astype(np.float32).astype(dtype)
  y = rng.randint(0, NUM_CLASSES, size=n).astype(np.int64)
  return x, y


def Loss() -> keras.losses.Loss:
  return keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                    dtype='float64')


def DropoutSeeds(pipe) -> Dict[str, int]:
  """{Keras Dropout name: the seed its KerasLayer draws masks with}."""
  seeds = {}
  for layer, _ in pipe.LayersWithTheta():
    obj = layer.keras_object
    if isinstance(obj, keras.layers.Dropout):
      seeds[obj.name] = layer.SublayerSeed(obj)
  return seeds


class OracleResult(NamedTuple):
  outputs: np.ndarray
  loss: float
  grads: Dict[str, np.ndarray]             # by Keras weight path
  moving: Dict[str, Dict[str, np.ndarray]]  # bn name: moving_mean/variance


def OracleStep(model: keras.Sequential, x: np.ndarray, y: np.ndarray,
               num_micro_batches: int, step_seed: int,
               dropout_seeds: Dict[str, int]) -> OracleResult:
  """One training step of the plain Keras model on T micro-batches.

  Returns the outputs, the loss (mean over the batch), the gradient of
  every trainable weight and each batch norm's moving statistics after the
  step (updated once, from all micro-batches). The model's own variables
  are left unchanged.
  """
  n = x.shape[0]
  m = n // num_micro_batches
  bns = [l for l in model.layers
         if isinstance(l, keras.layers.BatchNormalization)]
  saved = {bn.name: (bn.moving_mean.numpy(), bn.moving_variance.numpy())
           for bn in bns}
  bn_inputs: Dict[str, List[np.ndarray]] = {bn.name: [] for bn in bns}
  variables = model.trainable_weights
  with tf.GradientTape() as tape:
    outs = []
    for t in range(num_micro_batches):
      h = tf.constant(x[t * m:(t + 1) * m])
      for layer in model.layers:
        if isinstance(layer, keras.layers.Dropout):
          with py_utils.StepSeed(step_seed), py_utils.ExampleOffset(t * m):
            u = py_utils.StatelessUniform(h.shape.as_list(),
                                          dropout_seeds[layer.name])
          keep = 1.0 - layer.rate
          h = h * tf.cast(u < keep, h.dtype) / keep
        else:
          if isinstance(layer, keras.layers.BatchNormalization):
            bn_inputs[layer.name].append(h.numpy())
          h = layer(h, training=True)
      outs.append(h)
    out = tf.concat(outs, 0)
    loss = Loss()(tf.constant(y), out)
  grads = tape.gradient(loss, variables)
  moving = {}
  for bn in bns:
    values = np.concatenate(bn_inputs[bn.name], 0)
    axes = tuple(range(values.ndim - 1))
    mean, var = values.mean(axes), values.var(axes)
    old_mean, old_var = saved[bn.name]
    moving[bn.name] = dict(
        moving_mean=MOMENTUM * old_mean + (1 - MOMENTUM) * mean,
        moving_variance=MOMENTUM * old_var + (1 - MOMENTUM) * var)
    # Keras updated them once per micro-batch: put the old values back.
    bn.moving_mean.assign(old_mean)
    bn.moving_variance.assign(old_var)
  return OracleResult(out.numpy(), float(loss),
                      {v.path: g.numpy() for v, g in zip(variables, grads)},
                      moving)


def PipelineVariables(pipe) -> Dict[str, tf.Variable]:
  """The pipeline's variables keyed by the Keras weight path they mirror."""
  out = {}
  for layer, _ in pipe.LayersWithTheta():
    for kv, key in layer.KerasWeights():
      out[f'{layer.layer_name}/{kv.name}'] = layer.vars[key]
  return out


def KerasPath(model: keras.Sequential) -> Dict[str, Any]:
  """The model's weights keyed '<layer name>/<weight name>'."""
  return {f'{l.name}/{w.name}': w for l in model.layers for w in l.weights}


def SgdStep(model: keras.Sequential, grads: Dict[str, np.ndarray],
            moving: Dict[str, Dict[str, np.ndarray]],
            learning_rate: float) -> None:
  """w -= lr * g on the oracle model, and its moving statistics set."""
  for v in model.trainable_weights:
    v.assign(v.numpy() - learning_rate * grads[v.path])
  SetMovingStats(model, moving)


def SetMovingStats(model: keras.Sequential,
                   moving: Dict[str, Dict[str, np.ndarray]]) -> None:
  """Sets the batch norms' moving statistics (OracleStep's `moving`)."""
  for layer in model.layers:
    if layer.name in moving:
      layer.moving_mean.assign(moving[layer.name]['moving_mean'])
      layer.moving_variance.assign(moving[layer.name]['moving_variance'])


# -- layers for the bad-input tests (factories named by dotted path) --------


class RaggedRows(keras.layers.Layer):
  """Returns its input as a ragged tensor (cannot cross a boundary)."""

  def call(self, x):
    return tf.RaggedTensor.from_tensor(x, padding=0.0)

  def compute_output_spec(self, x):
    return keras.KerasTensor(x.shape, x.dtype, ragged=True)


def FixedBatchModel(batch_size: int = 8, units: int = 3) -> keras.Model:
  """A functional model whose keras.Input fixes the batch size."""
  inp = keras.Input((4,), batch_size=batch_size)
  return keras.Model(inp, keras.layers.Dense(units, name='fc')(inp),
                     name='fixed')


def Keras2Dense(units: int = 3):
  """A tf_keras (Keras 2) Dense layer."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  return tf_keras.layers.Dense(units)


# -- custom layers as keras.io writes them (no build(); sublayers made in
# __init__ and built by their first call), registered as the README asks --


@keras.saving.register_keras_serializable(package='keras_testlib')
class TokenAndPositionEmbedding(keras.layers.Layer):
  """keras.io "Text classification with Transformer": token + position."""

  def __init__(self, maxlen, vocab_size, embed_dim, **kwargs):
    super().__init__(**kwargs)
    self.maxlen, self.vocab_size, self.embed_dim = maxlen, vocab_size, (
        embed_dim)
    self.token_emb = keras.layers.Embedding(vocab_size, embed_dim,
                                            dtype=self.dtype_policy)
    self.pos_emb = keras.layers.Embedding(maxlen, embed_dim,
                                          dtype=self.dtype_policy)

  def call(self, x):
    positions = self.pos_emb(keras.ops.arange(0, keras.ops.shape(x)[-1]))
    return self.token_emb(x) + positions

  def get_config(self):
    return dict(super().get_config(), maxlen=self.maxlen,
                vocab_size=self.vocab_size, embed_dim=self.embed_dim)


@keras.saving.register_keras_serializable(package='keras_testlib')
class TransformerBlock(keras.layers.Layer):
  """keras.io "Text classification with Transformer", with a batch norm.

  Its `call` takes no `training`: the mode reaches the Dropout and the
  BatchNormalization inside through Keras' call context.
  """

  def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1, **kwargs):
    super().__init__(**kwargs)
    self.embed_dim, self.num_heads, self.ff_dim, self.rate = (
        embed_dim, num_heads, ff_dim, rate)
    kw = dict(dtype=self.dtype_policy)
    self.att = keras.layers.MultiHeadAttention(num_heads, embed_dim, **kw)
    self.ffn = keras.Sequential([
        keras.layers.Dense(ff_dim, activation='relu', **kw),
        keras.layers.Dense(embed_dim, **kw)])
    self.layernorm1 = keras.layers.LayerNormalization(epsilon=1e-6, **kw)
    self.norm2 = keras.layers.BatchNormalization(momentum=MOMENTUM, **kw)
    self.dropout1 = keras.layers.Dropout(rate, **kw)

  def call(self, inputs):
    attn = self.dropout1(self.att(inputs, inputs))
    out1 = self.layernorm1(inputs + attn)
    return self.norm2(out1 + self.ffn(out1))

  def get_config(self):
    return dict(super().get_config(), embed_dim=self.embed_dim,
                num_heads=self.num_heads, ff_dim=self.ff_dim, rate=self.rate)
