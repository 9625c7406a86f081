"""keras_hub backbones as given, pipelined under every schedule: fit equals
Keras's.

GPT-2, BERT and Gemma (RMS norm, rotary embeddings, grouped-query
attention) backbones, built from config in float64, cut at K=2 and K=4
devices and trained two steps with GPipe, 1F1B, interleaved 1F1B (2 stages
per device), ZB-H1 and ZB-V (2 stages per device): the weights after `fit`
equal plain Keras `fit`'s to rtol 1e-9 (the pipeline runs the same ops per
row; only the sums over micro-batches are grouped differently). Gemma
computes its RMS norm and softmax in float32 whatever the dtype, and float32
kernels round a 1-row micro-batch differently from the whole batch: its
updates are held to the difference Keras alone shows when it groups each
step's gradient as the pipeline does, plus 2^-15 of the update
(_Float32Atols). The default tier checks each model's predictions at K=2
(keras_nested_test).
`GPT2CausalLM(preprocessor=None)` as given (its token table tied to the
softmax, read on the first and the last device) trains the same way with
keras_hub's loss: sparse cross-entropy from logits, sample_weight =
padding_mask.
"""

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

from tensorpipe import keras_pipeline
from tensorpipe import test_utils

test_utils.ConfigureTestDevices()

_VOCAB, _LEN, _N, _T = 40, 6, 8, 8
_SCHEDULES = (('gpipe', None), ('1f1b', None), ('interleaved_1f1b', 2),
              ('zb_h1', None), ('zb_v', 2))


def _Models():
  """name -> (a function building the backbone, its extra inputs)."""
  rng = np.random.default_rng(3)
  return {
      'gpt2': (lambda: keras_hub.models.GPT2Backbone(
          vocabulary_size=_VOCAB, num_layers=4, num_heads=2, hidden_dim=8,
          intermediate_dim=16, max_sequence_length=_LEN, dropout=0.0,
          dtype='float64'), {}),
      'bert': (lambda: keras_hub.models.BertBackbone(
          vocabulary_size=_VOCAB, num_layers=4, num_heads=2, hidden_dim=8,
          intermediate_dim=16, max_sequence_length=_LEN, num_segments=2,
          dropout=0.0, dtype='float64'),
               {'segment_ids': rng.integers(0, 2, (_N, _LEN)).astype('int32')}),
      # 6 blocks: ZB-V at K=4 needs 8 stages, and Gemma with 4 blocks has
      # 7 layer calls.
      'gemma': (lambda: keras_hub.models.GemmaBackbone(
          vocabulary_size=_VOCAB, num_layers=6, num_query_heads=2,
          num_key_value_heads=1, hidden_dim=8, intermediate_dim=16,
          head_dim=4, dropout=0.0, dtype='float64'), {}),
  }


def _SequenceModel(build):
  """The backbone's sequence output as the one output (BERT's is a dict)."""
  backbone = build()
  out = backbone.output
  if isinstance(out, dict):
    return keras.Model(backbone.input, out['sequence_output'])
  return backbone


def _Tokens():
  rng = np.random.default_rng(4)
  mask = np.ones((2 * _N, _LEN), 'int32')
  mask[::3, -2:] = 0
  return {'token_ids': rng.integers(0, _VOCAB, (2 * _N, _LEN)).astype('int32'),
          'padding_mask': mask}


def _CausalLm():
  backbone = _Models()['gpt2'][0]()
  return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def _KerasFit(build, weights, loss, data, sample_weight=None,
              rows_per_gradient=_N):
  """Plain Keras `fit` of `build()` from `weights`: the weights after.

  Every step takes _N rows. rows_per_gradient=1 makes Keras itself compute
  each step's gradient as the mean of _N one-row gradients (the optimizer's
  gradient_accumulation_steps), the grouping of a pipeline with _N
  micro-batches of 1 row, with no tensorpipe involved.
  """
  model = build()
  model.set_weights(weights)
  steps = _N // rows_per_gradient
  model.compile(keras.optimizers.SGD(
      0.05, gradient_accumulation_steps=steps if steps > 1 else None), loss)
  model.fit(*data, sample_weight=sample_weight, batch_size=rows_per_gradient,
            epochs=1, shuffle=False, verbose=0)
  return model.get_weights()


def _Float32Atols(w0, want, rows):
  """Per weight, the bound on |pipelined - Keras fit| for a float64 model
  that computes parts in float32 (Gemma: RMS norm, softmax).

  A float32 op rounds each result by up to u = 2^-24 relative, and its
  kernels round a 1-row batch differently from an 8-row one (vector lanes,
  blocking and reduction order follow the shape, and differ between CPUs:
  AVX2, AVX-512, AMX); a norm's scale gradient is moreover a float32 sum
  over rows x positions (48 terms for the batch, 6 per micro-batch). And
  the update is a sum over rows that can cancel, so its error relative to
  its own size has no useful a-priori bound: it is measured instead, on the
  CPU that runs the test. `rows` is Keras alone computing each step's
  gradient from 1-row slices (the pipeline's grouping), and
  |rows - want| the regrouping noise of this CPU's kernels (measured on
  one CPU: 2e-6 to 9e-5 of the update, by initial weights; 1e-15 for
  GPT-2, float64 throughout).

  The pipeline is held to that plus a floor for what still differs between
  it and `rows`, which group alike: the loss and its float64 gradient taken
  over the whole batch instead of per row, other graph rewrites (1e-16),
  tipping float32 roundings by an ulp. Carried through 13 float32 sections
  (2 RMS norms and a softmax per block, 6 blocks, the final norm) of ~5 ops
  forward and ~10 backward, ~2^8 roundings of u: 2^-16 of the gradient per
  step, 2^-15 over the 2 steps, taken of the weight's largest update
  (measured: at most 3.4e-6 = 2^-18.2 over 9 initialisations). A loss
  scaled by 1 + 1e-3, or a micro-batch missing from the gradient sum, moves
  the update by 1e-3 and ~1/8 of its size.

  Returns:
    One absolute tolerance per weight: max|rows - want| +
    2^-15 max|want - w0|.
  """
  return [float(np.max(np.abs(r - w))) +
          2.0 ** -15 * float(np.max(np.abs(w - a)))
          for r, w, a in zip(rows, want, w0)]


class KerasHubBackbonesTest(tf.test.TestCase):

  def _CheckFit(self, label, build, w0, want, k, schedule, stages_per_device,
                loss, data, sample_weight=None, atols=None):
    """Fits `build()` from weights w0 pipelined; its weights equal `want`.

    Float64 models (atols None): the same ops per row, sums regrouped:
    rtol 1e-9. Else each weight's update (w - w0) equals Keras's to its
    atol (_Float32Atols).
    """
    model = build()
    model.set_weights(w0)
    pipe = keras_pipeline.TensorPipeModel(
        model, num_partitions=k, num_micro_batches=_T, batch_size=_N,
        schedule=schedule, num_stages_per_device=stages_per_device)
    pipe.compile(keras.optimizers.SGD(0.05), loss)
    pipe.fit(*data, sample_weight=sample_weight, batch_size=_N, epochs=1,
             shuffle=False, verbose=0)
    got_all = pipe.get_weights()
    self.assertLen(got_all, len(want))
    for i, (got, w, a) in enumerate(zip(got_all, want, w0)):
      msg = f'{label} K={k} {schedule}: weight {i}'
      if atols is None:
        np.testing.assert_allclose(got, w, rtol=1e-9, atol=1e-12,
                                   err_msg=msg)
      else:
        np.testing.assert_allclose(got - a, w - a, rtol=0, atol=atols[i],
                                   err_msg=msg)

  def _CheckEverySchedule(self, name):
    """The backbone `name` of _Models at K=2 and 4 under every schedule."""
    build, extra = _Models()[name]
    x = _Tokens()
    x.update({key: np.concatenate([v, v]) for key, v in extra.items()})
    y = np.random.default_rng(4).normal(size=(2 * _N, _LEN, 8))
    seq = lambda: _SequenceModel(build)
    # The same initial weights on every run: one Keras fit serves all ten
    # pipelined ones, and Gemma's float32 noise (which depends on the
    # weights, _Float32Atols) does not change from run to run.
    keras.utils.set_random_seed(5)
    w0 = seq().get_weights()
    want = _KerasFit(seq, w0, 'mse', (x, y))
    # Gemma computes its RMS norm and softmax in float32 whatever the dtype
    # (keras_hub's choice).
    atols = (_Float32Atols(w0, want, _KerasFit(
        seq, w0, 'mse', (x, y), rows_per_gradient=1))
             if name == 'gemma' else None)
    for k in (2, 4):
      for schedule, stages_per_device in _SCHEDULES:
        with self.subTest(k=k, schedule=schedule):
          self._CheckFit(name, seq, w0, want, k, schedule,
                         stages_per_device, 'mse', (x, y), atols=atols)

  def testGpt2EverySchedule(self):
    self._CheckEverySchedule('gpt2')

  def testBertEverySchedule(self):
    self._CheckEverySchedule('bert')

  # Ten pipelined fits of 6 blocks: 12-14 minutes on a loaded 2-core
  # machine, near pytest.ini's 900 s.
  @pytest.mark.timeout(1800)
  def testGemmaEverySchedule(self):
    self._CheckEverySchedule('gemma')

  def testGpt2CausalLmAsGivenEverySchedule(self):
    """The tied LM head (one table on two devices), keras_hub's loss
    weighting: sample_weight = padding_mask."""
    x = _Tokens()
    y = np.roll(x['token_ids'], -1, axis=1)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    keras.utils.set_random_seed(5)
    w0 = _CausalLm().get_weights()
    want = _KerasFit(_CausalLm, w0, loss, (x, y), x['padding_mask'])
    for k in (2, 4):
      for schedule, stages_per_device in _SCHEDULES:
        with self.subTest(k=k, schedule=schedule):
          self._CheckFit('gpt2_causal_lm', _CausalLm, w0, want, k, schedule,
                         stages_per_device, loss, (x, y), x['padding_mask'])


if __name__ == '__main__':
  tf.test.main()
