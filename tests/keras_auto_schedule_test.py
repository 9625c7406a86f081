"""TensorPipeModel(schedule='auto'): the planner's pick, run and stored.

The layer resolves 'auto' from the cut's FLOPs (schedule_auto); the model
must then train with the schedule the layer runs (a loss-inside schedule's
step, or GPipe's), store that schedule and its v in get_config, and fit
exactly as a model built with the picked schedule named. Float64, K=2,
T=2, a Sequential of eight Dense layers (the planner cuts it, so a
two-stages-per-device pick can happen). A functional model, cut along its
graph before any schedule runs, is refused with the fix.
"""

import keras
import numpy as np
import tensorflow as tf

from tensorpipe import keras_pipeline
from tensorpipe import test_utils

test_utils.ConfigureTestDevices()

T = 2
N = 8


def _Dense(units, seed, name, **kw):
  return keras.layers.Dense(
      units, dtype='float64', name=name,
      kernel_initializer=keras.initializers.GlorotUniform(seed), **kw)


def _Sequential():
  return keras.Sequential(
      [keras.Input((6,), dtype='float64')] +
      [_Dense(8, i, f'd{i}', activation='tanh') for i in range(7)] +
      [_Dense(3, 9, 'logits')])


def _Functional():
  inp = keras.Input((6,), dtype='float64')
  h = inp
  for i in range(4):
    h = _Dense(8, i, f'f{i}', activation='tanh')(h)
  return keras.Model(inp, _Dense(3, 9, 'out')(h), name='func')


def _Data():
  rng = np.random.RandomState(3)
  return rng.normal(size=(2 * N, 6)), rng.randint(0, 3, size=2 * N)


def _Fit(model):
  model.compile(optimizer=keras.optimizers.SGD(0.1),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True))
  x, y = _Data()
  hist = model.fit(x, y, batch_size=N, epochs=1, shuffle=False, verbose=0)
  return [w.copy() for w in model.get_weights()], hist.history['loss']


class KerasAutoScheduleTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    keras.backend.set_floatx('float64')
    self.addCleanup(keras.backend.set_floatx, 'float32')

  def _CheckPickRunsAndIsStored(self, make, **plan):
    auto = keras_pipeline.TensorPipeModel(
        make(), num_partitions=2, num_micro_batches=T, batch_size=N,
        schedule='auto', **plan)
    params = auto._pipe.params
    picked, v = params.schedule, params.num_stages_per_device
    self.assertNotEqual(picked, 'auto')
    self.assertEqual(auto._schedule, picked)
    config = auto.get_config()
    self.assertEqual((config['schedule'], config['num_stages_per_device']),
                     (picked, v))
    rebuilt = keras_pipeline.TensorPipeModel.from_config(config)
    self.assertEqual((rebuilt._pipe.params.schedule,
                      rebuilt._pipe.params.num_stages_per_device), (picked, v))
    named = keras_pipeline.TensorPipeModel(
        make(), num_partitions=2, num_micro_batches=T, batch_size=N,
        schedule=picked, num_stages_per_device=v)
    got, got_loss = _Fit(auto)
    want, want_loss = _Fit(named)
    for a, b in zip(got, want):
      np.testing.assert_array_equal(a, b)
    self.assertEqual(got_loss, want_loss)
    return picked, v

  def testSequentialOnSeparateDevicesPicksTwoStagesPerDevice(self):
    # FLOP costs on separate executors: the bubble decides, and eight
    # layers over K=2 leave room for v=2 (4 stages).
    picked, v = self._CheckPickRunsAndIsStored(_Sequential,
                                               plan_regime='separate')
    self.assertEqual(v, 2, picked)

  def testSequentialSharedRegimeDefault(self):
    picked, _ = self._CheckPickRunsAndIsStored(_Sequential)
    self.assertIn(picked, ('gpipe', '1f1b', 'zb_h1', 'interleaved_1f1b',
                           'zb_v'))

  def testRecomputeAutoIsResolvedRunAndStored(self):
    # FLOP costs, no memory budget: the step without recompute wins.
    auto = keras_pipeline.TensorPipeModel(
        _Sequential(), num_partitions=2, num_micro_batches=T, batch_size=N,
        schedule='auto', recompute='auto')
    params = auto._pipe.params
    self.assertIs(params.recompute, False)
    config = auto.get_config()
    self.assertIs(config['recompute'], False)
    named = keras_pipeline.TensorPipeModel(
        _Sequential(), num_partitions=2, num_micro_batches=T, batch_size=N,
        schedule=params.schedule,
        num_stages_per_device=params.num_stages_per_device,
        recompute=False)
    got, got_loss = _Fit(auto)
    want, want_loss = _Fit(named)
    for a, b in zip(got, want):
      np.testing.assert_array_equal(a, b)
    self.assertEqual(got_loss, want_loss)

  def testFunctionalModelIsRefusedWithTheFix(self):
    with self.assertRaisesRegex(
        ValueError, r"schedule='auto' plans the cut of a Sequential.*"
        r"functional model.*name a schedule"):
      keras_pipeline.TensorPipeModel(
          _Functional(), num_partitions=2, num_micro_batches=T,
          batch_size=N, schedule='auto')

  def testRecomputeAutoOfAFunctionalModelIsRefusedAndABudgetAllowed(self):
    with self.assertRaisesRegex(
        ValueError, r"recompute='auto' plans the cut of a Sequential.*"
        'functional model'):
      keras_pipeline.TensorPipeModel(
          _Functional(), num_partitions=2, num_micro_batches=T,
          batch_size=N, schedule='1f1b', recompute='auto')
    # A budget steers recompute='auto' with a named schedule: 1 byte per
    # device fits nothing, and the planner says so.
    with self.assertRaisesRegex(ValueError, "recompute='auto' found no "
                                'setting that fits.*1f1b T=2 norc: '
                                'memory peak'):
      keras_pipeline.TensorPipeModel(
          _Sequential(), num_partitions=2, num_micro_batches=T,
          batch_size=N, schedule='1f1b', recompute='auto',
          plan_memory_budget=1)

  def testPlanSettingsWithoutAutoAreRefused(self):
    with self.assertRaisesRegex(
        ValueError, r"plan_regime set with schedule='1f1b'.*use 'auto'"):
      keras_pipeline.TensorPipeModel(
          _Sequential(), num_partitions=2, num_micro_batches=T,
          batch_size=N, schedule='1f1b', plan_regime='separate')


if __name__ == '__main__':
  tf.test.main()
