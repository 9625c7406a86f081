"""keras_hub models and dict inputs and outputs on the Params route.

keras_params.PipelineParams flattens a keras_hub model (or any functional
model with dict inputs or outputs, keras_nested) and cuts its graph like any
functional model; the pipeline then takes one dict keyed by keras.Input name
and returns dict outputs as a NestedMap. SequenceTask.model_inputs feeds such
a model from the batch, so a registered experiment trains a keras_hub LM
with tools/trainer (params/lm/brown.py KerasGpt2Lm4x8). Checked against
plain Keras in float64 (rtol 1e-9: the same ops per row, only the rows are
grouped differently).
"""

import keras
import keras_hub
import numpy as np
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import keras_params
from tensorpipe import py_utils
from tensorpipe import tasks
from tensorpipe import test_utils
from tensorpipe.nested_map import NestedMap

test_utils.ConfigureTestDevices()

_VOCAB, _LEN, _N = 40, 6, 8
_INPUTS = {'token_ids': 'ids', 'padding_mask': '1-paddings'}


def _Lm(compile=True):  # pylint: disable=redefined-builtin
  keras.utils.set_random_seed(1)
  backbone = keras_hub.models.GPT2Backbone(
      vocabulary_size=_VOCAB, num_layers=2, num_heads=2, hidden_dim=8,
      intermediate_dim=16, max_sequence_length=_LEN, dropout=0.0,
      dtype='float64')
  return keras_hub.models.GPT2CausalLM(backbone, preprocessor=None,
                                       compile=compile)


def _Batch():
  """An LM batch as lm_input gives it: ids, labels, paddings (1: padding)."""
  rng = np.random.default_rng(0)
  paddings = np.zeros((_N, _LEN), 'float32')
  paddings[::3, -2:] = 1.0
  ids = rng.integers(0, _VOCAB, (_N, _LEN)).astype('int32')
  labels = rng.integers(0, _VOCAB, (_N, _LEN)).astype('int32')
  return NestedMap(ids=tf.constant(ids), labels=tf.constant(labels),
                   paddings=tf.constant(paddings))


def _KerasInputs(batch):
  return {'token_ids': batch.ids.numpy(),
          'padding_mask': (batch.paddings.numpy() == 0).astype('int32')}


class KerasHubParamsRouteTest(tf.test.TestCase):

  def testCausalLmTakesADictKeyedByInputNameLikeKeras(self):
    lm = _Lm()
    pipe = keras_params.BuildPipeline(lm, num_partitions=2,
                                      num_micro_batches=2, batch_size=_N)
    x = _KerasInputs(_Batch())
    want = lm.predict(x, batch_size=_N, verbose=0)
    got = pipe.FPropDefaultTheta(x).numpy()
    self.assertEqual(got.shape, (_N, _LEN, _VOCAB))
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    # Positional inputs come in the flattened model's (sorted-name) order.
    np.testing.assert_array_equal(pipe.FPropDefaultTheta(
        x['padding_mask'], x['token_ids']).numpy(), got)
    with self.assertRaisesRegex(ValueError, r"no \['padding_mask'\].*keras"
                                r'\.Input names'):
      pipe.FPropDefaultTheta({'token_ids': x['token_ids']})
    # The tied output projection reads stage 0's table: one variable.
    tied = [l for l in base_layer.Layers(pipe)
            if getattr(l.params, 'tied_to', None)]
    self.assertLen(tied, 1)
    self.assertLen(pipe.trainable_variables, len(lm.trainable_weights))

  def testFromAFunctionTheParamsHoldNoWeights(self):
    p = keras_params.PipelineParams(lambda: _Lm(compile=False),
                                    num_partitions=2, num_micro_batches=2,
                                    batch_size=_N)
    self.assertIn("input_names : ['padding_mask', 'token_ids']",
                  p.ToText().replace('"', "'"))
    pipe = p.Instantiate()  # its KerasLayers initialise their own weights
    out = pipe.FPropDefaultTheta(_KerasInputs(_Batch()))
    self.assertEqual(out.shape, (_N, _LEN, _VOCAB))
    self.assertTrue(np.all(np.isfinite(out.numpy())))
    # A keras_hub task model compiles an optimizer when made (a variable
    # with a fixed value): named with the fix.
    with self.assertRaisesRegex(ValueError, 'pass compile=False'):
      keras_params.PipelineParams(_Lm, num_partitions=2, num_micro_batches=2,
                                  batch_size=_N)

  def testDictOutputsComeBackAsANestedMapKeyedByName(self):
    keras.utils.set_random_seed(2)
    inp = keras.Input((4,), name='x', dtype='float64')
    h = keras.layers.Dense(3, dtype='float64', name='h')(inp)
    model = keras.Model({'x': inp}, {
        'b': keras.layers.Dense(2, dtype='float64', name='b')(h),
        'a': keras.layers.Dense(1, dtype='float64', name='a')(h)})
    pipe = keras_params.BuildPipeline(model, num_partitions=2,
                                      num_micro_batches=2, batch_size=4)
    x = {'x': np.random.default_rng(1).normal(size=(4, 4))}
    want = model(x)
    got = pipe.FPropDefaultTheta(x)
    self.assertIsInstance(got, NestedMap)
    self.assertEqual(sorted(got), ['a', 'b'])
    for key in ('a', 'b'):
      np.testing.assert_allclose(got[key], want[key], rtol=1e-9)


class ModelInputsTest(tf.test.TestCase):

  def _Task(self, schedule: str, lm) -> tasks.SequenceTask:
    model = keras_params.PipelineParams(
        lambda: _Lm(compile=False), num_partitions=2, num_micro_batches=2,
        batch_size=_N, schedule=schedule)
    task = tasks.SequenceTask.Params().Set(
        name='task', model=model, vocab_size=_VOCAB,
        model_inputs=_INPUTS).Instantiate()
    keras_params.CopyKerasWeights(task.children.model, lm)
    return task

  def testSequenceTaskTrainsAKerasHubLmLikeKerasUnderEverySchedule(self):
    lm, batch = _Lm(), _Batch()
    # Keras's loss and gradient norm (one tied table) on the whole batch.
    weights = 1.0 - batch.paddings.numpy().astype('float64')
    with tf.GradientTape() as tape:
      logits = lm(_KerasInputs(batch))
      xent = tf.nn.sparse_softmax_cross_entropy_with_logits(
          tf.cast(batch.labels, tf.int64), logits)
      want_loss = tf.reduce_sum(xent * weights) / weights.sum()
    want_norm = tf.linalg.global_norm(
        tape.gradient(want_loss, lm.trainable_weights))
    grads = {}
    for schedule in ('gpipe', '1f1b', 'zb_h1'):
      with self.subTest(schedule=schedule):
        task = self._Task(schedule, lm)
        with py_utils.TrainingMode(), tf.GradientTape() as tape:
          loss = task.FPropDefaultTheta(batch).loss
        variables = task.trainable_variables
        grads[schedule] = tape.gradient(loss, variables)
        np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-9)
        np.testing.assert_allclose(
            float(tf.linalg.global_norm(grads[schedule])), float(want_norm),
            rtol=1e-9)
        for g, g0 in zip(grads[schedule], grads['gpipe']):
          np.testing.assert_allclose(g, g0, rtol=1e-9, atol=1e-15)

  def testBadMappingsAreNamedWithTheFix(self):
    p = tasks.SequenceTask.Params().Set(
        name='task', model=keras_params.PipelineParams(
            lambda: _Lm(compile=False), num_partitions=1,
            num_micro_batches=1, batch_size=_N),
        vocab_size=_VOCAB)
    with self.assertRaisesRegex(ValueError, r"model_inputs='ids' must be "
                                r'None or a non-empty dict'):
      p.Copy().Set(model_inputs='ids').Instantiate()
    task = p.Copy().Set(model_inputs={'token_ids': 'tokens',
                                      'padding_mask': '1-paddings'}
                        ).Instantiate()
    spec = {k: tf.TensorSpec([_N, _LEN]) for k in ('ids', 'labels',
                                                   'paddings')}
    with self.assertRaisesRegex(ValueError, r"reads batch keys \['tokens'\]"
                                r'.*have \[.ids., .labels., .paddings.\]'):
      task.CheckInputSpec(spec, _N, 'input')


if __name__ == '__main__':
  tf.test.main()
