"""TensorPipeModel.fit under every schedule (schedule=, keras_loss_inside).

A Keras Sequential (conv, batch norms, dropout) and a functional model,
K=2 partitions, T=4 micro-batches, float64: two steps of `fit` under
'1f1b', 'zb_h1' and 'interleaved_1f1b' (v=2; 'zb_v' for the functional
model) give the weights GPipe gives (rtol 1e-9: the loss is summed per
micro-batch, in another order) and the same logged losses (Keras logs
them as a float32 mean); with sample weights and a partial last batch
(run unpipelined) too. Compiled weighted-mean metrics (accuracy, MAE,
crossentropy under 1f1b; weighted_metrics with per-token sample weights, as
keras_hub's causal LMs train, under zb_h1) are logged as plain Keras fit
logs them. The refusals
name the value and the fix.
"""

import keras
import numpy as np
import tensorflow as tf

from tensorpipe import distribute
from tensorpipe import keras_params
from tensorpipe import keras_pipeline
from tensorpipe import test_utils
from tests import keras_testlib

test_utils.ConfigureTestDevices()

RTOL = 1e-9
LOGGED_RTOL = 1e-6  # History's loss is a float32 Mean
T = 4
N = 16
SCHEDULES = (('1f1b', None), ('zb_h1', None), ('interleaved_1f1b', 2))


def _Functional():
  """Four tanh Dense layers, a skip (Add) and the logits: K x v = 4 stages
  can be cut."""
  def Dense(units, i, **kw):
    return keras.layers.Dense(
        units, kernel_initializer=keras.initializers.GlorotUniform(i),
        name=f'dense{i}', dtype='float64', **kw)

  inp = keras.Input((6,), dtype='float64')
  h = Dense(8, 1, activation='tanh')(inp)
  h = Dense(8, 2, activation='tanh')(h)
  skip = h
  h = Dense(8, 3, activation='tanh')(h)
  h = Dense(8, 4, activation='tanh')(h)
  h = keras.layers.Add(name='skip', dtype='float64')([h, skip])
  out = Dense(keras_testlib.NUM_CLASSES, 5)(h)
  return keras.Model(inp, out, name='func')


def _Data(kind, rows, seed=1):
  if kind == 'sequential':
    return keras_testlib.Batch(rows, seed=seed)
  rng = np.random.RandomState(seed)
  x = rng.normal(size=(rows, 6))
  return x, rng.randint(0, keras_testlib.NUM_CLASSES, size=rows)


def _Model(kind, schedule, v=None, **kw):
  model = (keras_testlib.MakeSequential() if kind == 'sequential'
           else _Functional())
  return keras_pipeline.TensorPipeModel(
      model, num_partitions=2, num_micro_batches=T, batch_size=N,
      schedule=schedule, num_stages_per_device=v, **kw)


def _Tokens():
  """Token ids [batch, 5] -> per-token logits [batch, 5, 7] (a causal LM's
  shape: labels and sample weights per token)."""
  init = keras.initializers.GlorotUniform
  inp = keras.Input((5,), dtype='int32')
  h = keras.layers.Embedding(7, 8, embeddings_initializer=init(1),
                             name='emb', dtype='float64')(inp)
  h = keras.layers.Dense(8, activation='tanh', kernel_initializer=init(2),
                         name='mid', dtype='float64')(h)
  out = keras.layers.Dense(7, kernel_initializer=init(3), name='head',
                           dtype='float64')(h)
  return keras.Model(inp, out, name='tokens')


def _KerasAndPipeHistories(make, schedule, x, y, compile_kw, **fit_kw):
  """History of plain Keras fit on make() and of TensorPipeModel(make())
  under `schedule`, both compiled with compile_kw()."""
  out = []
  for pipelined in (False, True):
    model = make()
    if pipelined:
      model = keras_pipeline.TensorPipeModel(
          model, num_partitions=2, num_micro_batches=T, batch_size=N,
          schedule=schedule)
    model.compile(keras.optimizers.SGD(0.125), **compile_kw())
    out.append(model.fit(x, y, batch_size=N, epochs=1, shuffle=False,
                         verbose=0, **fit_kw).history)
  return out


def _Fit(pipe, x, y, loss=None, **fit_kw):
  pipe.compile(keras.optimizers.SGD(0.125), loss or keras_testlib.Loss())
  history = pipe.fit(x, y, batch_size=N, epochs=1, shuffle=False, verbose=0,
                     **fit_kw)
  return history.history['loss'], pipe.get_weights()


class KerasSchedulesTest(tf.test.TestCase):

  def _AssertSameTraining(self, kind, rows=2 * N, loss=None, weights=False,
                          schedules=SCHEDULES):
    x, y = _Data(kind, rows)
    fit_kw = {}
    if weights:
      fit_kw['sample_weight'] = np.random.RandomState(5).uniform(
          0.0, 2.0, size=rows)
    want_loss, want = _Fit(_Model(kind, 'gpipe'), x, y, loss, **fit_kw)
    for schedule, v in schedules:
      pipe = _Model(kind, schedule, v)
      self.assertLen(pipe.pipeline.PartitionLayers(),
                     2 * (v or (2 if schedule == 'zb_v' else 1)))
      got_loss, got = _Fit(pipe, x, y, loss, **fit_kw)
      test_utils.AssertAllCloseScaled(self, got_loss, want_loss, LOGGED_RTOL,
                                      msg=f'{schedule} loss')
      self.assertLen(got, len(want))
      for i, (a, b) in enumerate(zip(got, want)):
        test_utils.AssertAllCloseScaled(self, a, b, RTOL,
                                        msg=f'{schedule} weight {i}')

  def testSequentialFitEqualsGPipeUnderEverySchedule(self):
    self._AssertSameTraining('sequential')

  def testFunctionalFitEqualsGPipeUnderEverySchedule(self):
    # zb_v: two stages per device by default (its V).
    self._AssertSameTraining('functional',
                             schedules=SCHEDULES + (('zb_v', None),))

  def testSampleWeightsAndPartialLastBatchEqualGPipe(self):
    # 40 rows: two pipelined steps and one of 8 rows, run unpipelined.
    self._AssertSameTraining('functional', rows=40, weights=True)

  def testSumAndWeightedMeanReductionsEqualGPipe(self):
    for reduction in ('sum', 'mean_with_sample_weight'):
      loss = keras.losses.SparseCategoricalCrossentropy(
          from_logits=True, reduction=reduction, dtype='float64')
      self._AssertSameTraining('functional', loss=loss, weights=True,
                               schedules=(('1f1b', None),))

  def testConfigRoundTripsTheScheduleAndPredictIsGPipes(self):
    pipe = _Model('functional', 'interleaved_1f1b', 2)
    x, _ = _Data('functional', N + 3)
    test_utils.AssertAllCloseScaled(
        self, pipe.predict(x, batch_size=N, verbose=0),
        _Model('functional', 'gpipe').predict(x, batch_size=N, verbose=0),
        RTOL)
    config = pipe.get_config()
    self.assertEqual(config['schedule'], 'interleaved_1f1b')
    self.assertEqual(config['num_stages_per_device'], 2)
    again = keras_pipeline.TensorPipeModel.from_config(config)
    self.assertEqual(again.pipeline.params.schedule, 'interleaved_1f1b')
    self.assertLen(again.pipeline.PartitionLayers(), 4)
    sizes = keras_pipeline.TensorPipeModel(
        keras_testlib.MakeSequential(), num_partitions=2,
        num_micro_batches=T, batch_size=N, partition_sizes=[1, 3, 2, 2],
        schedule='interleaved_1f1b', num_stages_per_device=2)
    self.assertEqual([len(p) for p in sizes.pipeline.PartitionLayers()],
                     [1, 3, 2, 2])

  def _AssertSameHistory(self, want, got, schedule):
    self.assertCountEqual(got, want)
    for key in want:
      # float64 metrics to RTOL; Keras' float32 ones (the loss, accuracy)
      # to their rounding.
      rtol = RTOL if key.startswith('f64') else LOGGED_RTOL
      test_utils.AssertAllCloseScaled(self, got[key], want[key], rtol,
                                      msg=f'{schedule} {key}')

  def testCompiledMetricsEqualPlainKerasFit(self):
    x, y = _Data('functional', 2 * N + 8)  # and a partial last batch
    y = np.eye(keras_testlib.NUM_CLASSES)[y]
    w = np.random.RandomState(5).uniform(0.0, 2.0, size=len(y))

    def Compile():
      return dict(
          loss=keras.losses.CategoricalCrossentropy(from_logits=True,
                                                    dtype='float64'),
          metrics=['accuracy', 'mae', keras.metrics.MeanAbsoluteError(
              name='f64_mae', dtype='float64')],
          weighted_metrics=[keras.metrics.CategoricalCrossentropy(
              from_logits=True, name='f64_xent', dtype='float64')])
    want, got = _KerasAndPipeHistories(_Functional, '1f1b', x, y, Compile,
                                       sample_weight=w)
    self.assertCountEqual(got, ['loss', 'accuracy', 'mae', 'f64_mae',
                                'f64_xent'])
    self._AssertSameHistory(want, got, '1f1b')

  def testPerTokenSampleWeightsAsAPaddingMaskUnderZbH1(self):
    rng = np.random.RandomState(3)
    x = rng.randint(0, 7, size=(2 * N, 5)).astype(np.int32)
    y = np.roll(x, -1, axis=1)
    mask = (np.arange(5)[None] < rng.randint(1, 6, size=(2 * N, 1)))

    def Compile():
      return dict(loss=keras.losses.SparseCategoricalCrossentropy(
          from_logits=True, dtype='float64'),
                  weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(
                      name='f64_acc', dtype='float64')])
    want, got = _KerasAndPipeHistories(_Tokens, 'zb_h1', x, y, Compile,
                                       sample_weight=mask.astype(np.float64))
    self._AssertSameHistory(want, got, 'zb_h1')

  def testBuildLogsWhichDeviceHoldsWhichStage(self):
    # absl's logger: its level is set here, whatever another test left.
    with self.assertLogs('absl', level='INFO') as logs:
      pipe = _Model('functional', 'zb_v')
    devices = pipe.pipeline.devices
    report = ("4 stages on 2 devices, 2 per device (schedule 'zb_v'):\n"
              f'  device 0 ({devices[0]}): stages 0, 3\n'
              f'  device 1 ({devices[1]}): stages 1, 2')
    self.assertEqual(pipe.pipeline.PlacementReport(), report)
    self.assertTrue(any(report in line for line in logs.output), logs.output)

  def testParamsRouteNumPartitionsCountsDevicesForEveryKind(self):
    # K = 2 devices for a Sequential (cut by FLOPs or by partition_sizes)
    # and a functional model (by FLOPs or cut_after); zb_v: 2 stages each.
    for model, kw in (
        (keras_testlib.MakeSequential, {}),
        (keras_testlib.MakeSequential, dict(partition_sizes=[1, 3, 2, 2])),
        (_Functional, {}),
        (_Functional, dict(cut_after=['dense1', 'dense2', 'skip']))):
      p = keras_params.PipelineParams(model(), 2, T, batch_size=N,
                                      schedule='zb_v', **kw)
      self.assertEqual(distribute.NumPartitions(p), 2, kw)
      pipe = p.Instantiate()
      self.assertLen(pipe.devices, 2)
      self.assertEqual(pipe.num_stages, 4, kw)
    with self.assertRaisesRegex(ValueError, r'partition_sizes=\[4, 4\] must '
                                r'be 4 \(num_partitions=2 devices x 2 stages'):
      keras_params.PipelineParams(keras_testlib.MakeSequential(), 2, T,
                                  partition_sizes=[4, 4], schedule='zb_v')

  def testRefusalsNameTheValueAndTheFix(self):
    x, y = _Data('functional', N)
    pipe = _Model('functional', '1f1b')
    # One-hot labels: AUC's own (symbolic) update must accept them.
    pipe.compile(keras.optimizers.SGD(0.1), keras.losses.
                 CategoricalCrossentropy(from_logits=True),
                 metrics=['accuracy', keras.metrics.AUC(name='auc')])
    with self.assertRaisesRegex(ValueError, r"metric 'auc' \(AUC\).*"
                                r"only weighted means.*schedule='gpipe'"):
      pipe.fit(x, np.eye(keras_testlib.NUM_CLASSES)[y], batch_size=N,
               verbose=0)
    pipe = _Model('functional', 'zb_h1')
    pipe.compile(keras.optimizers.SGD(0.1),
                 keras.losses.SparseCategoricalCrossentropy(
                     from_logits=True, reduction='none'))
    with self.assertRaisesRegex(ValueError, r"reduction='none'.*use one of"):
      pipe.fit(x, y, batch_size=N, verbose=0)


if __name__ == '__main__':
  tf.test.main()
