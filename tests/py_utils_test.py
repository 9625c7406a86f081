"""Tests for tensorpipe.py_utils: the one FProp context and its randomness."""

import dataclasses
import threading

import numpy as np
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import pipeline
from tensorpipe import py_utils
from tensorpipe import test_utils
from tensorpipe import timeline
from tensorpipe.layers import composite
from tensorpipe.layers import dropout
from tensorpipe.layers import linear

test_utils.ConfigureTestDevices()


class _ProgressScale(base_layer.BaseLayer):
  """y = x * (1 + drop-path progress): its gradient shows the progress seen."""

  def FProp(self, theta, x):
    del theta  # no weights
    return x * (1.0 + tf.cast(py_utils.CurrentDropPathProgress(), x.dtype))


def _Fc(name, dim=6):
  return linear.FCLayer.Params().Set(name=name, input_dim=dim,
                                     output_dim=dim, dtype=tf.float64)


def _Drop(name, keep_prob=0.5):
  return dropout.DropoutLayer.Params().Set(name=name, keep_prob=keep_prob,
                                           dtype=tf.float64)


class _FakeBatchNorm:
  """Stands in for a batch-norm layer: records UpdateMovingStats calls."""

  def __init__(self):
    self.updates = []

  def UpdateMovingStats(self, stats):
    self.updates.append(stats)


class ContextTest(tf.test.TestCase):

  def testDefaults(self):
    ctx = py_utils.Current()
    self.assertTrue(py_utils.IsTraining())
    self.assertEqual(ctx.step_seed, 0)
    self.assertEqual(ctx.example_offset, 0)
    self.assertEqual(ctx.batch_axis, 0)
    self.assertEqual(ctx.drop_path_progress, 1.0)
    self.assertIsNone(ctx.stats_collector)
    self.assertIsNone(ctx.timeline_recorder)

  def testBlocksNestAndExitRestoresTheOuterContext(self):
    with py_utils.StepSeed(3), py_utils.BatchAxis(1):
      with py_utils.EvalMode(), py_utils.DropPathProgress(0.5):
        inner = py_utils.Current()
      outer = py_utils.Current()
    self.assertEqual((inner.training, inner.step_seed, inner.batch_axis,
                      inner.drop_path_progress), (False, 3, 1, 0.5))
    self.assertEqual((outer.training, outer.step_seed, outer.batch_axis,
                      outer.drop_path_progress), (None, 3, 1, 1.0))
    self.assertEqual(py_utils.Current().step_seed, 0)

  def testCapturedContextOutlivesItsBlockAndIsImmutable(self):
    with py_utils.StepSeed(3):
      ctx = py_utils.CaptureContext()
    self.assertEqual(ctx.step_seed, 3)
    self.assertEqual(py_utils.Current().step_seed, 0)
    with self.assertRaises(dataclasses.FrozenInstanceError):
      ctx.step_seed = 4  # pytype: disable=not-writable

  def testExampleOffsetsCompose(self):
    with py_utils.ExampleOffset(8):
      with py_utils.ExampleOffset(2):
        self.assertEqual(py_utils.Current().example_offset, 10)
      with py_utils.ExampleOffset(tf.constant(3)):
        self.assertEqual(int(py_utils.Current().example_offset), 11)
      self.assertEqual(py_utils.Current().example_offset, 8)
    # Adding 0 builds no op: the offset keeps its type.
    offset = tf.constant(5)
    with py_utils.ExampleOffset(offset):
      self.assertIs(py_utils.Current().example_offset, offset)

  def testBadValuesRaise(self):
    cases = [
        (lambda: py_utils.ExampleOffset(1.5), TypeError, 'offset.*1.5'),
        (lambda: py_utils.ExampleOffset(-1), ValueError, r'offset=-1'),
        (lambda: py_utils.ExampleOffset(tf.constant(1.0)), TypeError,
         'integer tensor.*float32'),
        (lambda: py_utils.BatchAxis(-1), ValueError, 'batch axis -1'),
        (lambda: py_utils.DropPathProgress(1.5), ValueError,
         r'progress=1\.5.*\[0, 1\]'),
        (lambda: py_utils.DropPathProgress('half'), TypeError, "'half'"),
        (lambda: py_utils.DropPathProgress(tf.Variable(0.5)), TypeError,
         'read_value'),
        (lambda: py_utils.EnterContext('ctx'), TypeError, 'CaptureContext'),
        (lambda: py_utils.WithContext(None, len), TypeError,
         'CaptureContext'),
        (lambda: py_utils.ReplicaExampleOffset(0), ValueError,
         'per_replica_batch_size=0'),
    ]
    for fn, error, pattern in cases:
      with self.subTest(pattern=pattern):
        with self.assertRaisesRegex(error, pattern):
          with fn():
            pass

  def testRestoreContextRestoresAllButTheStatsCollector(self):
    layer = _FakeBatchNorm()
    with py_utils.EvalMode(), py_utils.StepSeed(5), \
        py_utils.ExampleOffset(4), py_utils.BatchAxis(1), \
        py_utils.DropPathProgress(0.25), timeline.Record() as rec, \
        py_utils.CollectBatchStats() as forward_stats:
      forward_ctx = py_utils.Current()
    with py_utils.RestoreContext(forward_ctx):
      ctx = py_utils.Current()
      self.assertEqual(
          (ctx.training, ctx.step_seed, ctx.example_offset, ctx.batch_axis,
           ctx.drop_path_progress), (False, 5, 4, 1, 0.25))
      self.assertIs(ctx.timeline_recorder, rec)
      self.assertIs(timeline.Active(), rec)
      # Recomputed statistics go neither to the forward's collector nor to
      # the layer's moving averages (they were reported once already).
      self.assertIsNot(ctx.stats_collector, forward_stats)
      py_utils.AddBatchStats(layer, 'recomputed stats')
    self.assertEqual(forward_stats, [])
    self.assertEqual(layer.updates, [])
    self.assertIsNone(timeline.Active())


class StatelessUniformTest(tf.test.TestCase):

  def testBatchAxisDrawsEachExamplesNumbersInBatchMajorOrder(self):
    seed = py_utils.LayerSeed('layer', 0)
    with py_utils.StepSeed(7):
      batch_major = py_utils.StatelessUniform([8, 3, 5], seed)
      with py_utils.BatchAxis(1):
        axis1 = py_utils.StatelessUniform([3, 8, 5], seed)
      axis2 = py_utils.StatelessUniform([3, 5, 8], seed, batch_axis=2)
    self.assertAllEqual(axis1, tf.transpose(batch_major, [1, 0, 2]))
    self.assertAllEqual(axis2, tf.transpose(batch_major, [1, 2, 0]))

  def testMicroBatchOnAxis1GetsItsExamplesOfTheWholeBatch(self):
    seed = py_utils.LayerSeed('layer', 0)
    with py_utils.StepSeed(7), py_utils.BatchAxis(1):
      whole = py_utils.StatelessUniform([3, 8, 5], seed)
      with py_utils.ExampleOffset(4):
        part = py_utils.StatelessUniform([3, 4, 5], seed)
      with py_utils.ExampleOffset(3):
        one = py_utils.StatelessUniform([3, 1, 5], seed)
    self.assertAllEqual(whole[:, 4:], part)
    self.assertAllEqual(whole[:, 3:4], one)
    self.assertNotAllEqual(whole[:, :4], part)

  def testPerExampleShapeFollowsTheBatchAxis(self):
    self.assertEqual(py_utils.PerExampleShape([8, 4, 4, 16]), [8, 1, 1, 1])
    with py_utils.BatchAxis(1):
      self.assertEqual(py_utils.PerExampleShape([2, 8, 3]), [1, 8, 1])

  def testBatchAxisOutOfRangeRaises(self):
    with py_utils.BatchAxis(2):
      with self.assertRaisesRegex(ValueError, r'batch axis 2.*\[4, 5\]'):
        py_utils.StatelessUniform([4, 5], 1)
      with self.assertRaisesRegex(ValueError, r'batch axis 2.*\[4, 5\]'):
        py_utils.PerExampleShape([4, 5])


def _CopyWeights(src, dst):
  """Gives `dst` the values of `src`'s variables, matched by layer path."""
  src_vars = test_utils.VariablesByName(src)
  for name, var in test_utils.VariablesByName(dst).items():
    var.assign(src_vars[name])


class RecomputeContextTest(tf.test.TestCase):

  def _Pipeline(self, **kwargs):
    return pipeline.TensorPipeLayer.Params().Set(
        name='pipe', partitions=[
            [_Fc('fc0'), _ProgressScale.Params().Set(name='scale',
                                                     dtype=tf.float64)],
            [_Fc('fc1')]], num_micro_batches=2, **kwargs).Instantiate()

  def _Grads(self, layer, progress):
    """Gradients taken OUTSIDE the forward's DropPathProgress block, as the
    trainer does."""
    variables = layer.trainable_variables

    @tf.function(autograph=False)
    def Step(x):
      with tf.GradientTape() as tape:
        with py_utils.DropPathProgress(tf.constant(progress)):
          loss = tf.reduce_sum(tf.square(layer.FPropDefaultTheta(x)))
      return tape.gradient(loss, variables)
    x = tf.random.stateless_normal([4, 6], [1, 2], dtype=tf.float64)
    return test_utils.VariablesByName(layer), dict(
        zip([v.ref() for v in variables], Step(x)))

  def testRecomputeSeesTheForwardsDropPathProgress(self):
    plain = self._Pipeline(recompute=False)
    ref_vars, ref = self._Grads(plain, 0.25)
    for impl in ('explicit', 'tf_recompute_grad'):
      with self.subTest(impl=impl):
        layer = self._Pipeline(recompute=True, recompute_impl=impl)
        _CopyWeights(plain, layer)
        got_vars, got = self._Grads(layer, 0.25)
        for name, var in ref_vars.items():
          # Same ops in the same order up to the sum over micro-batches.
          self.assertAllClose(got[got_vars[name].ref()], ref[var.ref()],
                              rtol=1e-12, atol=1e-12, msg=name)
    # The progress matters: at 1.0 the gradient of fc0 differs.
    _, full = self._Grads(plain, 1.0)
    w = ref_vars['fc0/w'].ref()
    self.assertNotAllClose(full[w], ref[w])


class ThreadTest(tf.test.TestCase):

  def testContextReachesAnotherThreadOnlyThroughWithContext(self):
    seen = {}

    def Read(key):
      seen[key] = (py_utils.IsTraining(), py_utils.Current().step_seed)

    with py_utils.EvalMode(), py_utils.StepSeed(7):
      ctx = py_utils.CaptureContext()
      for key, fn in (('plain', Read),
                      ('carried', py_utils.WithContext(ctx, Read))):
        thread = threading.Thread(target=fn, args=(key,))
        thread.start()
        thread.join()
    self.assertEqual(seen['plain'], (True, 0))  # the hazard: defaults
    self.assertEqual(seen['carried'], (False, 7))

  def _Strategy(self):
    return tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])

  def testMirroredStrategyReplicasSeeTheContextOnlyThroughWithContext(self):
    strategy = self._Strategy()

    def Replica():
      return tf.stack([tf.constant(float(py_utils.IsTraining())),
                       tf.cast(py_utils.Current().step_seed, tf.float32)])

    def Run(fn):
      with py_utils.EvalMode(), py_utils.StepSeed(tf.constant(7)):
        plain = strategy.run(fn)
        carried = strategy.run(
            py_utils.WithContext(py_utils.CaptureContext(), fn))
      return plain, carried

    for mode, run in (('eager', Run),
                      ('tf.function', tf.function(Run, autograph=False))):
      with self.subTest(mode=mode):
        plain, carried = run(Replica)
        for value in strategy.experimental_local_results(plain):
          # Replica threads start with the default context: training mode,
          # step seed 0, although the caller set EvalMode and StepSeed(7).
          self.assertAllEqual(value, [1.0, 0.0])
        for value in strategy.experimental_local_results(carried):
          self.assertAllEqual(value, [0.0, 7.0])

  def testReplicaExampleOffsetGivesEachReplicaItsRowsOfTheGlobalMask(self):
    strategy = self._Strategy()
    layer = _Drop('drop').Instantiate()
    n = 4
    with py_utils.StepSeed(3):
      global_mask = layer.FPropDefaultTheta(tf.ones([2 * n, 6], tf.float64))

    def Replica(offset):
      if offset:
        with py_utils.ReplicaExampleOffset(n):
          return layer.FPropDefaultTheta(tf.ones([n, 6], tf.float64))
      return layer.FPropDefaultTheta(tf.ones([n, 6], tf.float64))

    @tf.function(autograph=False)
    def Run(offset):
      with py_utils.StepSeed(3):
        ctx = py_utils.CaptureContext()
      return strategy.run(py_utils.WithContext(ctx, Replica), args=(offset,))

    masks = strategy.experimental_local_results(Run(True))
    for r, mask in enumerate(masks):
      self.assertAllEqual(mask, global_mask[r * n:(r + 1) * n], msg=r)
    # Without it every replica draws replica 0's rows.
    for mask in strategy.experimental_local_results(Run(False)):
      self.assertAllEqual(mask, global_mask[:n])

  def testPipelineMicroBatchOffsetsAddToTheEnclosingOffset(self):
    layers = [_Drop('drop0'), _Drop('drop1', 0.75)]
    pipe = pipeline.TensorPipeLayer.Params().Set(
        name='pipe', partitions=[[layers[0]], [layers[1]]],
        num_micro_batches=2).Instantiate()
    plain = composite.SequentialLayer.Params().Set(
        name='plain', sub=layers).Instantiate()
    x = tf.random.stateless_normal([16, 6], [3, 4], dtype=tf.float64)
    with py_utils.StepSeed(2):
      whole = plain.FPropDefaultTheta(x)
      # A replica holding examples 8..15 of the global batch.
      with py_utils.ExampleOffset(8):
        shard = tf.function(pipe.FPropDefaultTheta, autograph=False)(x[8:])
    self.assertAllEqual(shard, whole[8:])


if __name__ == '__main__':
  tf.test.main()
