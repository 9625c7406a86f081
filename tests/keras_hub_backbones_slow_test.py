"""keras_hub backbones as given, pipelined under every schedule: fit equals
Keras's.

GPT-2, BERT and Gemma (RMS norm, rotary embeddings, grouped-query
attention) backbones, built from config in float64, cut at K=2 and K=4
devices and trained two steps with GPipe, 1F1B, interleaved 1F1B (2 stages
per device), ZB-H1 and ZB-V (2 stages per device): the weights after `fit`
equal plain Keras `fit`'s to rtol 1e-9 (the pipeline runs the same ops per
row; only the sums over micro-batches are grouped differently). The default
tier checks each model's predictions at K=2 (keras_nested_test).
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
      'gemma': (lambda: keras_hub.models.GemmaBackbone(
          vocabulary_size=_VOCAB, num_layers=4, num_query_heads=2,
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


class KerasHubBackbonesTest(tf.test.TestCase):

  def _CheckFit(self, name, build, extra, k, schedule, stages_per_device):
    model, twin = _SequenceModel(build), _SequenceModel(build)
    twin.set_weights(model.get_weights())
    rng = np.random.default_rng(4)
    mask = np.ones((2 * _N, _LEN), 'int32')
    mask[::3, -2:] = 0
    x = {'token_ids': rng.integers(0, _VOCAB, (2 * _N, _LEN)).astype('int32'),
         'padding_mask': mask}
    x.update({key: np.concatenate([v, v]) for key, v in extra.items()})
    y = rng.normal(size=(2 * _N, _LEN, 8))
    pipe = keras_pipeline.TensorPipeModel(
        model, num_partitions=k, num_micro_batches=_T, batch_size=_N,
        schedule=schedule, num_stages_per_device=stages_per_device)
    for m in (pipe, twin):
      m.compile(keras.optimizers.SGD(0.05), 'mse')
      m.fit(x, y, batch_size=_N, epochs=1, shuffle=False, verbose=0)
    want = twin.get_weights()
    self.assertLen(pipe.get_weights(), len(want))
    for i, (got, w) in enumerate(zip(pipe.get_weights(), want)):
      np.testing.assert_allclose(
          got, w, rtol=1e-9, atol=1e-12,
          err_msg=f'{name} K={k} {schedule}: weight {i}')

  def testEveryBackboneEverySchedule(self):
    for name, (build, extra) in _Models().items():
      for k in (2, 4):
        for schedule, stages_per_device in _SCHEDULES:
          with self.subTest(model=name, k=k, schedule=schedule):
            self._CheckFit(name, build, extra, k, schedule, stages_per_device)


if __name__ == '__main__':
  tf.test.main()
