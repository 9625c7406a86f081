"""Weights read by several stages (tied_weights.py): a tied Transformer LM.

The tiny LM's softmax reads the embedding table (transposed): one variable,
owned by the first stage and read by the last. Every schedule's loss and
gradients equal the unpipelined model's (MicroBatchOracle, float64), the
table is one variable and one checkpoint entry, and a checkpoint written at
K=2 restores at K=1.
"""

import os
from unittest import mock

import tensorflow as tf

from models import transformer
from tensorpipe import base_layer
from tensorpipe import devices
from tensorpipe import pipeline
from tensorpipe import py_utils
from tensorpipe import schedule_program
from tensorpipe import test_utils
from tensorpipe import tied_weights
from tests.models import transformer_testlib as testlib

test_utils.ConfigureTestDevices()

# One decoder layer: the tests trace every schedule's cells (seconds each).
_TINY = dict(testlib.TINY, num_layers=1, hidden_dim=16, model_dim=8,
             num_heads=2)


def _Layers(**kwargs):
  return transformer.TransformerLmLayers(tied_embeddings=True, dropout=0.0,
                                         **dict(_TINY, **kwargs))


def _Shapes():
  return transformer.LmInputShapes(testlib.BATCH, testlib.TGT_LEN)


def _LossSum(out, unused_targets):
  return tf.reduce_sum(out.per_example_loss)


def _Pipe(k, num_micro_batches=2, **kwargs):
  return pipeline.TensorPipeLayer.Params().Set(
      name='TensorPipe', layers=_Layers(), num_partitions=k,
      num_micro_batches=num_micro_batches, input_shapes=_Shapes(),
      **kwargs).Instantiate()


class TiedLmTest(tf.test.TestCase):

  def testTableIsOneVariableOwnedByTheFirstStageReadByTheLast(self):
    pipe = _Pipe(2)
    paths = list(base_layer.VariablesByPath(pipe))
    self.assertIn(transformer.LM_TIED_TABLE, paths)
    self.assertEmpty([p for p in paths if p.startswith('softmax/')])
    (tie,) = pipe._ties  # pylint: disable=protected-access
    self.assertEqual(tie.variable, transformer.LM_TIED_TABLE)
    self.assertEqual(tie.stages, [0, 1])
    self.assertEqual(tie.readers[0].path[-1], 'tied_emb')
    # FPropMeta counts the table once: in the embedding, not the softmax.
    softmax = _Layers()[-1]
    self.assertEqual(softmax.cls.FPropMeta(
        softmax, dict(tgt_vecs=[8, 5, 8])).num_params, 0)

  def testGPipeEqualsTheOracle(self):
    batch = testlib.LmBatch(seed=3, vocab=_TINY['vocab_size'])
    # The explicit recompute: the copies' gradient (tied_weights.Share)
    # adds the stages' totals.
    test_utils.AssertPipelineMatchesOracle(
        self, _Layers(), 2, 2, [batch], transformer.MeanTokenLoss,
        rtol=1e-12)

  def testLossInsideSchedulesEqualTheOracle(self):
    batch = testlib.LmBatch(seed=4, vocab=_TINY['vocab_size'])
    tokens = float(tf.reduce_sum(1.0 - batch.paddings))
    # FPropLoss: the tape through Share; FPropLossAndGrads: Fold. (The
    # two-stage-per-device schedules are in the slow tier:
    # models/transformer_slow_test.py.)
    for schedule, entry in (('1f1b', 'FPropLoss'),
                            ('zb_h1', 'FPropLossAndGrads')):
      with self.subTest(schedule=schedule):
        test_utils.AssertOneFOneBMatchesOracle(
            self, _Layers(), 2, 2, [batch], None, _LossSum, tokens,
            rtol=1e-12, schedule=schedule, entry_points=(entry,))

  def testStagesInOtherProcessesGiveTheTableTheSameBits(self):
    """The table's gradient (and every other) is the same bits with the
    stages "in other processes" (devices.NumProcesses patched: one pass,
    the sums outside the cells) as in one process (the loop, a B cell's
    sums inside it). Grappler's arithmetic optimizer merged the adds of
    the stages' totals (tied_weights.SumInOrder) with the last running
    sum where both sat in one graph; K=1 reads the table twice in one
    stage."""
    batch = testlib.LmBatch(seed=3, vocab=_TINY['vocab_size'])

    def Grads(pipe, schedule):
      @tf.function(autograph=False)
      def Step():
        with tf.GradientTape() as tape, py_utils.TrainingMode(True):
          if schedule == 'gpipe':
            loss = _LossSum(pipe.FPropDefaultTheta(batch), None)
          else:
            loss = pipe.FPropLoss(pipe.theta, (batch,), None, _LossSum,
                                  1.0).loss
        return tape.gradient(loss, pipe.trainable_variables)
      return Step

    for k, schedule in ((1, '1f1b'), (2, 'gpipe'), (2, '1f1b')):
      one, other = (_Pipe(k, num_micro_batches=4, schedule=schedule)
                    for _ in range(2))
      for a, b in zip(one.variables, other.variables):
        b.assign(a)
      want, across = Grads(one, schedule)(), Grads(other, schedule)
      with mock.patch.object(devices, 'NumProcesses', return_value=2), \
          schedule_program.UnrollAcrossProcesses(
              schedule_program.ONE_PASS_CELLS):
        graph = across.get_concrete_function().graph
      self.assertEmpty(test_utils.WhileOps(graph))
      for v, a, b in zip(one.trainable_variables, want, across()):
        self.assertAllEqual(a, b, msg=f'K={k} {schedule} {v.name}')

  def testCheckpointAtK2RestoresAtK1(self):
    two, one = _Pipe(2), _Pipe(1)
    table = base_layer.VariablesByPath(two)[transformer.LM_TIED_TABLE]
    table.assign(table + 1.0)
    prefix = tf.train.Checkpoint(model=two).write(
        os.path.join(self.get_temp_dir(), 'ckpt'))
    keys = [k for k, _ in tf.train.list_variables(prefix)
            if 'emb' in k and 'OPTIMIZER' not in k]
    self.assertLen(keys, 1)  # the table, once
    tf.train.Checkpoint(model=one).read(prefix).assert_consumed()
    for path, var in base_layer.VariablesByPath(one).items():
      self.assertAllEqual(var, base_layer.VariablesByPath(two)[path],
                          msg=path)
    batch = testlib.LmBatch(seed=5, vocab=_TINY['vocab_size'])
    self.assertAllClose(transformer.MeanTokenLoss(one.FPropDefaultTheta(batch)),
                        transformer.MeanTokenLoss(two.FPropDefaultTheta(batch)),
                        rtol=1e-6)

  def testAWrongTablePathIsNamedWithTheFix(self):
    layers = _Layers()
    layers[-1].tied_embedding = 'emb/tgt_emb/embb'
    with self.assertRaisesRegex(ValueError, r"SequenceSoftmaxLayer 'softmax' "
                                r".*'emb/tgt_emb/embb'.*did you mean "
                                r"'emb/tgt_emb/emb'"):
      pipeline.TensorPipeLayer.Params().Set(
          name='TensorPipe', layers=layers, num_partitions=2,
          num_micro_batches=2, input_shapes=_Shapes()).Instantiate()


class FoldTest(tf.test.TestCase):

  def testReadersAreAddedToTheOwnerInStageOrder(self):
    tie = tied_weights.Tie('w', tied_weights.Use(0, (0, 'w')),
                           (tied_weights.Use(1, (0, 'r')),
                            tied_weights.Use(2, (1, 'r'))))
    grads = [[{'w': tf.constant(1e16, tf.float64)}],
             [{'r': tf.constant(1.0, tf.float64), 'b': tf.constant(2.0)}],
             [{}, {'r': tf.constant(-1e16, tf.float64)}]]
    dev = ['/CPU:0'] * 3
    out = tied_weights.Fold([tie], grads, dev)
    # ((1e16 + 1) + -1e16) = 0 in float64: the owner's term first.
    self.assertEqual(float(out[0][0]['w']), 0.0)
    self.assertEqual(sorted(out[1][0]), ['b'])
    self.assertEqual(out[2], [{}, {}])


if __name__ == '__main__':
  tf.test.main()
