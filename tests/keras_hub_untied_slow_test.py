"""A keras_hub causal LM with an untied output projection, pipelined under
every schedule: fit equals Keras's.

`MistralCausalLM(preprocessor=None)` (as Llama: RMS norm, rotary
embeddings, grouped-query attention, and a `ReversibleEmbedding` with
`tie_weights=False`, whose reverse call reads its own `reverse_embeddings`
matrix) is cut between the two calls of its token embedding at K=2 (GPipe,
1F1B, interleaved 1F1B and ZB-V with 2 stages per device, ZB-H1) and K=4
(GPipe, ZB-V) and trained two steps with keras_hub's loss
(sparse cross-entropy from logits, sample_weight = padding_mask). The last
stage is given only `reverse_embeddings` (the cut report says how many
values it reads), and the weights after `fit` equal plain Keras `fit`'s.
keras_hub 0.32's Llama itself cannot be pipelined (its decoder's
`get_config()` reads an attribute it never sets; README).
"""

from absl.testing import parameterized
import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

from tensorpipe import keras_pipeline
from tensorpipe import test_utils
from tests import keras_hub_testlib

test_utils.ConfigureTestDevices()

_VOCAB, _LEN, _DIM, _N, _T = 40, 6, 8, 8, 8
# (K, schedule, stages per device): every schedule at K=2; at K=4 GPipe
# and ZB-V (8 stages: 6 blocks give the model 9 layer calls).
_RUNS = ((2, 'gpipe', None), (2, '1f1b', None), (2, 'interleaved_1f1b', 2),
         (2, 'zb_h1', None), (2, 'zb_v', 2), (4, 'gpipe', None),
         (4, 'zb_v', 2))
# The model is float64, but keras_hub computes Mistral's RMS norm and
# attention softmax in float32 (as Gemma's): the pipeline's updates are
# held to the difference Keras alone shows when it groups each step's
# gradient as the pipeline does (1-row slices), plus 2^-15 of the update
# (keras_hub_testlib.Float32Atols). Measured once, K=2 ZB-H1: 2.7e-7 of
# the largest change a weight made.

def _Lm():
  keras.utils.set_random_seed(1)
  backbone = keras_hub.models.MistralBackbone(
      vocabulary_size=_VOCAB, num_layers=6, num_query_heads=2,
      num_key_value_heads=1, hidden_dim=_DIM, intermediate_dim=16,
      dtype='float64')
  return keras_hub.models.MistralCausalLM(backbone=backbone,
                                          preprocessor=None)


def _Tokens():
  return keras_hub_testlib.Tokens(_VOCAB, _LEN, 2 * _N)


class KerasHubUntiedLmTest(parameterized.TestCase, tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    """Plain Keras's fit and the float32 bound, once for every run."""
    super().setUpClass()
    x = _Tokens()
    cls.data = (x, np.roll(x['token_ids'], -1, axis=1))
    cls.mask = x['padding_mask']
    cls.loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    cls.w0 = _Lm().get_weights()
    cls.want = keras_hub_testlib.KerasFit(_Lm, cls.w0, cls.loss, cls.data,
                                          cls.mask, batch_size=_N)
    cls.atols = keras_hub_testlib.Float32Atols(
        cls.w0, cls.want, keras_hub_testlib.KerasFit(
            _Lm, cls.w0, cls.loss, cls.data, cls.mask, batch_size=_N,
            rows_per_gradient=1))

  # One test per run: each fit of the 6-block model takes minutes on a
  # loaded 2-core machine (all seven in one test ran past 900 s).
  @parameterized.named_parameters(
      *[(f'K{k}_{schedule}', k, schedule, v) for k, schedule, v in _RUNS])
  @pytest.mark.timeout(1800)
  def testMistralCausalLmFitEqualsKeras(self, k, schedule, stages_per_device):
    self.assertFalse(_Lm().backbone.token_embedding.tie_weights)
    model = _Lm()
    pipe = keras_pipeline.TensorPipeModel(
        model, num_partitions=k, num_micro_batches=_T, batch_size=_N,
        schedule=schedule, num_stages_per_device=stages_per_device)
    # The reader of the untied table reads reverse_embeddings only.
    self.assertIn(f'the later segments read {_VOCAB * _DIM} of its '
                  'weights', pipe.graph_pipeline.Report())
    pipe.compile(keras.optimizers.SGD(0.05), self.loss)
    pipe.fit(*self.data, sample_weight=self.mask, batch_size=_N, epochs=1,
             shuffle=False, verbose=0)
    got = pipe.get_weights()
    self.assertLen(got, len(self.want))
    for i, (g, w, start) in enumerate(zip(got, self.want, self.w0)):
      self.assertGreater(np.max(np.abs(w - start)), 0.0,
                         f'weight {i} did not train')
      np.testing.assert_allclose(
          g - start, w - start, rtol=0, atol=self.atols[i],
          err_msg=f'K={k} {schedule}: weight {i}')


if __name__ == '__main__':
  tf.test.main()
