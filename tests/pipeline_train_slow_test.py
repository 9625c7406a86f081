"""Slow tests of the 1F1B schedule: the full transparency grid and training.

- Loss and every gradient equal the micro-batch oracle: on the consistency
  CNN for K in {1, 2, 4} x T in {1, 4, 8}, with and without recompute, both
  training entry points (float64); on a tiny AmoebaNet (float64 but for its
  float32 head; dropout, drop-path and batch norm on) and a tiny Transformer
  (dropout on; float32, its softmax computes in float32) on the same grid
  (the AmoebaNet grid alone runs for minutes on 2 cores: an unrolled 1F1B
  configuration traces 2 K T cells), through FPropLoss under a tape (what
  tasks use; FPropLossAndGrads runs the same engine).
- The trainer binary: 20 steps of ResNet4x8 on Fashion-MNIST with
  schedule='1f1b' (set by --model_params_override), with and without
  recompute, give GPipe's losses in float32 (1F1B sums the gradients in
  GPipe's order, see the test).
"""

import os
import shutil
import tempfile

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

from models import consistency_cnn
from models import transformer as transformer_models
from tensorpipe import test_utils
from tests.models import amoebanet_testlib
from tests.models import transformer_testlib
from tests.tools import tool_testlib

test_utils.ConfigureTestDevices()

KS, TS = (1, 2, 4), (1, 4, 8)
GRID = [(k, t, rc) for rc in (True, False) for k in KS for t in TS]
# (name, K, recompute): one test each for the Transformer grid; the
# AmoebaNet grid has one test per (K, T, recompute) (_AMOEBA_TESTS).
_GRID_TESTS = [(f'K{k}{"" if rc else "No"}Recompute', k, rc)
               for k in KS for rc in (True, False)]
_AMOEBA_TESTS = [(f'K{k}T{t}{"" if rc else "No"}Recompute', k, t, rc)
                 for k in KS for t in TS for rc in (True, False)]


def _SquareSinSum(out, unused_targets):
  return 0.5 * tf.reduce_sum(tf.square(out)) + tf.reduce_sum(tf.sin(out))


def _AmoebaLossSum(out, labels):
  """Summed CE(logits) + 0.4 * CE(aux_logits), amoebanet_testlib.Loss x B."""

  def Ce(logits):
    return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))
  return Ce(out['logits']) + 0.4 * Ce(out['aux_logits'])


class TransparencyGridTest(parameterized.TestCase, tf.test.TestCase):

  def testConsistencyCnn(self):
    x = tf.random.stateless_normal([8, 8, 8, 1], seed=[3, 1])
    for k, t, rc in GRID:
      with self.subTest(k=k, t=t, recompute=rc):
        test_utils.AssertOneFOneBMatchesOracle(
            self, consistency_cnn.ConsistencyLayers(8), k, t, [x], None,
            _SquareSinSum, normalizer=1.0, recompute=rc)

  # The grids are split so that each test stays well inside pytest.ini's
  # per-test timeout on a slow or loaded 2-core machine: the Transformer
  # grid per (K, recompute); the AmoebaNet grid per (K, T, recompute), its
  # oracle traces T AmoebaNets (half its grid, one test per recompute mode,
  # ran past 900 s on an AVX2-only CPU; K=1 without recompute, T in 1, 4,
  # 8, past 900 s on a loaded one, and T=8 alone too at a load of 5 on 2
  # cores, hence a timeout of 2400 s).

  @parameterized.named_parameters(*_AMOEBA_TESTS)
  @pytest.mark.timeout(2400)
  def testTinyAmoebaNet(self, k, t, recompute):
    self._TinyAmoebaNetWithDropPathDropoutAndBatchNorm(k, t, recompute)

  @parameterized.named_parameters(*_GRID_TESTS)
  def testTinyTransformer(self, k, recompute):
    self._TinyTransformerWithDropout(k, recompute)

  def _TinyAmoebaNetWithDropPathDropoutAndBatchNorm(self, k, t, recompute):
    # 8 examples: T = 8 leaves one per micro-batch.
    x = tf.random.stateless_normal([8, amoebanet_testlib.SIZE,
                                    amoebanet_testlib.SIZE, 3], seed=[1, 7])
    labels = tf.range(8) % amoebanet_testlib.CLASSES
    # The weights and activations are float64, but the head casts the
    # logits to float32 (amoebanet_cells.py): 1F1B takes the loss of
    # each micro-batch ([1, 5] logits at T=8), the oracle of the whole
    # batch ([8, 5]), and float32 softmax kernels round differently per
    # shape: a few eps32 (1.2e-7) of the gradients' scale (measured
    # 2.5e-7 at K=4, T=8). 1e-5 bounds that; a wrong mask or micro-batch
    # changes them by O(1e-2).
    test_utils.AssertOneFOneBMatchesOracle(
        self, amoebanet_testlib.TinyLayers('D'), k, t, [x], labels,
        _AmoebaLossSum, normalizer=8.0, recompute=recompute, rtol=1e-5,
        entry_points=('FPropLoss',))

  def _TinyTransformerWithDropout(self, k, recompute):
    layers = transformer_models.TransformerLayers(
        dropout=0.2, atten_dropout=0.1, relu_dropout=0.1,
        shared_embeddings=False, **transformer_testlib.TINY)
    batch = transformer_testlib.TranslationBatch(seed=1)
    tokens = float(tf.reduce_sum(1.0 - batch.tgt_paddings))

    def LossSum(out, unused_targets):
      return tf.reduce_sum(out.per_example_loss)
    for t in TS:
      with self.subTest(k=k, t=t, recompute=recompute):
        # float32 softmax: sums in another order differ by ~n eps32; 1e-5
        # as in transformer_testlib.
        test_utils.AssertOneFOneBMatchesOracle(
            self, layers, k, t, [batch], None, LossSum, normalizer=tokens,
            dtype=None, rtol=1e-5, recompute=recompute,
            entry_points=('FPropLoss',))


class TrainerTest(tf.test.TestCase):

  def testOneFOneBTrainerLossesEqualGPipeOnFashionMnist(self):
    """20 steps, ResNet4x8 (K=4, T=8, batch norm), float32, GPipe vs 1F1B.

    1F1B sums each partition's micro-batch gradients in GPipe's order
    (schedule_program.Labels), so the trained weights stay equal and the
    losses differ only in how the reported loss is summed (per micro-batch
    vs over the batch: one or two ulps; measured 1e-7 relative). This
    batch-norm ResNet on micro-batches of 16 amplifies any difference in the
    gradients about 3x per step: when 1F1B summed in the order 0 .. T-1 the
    losses were 2e-5 apart at step 5 and 5e-3 at step 14, so 1e-5 over 20
    steps fails on any change of summation order, a dropped micro-batch, a
    wrong mask or normaliser.
    """
    test_utils.CheckPrepared(self, 'fashion_mnist')
    tmp = tempfile.mkdtemp(prefix='trainer_1f1b_',
                           dir=os.environ.get('TEST_TMPDIR'))
    self.addCleanup(shutil.rmtree, tmp, True)
    losses = {}
    for schedule, recompute in (('gpipe', True), ('1f1b', True),
                                ('1f1b', False)):
      logdir = os.path.join(tmp, f'{schedule}_{recompute}')
      run = tool_testlib.RunTool(
          'trainer', '--model=image.fashion_mnist.ResNet4x8',
          f'--logdir={logdir}', '--mode=train', '--max_steps=20',
          '--num_cpu_devices=4',
          '--model_params_override='
          f'task.model.schedule="{schedule}"; '
          f'task.model.recompute={recompute}; '
          'task.train.summary_interval_steps=1', timeout_s=900)
      self.assertEqual(run.returncode, 0, msg=run.stderr[-3000:])
      losses[(schedule, recompute)] = tool_testlib.SummaryScalars(logdir)
    want = losses[('gpipe', True)]
    self.assertLen(want, 20)
    for key in (('1f1b', True), ('1f1b', False)):
      np.testing.assert_allclose(losses[key], want, rtol=1e-5, atol=0,
                                 err_msg=str(key))
    # The run trained: the losses are not all equal.
    self.assertGreater(np.ptp(want), 1e-1)


if __name__ == '__main__':
  tf.test.main()
