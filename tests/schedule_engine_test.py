"""The schedule engine: compiled tables (literal) and the schedules it runs.

Interleaved 1F1B (v = 2 stages per device, round-robin) and a table the user
registers run on the engine and train bit for bit what GPipe trains on the
same stages: the engine relabels micro-batches so that every stage sums its
weight gradients in GPipe's backward order (schedule_program.Labels). The
zero-bubble schedules (ZB-H1, ZB-V) are also checked against the float64
micro-batch oracle, and their I-to-W stash slots against a literal table.
With stages in other processes (the one pass, on by default), every
schedule runs its whole table without a tf.while_loop, with the looped
engine's bits on conv stages (but for TF's autodiff of GPipe's loop and
runs over the cap).
"""

import os
from unittest import mock

from absl import logging
import tensorflow as tf

from tensorpipe import devices
from tensorpipe import pipeline
from tensorpipe import py_utils
from tensorpipe import schedule_builders
from tensorpipe import schedule_program
from tensorpipe import schedules
from tensorpipe import test_utils
from tensorpipe import timeline
from tensorpipe.layers import dropout
from tensorpipe.layers import linear
from tensorpipe.layers import normalization
from tensorpipe.schedules import Action

test_utils.ConfigureTestDevices()

BATCH = 8
_TESTDATA = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                         'testdata', 'torch_schedules')


class CompileTest(tf.test.TestCase):

  def testOneFOneBLiteral(self):
    # 1F1B, K=2, T=3 (schedules.py's example):
    #   tick    0   1   2   3   4   5   6   7
    #   dev 0   0F0 0F1 .   0B0 0F2 0B1 .   0B2
    #   dev 1   .   1F0 1B0 1F1 1B1 1F2 1B2 .
    program = schedule_program.Compile(schedule_builders.Build('1f1b', 2, 3))
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
                     [(0, 3, (), False), (3, 5, ((2, 1), (1, 2)), False),
                      (5, 8, (), False)])

  def testGPipeTableKeepsItsLabels(self):
    # GPipe's backward runs T-1 .. 0 already.
    program = schedule_program.Compile(schedule_builders.Build('gpipe', 2, 3))
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
    table = schedule_builders.Build('interleaved_1f1b', 2, 4, 2)
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

  def testSteadyLoopOfInterleavedOneFOneB(self):
    # Interleaved 1F1B, K=2, v=2, T=8; device 0's branches (1 = F0, 2 = F2,
    # 3 = B2, 4 = B0) from tick 4 repeat 1 3 1 3 2 4 2 4 three times:
    # a steady loop of 8 ticks per iteration, though each stage's F and B
    # come twice in it.
    program = schedule_program.Compile(
        schedule_builders.Build('interleaved_1f1b', 2, 8, 2))
    self.assertEqual(program.cells[0], [('F', 0), ('F', 2), ('B', 2),
                                        ('B', 0)])
    self.assertEqual(program.branch[0][4:28], [1, 3, 1, 3, 2, 4, 2, 4] * 3)
    steady = program.loops[1].steady
    self.assertEqual([(x.first, x.end) for x in program.loops],
                     [(0, 4), (4, 28), (28, 34)])
    self.assertEqual([ops[0] for ops in steady], [1, 3, 1, 3, 2, 4, 2, 4])
    # Device 0 waits before its second F0 (tick 2 of the iteration) and its
    # second F2 (tick 6): never twice one (op, stage) between barriers.
    self.assertEqual([b[0] for b in schedule_program.Barriers(steady)],
                     [False, True, False, False, False, True, False, False])
    # A period without repeats (1F1B's F, B) unrolled twice: one barrier,
    # between the periods, on every device.
    self.assertEqual(
        schedule_program.Barriers(((1, 2), (2, 1), (1, 2), (2, 1))),
        [(False, False), (True, True), (False, False), (False, False)])
    # Every steady loop of every registered schedule (K 2 and 4, T 4 to
    # 16, v 1 to 3 where it applies): between two runs of one (op,
    # stage) on a device in an iteration there is a barrier there.
    for name, vs in (('1f1b', (1,)), ('zb_h1', (1,)),
                     ('interleaved_1f1b', (2, 3)), ('zb_v', (2,))):
      for kk, tt, v in ((k, t, v) for k in (2, 4) for t in (4, 8, 16)
                        for v in vs):
        try:
          table = schedule_builders.Build(name, kk, tt, v)
        except ValueError:   # e.g. ZB-V needs T >= 2K - 1
          continue
        for loop in schedule_program.Compile(table).loops:
          barriers = schedule_program.Barriers(loop.steady)
          for d in range(kk):
            ops = [ops[d] for ops in loop.steady]
            for i, op in enumerate(ops):
              for j in range(i + 1, len(ops)):
                if ops[j] == op:
                  self.assertTrue(any(b[d] for b in barriers[i:j]),
                                  msg=f'{name} K={kk} T={tt} v={v} d={d}')
                  break
    # A period with a repeat counts only where it repeats: not ticks 0-3
    # of 1 2 1 3 as one period of 4, but 2 1 3 (distinct) as one of 3.
    self.assertEqual(schedule_program.SteadyRun([[1, 2, 1, 3]]), (1, 4, 3))
    self.assertEqual(schedule_program.SteadyRun([[1, 2, 1, 3, 1, 2, 1, 3]]),
                     (0, 8, 4))

  def testShortSwitchingLoopsRunOnceWithTheirCellsFixed(self):
    # 1F1B, K=2, T=3 (testOneFOneBLiteral): ramps of 3 ticks before and
    # after the steady loop. With unroll_ramps >= 3 each is one iteration
    # of its ticks' branches, idle cells (0) included; a longer ramp
    # switches.
    branch = [[1, 1, 0, 2, 1, 2, 0, 2], [0, 1, 2, 1, 2, 1, 2, 0]]
    loops = schedule_program.Loops(branch, 0, 8, unroll_ramps=3)
    self.assertEqual([tuple(x) for x in loops],
                     [(0, 3, ((1, 0), (1, 1), (0, 2)), True),
                      (3, 5, ((2, 1), (1, 2)), False),
                      (5, 8, ((2, 1), (0, 2), (2, 0)), True)])
    self.assertEqual([x.steady for x in schedule_program.Loops(
        branch, 0, 8, unroll_ramps=2)][::2], [(), ()])
    # Recorded steps keep one switching loop.
    self.assertEqual(schedule_program.Loops(branch, 0, 8, True, 1, 8),
                     [schedule_program.Loop(0, 8, ())])
    # In a ramp a device repeats a cell (device 0's F on ticks 0 and 1):
    # a barrier between; idle ticks never need one.
    self.assertEqual(schedule_program.Barriers(loops[0].steady),
                     [(True, False), (False, False), (False, False)])
    # A ramp waits after every cell of a device (device 1's B after its
    # F), as its switching loop ordered them; the steady loop (here of
    # one iteration) only before repeats.
    cells = [[('F', 0), ('B', 0)], [('F', 1), ('B', 1)]]
    self.assertEqual(schedule_program.LoopBarriers(loops[0], cells),
                     [(True, False), (False, True), (False, False)])
    self.assertEqual(schedule_program.LoopBarriers(loops[1], cells),
                     [(False, False), (False, False)])
    # A steady loop also waits after a W cell (its stash entry gone before
    # the device's next cell starts): ZB-V, K=1, T=4 runs F1 I1 W1 F0 I0
    # W0 per iteration, and waits after W1 (not after W0, its last tick).
    program = schedule_program.Compile(
        schedule_builders.Build('zb_v', 1, 4, 2))
    loop = max(program.loops, key=lambda x: len(x.steady))
    ops = [program.cells[0][b[0] - 1] for b in loop.steady]
    self.assertEqual(ops, [('F', 1), ('I', 1), ('W', 1), ('F', 0),
                           ('I', 0), ('W', 0)])
    self.assertEqual(
        [b[0] for b in schedule_program.LoopBarriers(loop, program.cells)],
        [False, False, True, False, False, False])
    # And after a B cell on a device with two stages: interleaved 1F1B,
    # K=1, v=2, T=8 runs F1 B1 F0 B0 per iteration, B1 and B0 of other
    # micro-batches; B0 waits for B1 (not two stages' backward cells at
    # once). A device with one stage gets no new wait: 1F1B's barriers are
    # those before repeats (K=2, T=8: one per period unrolled twice).
    program = schedule_program.Compile(
        schedule_builders.Build('interleaved_1f1b', 1, 8, 2))
    loop = max(program.loops, key=lambda x: len(x.steady))
    self.assertEqual([program.cells[0][b[0] - 1] for b in loop.steady],
                     [('F', 1), ('B', 1), ('F', 0), ('B', 0)])
    self.assertEqual(
        [b[0] for b in schedule_program.LoopBarriers(loop, program.cells)],
        [False, True, False, False])
    for kk in (2, 4):
      program = schedule_program.Compile(
          schedule_builders.Build('1f1b', kk, 8, 1))
      for loop in program.loops:
        if loop.steady:
          self.assertEqual(
              schedule_program.LoopBarriers(loop, program.cells),
              schedule_program.Barriers(loop.steady), msg=f'K={kk}')

  def testAcrossProcessesTheWholeTableIsOneFixedPass(self):
    # Stages in other processes (UnrollsAll): every tick of the run, the
    # steady ones too, in one ramp; a recorded step keeps its one loop.
    branch = [[1, 1, 0, 2, 1, 2, 0, 2], [0, 1, 2, 1, 2, 1, 2, 0]]
    self.assertEqual(
        schedule_program.Loops(branch, 2, 8, unroll_all=True),
        [schedule_program.Loop(2, 8, ((0, 2), (2, 1), (1, 2), (2, 1),
                                      (0, 2), (2, 0)), True)])
    self.assertEqual(schedule_program.Loops(branch, 0, 8, True,
                                            unroll_all=True),
                     [schedule_program.Loop(0, 8, ())])
    # Ticks 2 .. 7 hold 9 non-idle cells (4 + 5), ticks 0 .. 7 hold 12:
    # within a cap of 9, and over it.
    self.assertEqual(schedule_program.NumCells(branch, 2, 8), 9)
    self.assertEqual(schedule_program.NumCells(branch, 0, 8), 12)
    with mock.patch.object(schedule_program,
                           'UNROLL_ACROSS_PROCESSES_CELLS', 9):
      self.assertTrue(schedule_program.UnrollsAll(branch, 2, 8, 2))
      self.assertFalse(schedule_program.UnrollsAll(branch, 0, 8, 2))
      self.assertFalse(schedule_program.UnrollsAll(branch, 2, 8, 1))

  def testZeroBubbleStashSlotsLiteral(self):
    # ZB-H1, K=2, T=2 (schedule_builders.Build('zb_h1', 2, 2).Grid()):
    #   tick    0   1   2   3   4   5   6
    #   dev 0   0F0 0F1 .   0I0 0W0 0I1 0W1
    #   dev 1   .   1F0 1I0 1F1 1I1 1W0 1W1
    # Each I keeps its (x, dz) for its W from the I tick to the W tick:
    # stage 0 holds 0I0 on ticks 3-4 and 0I1 on ticks 5-6, so slot 0 is
    # free again for micro-batch 1 (one slot); stage 1 holds 1I0 on ticks
    # 2-5 while 1I1 writes on tick 4, so micro-batch 1 takes slot 1 (two).
    table = schedule_builders.Build('zb_h1', 2, 2)
    # ((stage, micro-batch), slot)
    self.assertEqual(sorted(table.Stash().items()),
                     [((0, 0), 0), ((0, 1), 0), ((1, 0), 0), ((1, 1), 1)])
    self.assertEqual(table.StashSlots(), {0: 1, 1: 2})
    program = schedule_program.Compile(table)
    self.assertEqual(program.cells, [[('F', 0), ('I', 0), ('W', 0)],
                                     [('F', 1), ('I', 1), ('W', 1)]])
    self.assertEqual(program.branch, [[1, 1, 0, 2, 3, 2, 3],
                                      [0, 1, 2, 1, 2, 3, 3]])
    self.assertEqual(program.num_stash, [1, 2])
    # The slot each I writes and its W reads, per tick (0 elsewhere).
    self.assertEqual(program.stash, [[0, 0, 0, 0, 0, 0, 0],
                                     [0, 0, 0, 0, 1, 0, 1]])


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
    schedule = got_pipe.params.schedule
    # The loss is a float32 sum of n = BATCH * classes squares: GPipe's
    # reduce_sum of the whole batch, the engine's sum of per-micro-batch
    # sums, two orders whose SIMD blocking depends on the CPU (equal bits
    # with AVX-512, one ulp apart with AVX2). Each order is within
    # (n - 1) * 2^-24 of the exact sum of non-negative terms.
    n = BATCH * want_pipe.PartitionLayers()[-1][-1].params.output_dim
    self.assertAllClose(want[0], got[0], rtol=2 * n * 2.0**-24, atol=0,
                        msg=f'{schedule} loss')
    # Every gradient is exact arithmetic per micro-batch, summed in GPipe's
    # backward order: bitwise on any CPU.
    names = [v.name for v in want_pipe.trainable_variables]
    for name, a, b in zip(names, want[1:], got[1:]):
      self.assertAllEqual(a, b, msg=f'{schedule} {name}')
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
    """K=2 devices x v=2 stages, T=4 and T=8: stage s on device s mod 2.

    At T=8 most ticks run in a steady loop whose period runs each stage's
    F and B twice (testSteadyLoopOfInterleavedOneFOneB).
    """
    for recompute, t in ((True, 4), (False, 4), (True, 8)):
      pipe = _Pipe('interleaved_1f1b', 2, 2, t, recompute)
      self.assertEqual(pipe.num_partitions, 2)
      self.assertEqual(pipe.num_stages, 4)
      self.assertEqual([s.device for s in pipe.stages],
                       [pipe.devices[s % 2] for s in range(4)])
      self._AssertBitwise(pipe, recompute)

  def testRegisteredTableRunsOnTheEngine(self):
    """A user's table: GPipe's, registered under another name, runs with
    the loss inside the pipeline (the engine, not GPipe's loops)."""
    name = 'gpipe_loss_inside_test'
    if name not in schedule_builders.Names():
      schedule_builders.Register(name, schedule_builders.GPipe)
    self._AssertBitwise(_Pipe(name, 2, 1, 4))

  def testZeroBubbleSchedulesEqualGPipe(self):
    """ZB-H1 (K=2) and ZB-V (K=2 devices x 2 stages in a V), T=4: the
    backward split into I (input gradients) and W (weight gradients of
    each conv and matmul from the (x, dz) that I kept) trains bit for bit
    what GPipe trains on the same stages."""
    for name, k, v in (('zb_h1', 2, 1), ('zb_v', 2, 2)):
      for recompute in (True, False):
        pipe = _Pipe(name, k, v, 4, recompute)
        self._AssertBitwise(pipe, recompute)
    self.assertEqual([s.device for s in _Pipe('zb_v', 2, 2, 4).stages],
                     [_Pipe('zb_v', 2, 2, 4).devices[d]
                      for d in (0, 1, 1, 0)])

  def testCsvTablesRun(self):
    """A table from CSV: torch.distributed.pipelining's ZBVZeroBubble (K=2
    ranks, 4 stages in a V, T=4) by path, and our 1F1B's ToCsv() held in
    the Params by schedules.CsvParam, both bit for bit GPipe's."""
    torch_zbv = os.path.join(_TESTDATA, 'ZBVZeroBubble_ranks2_stages4_mb4.csv')
    self._AssertBitwise(_Pipe(torch_zbv, 2, 2, 4))
    path = os.path.join(self.get_temp_dir(), 'mine.csv')
    with open(path, 'w') as f:
      f.write(schedule_builders.Build('1f1b', 2, 4).ToCsv())
    value = schedules.CsvParam(path)
    self.assertEqual(value, 'csv:' + '/'.join(
        schedule_builders.Build('1f1b', 2, 4).ToCsv().split('\r\n')[:2]))
    self._AssertBitwise(_Pipe(value, 2, 1, 4))

  def testBadCsvTablesAreRefused(self):
    torch_zbv = os.path.join(_TESTDATA, 'ZBVZeroBubble_ranks2_stages4_mb4.csv')
    with self.assertRaisesRegex(ValueError, r"has 4 micro-batches but the "
                                r'step has 8; set num_micro_batches=4'):
      _Pipe(torch_zbv, 2, 2, 8)
    with self.assertRaisesRegex(ValueError, r'has 4 stages, but K=2 devices '
                                r'x num_stages_per_device=1 makes 2; set '
                                r'num_stages_per_device=2'):
      _Pipe(torch_zbv, 2, 1, 4)
    with self.assertRaisesRegex(ValueError, r"schedule CSV '/no/such.csv' "
                                'cannot be read'):
      _Pipe('/no/such.csv', 2, 1, 4)

  def testEvalFPropOfInterleavedEqualsGPipe(self):
    got_pipe = _Pipe('interleaved_1f1b', 2, 2, 4)
    want_pipe = _Pipe('gpipe', 4, 1, 4)
    for a, b in zip(want_pipe.variables, got_pipe.variables):
      b.assign(a)
    x = tf.random.stateless_normal([BATCH, 8, 8, 2], seed=[1, 2])
    with py_utils.EvalMode():
      self.assertAllEqual(want_pipe.FPropDefaultTheta(x),
                          got_pipe.FPropDefaultTheta(x))


def _SquareSinSum(out, unused_targets):
  # Not a plain mean: dz differs from example to example.
  return 0.5 * tf.reduce_sum(tf.square(out)) + tf.reduce_sum(tf.sin(out))


def _DenseBatchNormModel():
  """FC, batch norm, FC, dropout, FC, FC: [b, 5] -> [b, 3]."""
  fc = linear.FCLayer.Params
  return [
      fc().Set(name='fc0', input_dim=5, output_dim=6),
      normalization.BatchNormLayer.Params().Set(name='bn', dim=6),
      fc().Set(name='fc1', input_dim=6, output_dim=6),
      dropout.DropoutLayer.Params().Set(name='drop', keep_prob=0.6),
      fc().Set(name='fc2', input_dim=6, output_dim=6),
      fc().Set(name='fc3', input_dim=6, output_dim=3, activation='NONE'),
  ]


class ZeroBubbleOracleTest(tf.test.TestCase):
  """ZB-H1 and ZB-V against the float64 micro-batch oracle (not GPipe).

  The oracle (test_utils.MicroBatchOracle) runs the unpipelined layers on
  each micro-batch, so a stash slot read by the wrong W, a dz lost for one
  micro-batch or a weight gradient taken twice shows as a gradient that
  differs from it. FPropLossAndGrads is checked (FPropLoss wraps the same
  step in a schedule-independent custom gradient, which the GPipe test
  above runs), in float64, where the only difference left is the
  order of sums of a few terms (up to 8 examples, 4 micro-batches), so
  within a few ulps: rtol 1e-12 of each tensor's scale
  (test_utils.AssertAllCloseScaled) leaves three orders of margin.
  """

  def testLossAndEveryGradientEqualTheOracle(self):
    x = tf.random.stateless_normal([BATCH, 5], seed=[7, 8])
    for name, k, v in (('zb_h1', 2, 1), ('zb_v', 2, 2)):
      with self.subTest(schedule=name):
        test_utils.AssertOneFOneBMatchesOracle(
            self, _DenseBatchNormModel(), k, 4, [x], None, _SquareSinSum,
            normalizer=float(BATCH), rtol=1e-12,
            entry_points=('FPropLossAndGrads',), schedule=name,
            num_stages_per_device=v)


def _DensePipe(schedule, k=2, t=2):
  """Two FC layers (no bias) per partition: matmuls only."""
  layers = [linear.FCLayer.Params().Set(name=f'fc{i}', input_dim=4,
                                        output_dim=4, bias=False)
            for i in range(2 * k)]
  return pipeline.TensorPipeLayer.Params().Set(
      name='TensorPipe', layers=layers, num_partitions=k,
      num_micro_batches=t, input_shapes=[[4, 4]],
      schedule=schedule).Instantiate()


class AcrossProcessesTest(tf.test.TestCase):
  """Stages in other processes (what the engine sees through
  devices.NumProcesses), with the one pass on (schedule_program.
  UnrollAcrossProcesses, the default), run the whole table in one pass
  with every cell fixed and no tf.while_loop (schedule_program.UnrollsAll),
  with the looped engine's bits on these conv stages; TF's autodiff of
  GPipe's loop and a run of more cells than the cap keep their loops."""

  def testNoLoopAndTheLoopedEnginesBits(self):
    x = tf.random.stateless_normal([BATCH, 8, 8, 2], seed=[5, 6])
    remote = mock.patch.object(devices, 'NumProcesses', return_value=2)
    one_pass = lambda: schedule_program.UnrollAcrossProcesses(
        schedule_program.ONE_PASS_CELLS)
    # K=4, T=8: where a 1-ulp difference once showed (schedule_engine.
    # _Gates).
    for name, k, v, t in (('gpipe', 2, 1, 4), ('1f1b', 2, 1, 4),
                          ('zb_h1', 2, 1, 4), ('interleaved_1f1b', 2, 2, 4),
                          ('zb_v', 2, 2, 4), ('gpipe', 4, 1, 8),
                          ('1f1b', 4, 1, 8)):
      looped, unrolled = _Pipe(name, k, v, t), _Pipe(name, k, v, t)
      for a, b in zip(looped.variables, unrolled.variables):
        b.assign(a)
      step = _GPipeStep if name == 'gpipe' else _EngineStep
      want_fn, got_fn = step(looped), step(unrolled)
      with py_utils.TrainingMode(True), py_utils.StepSeed(4):
        self.assertNotEmpty(test_utils.WhileOps(
            want_fn.get_concrete_function(x).graph))
        with remote, one_pass():
          graph = got_fn.get_concrete_function(x).graph
        self.assertEmpty(test_utils.WhileOps(graph), name)
        want, got = want_fn(x), got_fn(x)
      self.assertLen(got, 1 + 7)
      for i, (a, b) in enumerate(zip(want, got)):
        self.assertAllEqual(a, b, msg=f'{name} K={k} output {i}')
      for a, b in zip(looped.variables, unrolled.variables):
        self.assertAllEqual(a, b, msg=f'{name} K={k} {a.name}')

  def testAutodiffAndLongRunsKeepTheirLoops(self):
    x = tf.random.stateless_normal([BATCH, 8, 8, 2], seed=[5, 6])
    remote = mock.patch.object(devices, 'NumProcesses', return_value=2)
    # On by default: one pass, and no warning. Off: the loops, and no
    # warning either.
    for cells, loops in ((schedule_program.UNROLL_ACROSS_PROCESSES_CELLS,
                          False), (0, True)):
      with remote, schedule_program.UnrollAcrossProcesses(cells), \
          self.assertLogs(level='WARNING') as logs:
        graph = _EngineStep(_Pipe('1f1b', 2, 1, 4)).get_concrete_function(
            x).graph
        logging.warning('end of the trace')
      self.assertEqual(bool(test_utils.WhileOps(graph)), loops, cells)
      self.assertNotIn('Stages in', '\n'.join(logs.output))
    # GPipe without recompute: TF's autodiff differentiates its loop.
    with remote, self.assertLogs(level='WARNING') as logs:
      graph = _GPipeStep(_Pipe('gpipe', 2, 1, 4, recompute=False)
                         ).get_concrete_function(x).graph
    self.assertNotEmpty(test_utils.WhileOps(graph))
    self.assertIn("TF's autodiff of the loop", '\n'.join(logs.output))
    # 1F1B, K=2, T=4: 16 cells, over a cap of 8.
    cap = mock.patch.object(schedule_program,
                            'UNROLL_ACROSS_PROCESSES_CELLS', 8)
    with remote, cap, self.assertLogs(level='WARNING') as logs:
      graph = _EngineStep(_Pipe('1f1b', 2, 1, 4)).get_concrete_function(
          x).graph
    self.assertNotEmpty(test_utils.WhileOps(graph))
    self.assertIn('16 cells > schedule_program.'
                  'UNROLL_ACROSS_PROCESSES_CELLS=8', '\n'.join(logs.output))


class _TwiceFC(linear.FCLayer):
  """Reads its weight twice: the tape sums the two uses' gradients."""

  def FProp(self, theta, x):
    return tf.tanh(tf.matmul(tf.tanh(tf.matmul(x, theta.w)), theta.w) +
                   theta.b)


class WeightReadTwiceTest(tf.test.TestCase):

  def testSameBitsUnderEveryScheduleAndAcrossProcesses(self):
    """A weight read twice in one stage has its two uses' gradients summed
    by the tape, then added to the running sum: inside a B cell in one
    process (schedule_cells.Cells.sums_in_cell), outside it across
    processes and under ZB-H1. Grappler's arithmetic optimizer merges the
    two additions into one AddN (another order) unless the gradient is
    kept apart (grad_sum.ApartIfSum in `Backward`): every form has
    GPipe's bits."""
    x = tf.random.stateless_normal([BATCH, 16], seed=[1, 2])
    remote = mock.patch.object(devices, 'NumProcesses', return_value=2)
    one_pass = lambda: schedule_program.UnrollAcrossProcesses(
        schedule_program.ONE_PASS_CELLS)
    want = None
    for name in ('gpipe', '1f1b', 'zb_h1'):
      for across in (False, True):
        pipe = pipeline.TensorPipeLayer.Params().Set(
            name='TensorPipe', layers=[
                _TwiceFC.Params().Set(name=f'fc{i}', input_dim=16,
                                      output_dim=16) for i in range(4)],
            num_partitions=2, num_micro_batches=4, input_shapes=[[BATCH, 16]],
            schedule=name, random_seed=3).Instantiate()
        step = _GPipeStep(pipe) if name == 'gpipe' else _EngineStep(pipe)
        if across:  # one pass, its sums outside the cells
          with remote, one_pass():
            graph = step.get_concrete_function(x).graph
          self.assertEmpty(test_utils.WhileOps(graph), name)
        got = step(x)
        if want is None:
          want = got
          continue
        # The loss: a float32 sum of n = BATCH * 16 squares, GPipe's of
        # the whole batch, the engine's of per-micro-batch sums (equal
        # bits with AVX-512, one ulp apart with AVX2: see
        # EngineEqualsGPipeTest); the gradients bitwise on any CPU.
        n = BATCH * 16
        self.assertAllClose(want[0], got[0], rtol=2 * n * 2.0**-24, atol=0,
                            msg=f'{name} across={across} loss')
        for i, (a, b) in enumerate(zip(want[1:], got[1:])):
          self.assertAllEqual(a, b,
                              msg=f'{name} across={across} gradient {i}')


class LoopDeviceTest(tf.test.TestCase):

  def testEveryLoopIsControlledFromThePipelinesFirstDevice(self):
    """schedule_engine.LOOP_DEVICE: with the devices given in reverse, the
    loops of 1F1B (switching and steady) and of GPipe's explicit recompute
    sit on '/CPU:1', not on the caller's default device (1F1B's ramps
    switching: fixed, the default, they are no loop)."""
    x = tf.random.stateless_normal([BATCH, 8, 8, 2], seed=[1, 2])
    for schedule in ('1f1b', 'gpipe'):
      pipe = pipeline.TensorPipeLayer.Params().Set(
          name='TensorPipe', layers=test_utils.ConvTestModel(),
          num_partitions=2, num_micro_batches=4,
          input_shapes=[[BATCH, 8, 8, 2]], schedule=schedule,
          devices=['/CPU:1', '/CPU:0'], random_seed=3).Instantiate()
      step = (_EngineStep(pipe) if schedule == '1f1b' else
              _GPipeStep(pipe))
      with schedule_program.RampTicks(0):
        loops = test_utils.WhileOps(step.get_concrete_function(x).graph)
      self.assertGreaterEqual(len(loops), 2, schedule)
      for op in loops:
        self.assertEqual(tf.DeviceSpec.from_string(op.device).device_index,
                         1, f'{schedule}: {op.name} on {op.device!r}')


class SplitBackwardGraphTest(tf.test.TestCase):

  def _MatMulsPerCell(self, schedule):
    """MatMul count of each cell's branch function (one switching loop)."""
    pipe = _DensePipe(schedule)

    def Step(x):
      return pipe.FPropLossAndGrads(pipe.theta, (x,), None, _Square,
                                    1.0).loss
    x = tf.zeros([4, 4])
    # Cells inline, so their ops sit in their branch functions.
    with py_utils.TrainingMode(True), timeline.Record(), \
        schedule_program.IsolatedCells(False):
      graph_def = tf.function(Step, autograph=False).get_concrete_function(
          x).graph.as_graph_def()
    return sorted(n for n in (
        [node.op for node in f.node_def].count('MatMul')
        for f in graph_def.library.function
        if '_branch' in f.signature.name or 'cond_true' in
        f.signature.name) if n)

  def testInputGradientCellBuildsNoWeightGradientKernel(self):
    """Stages of 2 matmuls: F 2; B 2 + 2 + 2 (recompute, dx, dw; stage 0
    takes no dx of its data: 5); I the same without dw (4; 3). W traces
    each op again to build its tape (2, whose outputs nothing reads:
    function instantiation prunes them) and takes one dw each (2): 4."""
    self.assertEqual(self._MatMulsPerCell('1f1b'), [2, 2, 5, 6])
    self.assertEqual(self._MatMulsPerCell('zb_h1'), [2, 2, 3, 4, 4, 4])


class EngineTimelineTest(tf.test.TestCase):

  def testCellsFollowTheTable(self):
    for name, v, per_cell in (('interleaved_1f1b', 2, 3), ('zb_v', 2, 4)):
      pipe = _Pipe(name, 2, v, 4)
      table = schedule_builders.Build(name, 2, 4, v)
      x = tf.random.stateless_normal([BATCH, 8, 8, 2], seed=[5, 6])

      def Step(x, pipe=pipe):
        pipe.FPropLossAndGrads(pipe.theta, (x,), None, _Square, 16.0)
        return timeline.Active().Tensors()
      with py_utils.TrainingMode(True), timeline.Record() as rec:
        fn = tf.function(Step, autograph=False).get_concrete_function(x)
      events = rec.Events(fn(x))
      # Per micro-batch and stage: forward, recompute and backward
      # (interleaved: B; ZB-V: I), and ZB-V's W (one 'backward' span).
      self.assertLen(events, per_cell * 4 * 4, name)
      phases = {'F': ('forward',), 'B': ('recompute', 'backward'),
                'I': ('recompute', 'backward'), 'W': ('backward',)}
      for d in range(2):
        mine = sorted((e for e in events if e.k == d), key=lambda e: e.tick)
        ran = [(e.tick, e.phase) for e in mine]
        want = [(c, phase) for c, a in enumerate(table.grid[d]) if a
                for phase in phases[a.op]]
        self.assertEqual(ran, want, name)
        for before, after in zip(mine, mine[1:]):
          # One device runs its cells one after another.
          self.assertGreaterEqual(after.start, before.start, name)


if __name__ == '__main__':
  tf.test.main()
