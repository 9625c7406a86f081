"""The schedule engine: compiled tables (literal) and the schedules it runs.

Interleaved 1F1B (v = 2 stages per device, round-robin) and a table the user
registers run on the engine and train bit for bit what GPipe trains on the
same stages: the engine relabels micro-batches so that every stage sums its
weight gradients in GPipe's backward order (schedule_program.Labels).
"""

import tensorflow as tf

from tensorpipe import pipeline
from tensorpipe import py_utils
from tensorpipe import schedule_builders
from tensorpipe import schedule_program
from tensorpipe import schedules
from tensorpipe import test_utils
from tensorpipe import timeline
from tensorpipe.schedules import Action

test_utils.ConfigureTestDevices()

BATCH = 8


class CompileTest(tf.test.TestCase):

  def testOneFOneBLiteral(self):
    # 1F1B, K=2, T=3 (schedules.py's example):
    #   tick    0   1   2   3   4   5   6   7
    #   dev 0   0F0 0F1 .   0B0 0F2 0B1 .   0B2
    #   dev 1   .   1F0 1B0 1F1 1B1 1F2 1B2 .
    program = schedule_program.Compile(schedules.Build('1f1b', 2, 3))
    self.assertEqual(program.cells, [[('F', 0), ('B', 0)],
                                     [('F', 1), ('B', 1)]])
    self.assertEqual(program.branch, [[1, 1, 0, 2, 1, 2, 0, 2],
                                      [0, 1, 2, 1, 2, 1, 2, 0]])
    # Stage 0's backward cells take labels 0, 1, 2: micro-batches 2, 1, 0.
    self.assertEqual(program.real, [2, 1, 0])
    self.assertEqual(program.micro_batch, [[2, 1, 0, 2, 0, 1, 0, 0],
                                           [0, 2, 2, 1, 1, 0, 0, 0]])
    self.assertEqual(program.num_slots, [0, 1])
    self.assertEqual([r.depth for r in program.out_rings[:1]], [1])
    self.assertEqual([r.depth for r in program.dx_rings[1:]], [1])
    self.assertEqual([tuple(x) for x in program.loops],
                     [(0, 3, ()), (3, 5, ((2, 1), (1, 2))), (5, 8, ())])

  def testGPipeTableKeepsItsLabels(self):
    # GPipe's backward runs T-1 .. 0 already.
    program = schedule_program.Compile(schedules.Build('gpipe', 2, 3))
    self.assertEqual(program.real, [0, 1, 2])
    self.assertEqual(program.num_slots, [0, 3])

  def testRingDepthIsTheLeastThatHoldsEveryOutputUntilItIsRead(self):
    # Outputs on ticks 0, 1, 2 read on ticks 3, 4, 5: the output of tick 1
    # is written before the one of tick 0 is read, and so on: depth 3.
    ring = schedule_program.MakeRing([(0, 0), (1, 1), (2, 2)],
                                     {0: 3, 1: 4, 2: 5}, 6)
    self.assertEqual(ring, schedule_program.Ring(
        3, [0, 1, 2, 0, 0, 0], [0, 0, 0, 0, 1, 2]))
    # Read on the tick the next one is written: the read sees the old one.
    ring = schedule_program.MakeRing([(0, 0), (2, 1)], {0: 2, 1: 3}, 4)
    self.assertEqual(ring.depth, 1)
    ring = schedule_program.MakeRing([(0, 0), (2, 1)], {0: 3, 1: 4}, 5)
    self.assertEqual(ring.depth, 2)

  def testInterleavedPlanAndRings(self):
    table = schedules.Build('interleaved_1f1b', 2, 4, 2)
    program = schedule_program.Compile(table)
    self.assertEqual(program.stage_device, [0, 1, 0, 1])
    self.assertEqual(program.cells[0], [('F', 0), ('F', 2), ('B', 2),
                                        ('B', 0)])
    # Some boundary is read two producer cells later.
    self.assertEqual(max(r.depth for r in program.out_rings[:-1]), 2)
    for s, ring in enumerate(program.out_rings[:-1]):
      # Every output is read by stage s + 1 on a later tick, before the
      # producer overwrites its entry.
      f_s = [(c, a.micro_batch) for c, a in enumerate(
          table.grid[program.stage_device[s]]) if a and a == Action(
              'F', a.micro_batch, s)]
      for j, (c, m) in enumerate(f_s):
        read = table.Ticks()[Action('F', m, s + 1)][1]
        self.assertGreater(read, c)
        if j + ring.depth < len(f_s):
          self.assertLessEqual(read, f_s[j + ring.depth][0])
        self.assertEqual(ring.write[c], ring.read[read])

  def testSplitBackwardIsRefused(self):
    with self.assertRaisesRegex(ValueError, r"schedule 'zb_h1' splits the "
                                r'backward pass \(0I0 on device 0, tick 3\)'
                                '.*F and B cells only'):
      schedule_program.Compile(schedules.Build('zb_h1', 2, 2))


def _Pipe(schedule, k, v, t, recompute=True, seed=3):
  return pipeline.TensorPipeLayer.Params().Set(
      name='TensorPipe', layers=test_utils.ConvTestModel(),
      num_partitions=k, num_stages_per_device=v, num_micro_batches=t,
      input_shapes=[[BATCH, 8, 8, 2]], recompute=recompute, schedule=schedule,
      random_seed=seed).Instantiate()


def _Square(out, unused_targets=None):
  # Its gradient is exact arithmetic: per micro-batch or whole batch alike.
  return 0.5 * tf.reduce_sum(tf.square(out))


def _GPipeStep(pipe):
  @tf.function(autograph=False)
  def Step(x):
    with tf.GradientTape() as tape:
      loss = _Square(pipe.FPropDefaultTheta(x)) / 16.0
    return [loss] + list(tape.gradient(loss, pipe.trainable_variables))
  return Step


def _EngineStep(pipe):
  @tf.function(autograph=False)
  def Step(x):
    with tf.GradientTape() as tape:
      loss = pipe.FPropLoss(pipe.theta, (x,), None, _Square, 16.0).loss
    return [loss] + list(tape.gradient(loss, pipe.trainable_variables))
  return Step


class EngineEqualsGPipeTest(tf.test.TestCase):

  def _AssertBitwise(self, got_pipe, recompute=True):
    want_pipe = _Pipe('gpipe', got_pipe.num_stages, 1,
                      got_pipe.params.num_micro_batches, recompute)
    self.assertEqual([[layer.params.name for layer in part]
                      for part in want_pipe.PartitionLayers()],
                     [[layer.params.name for layer in part]
                      for part in got_pipe.PartitionLayers()])
    for a, b in zip(want_pipe.variables, got_pipe.variables):
      self.assertEqual(a.name, b.name)
      b.assign(a)
    x = tf.random.stateless_normal([BATCH, 8, 8, 2], seed=[5, 6])
    moving = [v for v in want_pipe.variables if not v.trainable]
    self.assertNotEmpty(moving)
    before = [v.numpy() for v in moving]
    with py_utils.TrainingMode(True), py_utils.StepSeed(4):
      want = _GPipeStep(want_pipe)(x)
      got = _EngineStep(got_pipe)(x)
    self.assertLen(got, 1 + 7)
    names = ['loss'] + [v.name for v in want_pipe.trainable_variables]
    for name, a, b in zip(names, want, got):
      self.assertAllEqual(a, b, msg=f'{got_pipe.params.schedule} {name}')
    # The batch-norm statistics are summed in forward order: micro-batches
    # T-1 .. 0 here, 0 .. T-1 in GPipe, so equal to float32 rounding of a
    # sum of T terms (a few ulps of the largest statistic).
    got_moving = [v for v in got_pipe.variables if not v.trainable]
    t = got_pipe.params.num_micro_batches
    for a, b, old in zip(moving, got_moving, before):
      eps = t * 2.0**-23 * float(tf.reduce_max(tf.abs(a)))
      self.assertAllClose(a, b, rtol=0, atol=eps, msg=a.name)
      self.assertNotAllClose(a, old, msg=f'{a.name} was not updated')

  def testInterleavedOneFOneBEqualsGPipeOnTheSameStages(self):
    """K=2 devices x v=2 stages, T=4: stage s on device s mod 2."""
    for recompute in (True, False):
      pipe = _Pipe('interleaved_1f1b', 2, 2, 4, recompute)
      self.assertEqual(pipe.num_partitions, 2)
      self.assertEqual(pipe.num_stages, 4)
      self.assertEqual([s.device for s in pipe.stages],
                       [pipe.devices[s % 2] for s in range(4)])
      self._AssertBitwise(pipe, recompute)

  def testRegisteredTableRunsOnTheEngine(self):
    """A user's table: GPipe's, registered under another name, runs with
    the loss inside the pipeline (the engine, not GPipe's loops)."""
    name = 'gpipe_loss_inside_test'
    if name not in schedules.Names():
      schedules.Register(name, schedule_builders.GPipe)
    self._AssertBitwise(_Pipe(name, 2, 1, 4))

  def testEvalFPropOfInterleavedEqualsGPipe(self):
    got_pipe = _Pipe('interleaved_1f1b', 2, 2, 4)
    want_pipe = _Pipe('gpipe', 4, 1, 4)
    for a, b in zip(want_pipe.variables, got_pipe.variables):
      b.assign(a)
    x = tf.random.stateless_normal([BATCH, 8, 8, 2], seed=[1, 2])
    with py_utils.EvalMode():
      self.assertAllEqual(want_pipe.FPropDefaultTheta(x),
                          got_pipe.FPropDefaultTheta(x))


class EngineTimelineTest(tf.test.TestCase):

  def testInterleavedCellsFollowTheTable(self):
    pipe = _Pipe('interleaved_1f1b', 2, 2, 4)
    table = schedules.Build('interleaved_1f1b', 2, 4, 2)
    x = tf.random.stateless_normal([BATCH, 8, 8, 2], seed=[5, 6])

    def Step(x):
      pipe.FPropLossAndGrads(pipe.theta, (x,), None, _Square, 16.0)
      return timeline.Active().Tensors()
    with py_utils.TrainingMode(True), timeline.Record() as rec:
      fn = tf.function(Step, autograph=False).get_concrete_function(x)
    events = rec.Events(fn(x))
    # Forward, recompute, backward of each of S T cells.
    self.assertLen(events, 3 * 4 * 4)
    for d in range(2):
      mine = sorted((e for e in events if e.k == d), key=lambda e: e.tick)
      ran = [(e.tick, e.phase) for e in mine]
      want = [(c, phase) for c, a in enumerate(table.grid[d]) if a
              for phase in (('forward',) if a.op == 'F' else
                            ('recompute', 'backward'))]
      self.assertEqual(ran, want)
      for before, after in zip(mine, mine[1:]):
        # One device runs its cells one after another.
        self.assertGreaterEqual(after.start, before.start)


if __name__ == '__main__':
  tf.test.main()
