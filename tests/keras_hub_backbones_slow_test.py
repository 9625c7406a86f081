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
(keras_hub_testlib.Float32Atols). The default tier checks each model's
predictions at K=2 (keras_nested_test).
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
from tests import keras_hub_testlib

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
  return keras_hub_testlib.Tokens(_VOCAB, _LEN, 2 * _N)


def _CausalLm():
  backbone = _Models()['gpt2'][0]()
  return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


class KerasHubBackbonesTest(tf.test.TestCase):

  def _CheckFit(self, label, build, w0, want, k, schedule, stages_per_device,
                loss, data, sample_weight=None, atols=None):
    """Fits `build()` from weights w0 pipelined; its weights equal `want`.

    Float64 models (atols None): the same ops per row, sums regrouped:
    rtol 1e-9. Else each weight's update (w - w0) equals Keras's to its
    atol (keras_hub_testlib.Float32Atols).
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
    # weights, keras_hub_testlib.Float32Atols) does not change from run to
    # run.
    keras.utils.set_random_seed(5)
    w0 = seq().get_weights()
    want = keras_hub_testlib.KerasFit(seq, w0, 'mse', (x, y), batch_size=_N)
    # Gemma computes its RMS norm and softmax in float32 whatever the dtype
    # (keras_hub's choice).
    atols = None
    if name == 'gemma':
      rows = keras_hub_testlib.KerasFit(seq, w0, 'mse', (x, y), batch_size=_N,
                                        rows_per_gradient=1)
      atols = keras_hub_testlib.Float32Atols(w0, want, rows)
    for k in (2, 4):
      for schedule, stages_per_device in _SCHEDULES:
        with self.subTest(k=k, schedule=schedule):
          self._CheckFit(name, seq, w0, want, k, schedule,
                         stages_per_device, 'mse', (x, y), atols=atols)

  def testGpt2EverySchedule(self):
    self._CheckEverySchedule('gpt2')

  def testBertEverySchedule(self):
    self._CheckEverySchedule('bert')

  # Ten pipelined fits of 6 blocks: 10-14 minutes on a loaded 2-core
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
    want = keras_hub_testlib.KerasFit(_CausalLm, w0, loss, (x, y),
                                      x['padding_mask'], batch_size=_N)
    for k in (2, 4):
      for schedule, stages_per_device in _SCHEDULES:
        with self.subTest(k=k, schedule=schedule):
          self._CheckFit('gpt2_causal_lm', _CausalLm, w0, want, k, schedule,
                         stages_per_device, loss, (x, y), x['padding_mask'])


if __name__ == '__main__':
  tf.test.main()
