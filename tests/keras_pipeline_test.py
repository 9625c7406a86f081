"""Tests for tensorpipe.keras_pipeline: a Keras Sequential pipelined and fit.

Transparency: the pipelined model (K=2 and K=4 partitions, T=4
micro-batches, recompute on) equals the plain Keras Sequential it was made
from, run on the same micro-batches (tests/keras_testlib.py), in float64:
outputs, loss, every gradient and the moving statistics, both for the
TensorPipeLayer (`BuildPipeline`) and for `TensorPipeModel.fit` (ten losses,
then all weights), within test_utils.DEFAULT_RTOL.
"""

import os

import keras
import numpy as np
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import keras_params
from tensorpipe import keras_pipeline
from tensorpipe import test_utils
from tests import export_testlib
from tests import keras_testlib

test_utils.ConfigureTestDevices()

RTOL = test_utils.DEFAULT_RTOL[tf.float64]
# Keras' loss metric (History, callbacks' logs) is a float32 Mean: the
# logged losses carry float32 rounding (eps 6e-8).
LOGGED_RTOL = 1e-6
T = 4
N = 32


def _Close(test, actual, expected, msg='', scale=0.0):
  test_utils.AssertAllCloseScaled(test, actual, expected, RTOL, msg=msg,
                                  scale=scale)


def _Compile(model, learning_rate=0.125):
  # 0.125 is exact in float32 (Keras keeps the learning rate in float32).
  model.compile(keras.optimizers.SGD(learning_rate), keras_testlib.Loss())
  return model


class PipelineTransparencyTest(tf.test.TestCase):

  def _CheckWrapper(self, num_partitions):
    model = keras_testlib.MakeSequential()
    pipe = keras_params.BuildPipeline(model, num_partitions, T,
                                        batch_size=N, recompute=True)
    self.assertLen(pipe.PartitionLayers(), num_partitions)
    variables = keras_testlib.PipelineVariables(pipe)
    names = sorted(k for k, v in variables.items() if v.trainable)
    x, y = keras_testlib.Batch(N)

    @tf.function(autograph=False)
    def Step(x, y):
      with tf.GradientTape() as tape:
        out = pipe.FPropDefaultTheta(x)
        loss = keras_testlib.Loss()(y, out)
      return out, loss, tape.gradient(loss, [variables[k] for k in names])
    out, loss, grads = Step(tf.constant(x), tf.constant(y))
    ref = keras_testlib.OracleStep(model, x, y, T, 0,
                                   keras_testlib.DropoutSeeds(pipe))
    _Close(self, out, ref.outputs, 'outputs')
    _Close(self, loss, ref.loss, 'loss')
    paths = {k: w.path for k, w in keras_testlib.KerasPath(model).items()}
    self.assertCountEqual([paths[k] for k in names], ref.grads)
    scale = test_utils.MaxAbs(list(ref.grads.values()))
    for name, grad in zip(names, grads):
      _Close(self, grad, ref.grads[paths[name]], name, scale)
    for bn, stats in ref.moving.items():
      for stat, value in stats.items():
        _Close(self, variables[f'{bn}/{stat}'], value, f'{bn}/{stat}')

  def testWrapperMatchesPlainKerasK2(self):
    self._CheckWrapper(2)

  def testWrapperMatchesPlainKerasK4(self):
    self._CheckWrapper(4)

  def _CheckFit(self, num_partitions, steps=10):
    model = keras_testlib.MakeSequential()
    pipe = _Compile(keras_pipeline.TensorPipeModel(
        model, num_partitions=num_partitions, num_micro_batches=T,
        batch_size=N))
    xs, ys = keras_testlib.Batch(N * steps, seed=1)
    data = tf.data.Dataset.from_tensor_slices((xs, ys)).batch(
        N, drop_remainder=True).repeat()
    # One step per epoch: History's loss of epoch s is step s's loss.
    history = pipe.fit(data, epochs=steps, steps_per_epoch=1, verbose=0)
    seeds = keras_testlib.DropoutSeeds(pipe.pipeline)
    ref_model = keras_testlib.MakeSequential()
    losses, same_seed_losses = [], []
    for s in range(steps):
      batch = (xs[s * N:(s + 1) * N], ys[s * N:(s + 1) * N])
      # The step seed is the optimizer's iteration count.
      ref = keras_testlib.OracleStep(ref_model, *batch, T, s, seeds)
      same_seed_losses.append(keras_testlib.OracleStep(
          ref_model, *batch, T, 0, seeds).loss)
      losses.append(ref.loss)
      keras_testlib.SgdStep(ref_model, ref.grads, ref.moving, 0.125)
    test_utils.AssertAllCloseScaled(self, history.history['loss'], losses,
                                    LOGGED_RTOL)
    # Masks drawn with one seed for every step give other losses.
    self.assertGreater(np.max(np.abs(np.array(losses[1:]) -
                                     same_seed_losses[1:])), 1e-3)
    mine = keras_testlib.PipelineVariables(pipe.pipeline)
    theirs = keras_testlib.KerasPath(ref_model)
    self.assertCountEqual(mine, theirs)
    for name, var in mine.items():
      _Close(self, var, theirs[name].numpy(), name)

  def testFitMatchesReferenceLoopK2(self):
    self._CheckFit(2)

  def testFitMatchesReferenceLoopK4(self):
    self._CheckFit(4)


class PartialBatchTest(tf.test.TestCase):

  def testPredictAndEvaluateOnBatchesNotDivisibleByT(self):
    model = keras_testlib.MakeSequential()
    pipe = _Compile(keras_pipeline.TensorPipeModel(
        model, num_partitions=2, num_micro_batches=T, batch_size=16))
    x, y = keras_testlib.Batch(37, seed=2)
    expected = model(x, training=False).numpy()
    # Batches of 16, 16 and 5 rows of unknown static size: padded to 16.
    _Close(self, pipe.predict(x, batch_size=16, verbose=0), expected)
    # A batch of known size 10: padded to 12 = 3 T.
    _Close(self, pipe(tf.constant(x[:10])), expected[:10])
    # A batch larger than batch_size: run unpipelined.
    _Close(self, pipe.predict(x, batch_size=37, verbose=0), expected)
    plain = keras.models.clone_model(model)
    plain.set_weights(model.get_weights())
    plain.compile(loss=keras_testlib.Loss())
    test_utils.AssertAllCloseScaled(
        self, pipe.evaluate(x, y, batch_size=16, verbose=0),
        plain.evaluate(x, y, batch_size=16, verbose=0), LOGGED_RTOL)

  def testFitOnArraysRunsThePartialLastBatchUnpipelined(self):
    model = keras_testlib.MakeSequential()
    pipe = _Compile(keras_pipeline.TensorPipeModel(
        model, num_partitions=2, num_micro_batches=T, batch_size=16))
    x, y = keras_testlib.Batch(40, seed=3)
    history = pipe.fit(x, y, batch_size=16, epochs=1, shuffle=False,
                       verbose=0).history['loss']
    seeds = keras_testlib.DropoutSeeds(pipe.pipeline)
    ref_model = keras_testlib.MakeSequential()
    losses, rows = [], []
    # Steps of 16 (pipelined, T micro-batches), 16, and 8 rows (one).
    for step, (start, size, t) in enumerate([(0, 16, T), (16, 16, T),
                                             (32, 8, 1)]):
      ref = keras_testlib.OracleStep(
          ref_model, x[start:start + size], y[start:start + size], t, step,
          seeds)
      keras_testlib.SgdStep(ref_model, ref.grads, ref.moving, 0.125)
      losses.append(ref.loss)
      rows.append(size)
    # The epoch's loss is the mean over rows, as Keras logs it: each batch's
    # loss weighted by its rows (the plain mean of the three is 2% off).
    weighted = float(np.dot(losses, rows) / np.sum(rows))
    self.assertGreater(abs(np.mean(losses) - weighted), 1e-3 * weighted)
    test_utils.AssertAllCloseScaled(self, history, [weighted], LOGGED_RTOL)
    theirs = keras_testlib.KerasPath(ref_model)
    for name, var in keras_testlib.PipelineVariables(pipe.pipeline).items():
      _Close(self, var, theirs[name].numpy(), name)


class KerasModelApiTest(tf.test.TestCase):

  def testCallbacksSaveAndLoadModel(self):
    model = keras_testlib.MakeSequential()
    pipe = _Compile(keras_pipeline.TensorPipeModel(
        model, num_partitions=2, num_micro_batches=T, batch_size=16))
    x, y = keras_testlib.Batch(32, seed=4)
    tmp = self.get_temp_dir()
    path = os.path.join(tmp, 'model.keras')
    pipe.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[
        keras.callbacks.ModelCheckpoint(path),
        keras.callbacks.TensorBoard(os.path.join(tmp, 'tb'))])
    self.assertTrue(os.path.exists(path))
    self.assertNotEmpty(tf.io.gfile.glob(os.path.join(tmp, 'tb', 'train',
                                                      'events.*')))
    expected = pipe.predict(x, batch_size=16, verbose=0)
    loaded = keras.models.load_model(path)
    self.assertIsInstance(loaded, keras_pipeline.TensorPipeModel)
    self.assertLen(loaded.pipeline.PartitionLayers(), 2)
    _Close(self, loaded.predict(x, batch_size=16, verbose=0), expected)
    # save_weights / load_weights into a model built from other weights.
    weights = os.path.join(tmp, 'pipe.weights.h5')
    pipe.save_weights(weights)
    other = keras_pipeline.TensorPipeModel(
        keras_testlib.MakeSequential(seed=5), num_partitions=2,
        num_micro_batches=T, batch_size=16)
    other.load_weights(weights)
    _Close(self, other.predict(x, batch_size=16, verbose=0), expected)

  def testExportServesAnyBatchWithoutTensorpipe(self):
    model = keras_testlib.MakeSequential()
    pipe = keras_pipeline.TensorPipeModel(model, num_partitions=2,
                                          num_micro_batches=T, batch_size=16)
    x, _ = keras_testlib.Batch(37, seed=6)
    tmp = self.get_temp_dir()
    one_device = pipe.export(os.path.join(tmp, 'one_device'))
    pipelined = pipe.export_saved_model(os.path.join(tmp, 'pipelined'),
                                        pipelined=True)
    expected = model(x, training=False).numpy()
    # 37 rows, then 5: neither a multiple of T nor of the batch size.
    loaded = export_testlib.RunInCleanProcess(
        one_device, [{'inputs': x}, {'inputs': x[:5]}], tmp)
    self.assertEqual(loaded.modules, [])
    self.assertEqual(loaded.inputs['inputs'], [[None, 6, 6, 2], 'float64'])
    _Close(self, loaded.outputs[0]['outputs'], expected)
    _Close(self, loaded.outputs[1]['outputs'], expected[:5])
    serve = tf.saved_model.load(pipelined).signatures['serving_default']
    for rows in (37, 5):
      _Close(self, serve(inputs=tf.constant(x[:rows]))['outputs'],
             expected[:rows], 'pipelined')

  def testVariablePathsDoNotDependOnK(self):
    model = keras_testlib.MakeSequential()
    paths = [sorted(base_layer.VariablesByPath(
        keras_params.BuildPipeline(model, k, T)))
             for k in (1, 2, 4)]
    self.assertEqual(paths[0], paths[1])
    self.assertEqual(paths[0], paths[2])
    self.assertIn('conv/kernel', paths[0])
    self.assertIn('bn2/moving_variance', paths[0])

  def testManualPartitionSizes(self):
    pipe = keras_params.BuildPipeline(keras_testlib.MakeSequential(), 2, T,
                                        partition_sizes=[3, 5])
    self.assertEqual([[l.layer_name for l in part]
                      for part in pipe.PartitionLayers()],
                     [['conv', 'bn1', 'relu'],
                      ['flat', 'fc1', 'drop', 'bn2', 'logits']])
    with self.assertRaisesRegex(ValueError, r'partition_sizes=\[3, 4\] must '
                                'be 2 positive ints summing to the 8 layers'):
      keras_params.PipelineParams(keras_testlib.MakeSequential(), 2, T,
                                    partition_sizes=[3, 4])

  def testBadModelsNameTheFix(self):
    class Subclassed(keras.Model):

      def call(self, x):
        return x
    with self.assertRaisesRegex(TypeError, 'subclassed Keras model.*build '
                                'it functionally'):
      keras_params.PipelineParams(Subclassed(), 1, 1)
    with self.assertRaisesRegex(ValueError, 'input shape is unknown.*'
                                'input_shape'):
      keras_params.PipelineParams([keras.layers.Dense(2)], 1, 1)
    lam = keras.Sequential([keras.Input((3,)),
                            keras.layers.Lambda(lambda v: v, name='lam')])
    with self.assertRaisesRegex(ValueError, "'lam': keras_config cannot be "
                                'deserialised'):
      keras_params.BuildPipeline(lam, 1, 1)
    with self.assertRaisesRegex(ValueError, 'batch_size=6 must be a multiple '
                                'of num_micro_batches=4'):
      keras_pipeline.TensorPipeModel(keras_testlib.MakeSequential(),
                                     num_micro_batches=4, batch_size=6)
    import tf_keras  # pylint: disable=g-import-not-at-top
    with self.assertRaisesRegex(TypeError, r'Keras 2 \(tf_keras\)'):
      keras_params.PipelineParams(
          tf_keras.Sequential([tf_keras.layers.Dense(2, input_shape=(3,))]),
          1, 1)


if __name__ == '__main__':
  tf.test.main()
