"""keras.applications models pipelined through the Keras front door (slow).

MobileNetV2, ResNet50 and DenseNet121 (weights=None, 32x32x3, 10 classes),
in float64, cut into K = 2 and 4 partitions with T = 4 micro-batches. The
oracle is the same Keras model run by Keras on the same micro-batches in
training mode (batch norm normalises each micro-batch with its own
statistics) and on the whole batch in inference mode. EfficientNetB0 (its
Normalization adapted), EfficientNetV2B0 and ConvNeXtTiny with their
default preprocessing, at K = 2: predict, to_keras and export against
Keras' predict.
"""

import os
import time

from absl.testing import parameterized
import keras
import numpy as np
import tensorflow as tf

from tensorpipe import keras_pipeline
from tensorpipe import test_utils

test_utils.ConfigureTestDevices()

RTOL = 1e-9
BATCH, T = 8, 4
SHAPE = (32, 32, 3)

_MODELS = {
    'MobileNetV2': lambda: keras.applications.MobileNetV2(
        weights=None, input_shape=SHAPE, classes=10),
    'ResNet50': lambda: keras.applications.ResNet50(
        weights=None, input_shape=SHAPE, classes=10),
    'DenseNet121': lambda: keras.applications.DenseNet121(
        weights=None, input_shape=SHAPE, classes=10),
}

# Models with a Keras Normalization layer (keras.applications' default
# preprocessing), whose mean and variance the pipeline passes as theta.
_NORMALIZED = {
    'EfficientNetB0': lambda: keras.applications.EfficientNetB0(
        weights=None, input_shape=SHAPE, classes=10),
    'EfficientNetV2B0': lambda: keras.applications.EfficientNetV2B0(
        weights=None, input_shape=SHAPE, classes=10),
    'ConvNeXtTiny': lambda: keras.applications.ConvNeXtTiny(
        weights=None, input_shape=SHAPE, classes=10),
}


def _Images(n, seed=0):
  # float32 values: Keras' input adapter casts float arrays to float32.
  rng = np.random.RandomState(seed)
  return rng.uniform(-1, 1, (n,) + SHAPE).astype(np.float32).astype(
      np.float64)


def _Loss(out):
  w = np.random.RandomState(1).normal(size=out.shape)
  return tf.reduce_sum(out * w)


class KerasApplicationsTest(parameterized.TestCase, tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self._floatx = keras.config.floatx()
    keras.config.set_floatx('float64')

  def tearDown(self):
    keras.config.set_floatx(self._floatx)
    super().tearDown()

  @parameterized.named_parameters(
      *[(f'{name}_K{k}', name, k) for name in _MODELS for k in (2, 4)])
  def testPredictionsAndGradientsEqualKeras(self, name, k):
    model = _MODELS[name]()
    start = time.time()
    pm = keras_pipeline.TensorPipeModel(model, num_partitions=k,
                                        num_micro_batches=T, batch_size=BATCH)
    print(f'{name} K={k}: pipeline built in {time.time() - start:.1f} s '
          f'({len(model.layers)} layers)')
    report = pm.graph_pipeline.Report()
    print(report)
    self.assertEqual(report.count('    cut '), k - 1)
    self.assertRegex(report, r'cut 0: \d+ tensor\(s\), \d+ bytes')
    x = _Images(BATCH)
    # Inference: the whole batch, moving averages.
    self.assertAllClose(pm.predict(x, batch_size=BATCH, verbose=0),
                        model.predict(x, batch_size=BATCH, verbose=0),
                        rtol=RTOL, atol=1e-12)
    variables = pm.KerasOrderVariables()
    with tf.GradientTape() as tape:
      got = pm(x, training=True)
      loss = _Loss(got)
    grads = tape.gradient(loss, variables)
    n = BATCH // T
    with tf.GradientTape() as tape:
      want = tf.concat([model(x[i * n:(i + 1) * n], training=True)
                        for i in range(T)], 0)
      want_loss = _Loss(want)
    want_grads = tape.gradient(want_loss, model.weights)
    self.assertAllClose(got, want, rtol=RTOL, atol=1e-12)
    checked = 0
    for v, kv, g, w in zip(variables, model.weights, grads, want_grads):
      if not kv.trainable:
        self.assertIsNone(g, msg=v.name)
        continue
      self.assertAllClose(g, w, rtol=RTOL, atol=1e-12, msg=v.name)
      checked += 1
    self.assertEqual(checked, len(model.trainable_weights))

  @parameterized.named_parameters(*[(name, name) for name in _MODELS])
  def testFitEvaluatePredictSaveAndExport(self, name):
    model = _MODELS[name]()
    pm = keras_pipeline.TensorPipeModel(model, num_partitions=4,
                                        num_micro_batches=T, batch_size=BATCH)
    pm.compile(keras.optimizers.SGD(0.01),
               keras.losses.SparseCategoricalCrossentropy(),
               metrics=['accuracy'])
    x = _Images(2 * BATCH, seed=2)
    y = np.arange(2 * BATCH) % 10
    pm.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    loss, _ = pm.evaluate(x, y, batch_size=BATCH, verbose=0)
    self.assertTrue(np.isfinite(loss))
    part = x[:5]
    got = pm.predict(part, batch_size=BATCH, verbose=0)
    self.assertAllClose(got, pm.to_keras().predict(part, verbose=0),
                        rtol=RTOL, atol=1e-12)
    path = os.path.join(self.get_temp_dir(), f'{name}.keras')
    pm.save(path)
    loaded = keras.models.load_model(path)
    self.assertAllEqual(loaded.predict(part, batch_size=BATCH, verbose=0),
                        got)
    export_dir = os.path.join(self.get_temp_dir(), f'{name}_export')
    pm.export(export_dir)
    serve = tf.saved_model.load(export_dir).signatures['serving_default']
    (key,) = serve.structured_input_signature[1]
    served = serve(**{key: tf.constant(part)})
    self.assertAllClose(list(served.values())[0], got, rtol=RTOL,
                        atol=1e-12)

  @parameterized.named_parameters(*[(name, name) for name in _NORMALIZED])
  def testNormalizationStateEqualsKerasInPredictToKerasAndExport(self, name):
    model = _NORMALIZED[name]()
    norms = [l for l in model.layers
             if isinstance(l, keras.layers.Normalization)]
    self.assertLen(norms, 1)
    if norms[0].input_mean is None:
      # EfficientNetB0's Normalization is adapted (ImageNet weights carry
      # its state); adapt it to data far from mean 0 / variance 1. The
      # others are given their mean and variance by keras.applications.
      norms[0].adapt(_Images(16, seed=5) * 0.3 + 0.6)
    pm = keras_pipeline.TensorPipeModel(model, num_partitions=2,
                                        num_micro_batches=T, batch_size=BATCH)
    x = _Images(BATCH, seed=6) * 127.5 + 127.5  # pixels, as the models take
    want = model.predict(x, batch_size=BATCH, verbose=0)
    self.assertAllClose(pm.predict(x, batch_size=BATCH, verbose=0), want,
                        rtol=RTOL, atol=1e-12)
    self.assertAllClose(pm.to_keras().predict(x, batch_size=BATCH,
                                              verbose=0), want, rtol=RTOL,
                        atol=1e-12)
    export_dir = os.path.join(self.get_temp_dir(), f'{name}_export')
    pm.export(export_dir)
    serve = tf.saved_model.load(export_dir).signatures['serving_default']
    (key,) = serve.structured_input_signature[1]
    served = serve(**{key: tf.constant(x)})
    self.assertAllClose(list(served.values())[0], want, rtol=RTOL,
                        atol=1e-12)


if __name__ == '__main__':
  tf.test.main()
