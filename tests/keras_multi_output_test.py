"""TensorPipeModel.fit of a model with several outputs, loss inside.

A functional model with two outputs, one of them made by the first layers
(so it crosses every later cut, carried in the boundaries to the last
stage), K=2 devices, T=4 micro-batches, float64 (floatx too, so that
Keras' loss trackers and metrics log float64): `fit` under every
loss-inside schedule ('1f1b' and 'zb_v' with list outputs, 'zb_h1' and
'interleaved_1f1b' with dict outputs) logs what plain Keras fit logs (the
total loss, each output's '<name>_loss', per-output metrics and weighted
metrics) and ends with Keras' weights, rtol 1e-9: the pipeline only
regroups sums. The losses have different normalisers (rows, the sum of the
sample weights, 1) and weights, sample weights are one array or one per
output, and the last batch is partial (run unpipelined). What cannot be
reproduced from micro-batch sums is refused in one line.
"""

import keras
import numpy as np
import tensorflow as tf

from tensorpipe import keras_pipeline
from tensorpipe import test_utils

test_utils.ConfigureTestDevices()

RTOL = 1e-9
T = 4
N = 16
ROWS = 2 * N + 8  # two pipelined steps and a partial one of 8 rows


@keras.saving.register_keras_serializable(package='keras_multi_output_test')
class _Penalised(keras.layers.Layer):
  """The identity, adding an activity penalty with add_loss."""

  def call(self, x):
    self.add_loss(0.01 * keras.ops.sum(x * x))
    return x


def _TwoOutputs(dict_outputs: bool = False, name: str = 'two',
                penalty: bool = False) -> keras.Model:
  """Inputs [batch, 6] -> logits [batch, 3] (made last) and aux [batch, 3]
  (made by the second layer, in the first stage)."""
  init = keras.initializers.GlorotUniform

  def Dense(units, i, name, **kw):
    return keras.layers.Dense(units, kernel_initializer=init(i), name=name,
                              dtype='float64', **kw)
  inp = keras.Input((6,), dtype='float64')
  h = Dense(8, 1, 'd1', activation='tanh')(inp)
  if penalty:
    h = _Penalised(name='penalty', dtype='float64')(h)
  aux = Dense(3, 2, 'aux')(h)
  # Read here and nowhere later: only its being an output carries aux on.
  h = keras.layers.Concatenate(name='cat', dtype='float64')([h, aux])
  h = Dense(8, 3, 'd3', activation='tanh')(h)
  h = Dense(8, 4, 'd4', activation='tanh')(h)
  logits = Dense(3, 5, 'logits')(h)
  outputs = ({'logits': logits, 'aux': aux} if dict_outputs
             else [logits, aux])
  return keras.Model(inp, outputs, name=name)


def _Data():
  rng = np.random.RandomState(1)
  x = rng.normal(size=(ROWS, 6))
  labels = rng.randint(0, 3, size=ROWS)
  targets = rng.normal(size=(ROWS, 3))
  return x, labels, targets, rng.uniform(0.0, 2.0, size=(2, ROWS))


def _Pipe(model, schedule, v=None):
  return keras_pipeline.TensorPipeModel(
      model, num_partitions=2, num_micro_batches=T, batch_size=N,
      schedule=schedule, num_stages_per_device=v)


class KerasMultiOutputTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    # Keras' loss trackers and metrics are made in floatx at compile.
    self._floatx = keras.config.floatx()
    keras.config.set_floatx('float64')

  def tearDown(self):
    keras.config.set_floatx(self._floatx)
    super().tearDown()

  def _AssertFitEqualsKeras(self, make, schedules, compile_kw, fit_args,
                            fit_kw=None):
    """fit of plain Keras make() and of TensorPipeModel(make()) under each
    (schedule, v): the same history (every key) and the same weights."""
    def Fit(model):
      model.compile(keras.optimizers.SGD(0.125), **compile_kw())
      history = model.fit(*fit_args, epochs=1, verbose=0,
                          **(fit_kw or {})).history
      return history, model.get_weights()
    want_history, want = Fit(make())
    for schedule, v in schedules:
      pipe = _Pipe(make(), schedule, v)
      # The aux output is made in the first stage: it must reach the last.
      plan, graph = pipe.graph_pipeline.plan, pipe.graph_pipeline.graph
      aux = graph.outputs[list(graph.output_names).index('aux')]
      self.assertIn(aux, plan.boundaries[-1], pipe.graph_pipeline.Report())
      history, got = Fit(pipe)
      self.assertCountEqual(history, want_history)
      for key in want_history:
        test_utils.AssertAllCloseScaled(self, history[key], want_history[key],
                                        RTOL, msg=f'{schedule} {key}')
      self.assertLen(got, len(want))
      for i, (a, b) in enumerate(zip(got, want)):
        test_utils.AssertAllCloseScaled(self, a, b, RTOL,
                                        msg=f'{schedule} weight {i}')
    return want_history

  def testListOutputsFitEqualsKerasUnder1f1bAndZbV(self):
    x, labels, targets, w = _Data()

    def Compile():
      # Normalisers: rows for the logits, the sum of the weights for aux.
      return dict(
          loss=[keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                keras.losses.MeanSquaredError(
                    reduction='mean_with_sample_weight')],
          loss_weights=[0.7, 2.5], metrics=[['accuracy'], ['mae']],
          weighted_metrics=[[], ['mse']])
    # Batches of unknown size, the last one partial: each step chooses
    # between the pipeline and an unpipelined step (a tf.cond).
    data = tf.data.Dataset.from_tensor_slices(
        (x, (labels, targets), w[0])).batch(N)
    history = self._AssertFitEqualsKeras(
        _TwoOutputs, (('1f1b', None), ('zb_v', None)), Compile, (data,),
        dict(shuffle=False))
    self.assertCountEqual(history, ['loss', 'logits_loss', 'aux_loss',
                                    'logits_accuracy', 'aux_mae', 'aux_mse'])

  def testDictOutputsFitEqualsKerasUnderZbH1AndInterleaved1f1b(self):
    x, labels, targets, w = _Data()

    def Compile():
      # Normalisers: rows for the logits, 1 for aux (reduction 'sum').
      return dict(
          loss={'aux': keras.losses.MeanSquaredError(reduction='sum'),
                'logits': keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True)},
          loss_weights={'logits': 1.5, 'aux': 0.3},
          metrics={'logits': ['accuracy']}, weighted_metrics={'aux': ['mae']})
    rows = 2 * N  # full batches of a known size: pipelined, no tf.cond
    self._AssertFitEqualsKeras(
        lambda: _TwoOutputs(dict_outputs=True),
        (('zb_h1', None), ('interleaved_1f1b', 2)), Compile,
        (x[:rows], {'logits': labels[:rows], 'aux': targets[:rows]}),
        dict(sample_weight={'logits': w[0, :rows], 'aux': w[1, :rows]},
             batch_size=N, shuffle=False))

  def testUnreproducibleLossesAreRefusedInOneLine(self):
    x, labels, targets, _ = _Data()
    y = [labels[:N], targets[:N]]
    xent = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    cases = (
        (dict(loss=[xent, keras.losses.MeanSquaredError(reduction='none')]),
         y, r"reduction='none'.*use one of"),
        (dict(loss=[xent, 'mse'], metrics=[
            [], [keras.metrics.RootMeanSquaredError(name='rmse')]]), y,
         r"metric 'rmse'.*only weighted means.*schedule='gpipe'"),
        (dict(loss=[xent, None]), y[:1],
         r"labels with each of the model's 2 outputs; got 1: pass labels "
         r"for every output.*schedule='gpipe'"),
        (dict(loss=[xent, 'mse']), y,
         r"'penalty'.*added 1 loss\(es\) \(add_loss.*add the penalty to "
         'the task loss'))
    for i, (compile_kw, labels_, error) in enumerate(cases):
      pipe = _Pipe(_TwoOutputs(penalty=i == len(cases) - 1), '1f1b')
      pipe.compile(keras.optimizers.SGD(0.1), **compile_kw)
      with self.assertRaisesRegex(ValueError, error) as caught:
        pipe.fit(x[:N], labels_, batch_size=N, verbose=0)
      self.assertNotIn('\n', str(caught.exception))


if __name__ == '__main__':
  tf.test.main()
