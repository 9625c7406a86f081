"""Tests of the loss-inside training step (tensorpipe/pipeline_train.py),
default tier, on the 1F1B schedule.

- Transparency: loss and every gradient of both training entry points
  (FPropLossAndGrads; FPropLoss under a tape) equal the micro-batch oracle
  (float64), with batch norm and dropout, with and without recompute (the
  unrolled schedule), on a conv model and the
  consistency CNN; the full K x T grid on the consistency CNN, a tiny
  AmoebaNet and a tiny Transformer is in pipeline_train_slow_test.py.
- Batch-norm moving averages after two steps equal GPipe's.
- Partition k keeps min(K - k, T) boundary inputs (the TensorArrays built).
- Tasks train through the 1F1B entry point: a ClassificationTask in
  distribute.TrainStep with R=2 replicas and a SequenceTask give GPipe's
  losses, gradients and weights.
- A recorded timeline has every cell once, where the schedule and the
  loop's two ticks in flight allow it, and changes no result (bitwise);
  without recompute each partition runs its cells in schedule order.
- Bad settings and bad loss functions: one clear error each.
"""

import tensorflow as tf

from models import consistency_cnn
from models import resnet
from models import transformer as transformer_models
from tensorpipe import base_layer
from tensorpipe import pipeline
from tensorpipe import py_utils
from tensorpipe import schedule_builders
from tensorpipe import schedule_program
from tensorpipe import tasks
from tensorpipe import test_utils
from tensorpipe import timeline
from tensorpipe.layers import composite
from tensorpipe.layers import dropout
from tensorpipe.layers import linear
from tensorpipe.layers import normalization
from tensorpipe.nested_map import NestedMap
from tests.models import transformer_testlib

test_utils.ConfigureTestDevices()

BATCH = 8
CLASSES = 5


def _DenseModel():
  """FC, batch norm, dropout, FC: [b, 5] -> [b, 5]; quick to trace."""
  return [
      linear.FCLayer.Params().Set(name='fc0', input_dim=5, output_dim=6),
      normalization.BatchNormLayer.Params().Set(name='bn', dim=6),
      dropout.DropoutLayer.Params().Set(name='drop', keep_prob=0.6),
      linear.FCLayer.Params().Set(name='fc1', input_dim=6,
                                  output_dim=CLASSES, activation='NONE'),
  ]


def _XentSum(logits, labels):
  """Softmax cross-entropy summed over the examples given."""
  return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=labels, logits=logits))


def _SquareSinSum(out, unused_targets):
  # Not a plain mean: the gradient differs from example to example.
  return 0.5 * tf.reduce_sum(tf.square(out)) + tf.reduce_sum(tf.sin(out))


def _Images(seed=5, shape=(BATCH, 8, 8, 2)):
  return tf.random.stateless_normal(list(shape), seed=[seed, 6])


def _Labels():
  return tf.range(BATCH) % CLASSES


class TransparencyTest(tf.test.TestCase):

  def testConvModelWithBatchNormAndDropoutMatchesOracle(self):
    # K=4 with recompute: pipeline_train_slow_test's AmoebaNet grid (batch
    # norm and dropout too) at every K, T and recompute setting.
    for k, t, recompute in [(1, 1, True), (2, 4, True), (4, 8, False)]:
      with self.subTest(k=k, t=t, recompute=recompute):
        test_utils.AssertOneFOneBMatchesOracle(
            self, test_utils.ConvTestModel(), k, t, [_Images()], _Labels(), _XentSum,
            normalizer=float(BATCH), recompute=recompute)

  def testConsistencyCnnMatchesOracle(self):
    x = tf.random.stateless_normal([BATCH, 8, 8, 1], seed=[3, 1])
    test_utils.AssertOneFOneBMatchesOracle(
        self, consistency_cnn.ConsistencyLayers(8), 4, 4, [x], None,
        _SquareSinSum, normalizer=1.0)

  def testMetricsAreSummedOverMicroBatches(self):
    """Each metric is (sum of values, sum of weights) over the T
    micro-batches: the loss function's metrics of the oracle's outputs of
    each micro-batch (MicroBatchOracle, float64), summed here."""
    t = 4
    size = BATCH // t
    layers = [lp.Copy().Set(dtype=tf.float64)
              for lp in test_utils.ConvTestModel()]
    x, labels = tf.cast(_Images(), tf.float64), _Labels()

    def LossFn(logits, labels):
      n = tf.cast(tf.shape(logits)[0], logits.dtype)
      hits = tf.reduce_sum(tf.cast(tf.equal(
          tf.argmax(logits, -1, output_type=tf.int32), labels), logits.dtype))
      # A value that differs from micro-batch to micro-batch: a metric taken
      # from one micro-batch (or averaged) cannot match the sum.
      return NestedMap(loss=_XentSum(logits, labels), metrics=NestedMap(
          correct=(hits, n), logit0=(tf.reduce_sum(logits[:, 0]), n)))

    ref = composite.SequentialLayer.Params().Set(
        name='Sequential', sub=layers).Instantiate()
    with py_utils.TrainingMode(True), py_utils.StepSeed(2):
      ref_logits, _, _ = test_utils.MicroBatchOracle(ref, t, tf.reduce_sum, x)
    expected = {'correct': [0.0, 0.0], 'logit0': [0.0, 0.0]}
    per_micro_batch, expected_loss = [], 0.0
    for i in range(t):
      part = slice(i * size, (i + 1) * size)
      res = LossFn(ref_logits[part], labels[part])
      expected_loss += float(res.loss) / 8.0
      for name, (value, weight) in res.metrics.items():
        expected[name][0] += float(value)
        expected[name][1] += float(weight)
      per_micro_batch.append(float(res.metrics.logit0[0]))
    self.assertLen(set(per_micro_batch), t)  # the check can tell them apart
    self.assertEqual(expected['correct'][1], BATCH)

    pipe = pipeline.TensorPipeLayer.Params().Set(
        name='TensorPipe', layers=layers, num_partitions=2,
        num_micro_batches=t, input_shapes=[[BATCH, 8, 8, 2]],
        schedule='1f1b').Instantiate()

    @tf.function(autograph=False)
    def Run(x, labels):
      with py_utils.TrainingMode(True), py_utils.StepSeed(2):
        res = pipe.FPropLossAndGrads(pipe.theta, (x,), labels, LossFn, 8.0)
      return res.metrics, res.loss
    metrics, loss = Run(x, labels)
    self.assertEqual(sorted(metrics), ['correct', 'logit0'])
    hits, n = metrics.correct
    self.assertEqual((float(hits), float(n)), tuple(expected['correct']))
    self.assertAllClose(metrics.logit0, expected['logit0'], rtol=1e-9,
                        atol=0.0)
    self.assertAllClose(loss, expected_loss, rtol=1e-9, atol=0.0)


class GradientsEqualGPipeBitwiseTest(tf.test.TestCase):

  def testSameSumOrderGivesTheSameBits(self):
    """1F1B feeds micro-batches last-first (schedule_program.Labels), so
    every partition sums its weight gradients in GPipe's backward order and
    the two schedules' gradients are equal bit for bit, with batch norm and
    dropout. The loss is a square (its gradient is exact arithmetic, so it
    does not depend on whether it was computed per micro-batch or on the
    whole batch, unlike exp inside a softmax, whose vectorised and scalar
    forms differ in the last bit); each stage then runs the same kernels on
    the same micro-batch shapes in both schedules. Summing in the order
    0 .. T-1 instead differs in the last bits of most gradients.
    """
    x = _Images(shape=(4 * BATCH, 8, 8, 2))

    def Square(out, unused_targets=None):
      return 0.5 * tf.reduce_sum(tf.square(out))

    for k_total, t_total, recompute, grad_sum in [
        (2, 4, True, 'sequential'), (4, 8, True, 'sequential'),
        (4, 8, False, 'sequential'), (2, 4, True, 'pairwise')]:
      def Build(schedule):
        return pipeline.TensorPipeLayer.Params().Set(
            name='TensorPipe', layers=test_utils.ConvTestModel(),
            num_partitions=k_total, num_micro_batches=t_total,
            input_shapes=[list(x.shape)], recompute=recompute,
            schedule=schedule, grad_sum=grad_sum).Instantiate()  # pylint: disable=cell-var-from-loop
      gpipe, ofob = Build('gpipe'), Build('1f1b')
      for a, b in zip(gpipe.variables, ofob.variables):
        b.assign(a)

      @tf.function(autograph=False)
      def GPipeStep(x):
        with tf.GradientTape() as tape:
          loss = Square(gpipe.FPropDefaultTheta(x)) / 32.0  # pylint: disable=cell-var-from-loop
        return tape.gradient(loss, gpipe.trainable_variables)  # pylint: disable=cell-var-from-loop

      @tf.function(autograph=False)
      def OneFOneBStep(x):
        with tf.GradientTape() as tape:
          loss = ofob.FPropLoss(ofob.theta, (x,), None, Square, 32.0).loss  # pylint: disable=cell-var-from-loop
        return tape.gradient(loss, ofob.trainable_variables)  # pylint: disable=cell-var-from-loop

      with py_utils.TrainingMode(True), py_utils.StepSeed(4):
        want, got = GPipeStep(x), OneFOneBStep(x)
      self.assertLen(got, 7)
      for v, a, b in zip(gpipe.trainable_variables, want, got):
        self.assertAllEqual(a, b, msg=f'K={k_total} T={t_total} '
                            f'recompute={recompute} {grad_sum} {v.name}')


  def testBatchNormResNetAtFourStagesGivesGPipesBits(self):
    """A batch-norm ResNet (models/resnet.SmallResNetLayers) at K=4, T=4,
    with switching ramps (schedule_program.RampTicks(0): a recorded step's,
    GPipe's, a ramp over 48 ticks) and with fixed ones (the default):
    fixed ramps in a one-iteration
    tf.while_loop changed these gradients by an ulp (Grappler's constant
    folding); run without a loop they are GPipe's. The loss is a softmax
    cross-entropy: each example's gradient is computed alike per
    micro-batch and on the whole batch."""
    batch = 32
    x = tf.random.stateless_uniform([batch, 28, 28, 1], seed=[1, 2])
    y = tf.random.stateless_uniform([batch], seed=[3, 4], maxval=10,
                                    dtype=tf.int32)

    def Build(schedule):
      return pipeline.TensorPipeLayer.Params().Set(
          name='TensorPipe', layers=resnet.SmallResNetLayers(8, 1),
          num_partitions=4, num_micro_batches=4,
          input_shapes=[[batch, 28, 28, 1]], schedule=schedule,
          random_seed=3).Instantiate()
    gpipe = Build('gpipe')

    @tf.function(autograph=False)
    def GPipeStep(x, y):
      with tf.GradientTape() as tape:
        loss = _XentSum(gpipe.FPropDefaultTheta(x), y) / batch
      return tape.gradient(loss, gpipe.trainable_variables)

    with py_utils.TrainingMode(True), py_utils.StepSeed(4):
      want = GPipeStep(x, y)
    for ramps in (0, schedule_program.FIXED_RAMP_TICKS):
      ofob = Build('1f1b')
      for a, b in zip(gpipe.variables, ofob.variables):
        b.assign(a)

      @tf.function(autograph=False)
      def OneFOneBStep(x, y):
        with tf.GradientTape() as tape:
          loss = ofob.FPropLoss(ofob.theta, (x,), y, _XentSum, batch).loss  # pylint: disable=cell-var-from-loop
        return tape.gradient(loss, ofob.trainable_variables)  # pylint: disable=cell-var-from-loop

      with py_utils.TrainingMode(True), py_utils.StepSeed(4):
        with schedule_program.RampTicks(ramps):
          OneFOneBStep.get_concrete_function(x, y)
        got = OneFOneBStep(x, y)
      self.assertLen(got, 29)
      for v, a, b in zip(gpipe.trainable_variables, want, got):
        self.assertAllEqual(a, b, msg=f'ramp ticks {ramps}: {v.name}')


class MovingAveragesTest(tf.test.TestCase):

  def testMovingAveragesAndGradientsEqualGPipe(self):
    layer_ps = [
        linear.FCLayer.Params().Set(name='fc0', input_dim=3, output_dim=4,
                                    activation='NONE'),
        normalization.BatchNormLayer.Params().Set(name='bn0', dim=4,
                                                  decay=0.9),
        linear.FCLayer.Params().Set(name='fc1', input_dim=4, output_dim=4,
                                    activation='RELU'),
        normalization.BatchNormLayer.Params().Set(name='bn1', dim=4,
                                                  decay=0.9),
    ]

    def Build(schedule):
      return pipeline.TensorPipeLayer.Params().Set(
          name='TensorPipe', partitions=[layer_ps[:1], layer_ps[1:3],
                                         layer_ps[3:]],
          num_micro_batches=6, schedule=schedule).Instantiate()
    gpipe, ofob = Build('gpipe'), Build('1f1b')
    for a, b in zip(gpipe.variables, ofob.variables):
      self.assertAllEqual(a, b)

    def Loss(out, unused_targets=None):
      return _SquareSinSum(out, None)

    @tf.function(autograph=False)
    def GPipeStep(x):
      with tf.GradientTape() as tape:
        loss = Loss(gpipe.FPropDefaultTheta(x))
      return tape.gradient(loss, gpipe.trainable_variables)

    @tf.function(autograph=False)
    def OneFOneBStep(x):
      res = ofob.FPropLossAndGrads(ofob.theta, (x,), None, Loss, 1.0)
      by_var = {id(v): g for v, g in zip(tf.nest.flatten(ofob.theta),
                                         tf.nest.flatten(res.grads))}
      return [by_var[id(v)] for v in ofob.trainable_variables]

    for step in range(2):  # Two steps: the averages accumulate.
      x = tf.random.stateless_normal([24, 3], seed=[step, 2]) * 3.0 + 1.0
      with py_utils.TrainingMode(True):
        want = GPipeStep(x)
        got = OneFOneBStep(x)
      scale = test_utils.MaxAbs(want)
      test_utils.AssertAllCloseScaled(self, got, want, 1e-5, scale=scale)
    moving = [v for v in gpipe.variables if not v.trainable]
    self.assertLen(moving, 4)  # moving mean and variance of bn0, bn1
    for a, b in zip(moving, [v for v in ofob.variables if not v.trainable]):
      self.assertNotAllClose(a, tf.zeros_like(a) + (
          0.0 if 'mean' in a.name else 1.0))
      # The same float32 sums over the same micro-batches in the same order.
      self.assertAllClose(b, a, rtol=1e-6, atol=1e-6, msg=a.name)


def _SlotListsByWidth(k_total, t_total):
  """{input width of partition k: sizes of the TensorArrays of that shape}."""
  widths = [5, 6, 7, 8, 3]
  layer_ps = [linear.FCLayer.Params().Set(name=f'fc{i}', input_dim=widths[i],
                                          output_dim=widths[i + 1])
              for i in range(4)]
  pipe = pipeline.TensorPipeLayer.Params().Set(
      name='TensorPipe', partitions=[[lp] for lp in layer_ps[:k_total - 1]]
      + [layer_ps[k_total - 1:]], num_micro_batches=t_total,
      schedule='1f1b').Instantiate()
  batch = 2 * t_total

  @tf.function(autograph=False)
  def Step(x):
    return pipe.FPropLossAndGrads(pipe.theta, (x,), None, _SquareSinSum,
                                  1.0).loss
  graph = Step.get_concrete_function(
      tf.TensorSpec([batch, widths[0]])).graph
  sizes = {}
  for op in graph.get_operations():
    if op.type == 'TensorListReserve':
      shape = tf.get_static_value(op.inputs[0])
      sizes.setdefault(int(shape[-1]), []).append(
          int(tf.get_static_value(op.inputs[1])))
  return sizes


class SlotBoundTest(tf.test.TestCase):

  def testPartitionKKeepsMinOfKMinusKAndTBoundaryInputs(self):
    # Partition k's input has width 5 + k; partition 0 reads the mini-batch
    # and keeps nothing. GPipe would keep T (+1) per partition.
    self.assertEqual(_SlotListsByWidth(4, 8), {6: [3], 7: [2], 8: [1]})
    self.assertEqual(_SlotListsByWidth(4, 2), {6: [2], 7: [2], 8: [1]})
    program = schedule_program.Compile(schedule_builders.Build('1f1b', 4, 8))
    self.assertEqual(program.num_slots, [0, 3, 2, 1])


class SteadyLoopTest(tf.test.TestCase):

  def testLoopsCoverEveryTickAndSteadyOpsFollowTheSchedule(self):
    """The engine's loop plan for 1F1B: the ticks on which every partition
    works run as a loop of (forward, backward) pairs with no switch."""
    for k_total in range(1, 6):
      for t_total in range(1, 10):
        case = (k_total, t_total)
        table = schedule_builders.Build('1f1b', k_total, t_total)
        ticks = 2 * (t_total + k_total - 1)
        self.assertEqual(table.num_ticks, ticks, case)
        program = schedule_program.Compile(table)
        loops = program.loops
        self.assertEqual(loops[0].first, 0, case)
        self.assertEqual(loops[-1].end, ticks, case)
        for a, b in zip(loops, loops[1:]):
          self.assertEqual(a.end, b.first, case)
        steady = [loop for loop in loops if loop.steady]
        if t_total <= k_total and k_total > 1:
          # No two ticks in a row on which every partition works.
          self.assertEqual(loops, [schedule_program.Loop(0, ticks, ())],
                           case)
          continue
        self.assertLen(steady, 1)
        first, end, ops = steady[0].first, steady[0].end, steady[0].steady
        # K > 1: ticks 2K - 1 .. 2T - 2; K = 1 works on every tick.
        want = (2 * k_total - 1, 2 * t_total - 1) if k_total > 1 else (
            0, ticks)
        self.assertEqual((first, end), want, case)
        self.assertEqual((end - first) % 2, 0, case)
        for c in range(first, end):
          for k in range(k_total):
            action = table.grid[k][c]
            self.assertIsNotNone(action, (case, c, k))
            cell = program.cells[k][ops[(c - first) % 2][k] - 1]
            self.assertEqual(cell, (action.op, k), (case, c, k))
    self.assertEqual(
        schedule_program.Compile(
            schedule_builders.Build('1f1b', 2, 8), one_loop=True).loops,
        [schedule_program.Loop(0, 18, ())])

  def testLoopBodiesHaveNoSwitch(self):
    """The steady loop holds its cells itself, with no switch_case; a
    loss-inside table's short ramps before and after it run once, without
    a loop, their cells fixed (schedule_program.RAMP_TICKS): no switch
    anywhere in the step. Each F and B cell is a function of its own
    (schedule_program.ISOLATED_CELLS), a B cell's gradient sums inside
    it; traced inline, as here second, its ops sit in the loop body."""
    layer = pipeline.TensorPipeLayer.Params().Set(
        name='TensorPipe', layers=_DenseModel(), num_partitions=2,
        num_micro_batches=4, input_shapes=[[BATCH, 5]], schedule='1f1b',
        dtype=tf.float64).Instantiate()
    x = tf.zeros([BATCH, 5], tf.float64)

    def Step(x):
      with tf.GradientTape() as tape:
        loss = layer.FPropLoss(layer.theta, (x,), _Labels(), _XentSum,
                               1.0).loss
      return tape.gradient(loss, layer.trainable_variables)

    def Traced(isolated):
      with schedule_program.IsolatedCells(isolated):
        graph_def = tf.function(Step, autograph=False).get_concrete_function(
            x).graph.as_graph_def()
      ops = {f.signature.name: [n.op for n in f.node_def]
             for f in graph_def.library.function}
      nodes = list(graph_def.node) + [
          n for f in graph_def.library.function for n in f.node_def]
      return graph_def, ops, nodes
    cases = ('Case', 'StatelessCase', 'If', 'StatelessIf')
    # Isolated (the default): no switch, and every MatMul (the cells' only
    # one) is inside a function that is not inlined, called from the ramps
    # or the steady loop's body.
    graph_def, ops, nodes = Traced(True)
    self.assertFalse([n.name for n in nodes if n.op in cases])
    cells = {f.signature.name for f in graph_def.library.function
             if f.attr['_noinline'].b}
    self.assertNotEmpty(cells)
    self.assertEqual({name for name, o in ops.items() if 'MatMul' in o},
                     cells)
    self.assertNotIn('MatMul', [n.op for n in graph_def.node])
    # In one process a B cell adds its weight gradients to the running
    # sums inside its function (schedule_cells.Cells.sums_in_cell): every
    # AddN of the step is in a cell, none in the loop body or the ramps
    # around the calls.
    adds = {name for name, o in ops.items() if 'AddN' in o}
    self.assertNotEmpty(adds)
    self.assertLessEqual(adds, cells)
    self.assertNotIn('AddN', [n.op for n in graph_def.node])
    _, ops, nodes = Traced(False)
    bodies = {name: o for name, o in ops.items() if '_body_' in name}
    self.assertLen(bodies, 1)  # the steady loop; the ramps have none
    # It holds its cells itself (a switching body has them in its branch
    # functions).
    self.assertGreater(list(bodies.values())[0].count('MatMul'), 0)
    self.assertFalse([n.name for n in nodes if n.op in cases])
    # After a barrier a device's sums wait for the state it left
    # (schedule_engine._Gates): in the ramps, where a device runs a cell
    # after another, some gradient sums (AddN) have control inputs, which
    # keep Grappler from merging two additions of one sum into another
    # order. Without the gates none has.
    gated = [n.name for n in nodes
             if n.op == 'AddN' and any(i.startswith('^') for i in n.input)]
    self.assertNotEmpty(gated)


def _TaskParams(schedule, num_micro_batches=2):
  pipe = pipeline.TensorPipeLayer.Params().Set(
      name='TensorPipe', layers=[
          linear.FCLayer.Params().Set(name='fc0', input_dim=5, output_dim=6),
          normalization.BatchNormLayer.Params().Set(name='bn', dim=6,
                                                    decay=0.5),
          dropout.DropoutLayer.Params().Set(name='drop', keep_prob=0.6),
          linear.FCLayer.Params().Set(name='fc1', input_dim=6,
                                      output_dim=3, activation='NONE'),
      ], num_partitions=2, num_micro_batches=num_micro_batches,
      input_shapes=[[8, 5]], schedule=schedule)
  return tasks.ClassificationTask.Params().Set(
      name='task', model=pipe, num_classes=3, input_key='image',
      label_smoothing=0.1, dtype=tf.float64)


class ReplicatedTaskTest(tf.test.TestCase):

  def testTrainStepWithTwoReplicasEqualsGPipe(self):
    """distribute.TrainStep, R=2 x K=2: 1F1B's steps are GPipe's."""

    def Run(schedule):
      _, replicas, _, train_step = test_utils.ReplicatedSgdStep(
          _TaskParams(schedule), [['/CPU:0', '/CPU:1'], ['/CPU:2', '/CPU:3']])
      history = []
      for step in range(2):
        batch = NestedMap(
            image=tf.random.stateless_normal([16, 5], seed=[step, 1],
                                             dtype=tf.float64),
            label=tf.random.stateless_uniform([16], seed=[step, 2], maxval=3,
                                              dtype=tf.int32))
        history.append(train_step(batch, tf.constant(step, tf.int64)))
      return history, replicas

    want, want_replicas = Run('gpipe')
    got, got_replicas = Run('1f1b')
    # The model runs in float64, but the task's loss casts the logits to
    # float32 (tasks.py): its softmax kernels round differently for a
    # micro-batch [2, 3] than for a replica's batch [8, 3], so the loss
    # gradients differ by a few float32 ulps (eps32 = 1.2e-7) of their
    # scale; 1e-6 bounds that, while a wrong micro-batch or mask changes
    # values by O(1e-2) of their scale.
    rtol = 1e-6
    for step, (g, w) in enumerate(zip(got, want)):
      for key in ('loss', 'total_loss', 'grad_norm', 'accuracy'):
        test_utils.AssertAllCloseScaled(self, g[key], w[key], rtol,
                                        msg=f'step {step} {key}')
    for g_task, w_task in zip(got_replicas, want_replicas):
      g_vars = base_layer.VariablesByPath(g_task)
      w_vars = base_layer.VariablesByPath(w_task)
      self.assertEqual(sorted(g_vars), sorted(w_vars))
      for path, var in w_vars.items():
        # Moving statistics are summed in float32 as well (normalization.py).
        test_utils.AssertAllCloseScaled(self, g_vars[path], var, rtol,
                                        msg=path)


class SequenceTaskTest(tf.test.TestCase):

  def testLmTaskLossMetricsAndGradientsEqualGPipe(self):
    layers = transformer_models.TransformerLmLayers(
        dropout=0.2, atten_dropout=0.1, **transformer_testlib.TINY)
    batch = transformer_testlib.LmBatch(seed=2)

    def Run(schedule):
      pipe = pipeline.TensorPipeLayer.Params().Set(
          name='TensorPipe', layers=layers, num_partitions=2,
          num_micro_batches=4, schedule=schedule,
          # The task's loss and metrics are the point here; recompute under
          # both schedules: pipeline_train_slow_test's Transformer grid.
          recompute=False,
          input_shapes=transformer_models.LmInputShapes(
              transformer_testlib.BATCH, transformer_testlib.TGT_LEN))
      task = tasks.SequenceTask.Params().Set(
          name='task', model=pipe,
          vocab_size=transformer_testlib.TINY['vocab_size']).Instantiate()

      @tf.function(autograph=False)
      def Step(batch):
        with py_utils.TrainingMode(True), py_utils.StepSeed(4):
          with tf.GradientTape() as tape:
            out = task.ComputeLoss(batch)
        return out.metrics, tape.gradient(out.loss, task.trainable_variables)
      return Step(batch)

    want_metrics, want_grads = Run('gpipe')
    got_metrics, got_grads = Run('1f1b')
    self.assertEqual(sorted(got_metrics), sorted(want_metrics))
    for name in want_metrics:
      test_utils.AssertAllCloseScaled(self, got_metrics[name],
                                      want_metrics[name], 1e-5, msg=name)
    scale = test_utils.MaxAbs(want_grads)
    test_utils.AssertAllCloseScaled(self, got_grads, want_grads, 1e-5,
                                    scale=scale)


class TimelineTest(tf.test.TestCase):

  def testCellsFollowTheScheduleAndRecordingChangesNoResult(self):
    k_total, t_total = 2, 4
    pipe = pipeline.TensorPipeLayer.Params().Set(
        name='TensorPipe', layers=_DenseModel(), num_partitions=k_total,
        num_micro_batches=t_total, input_shapes=[[BATCH * 2, 5]],
        schedule='1f1b').Instantiate()
    x = _Images(shape=(BATCH * 2, 5))
    labels = tf.range(BATCH * 2) % CLASSES
    moving = [v for v in pipe.variables if not v.trainable]
    initial = [v.numpy() for v in moving]

    def Step(x, labels):
      res = pipe.FPropLossAndGrads(pipe.theta, (x,), labels, _XentSum, 16.0)
      rec = timeline.Active()
      return ([res.loss] + tf.nest.flatten(res.grads),
              rec.Tensors() if rec else {})

    def Run(record):
      for v, value in zip(moving, initial):
        v.assign(value)
      with py_utils.TrainingMode(True), py_utils.StepSeed(1):
        if record:
          with timeline.Record() as rec:
            fn = tf.function(Step).get_concrete_function(x, labels)
        else:
          rec = None
          fn = tf.function(Step).get_concrete_function(x, labels)
      values, stamps = fn(x, labels)
      return values + [v.read_value() for v in moving], rec, stamps

    plain, _, no_stamps = Run(False)
    recorded, rec, stamps = Run(True)
    self.assertEmpty(no_stamps)
    for i, (a, b) in enumerate(zip(recorded, plain)):
      self.assertAllEqual(a, b, msg=f'result {i}')
    events = rec.Events(stamps)
    self.assertLen(events, 3 * k_total * t_total)
    for k in range(k_total):
      mine = [e for e in events if e.k == k]
      for phase in ('forward', 'recompute', 'backward'):
        self.assertEqual(sorted(e.t for e in mine if e.phase == phase),
                         list(range(t_total)), msg=f'{phase} k={k}')
      cells = {(e.phase, e.t): e for e in mine}
      for t in range(t_total):
        fwd, rc, bwd = (cells[(phase, t)] for phase in
                        ('forward', 'recompute', 'backward'))
        self.assertLessEqual(fwd.start, fwd.end)
        self.assertLessEqual(rc.end, bwd.start)
        if k < k_total - 1:
          # b(t, k) >= f(t, k) + 2 and the loop has two ticks in flight:
          # the backward cell starts after its forward cell has ended.
          self.assertGreaterEqual(rc.start, fwd.end, msg=f't={t} k={k}')


  def testWithoutRecomputeEachPartitionRunsItsCellsInScheduleOrder(self):
    """recompute=False: a forward cell starts only after the previous
    cell of its partition ended, so partition k holds at most min(K - k, T)
    micro-batches of activations (their backward cells ran before)."""
    k_total, t_total = 3, 6
    pipe = pipeline.TensorPipeLayer.Params().Set(
        name='TensorPipe', layers=_DenseModel(), num_partitions=k_total,
        num_micro_batches=t_total, input_shapes=[[24, 5]],
        schedule='1f1b', recompute=False).Instantiate()

    def Step(x, labels):
      pipe.FPropLossAndGrads(pipe.theta, (x,), labels, _XentSum, 24.0)
      return timeline.Active().Tensors()
    x = _Images(shape=(24, 5))
    labels = tf.range(24) % CLASSES
    with py_utils.TrainingMode(True), timeline.Record() as rec:
      fn = tf.function(Step).get_concrete_function(x, labels)
    events = rec.Events(fn(x, labels))
    self.assertLen(events, 2 * k_total * t_total)  # no recompute cells
    for k in range(k_total):
      mine = sorted((e for e in events if e.k == k), key=lambda e: e.tick)
      for before, after in zip(mine, mine[1:]):
        self.assertGreaterEqual(after.start, before.end,
                                msg=f'k={k}: {before} then {after}')
      in_flight = peak = 0
      for e in mine:
        in_flight += 1 if e.phase == 'forward' else -1
        peak = max(peak, in_flight)
      self.assertEqual(peak, min(k_total - k, t_total))

  def testWithoutRecomputeTheLastPartitionsNextCellWaitsForTheLoss(self):
    """recompute=False: nothing reads a micro-batch's loss before the step
    ends, so an executor free to run it late kept every micro-batch's
    outputs (the loss's input) alive until then (dense32mem, 1F1B, K=1,
    T=8, one inter-op thread: 43.8 MiB against 39.6 with the wait). The
    last partition's next cell waits for it: micro-batch 1's loss op has
    micro-batch 0's among its ancestors, though no value flows between
    them (the gradient of sum(softplus(y)) reads y, not softplus(y))."""
    layers = [linear.FCLayer.Params().Set(name='fc0', input_dim=5,
                                          output_dim=6),
              linear.FCLayer.Params().Set(name='fc1', input_dim=6,
                                          output_dim=3, activation='NONE')]
    pipe = pipeline.TensorPipeLayer.Params().Set(
        name='TensorPipe', layers=layers, num_partitions=2,
        num_micro_batches=2, input_shapes=[[8, 5]],
        schedule='1f1b', recompute=False).Instantiate()

    def Step(x):
      return pipe.FPropLossAndGrads(
          pipe.theta, (x,), None,
          lambda y, unused_t: tf.reduce_sum(tf.math.softplus(y)), 8.0).grads
    graph = tf.function(Step).get_concrete_function(
        _Images(shape=(8, 5))).graph
    losses = [op for op in graph.get_operations() if op.type == 'Softplus']
    self.assertLen(losses, 2)  # one per micro-batch, in table order
    seen, todo = set(), [losses[1]]
    while todo:
      op = todo.pop()
      for up in [t.op for t in op.inputs] + list(op.control_inputs):
        if up not in seen:
          seen.add(up)
          todo.append(up)
    self.assertIn(losses[0], seen)


class BadInputTest(tf.test.TestCase):

  def _Pipe(self, **kwargs):
    settings = dict(name='TensorPipe', layers=test_utils.ConvTestModel(), num_partitions=2,
                    num_micro_batches=2, input_shapes=[[BATCH, 8, 8, 2]],
                    schedule='1f1b')
    settings.update(kwargs)
    return pipeline.TensorPipeLayer.Params().Set(**settings).Instantiate()

  def testUnknownScheduleRaises(self):
    with self.assertRaisesRegex(ValueError, r"schedule='pipedream' is not "
                                r"one of \['1f1b', 'gpipe', .*"
                                r"'interleaved_1f1b'.*"
                                r'schedule_builders.Register'):
      self._Pipe(schedule='pipedream')

  def testSplitBackwardWithPairwiseSumRaises(self):
    for schedule, v in (('zb_h1', 1), ('zb_v', 2)):
      with self.assertRaisesRegex(
          ValueError, f"schedule='{schedule}' splits the backward pass into "
          r"input- and weight-gradient cells \(I, W\).*grad_sum='pairwise' "
          "needs whole backward cells: use grad_sum='sequential'"):
        self._Pipe(schedule=schedule, num_stages_per_device=v,
                   num_micro_batches=4, input_shapes=[[4 * BATCH, 8, 8, 2]],
                   grad_sum='pairwise')

  def testStagesPerDeviceTheScheduleCannotPlaceRaise(self):
    with self.assertRaisesRegex(ValueError, "TensorPipeLayer 'TensorPipe': "
                                "schedule '1f1b' runs one stage per device, "
                                'got num_stages_per_device=2; use 1, or '
                                'schedule="interleaved_1f1b"'):
      self._Pipe(num_stages_per_device=2)
    with self.assertRaisesRegex(ValueError, "schedule='gpipe' runs one stage "
                                'per device, got num_stages_per_device=2'):
      self._Pipe(schedule='gpipe', num_stages_per_device=2)
    with self.assertRaisesRegex(ValueError, 'interleaved_1f1b needs '
                                'num_micro_batches a multiple of '
                                'num_devices=2, got 3; use T=4'):
      self._Pipe(schedule='interleaved_1f1b', num_stages_per_device=2,
                 num_micro_batches=3, input_shapes=[[3 * BATCH, 8, 8, 2]])
    with self.assertRaisesRegex(ValueError, 'num_stages_per_device=0 must be '
                                'an int >= 1'):
      self._Pipe(num_stages_per_device=0)

  def testZeroBubbleVTakesTwoStagesPerDeviceByDefault(self):
    """ZB-V is defined on two stages per device: num_stages_per_device left
    at None gives v=2; an explicit other v is refused as before."""
    pipe = self._Pipe(schedule='zb_v', num_micro_batches=4,
                      input_shapes=[[4 * BATCH, 8, 8, 2]])
    self.assertEqual((pipe.num_partitions, pipe.num_stages), (2, 4))
    self.assertEqual([s.device for s in pipe.stages],
                     [pipe.devices[d] for d in (0, 1, 1, 0)])
    self.assertEqual(self._Pipe().num_stages, 2)   # other schedules: v=1
    for k, v in ((2, 1), (1, 3)):
      with self.assertRaisesRegex(
          ValueError, "^TensorPipeLayer 'TensorPipe': zb_v holds exactly 2 "
          f'stages per device, got num_stages_per_device={v}; use 2$'):
        self._Pipe(schedule='zb_v', num_partitions=k, num_micro_batches=4,
                   input_shapes=[[4 * BATCH, 8, 8, 2]],
                   num_stages_per_device=v)

  def testTfRecomputeGradImplRaises(self):
    with self.assertRaisesRegex(ValueError, "recompute_impl="
                                "'tf_recompute_grad' does not apply"):
      self._Pipe(recompute_impl='tf_recompute_grad')

  def testTrainingFPropRaisesAndEvalFPropMatchesGPipe(self):
    pipe = self._Pipe()
    with self.assertRaisesRegex(ValueError, 'call FPropLoss'):
      with py_utils.TrainingMode(True):
        pipe.FPropDefaultTheta(_Images())
    gpipe = self._Pipe(schedule='gpipe')
    with py_utils.EvalMode():
      self.assertAllEqual(pipe.FPropDefaultTheta(_Images()),
                          gpipe.FPropDefaultTheta(_Images()))

  def testCsvTableIsNamedByALabelNotPasted(self):
    zb = 'csv:' + schedule_builders.Build('zb_h1', 2, 4).ToCsv().replace(
        '\r\n', '/').rstrip('/')
    with self.assertRaisesRegex(ValueError, r"schedule='csv table \(2 rows\)'"
                                ' splits the backward pass') as ctx:
      self._Pipe(schedule=zb, num_micro_batches=4, grad_sum='pairwise',
                 input_shapes=[[4 * BATCH, 8, 8, 2]])
    self.assertNotIn('csv:', str(ctx.exception))
    one = 'csv:' + schedule_builders.Build('1f1b', 2, 2).ToCsv().replace(
        '\r\n', '/').rstrip('/')
    pipe = self._Pipe(schedule=one)
    with self.assertRaisesRegex(ValueError, r"schedule='csv table \(2 rows\)'"
                                '.*call FPropLoss') as ctx:
      with py_utils.TrainingMode(True):
        pipe.FPropDefaultTheta(_Images())
    self.assertNotIn('csv:', str(ctx.exception))
    # The layer's T is the range a CSV cell is checked against.
    with self.assertRaisesRegex(ValueError, r'column 1: 0F99999999: '
                                r'micro-batch 99999999 is not in \[0, 2\); '
                                r'use micro-batches 0 \.\. 1$'):
      self._Pipe(schedule='csv:0F0,0F99999999,0B0,0B1/1F0,1B0,1F1,1B1')

  def testFPropLossOnGPipeRaises(self):
    pipe = self._Pipe(schedule='gpipe')
    with self.assertRaisesRegex(ValueError, "set schedule='1f1b'"):
      pipe.FPropLoss(pipe.theta, (_Images(),), _Labels(), _XentSum, 8.0)

  def testBadLossFunctionsRaise(self):
    pipe = self._Pipe()
    bad = [
        (lambda out, y: tf.reduce_sum(out, 0), 'shape \\(5,\\) as the loss'),
        (lambda out, y: NestedMap(loss=_XentSum(out, y), logits=out),
         r"keys \['logits', 'loss'\]"),
        (lambda out, y: NestedMap(loss=_XentSum(out, y),
                                  metrics=NestedMap(acc=1.0)),
         r"metrics\['acc'\]=1.0, not a \(value sum, weight\) pair"),
        (lambda out, y: 3.0, 'float 3.0 as the loss'),
    ]
    for fn, message in bad:
      with self.subTest(message=message):
        with self.assertRaisesRegex(ValueError, message):
          pipe.FPropLossAndGrads(pipe.theta, (_Images(),), _Labels(), fn,
                                 8.0)
    with self.assertRaisesRegex(TypeError, 'loss_fn=3 is not callable'):
      pipe.FPropLoss(pipe.theta, (_Images(),), _Labels(), 3, 8.0)


if __name__ == '__main__':
  tf.test.main()
