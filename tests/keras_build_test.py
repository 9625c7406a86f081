"""Keras layers in a pipeline as Keras itself builds and runs them.

The oracle is plain Keras (predict, fit, the model's own training-mode
call per micro-batch), in float64:

  * a Normalization adapted to data far from mean 0 / variance 1: its mean
    and variance are weights the pipeline passes in as theta, and
    `to_keras` must derive Keras' tensors from them again (with fit's
    logged loss against Keras' History, a partial last batch included);
  * registered custom layers without `build()` (keras.io's "Text
    classification with Transformer"), which Keras' functional loader
    rebuilds by calling them on symbolic inputs;
  * losses keyed by output name on a multi-input, multi-output model.
"""

import keras
import numpy as np
import tensorflow as tf

from tensorpipe import keras_pipeline
from tensorpipe import test_utils
from tests import keras_testlib

test_utils.ConfigureTestDevices()

RTOL = test_utils.DEFAULT_RTOL[tf.float64]
# Keras' loss metric (History) is a float32 Mean: float32 rounding.
LOGGED_RTOL = 1e-6
BATCH, T = 16, 4
MEANS = np.array([5.0, -4.0, 10.0, 2.0])
STDS = np.array([3.0, 1.0, 5.0, 2.0])


def _Data(n, seed=0):
  """[n, 4] features of mean MEANS, std STDS; [n, 2] targets."""
  rng = np.random.RandomState(seed)
  # float32 values: Keras' input adapter casts float arrays to float32.
  x = (rng.normal(size=(n, 4)) * STDS + MEANS).astype(np.float32)
  y = rng.normal(size=(n, 2)).astype(np.float32)
  return x.astype(np.float64), y.astype(np.float64)


def _Init(seed):
  return keras.initializers.GlorotUniform(seed=seed)


def _NormalizedModel(kind):
  """Normalization adapted to _Data, then Dense layers (no batch norm,
  no dropout: plain Keras fit is then the oracle of the pipeline's fit)."""
  kw = dict(dtype='float64')
  norm = keras.layers.Normalization(name='norm', **kw)
  norm.adapt(_Data(256, seed=7)[0])
  layers = [norm,
            keras.layers.Dense(6, 'tanh', kernel_initializer=_Init(1),
                               name='h', **kw),
            keras.layers.Dense(2, kernel_initializer=_Init(2), name='out',
                               **kw)]
  if kind == 'sequential':
    return keras.Sequential([keras.Input((4,), **kw)] + layers)
  x = keras.Input((4,), name='x', **kw)
  return keras.Model(x, layers[2](layers[1](layers[0](x))),
                     name='normalized')


def _Compile(model):
  # 0.125 is exact in float32 (Keras keeps the learning rate in float32).
  model.compile(keras.optimizers.SGD(0.125),
                keras.losses.MeanSquaredError(dtype='float64'))
  return model


class NormalizationStateTest(tf.test.TestCase):

  def _Check(self, kind, fit=True):
    model = _NormalizedModel(kind)
    # The adapted state is far from 0 / 1: ignoring it is visible.
    self.assertAllClose(model.get_layer('norm').adapt_mean, MEANS, atol=1.0)
    pm = _Compile(keras_pipeline.TensorPipeModel(
        model, num_partitions=2, num_micro_batches=T, batch_size=BATCH))
    x, y = _Data(40, seed=1)
    want = model.predict(x, batch_size=BATCH, verbose=0)
    test_utils.AssertAllCloseScaled(
        self, pm.predict(x, batch_size=BATCH, verbose=0), want, RTOL,
        msg='predict')
    plain = _NormalizedModel(kind)
    if fit:
      # 40 rows in batches of 16, 16 and 8 (the last one partial): the
      # epoch's loss is Keras' mean over rows.
      _Compile(plain)
      want_history = plain.fit(x, y, batch_size=BATCH, epochs=1,
                               shuffle=False, verbose=0).history['loss']
      history = pm.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False,
                       verbose=0).history['loss']
      test_utils.AssertAllCloseScaled(self, history, want_history,
                                      LOGGED_RTOL, msg='history')
      for got, w, v in zip(pm.get_weights(), plain.get_weights(),
                           plain.weights):
        test_utils.AssertAllCloseScaled(self, got, w, RTOL, msg=v.path)
    else:
      other = [w * 1.5 if w.dtype.kind == 'f' else w
               for w in plain.get_weights()]
      pm.set_weights(other)
      plain.set_weights(other)
      plain.get_layer('norm').finalize_state()  # as Keras' loaders do
    trained = plain.predict(x, batch_size=BATCH, verbose=0)
    test_utils.AssertAllCloseScaled(
        self, pm.predict(x, batch_size=BATCH, verbose=0), trained, RTOL,
        msg='predict after the update')
    back = pm.to_keras()
    test_utils.AssertAllCloseScaled(
        self, back.predict(x, batch_size=BATCH, verbose=0), trained, RTOL,
        msg='to_keras')

  def testSequentialPredictFitAndToKerasEqualKeras(self):
    self._Check('sequential')

  def testFunctionalPredictSetWeightsAndToKerasEqualKeras(self):
    # fit as the Sequential's; set_weights gives the Normalization another
    # mean and variance (x 1.5), which the pipeline reads as theta.
    self._Check('functional', fit=False)

  def testGivenMeanAndVarianceAsConvNeXtsPreprocessing(self):
    kw = dict(dtype='float64')
    x = keras.Input((4,), name='x', **kw)
    h = keras.layers.Normalization(mean=MEANS.tolist(),
                                   variance=(STDS**2).tolist(), name='norm',
                                   **kw)(x)
    model = keras.Model(x, keras.layers.Dense(
        2, kernel_initializer=_Init(1), name='out', **kw)(h))
    pm = keras_pipeline.TensorPipeModel(model, num_partitions=2,
                                        num_micro_batches=T, batch_size=BATCH)
    x, _ = _Data(BATCH, seed=2)
    want = model.predict(x, batch_size=BATCH, verbose=0)
    for got, what in ((pm.predict(x, batch_size=BATCH, verbose=0),
                       'predict'),
                      (pm.to_keras().predict(x, batch_size=BATCH, verbose=0),
                       'to_keras')):
      test_utils.AssertAllCloseScaled(self, got, want, RTOL, msg=what)


def _TextModel(rate=0.0):
  """keras.io's text classifier: custom layers without build()."""
  kw = dict(dtype='float64')
  ids = keras.Input((5,), dtype='int32', name='ids')
  h = keras_testlib.TokenAndPositionEmbedding(5, 20, 4, name='embed',
                                              **kw)(ids)
  h = keras_testlib.TransformerBlock(4, 2, 8, rate=rate, name='block',
                                     **kw)(h)
  h = keras.layers.GlobalAveragePooling1D(name='pool', **kw)(h)
  return keras.Model(ids, keras.layers.Dense(3, name='logits', **kw)(h),
                     name='text')


@keras.saving.register_keras_serializable(package='keras_build_test')
class IdsOnly(keras.layers.Layer):
  """A custom layer without build() that refuses float inputs."""

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.emb = keras.layers.Embedding(10, 2)

  def call(self, ids):
    if 'int' not in str(ids.dtype):
      raise TypeError(f'IdsOnly takes token ids, got {ids.dtype}')
    return self.emb(ids)


class CustomLayerTest(tf.test.TestCase):

  def testLayersWithoutBuildAreRebuiltAsKerasLoaderDoes(self):
    model = _TextModel()
    # Its two tables were made by its first call; from its config it
    # comes back marked built with none.
    self.assertLen(model.get_layer('embed').weights, 2)
    ids = np.random.RandomState(0).randint(0, 20, (BATCH, 5)).astype(
        np.int32)
    pm = keras_pipeline.TensorPipeModel(model, num_partitions=2,
                                        num_micro_batches=T, batch_size=BATCH)
    self.assertLen(pm.get_weights(), len(model.get_weights()))
    test_utils.AssertAllCloseScaled(
        self, pm.predict(ids, batch_size=BATCH, verbose=0),
        model.predict(ids, batch_size=BATCH, verbose=0), RTOL,
        msg='predict')
    # Training mode reaches the batch norm inside TransformerBlock, whose
    # call takes no `training`, through Keras' call context: it normalises
    # each micro-batch with its own statistics, as Keras does.
    # The recompute pass runs outside any Keras call, so the mode must be
    # passed to the layer itself: the gradients check that.
    n = BATCH // T
    weights = np.random.RandomState(1).normal(size=(BATCH, 3))
    with tf.GradientTape() as tape:
      want = tf.concat([model(ids[i * n:(i + 1) * n], training=True)
                        for i in range(T)], 0)
      want_loss = tf.reduce_sum(want * weights)
    # Embedding gradients are IndexedSlices: dense for the comparison.
    want_grads = [tf.convert_to_tensor(g) for g in tape.gradient(
        want_loss, model.trainable_weights)]
    variables = pm.KerasOrderVariables()
    with tf.GradientTape() as tape:
      got = pm(ids, training=True)
      loss = tf.reduce_sum(got * weights)
    grads = dict(zip([id(v) for v in variables],
                     tape.gradient(loss, variables)))
    grads = {k: tf.convert_to_tensor(g) for k, g in grads.items()
             if g is not None}
    test_utils.AssertAllCloseScaled(self, got, want, RTOL, msg='train')
    self.assertNotAllClose(got, model(ids), rtol=1e-3)
    scale = test_utils.MaxAbs(want_grads)
    checked = 0
    for v, kv in zip(variables, model.weights):
      if kv.trainable:
        test_utils.AssertAllCloseScaled(self, grads[id(v)],
                                        want_grads[checked], RTOL,
                                        msg=kv.path, scale=scale)
        checked += 1
    self.assertEqual(checked, len(want_grads))

  def testLayerThatCannotBeRebuiltNamesTheFix(self):
    ids = keras.Input((3,), dtype='int32', name='ids')
    model = keras.Model(ids, keras.layers.Flatten()(IdsOnly(name='lookup')(
        ids)))
    with self.assertRaisesRegex(
        ValueError, r"'lookup'.*marked built.*sublayers \['embedding.*"
        r'IdsOnly takes token ids.*give IdsOnly a build\(\) method'):
      keras_pipeline.TensorPipeModel(model, num_partitions=1)


def _TicketModel():
  """keras.io's multi-input, multi-output model (ticket triage), tiny."""
  kw = dict(dtype='float64')
  title = keras.Input((3,), name='title', **kw)
  body = keras.Input((4,), name='body', **kw)
  tags = keras.Input((2,), name='tags', **kw)
  h = keras.layers.Concatenate(**kw)([title, body, tags])
  h = keras.layers.Dense(5, 'tanh', kernel_initializer=_Init(3), name='h',
                         **kw)(h)
  priority = keras.layers.Dense(1, kernel_initializer=_Init(4),
                                name='priority', **kw)(h)
  department = keras.layers.Dense(3, kernel_initializer=_Init(5),
                                  name='department', **kw)(h)
  return keras.Model([title, body, tags], [priority, department])


class OutputNamesTest(tf.test.TestCase):

  def testLossesKeyedByOutputNameTrainAsKeras(self):
    def Compile(m):
      m.compile(keras.optimizers.SGD(0.125), loss={
          'department': keras.losses.CategoricalCrossentropy(
              from_logits=True, dtype='float64'),
          'priority': keras.losses.BinaryCrossentropy(
              from_logits=True, dtype='float64')},
                loss_weights={'priority': 1.0, 'department': 0.25})
      return m
    pm = Compile(keras_pipeline.TensorPipeModel(
        _TicketModel(), num_partitions=2, num_micro_batches=T,
        batch_size=BATCH))
    self.assertEqual(pm.output_names, ['priority', 'department'])
    plain = Compile(_TicketModel())
    rng = np.random.RandomState(2)
    x = {name: rng.normal(size=(2 * BATCH, d)).astype(np.float32).astype(
        np.float64) for name, d in (('title', 3), ('body', 4), ('tags', 2))}
    y = {'priority': rng.randint(0, 2, (2 * BATCH, 1)).astype(np.float64),
         'department': np.eye(3)[rng.randint(0, 3, 2 * BATCH)]}
    want = plain.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False,
                     verbose=0).history
    got = pm.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False,
                 verbose=0).history
    self.assertCountEqual(got, want)
    for key in want:
      test_utils.AssertAllCloseScaled(self, got[key], want[key],
                                      LOGGED_RTOL, msg=key)
    for g, w, v in zip(pm.get_weights(), plain.get_weights(), plain.weights):
      test_utils.AssertAllCloseScaled(self, g, w, RTOL, msg=v.path)


if __name__ == '__main__':
  tf.test.main()
