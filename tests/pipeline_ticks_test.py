"""Tests of the GPipe loops' tick structure: the cond-free steady loop.

GPipe's forward and backward passes each run on the schedule engine as up
to three tf.while_loops (`schedule_program.Loops` over the `gpipe` table's
F ticks, then its B ticks): the ramp-up ticks (a tf.cond per partition
with a bubble there), the ticks where every partition is busy (no cond,
unroll_ticks ticks per iteration), and the ramp-down ticks. These tests
check the split against the schedule, that the graph does not grow with T,
that K=1 builds no cond at all, and that the split and unrolled loops give
bit-identical results to one switching loop (the timeline's recorded step
runs one) and to unroll_ticks=1, that the unrolled ticks are chained on
every device, and that a float32 batch-norm ResNet trains bit for bit alike
with unroll_ticks 1 and 2.
"""

import os
import re

import numpy as np
import tensorflow as tf

import tensorpipe
from models import resnet
from tensorpipe import base_experiment
from tensorpipe import lr_schedules
from tensorpipe import optimizers
from tensorpipe import py_utils
from tensorpipe import schedule_builders
from tensorpipe import schedule_engine
from tensorpipe import schedule_program
from tensorpipe import synthetic_input
from tensorpipe import tasks
from tensorpipe import test_utils
from tensorpipe import timeline
from tensorpipe import trainer_lib
from tensorpipe.layers import linear
from tensorpipe.layers import normalization

test_utils.ConfigureTestDevices()

_COND_OPS = ('If', 'StatelessIf')
_WHILE_OPS = ('While', 'StatelessWhile')


def _Layers(num_layers, dim=4, dtype=tf.float64, batch_norm=False):
  layers = []
  for i in range(num_layers):
    layers.append(linear.FCLayer.Params().Set(
        name=f'fc{i}', input_dim=dim, output_dim=dim, activation='RELU',
        dtype=dtype))
    if batch_norm and i == 0:
      layers.append(normalization.BatchNormLayer.Params().Set(
          name='bn', dim=dim, dtype=dtype))
  return layers


def _Pipe(num_partitions, num_micro_batches, unroll_ticks=2, **kwargs):
  layers = _Layers(num_partitions, **kwargs)
  if kwargs.get('batch_norm'):
    parts = [layers[:2]] + [[lp] for lp in layers[2:]]
  else:
    parts = [[lp] for lp in layers]
  return tensorpipe.TensorPipeLayer.Params().Set(
      name='TensorPipe', partitions=parts, num_micro_batches=num_micro_batches,
      unroll_ticks=unroll_ticks).Instantiate()


def _StepGraph(layer, x):
  """The training step's concrete function (forward, backward loops), its
  cells inline (schedule_program.IsolatedCells(False)), so their ops sit
  in the loop bodies."""
  def Step(x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(layer.FPropDefaultTheta(x))
    return tape.gradient(loss, layer.trainable_variables)
  with schedule_program.IsolatedCells(False):
    return tf.function(Step, autograph=False).get_concrete_function(x)


def _OpCounts(concrete):
  """{function name (or '' for the top graph): [op types]}."""
  graph_def = concrete.graph.as_graph_def()
  out = {'': [n.op for n in graph_def.node]}
  for f in graph_def.library.function:
    out[f.signature.name] = [n.op for n in f.node_def]
  return out


class TickLoopsTest(tf.test.TestCase):

  def testLoopsCoverEveryTickAndSteadyLoopHasNoBubble(self):
    for unroll in (1, 2, 3):
      for k_total in range(1, 6):
        for t_total in range(1, 10):
          case = (unroll, k_total, t_total)
          table = schedule_builders.Build('gpipe', k_total, t_total)
          span = table.num_ticks // 2   # F ticks, then as many B ticks
          self.assertEqual(span, t_total + k_total - 1)
          branch = schedule_program.Compile(table).branch
          for first in (0, span):  # the forward pass, the backward pass
            loops = schedule_program.Loops(branch, first, first + span,
                                           unroll_ticks=unroll)
            # Contiguous, in order, all ticks, at most three loops.
            self.assertEqual(loops[0].first, first)
            self.assertEqual(loops[-1].end, first + span)
            for a, b in zip(loops, loops[1:]):
              self.assertEqual(a.end, b.first)
            self.assertLessEqual(len(loops), 3)
            steady = 0
            for loop in loops:
              self.assertLess(loop.first, loop.end)
              if not loop.steady:
                continue
              # Whole iterations of busy ticks, cells as in the table.
              n = len(loop.steady)
              self.assertEqual((loop.end - loop.first) % n, 0, case)
              for c in range(loop.first, loop.end):
                ops = loop.steady[(c - loop.first) % n]
                for k in range(k_total):
                  self.assertEqual(ops[k], branch[k][c], (case, c, k))
                  self.assertNotEqual(ops[k], schedule_program.IDLE)
              steady += loop.end - loop.first
            all_busy = max(0, t_total - k_total + 1)
            if all_busy < 2:
              self.assertEqual(steady, 0, case)
            else:
              # Fewer than `unroll` of them join the ramp-up loop.
              self.assertEqual(steady, all_busy - all_busy % unroll
                               if all_busy >= unroll else all_busy, case)

  def testOneLoopWhenAskedOrWhenNoTickIsBusy(self):
    branch = schedule_program.Compile(schedule_builders.Build('gpipe', 3, 8)).branch
    self.assertEqual(schedule_program.Loops(branch, 0, 10, one_loop=True,
                                            unroll_ticks=2),
                     [schedule_program.Loop(0, 10, ())])
    branch = schedule_program.Compile(schedule_builders.Build('gpipe', 4, 2)).branch
    self.assertEqual(schedule_program.Loops(branch, 0, 5, unroll_ticks=2),
                     [schedule_program.Loop(0, 5, ())])

  def testUnrolledLoopsMatchUnrolledOffBitForBit(self):
    # unroll_ticks only regroups the ticks of the steady loop (and moves its
    # leftover ticks into the guarded ramp-up loop): same ops, same values.
    rng = np.random.RandomState(1)
    for k_total, t_total, unroll, batch_norm in (
        (1, 5, 2, False), (1, 8, 3, True), (2, 7, 2, True), (3, 8, 2, False),
        (3, 9, 4, True), (4, 4, 3, False)):
      case = f'K={k_total} T={t_total} unroll_ticks={unroll}'
      x = tf.constant(rng.randn(2 * t_total, 4))
      results = []
      for u in (1, unroll):
        layer = _Pipe(k_total, t_total, batch_norm=batch_norm,
                      unroll_ticks=u)
        results.append(test_utils.LossAndGrads(layer, tf.reduce_sum, x))
      for a, b in zip(tf.nest.flatten(results[0]),
                      tf.nest.flatten(results[1])):
        self.assertAllEqual(a, b, msg=case)

  def testBarrierFindsTheTickStateOnEachDevice(self):
    # The control edge between unrolled ticks is built from the tensors
    # TensorsOn finds on the partition's device; graph tensors carry full
    # device names while partitions may be named short (or the reverse).
    @tf.function(autograph=False)
    def Check():
      with tf.device('/job:localhost/replica:0/task:0/device:CPU:1'):
        on1 = tf.constant(1.0) + 1.0
      with tf.device('/device:CPU:0'):
        on0 = tf.constant(2.0) + 1.0
      ta = tf.TensorArray(tf.float32, size=1)
      found = {}
      for name in ('/device:CPU:1', '/job:localhost/replica:0/task:0/'
                   'device:CPU:1', '/job:localhost/device:CPU:0', 'CPU:0'):
        on = schedule_engine.TensorsOn(name, [on1, (on0, ta)])
        found[name] = [x.name for x in on]
      self.assertEqual(found, {
          '/device:CPU:1': [on1.name],
          '/job:localhost/replica:0/task:0/device:CPU:1': [on1.name],
          '/job:localhost/device:CPU:0': [on0.name],
          'CPU:0': [on0.name]})
      return on1
    Check()

  def testUnrolledTicksAreChainedOnEveryDevice(self):
    # In the steady body with unroll_ticks=u, the next tick's index on each
    # of the K devices waits (control edges) for the state the tick before
    # left there (tensors and TensorArray writes): (u - 1) K chained nodes
    # in each of the two steady bodies of a training step (forward loop,
    # explicit recompute loop).
    for k_total, unroll in ((1, 2), (2, 2), (3, 3)):
      layer = _Pipe(k_total, 9, unroll_ticks=unroll, batch_norm=True)
      x = tf.zeros([18, 4], tf.float64)
      with py_utils.TrainingMode(True):
        graph_def = _StepGraph(layer, x).graph.as_graph_def()
      chained = {}
      for f in graph_def.library.function:
        # t + step: the step constant carries the control inputs.
        nodes = [n.name for n in f.node_def
                 if n.op == 'Const' and re.search(r'/add(_\d+)?/y$', n.name)
                 and any(i.startswith('^') for i in n.input)]
        if nodes:
          chained[f.signature.name] = len(nodes)
      self.assertEqual(sorted(chained.values()),
                       [(unroll - 1) * k_total] * 2,
                       f'K={k_total} unroll_ticks={unroll}: {chained}')

  def testSteadyLoopBodyHoldsUnrollCopies(self):
    def MostMatMuls(unroll):
      # The biggest loop body is the backward pass's steady one.
      layer = _Pipe(2, 9, unroll_ticks=unroll)
      counts = _OpCounts(_StepGraph(layer, tf.zeros([18, 4], tf.float64)))
      return max(ops.count('MatMul') for name, ops in counts.items()
                 if '_body_' in name)
    one, three = MostMatMuls(1), MostMatMuls(3)
    self.assertGreater(one, 0)
    self.assertEqual(three, 3 * one)

  def testBadUnrollTicksIsRefused(self):
    for bad in (0, -1, 1.5, True, None):
      with self.assertRaisesRegex(ValueError, r'unroll_ticks=.*int >= 1'):
        _Pipe(2, 4, unroll_ticks=bad)

  def testGraphSizeDoesNotGrowWithT(self):
    # (T's parity moves a ramp tick into the steady loop at K=2 and
    # unroll_ticks=2, which changes the ramp loops' bodies: even T here.)
    sizes = []
    for t_total in (4, 6, 16):
      layer = _Pipe(2, t_total)
      x = tf.zeros([2 * t_total, 4], tf.float64)
      counts = _OpCounts(_StepGraph(layer, x))
      sizes.append(sorted(len(ops) for ops in counts.values()))
    self.assertEqual(sizes[0], sizes[1])
    self.assertEqual(sizes[0], sizes[2])

  def testOnePartitionBuildsNoCond(self):
    layer = _Pipe(1, 8)
    counts = _OpCounts(_StepGraph(layer, tf.zeros([16, 4], tf.float64)))
    all_ops = [op for ops in counts.values() for op in ops]
    self.assertEqual(sum(op in _WHILE_OPS for op in all_ops), 2)  # one forward, one backward
    self.assertNotIn('If', all_ops)
    self.assertNotIn('StatelessIf', all_ops)
    # The loops end on the partition's own micro-batch index: no iteration
    # counter (maximum_iterations adds one, and-ed into the condition).
    self.assertNotIn('LogicalAnd', all_ops)

  def testSteadyLoopBodiesHaveNoCond(self):
    layer = _Pipe(3, 8)
    counts = _OpCounts(_StepGraph(layer, tf.zeros([16, 4], tf.float64)))
    all_ops = [op for ops in counts.values() for op in ops]
    self.assertEqual(sum(op in _WHILE_OPS for op in all_ops), 6)  # 3 forward, 3 backward
    bodies = {name: ops for name, ops in counts.items() if '_body_' in name}
    self.assertLen(bodies, 6)
    conds = sorted(sum(op in _COND_OPS for op in ops)
                   for ops in bodies.values())
    # Each ramp body holds one cond per partition that idles on some of its
    # ticks and works on others; the two steady bodies hold none.
    branch = schedule_program.Compile(schedule_builders.Build('gpipe', 3, 8)).branch
    want = []
    for first in (0, 10):
      for loop in schedule_program.Loops(branch, first, first + 10,
                                         unroll_ticks=2):
        want.append(0 if loop.steady else sum(
            len(set(row[loop.first:loop.end])) > 1 for row in branch))
    self.assertEqual(want.count(0), 2)
    self.assertEqual(conds, sorted(want))
    self.assertGreater(sum(conds), 0)

  def testSplitLoopsMatchOneGuardedLoopBitForBit(self):
    # The recorded step (timeline on) runs one guarded loop per pass; the
    # plain step runs the split loops. Same ops on the same values: equal.
    rng = np.random.RandomState(0)
    for k_total, t_total, batch_norm in ((1, 3, False), (2, 4, True),
                                         (3, 5, False), (4, 2, False),
                                         (3, 3, True)):
      layer = _Pipe(k_total, t_total, batch_norm=batch_norm)
      x = tf.constant(rng.randn(2 * t_total, 4))
      plain = test_utils.LossAndGrads(layer, tf.reduce_sum, x)
      with timeline.Record():
        recorded = test_utils.LossAndGrads(layer, tf.reduce_sum, x)
      for a, b in zip(tf.nest.flatten(plain), tf.nest.flatten(recorded)):
        self.assertAllEqual(a, b, msg=f'K={k_total} T={t_total}')


class UnrolledTrainingTest(tf.test.TestCase):

  def testResNetTrainsBitForBitLikeUnrollOff(self):
    """Three SGD steps of a float32 batch-norm ResNet, K=2, T=8: u=2 == u=1.

    With the barrier between unrolled ticks a no-op (it once matched no
    tensor: graph tensors carry full device names), Grappler merged one
    tick's gradient and statistics sums with the next tick's: the losses
    were 3e-5 apart by step 3 (and 7e-3 after 20 trainer steps).
    """
    class Exp(base_experiment.BaseExperiment):
      UNROLL = 1

      def Train(self):
        return synthetic_input.SyntheticImageInput.Params().Set(
            name='train', batch_size=64, num_examples=192, num_classes=10,
            image_shape=[28, 28, 1])

      def Test(self):
        return self.Train().Set(name='test', split='test')

      def Task(self):
        model = tensorpipe.TensorPipeLayer.Params().Set(
            name='TensorPipe', layers=resnet.SmallResNetLayers(16, 1),
            num_partitions=2, num_micro_batches=8,
            input_shapes=[[64, 28, 28, 1]], unroll_ticks=self.UNROLL)
        p = tasks.ClassificationTask.Params().Set(
            name='task', model=model, num_classes=10)
        p.train.optimizer = optimizers.SGD.Params().Set(momentum=0.9,
                                                        nesterov=True)
        p.train.lr_schedule = lr_schedules.WarmupRsqrtDecay.Params().Set(
            peak=0.1, warmup_steps=2)
        return p

    losses, weights = {}, {}
    for unroll in (1, 2):
      exp = type('Exp', (Exp,), {'UNROLL': unroll})()
      tf.keras.utils.set_random_seed(1)
      trainer = trainer_lib.Trainer(
          exp.ModelParams(), os.path.join(self.get_temp_dir(), str(unroll)),
          log_fn=lambda _: None)
      trainer.RestoreLatest()
      losses[unroll] = [float(trainer.TrainStep(b)['loss'])
                        for b in trainer.TrainInput().Dataset().take(3)]
      weights[unroll] = {
          name: v.numpy() for name, v in test_utils.VariablesByName(
              trainer.task.children.model).items()}
    self.assertAllEqual(losses[2], losses[1])
    self.assertGreater(abs(losses[1][2] - losses[1][0]), 1e-3)  # it trained
    self.assertEqual(sorted(weights[2]), sorted(weights[1]))
    for name, want in weights[1].items():
      self.assertAllEqual(weights[2][name], want, msg=name)


if __name__ == '__main__':
  tf.test.main()
