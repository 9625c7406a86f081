"""keras_hub backbones as given, pipelined under every schedule: fit equals
Keras's.

GPT-2, BERT and Gemma (RMS norm, rotary embeddings, grouped-query
attention) backbones, built from config in float64, cut at K=2 and K=4
devices and trained two steps with GPipe, 1F1B, interleaved 1F1B (2 stages
per device), ZB-H1 and ZB-V (2 stages per device): the weights after `fit`
equal plain Keras `fit`'s to rtol 1e-9 (the pipeline runs the same ops per
row; only the sums over micro-batches are grouped differently). The default
tier checks each model's predictions at K=2 (keras_nested_test).
`GPT2CausalLM(preprocessor=None)` as given (its token table tied to the
softmax, read on the first and the last device) trains the same way with
keras_hub's loss: sparse cross-entropy from logits, sample_weight =
padding_mask.
"""

import keras
import keras_hub
import numpy as np
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


class KerasHubBackbonesTest(tf.test.TestCase):

  def _CheckFit(self, name, build, k, schedule, stages_per_device, loss,
                data, sample_weight=None):
    """Fits `build()` pipelined and plain on data = (x, y); equal."""
    model, twin = build(), build()
    twin.set_weights(model.get_weights())
    pipe = keras_pipeline.TensorPipeModel(
        model, num_partitions=k, num_micro_batches=_T, batch_size=_N,
        schedule=schedule, num_stages_per_device=stages_per_device)
    for m in (pipe, twin):
      m.compile(keras.optimizers.SGD(0.05), loss)
      m.fit(*data, sample_weight=sample_weight, batch_size=_N, epochs=1,
            shuffle=False, verbose=0)
    want = twin.get_weights()
    self.assertLen(pipe.get_weights(), len(want))
    # Float64 models: the same ops per row, sums regrouped: rtol 1e-9.
    # Gemma computes its RMS norm and softmax in float32 whatever the dtype
    # (keras_hub's choice), and float32 kernels round differently for a
    # micro-batch of 1 row than for 8: errors of a few float32 ulps (2^-23
    # relative) per op, through 6 blocks and 2 steps: 1e-5 of the scale.
    float32_inside = name.startswith('gemma')
    for i, (got, w) in enumerate(zip(pipe.get_weights(), want)):
      scale = max(float(np.max(np.abs(w))), 1e-30)
      np.testing.assert_allclose(
          got, w, rtol=1e-5 if float32_inside else 1e-9,
          atol=1e-5 * scale if float32_inside else 1e-12,
          err_msg=f'{name} K={k} {schedule}: weight {i}')

  def testEveryBackboneEverySchedule(self):
    for name, (build, extra) in _Models().items():
      x = _Tokens()
      x.update({key: np.concatenate([v, v]) for key, v in extra.items()})
      y = np.random.default_rng(4).normal(size=(2 * _N, _LEN, 8))
      for k in (2, 4):
        for schedule, stages_per_device in _SCHEDULES:
          with self.subTest(model=name, k=k, schedule=schedule):
            self._CheckFit(name, lambda b=build: _SequenceModel(b), k,
                           schedule, stages_per_device, 'mse', (x, y))

  def testGpt2CausalLmAsGivenEverySchedule(self):
    """The tied LM head (one table on two devices), keras_hub's loss
    weighting: sample_weight = padding_mask."""
    x = _Tokens()
    y = np.roll(x['token_ids'], -1, axis=1)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for k in (2, 4):
      for schedule, stages_per_device in _SCHEDULES:
        with self.subTest(k=k, schedule=schedule):
          self._CheckFit('gpt2_causal_lm', _CausalLm, k, schedule,
                         stages_per_device, loss, (x, y), x['padding_mask'])


if __name__ == '__main__':
  tf.test.main()
