"""Tests of TensorPipeLayer: the paper's consistency test, transparency, errors."""

import re
from unittest import mock

import numpy as np
import tensorflow as tf
# Private: AutoGraphTest counts the functions AutoGraph converts.
from tensorflow.python.autograph.impl import api as autograph_api

import tensorpipe
from tensorpipe import base_layer
from tensorpipe import py_utils
from tensorpipe import schedule_builders
from tensorpipe import test_utils
from tensorpipe import timeline
from tensorpipe.layers import composite
from tensorpipe.layers import conv
from tensorpipe.layers import dropout
from tensorpipe.layers import linear
from tensorpipe.layers import normalization
from tensorpipe.nested_map import NestedMap

test_utils.ConfigureTestDevices()


def ConvStack(num_layers=16):
  """The paper's consistency model: 16 Conv2DLayers 3x3, 1 -> 1 channel."""
  return [conv.Conv2DLayer.Params().Set(
      name=f'conv{i}', filter_shape=(3, 3, 1, 1), filter_stride=(1, 1))
          for i in range(num_layers)]


def Pipe(layers=None, partitions=None, **kwargs):
  p = tensorpipe.TensorPipeLayer.Params().Set(name='TensorPipe', **kwargs)
  if partitions is not None:
    p.partitions = partitions
  else:
    p.layers = layers
  return p.Instantiate()


def Sequential(layers):
  return composite.SequentialLayer.Params().Set(
      name='Sequential', sub=layers).Instantiate()


def SplitEven(layers, k):
  n = len(layers) // k
  return [layers[i * n:(i + 1) * n] for i in range(k)]


def MeanLoss(out):
  return tf.reduce_mean(tf.nest.flatten(out)[0])


class SquareWeightLayer(base_layer.BaseLayer):
  """Base of the test layers below: a [dim, dim] weight `w`."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 4, 'Feature dimension.')
    return p

  def __init__(self, params):
    super().__init__(params)
    d = self.params.dim
    self.CreateVariable('w', base_layer.WeightParams([d, d]))


class TwoOutputsLayer(SquareWeightLayer):
  """x -> (relu(x @ w), x): two tensors cross the next boundary."""

  def FProp(self, theta, x):
    return tf.nn.relu(tf.matmul(x, theta.w)), x

  @classmethod
  def FPropMeta(cls, p, x):
    return base_layer.FPropMetaResult(2 * x.num_elements() * p.dim, (x, x),
                                      p.dim * p.dim)


class CombineLayer(base_layer.BaseLayer):
  """(a, b) -> NestedMap(x=a * v + b, ids=int ids): a NestedMap output."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 4, 'Feature dimension.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateVariable('v', base_layer.WeightParams([self.params.dim]))

  def FProp(self, theta, a, b):
    ids = tf.cast(tf.reduce_sum(tf.ones_like(a), axis=-1), tf.int32)
    return NestedMap(x=a * theta.v + b, ids=ids)

  @classmethod
  def FPropMeta(cls, p, a, b):
    ids = a[:-1]
    return base_layer.FPropMetaResult(
        2 * a.num_elements(), (NestedMap(x=a, ids=ids),), p.dim)


class UseNestedLayer(SquareWeightLayer):
  """NestedMap(x, ids) -> x * w + ids (an int tensor crossed a boundary)."""

  def FProp(self, theta, nm):
    return tf.matmul(nm.x, theta.w) + tf.cast(nm.ids, nm.x.dtype)[:, None]

  @classmethod
  def FPropMeta(cls, p, nm):
    return base_layer.FPropMetaResult(
        2 * nm.x.num_elements() * p.dim, nm.x, p.dim * p.dim)


def MixedModel():
  """Conv+BN, a residual ParallelLayer, dropout, pooling and a classifier."""
  c = conv.Conv2DLayer.Params
  residual = composite.ParallelLayer.Params().Set(
      name='res', merge='sum', activation='RELU', sub=[
          composite.IdentityLayer.Params().Set(name='skip'),
          composite.SequentialLayer.Params().Set(name='block', sub=[
              c().Set(name='rc1', filter_shape=(3, 3, 4, 4), batch_norm=True),
              c().Set(name='rc2', filter_shape=(3, 3, 4, 4), batch_norm=True,
                      activation='NONE')])])
  return [
      c().Set(name='stem', filter_shape=(3, 3, 2, 4), batch_norm=True),
      residual,
      dropout.DropoutLayer.Params().Set(name='drop1', keep_prob=0.7),
      c().Set(name='conv2', filter_shape=(3, 3, 4, 4), filter_stride=(2, 2),
              bias=True),
      linear.FlattenLayer.Params().Set(name='flat'),
      dropout.DropoutLayer.Params().Set(name='drop2', keep_prob=0.8),
      linear.FCLayer.Params().Set(name='fc', input_dim=64, output_dim=5,
                                  activation='NONE'),
  ]


class ConsistencyTest(tf.test.TestCase):
  """The paper's unit test (supplement figure 1), ported to TF2."""

  def _GradNorm(self, layer, x):
    _, loss, grads = test_utils.LossAndGrads(layer, MeanLoss, x)
    self.assertLen(grads, 16)
    return float(loss), test_utils.GlobalNorm(grads)

  def testGradNormEqualForOneTwoFourPartitions(self):
    x = tf.random.uniform([16, 8, 8, 1], seed=12345)
    ref_loss, ref_norm = self._GradNorm(Sequential(ConvStack()), x)
    self.assertGreater(ref_norm, 0.0)
    results = {}
    for k in (1, 2, 4):
      results[f'manual K={k}'] = self._GradNorm(
          Pipe(partitions=SplitEven(ConvStack(), k), num_micro_batches=8), x)
      results[f'auto K={k}'] = self._GradNorm(
          Pipe(layers=ConvStack(), num_partitions=k, num_micro_batches=8,
               input_shapes=[[16, 8, 8, 1]]), x)
    for key, (loss, norm) in results.items():
      self.assertAllClose(norm, ref_norm, rtol=1e-6, atol=0, msg=key)
      self.assertAllClose(loss, ref_loss, rtol=1e-6, atol=0, msg=key)

  def testAutomaticPartitioningBalancesEqualLayers(self):
    layer = Pipe(layers=ConvStack(), num_partitions=4, num_micro_batches=8,
                 input_shapes=[[16, 8, 8, 1]])
    self.assertEqual([len(p) for p in layer.PartitionLayers()], [4, 4, 4, 4])
    self.assertAllClose(layer.partition_plan.imbalance, 1.0)
    # Manual partitions and K=1 have no plan.
    self.assertIsNone(Pipe(partitions=SplitEven(ConvStack(4), 2))
                      .partition_plan)
    self.assertIsNone(Pipe(layers=ConvStack(4)).partition_plan)


class TransparencyTest(tf.test.TestCase):
  """Pipelined == unpipelined: outputs, loss and every gradient."""

  def _Compare(self, layer_ps, k, t, x, **kw):
    return test_utils.AssertPipelineMatchesOracle(
        self, layer_ps, k, t, [x], MeanLoss, **kw)

  def testMixedModelMatchesUnpipelinedForSeveralKAndT(self):
    x = tf.random.stateless_normal([8, 8, 8, 2], seed=[1, 2])
    for k, t in [(1, 1), (2, 4), (3, 2), (4, 8)]:
      with self.subTest(k=k, t=t):
        self._Compare(MixedModel(), k, t, x)

  def testWithoutRecomputeMatches(self):
    x = tf.random.stateless_normal([8, 8, 8, 2], seed=[3, 4])
    self._Compare(MixedModel(), 3, 4, x, recompute=False)

  def testTfRecomputeGradImplMatches(self):
    x = tf.random.stateless_normal([8, 8, 8, 2], seed=[3, 4])
    self._Compare(MixedModel(), 2, 4, x, recompute_impl='tf_recompute_grad')

  def testMultiTensorActivationsCrossBoundaries(self):
    layer_ps = [
        linear.FCLayer.Params().Set(name='fc0', input_dim=3, output_dim=4),
        TwoOutputsLayer.Params().Set(name='two'),
        CombineLayer.Params().Set(name='combine'),
        UseNestedLayer.Params().Set(name='use'),
    ]
    x = tf.random.stateless_normal([12, 3], seed=[5, 6])
    for k, t in [(4, 3), (2, 6), (4, 1)]:
      with self.subTest(k=k, t=t):
        self._Compare(layer_ps, k, t, x)

  def testDropoutIndependentOfMicroBatches(self):
    """Per-example masks: without batch norm, T does not change anything."""
    layer_ps = [
        linear.FCLayer.Params().Set(name='fc0', input_dim=6, output_dim=6),
        dropout.DropoutLayer.Params().Set(name='drop', keep_prob=0.5),
        linear.FCLayer.Params().Set(name='fc1', input_dim=6, output_dim=6),
    ]
    x = tf.random.stateless_normal([8, 6], seed=[7, 8])
    whole = Sequential(layer_ps)
    ref_out, ref_loss, _ = test_utils.LossAndGrads(whole, MeanLoss, x)
    for t in (1, 2, 8):
      out, loss, _ = test_utils.LossAndGrads(
          Pipe(layers=layer_ps, num_partitions=3, num_micro_batches=t,
               input_shapes=[[8, 6]]), MeanLoss, x)
      self.assertAllClose(out, ref_out, rtol=1e-6)
      self.assertAllClose(loss, ref_loss, rtol=1e-6)

  def testDropoutMasksChangeWithStepSeed(self):
    layer = Pipe(layers=[dropout.DropoutLayer.Params().Set(
        name='drop', keep_prob=0.5)], num_micro_batches=2)
    x = tf.ones([4, 16])
    with py_utils.StepSeed(1):
      a = layer.FPropDefaultTheta(x)
    with py_utils.StepSeed(2):
      b = layer.FPropDefaultTheta(x)
    self.assertNotAllClose(a, b)

  def testGradientTakenOutsideStepSeedBlockUsesForwardMasks(self):
    layer_ps = [
        linear.FCLayer.Params().Set(name='fc0', input_dim=6, output_dim=6),
        dropout.DropoutLayer.Params().Set(name='drop', keep_prob=0.5),
        linear.FCLayer.Params().Set(name='fc1', input_dim=6, output_dim=6),
    ]
    x = tf.random.stateless_normal([8, 6], seed=[7, 9])
    for impl in ('explicit', 'tf_recompute_grad'):
      with self.subTest(impl=impl):
        pipe = Pipe(layers=layer_ps, num_partitions=2, num_micro_batches=4,
                    input_shapes=[[8, 6]], recompute_impl=impl)
        ref = Sequential(layer_ps)
        grads = []
        for layer in (pipe, ref):
          with tf.GradientTape() as tape:
            with py_utils.StepSeed(7):
              loss = MeanLoss(layer.FPropDefaultTheta(x))
          grads.append(tape.gradient(loss, layer.trainable_variables))
        for a, b in zip(*grads):
          self.assertAllClose(a, b, rtol=1e-5, atol=1e-7)

  def testEvalModeUsesMovingStatsAndMatchesSequential(self):
    x = tf.random.stateless_normal([8, 8, 8, 2], seed=[9, 9])
    pipe = Pipe(layers=MixedModel(), num_partitions=2, num_micro_batches=4,
                input_shapes=[[8, 8, 8, 2]])
    ref = Sequential(MixedModel())
    with py_utils.EvalMode():
      self.assertAllClose(pipe.FPropDefaultTheta(x), ref.FPropDefaultTheta(x),
                          rtol=1e-5, atol=1e-6)

  def testBfloat16Activations(self):
    layer_ps = [linear.FCLayer.Params().Set(name=f'fc{i}', input_dim=8,
                                            output_dim=8) for i in range(4)]
    pipe = Pipe(layers=layer_ps, num_partitions=2, num_micro_batches=2,
                input_shapes=[[4, 8]], fprop_dtype=tf.bfloat16)
    x = tf.random.stateless_normal([4, 8], seed=[1, 1])
    out, loss, grads = test_utils.LossAndGrads(pipe, MeanLoss, x)
    self.assertEqual(out.dtype, tf.bfloat16)
    self.assertTrue(all(v.dtype == tf.float32
                        for v in pipe.trainable_variables))
    ref = Sequential(layer_ps)
    ref_out = ref.FPropDefaultTheta(x)
    self.assertAllClose(tf.cast(out, tf.float32), ref_out, rtol=0.05,
                        atol=0.05)
    self.assertTrue(all(g is not None for g in grads))


class BatchNormStatsTest(tf.test.TestCase):

  def testInputShapesMayBeADictOfLists(self):
    layer = Pipe(layers=[UseNestedLayer.Params().Set(name='use')],
                 input_shapes=[dict(x=[4, 4], ids=[4])])
    self.assertEqual(layer.num_partitions, 1)

  def testMovingStatsAfterStepEqualWholeMiniBatchStats(self):
    bn_p = normalization.BatchNormLayer.Params().Set(
        name='bn', dim=3, decay=0.9)
    layer_ps = [linear.FCLayer.Params().Set(name='fc', input_dim=3,
                                            output_dim=3, activation='NONE'),
                bn_p]
    pipe = Pipe(layers=layer_ps, num_partitions=2, num_micro_batches=4,
                input_shapes=[[16, 3]])
    x = tf.random.stateless_normal([16, 3], seed=[4, 2]) * 3.0 + 1.0
    test_utils.LossAndGrads(pipe, MeanLoss, x)
    fc, bn = pipe.PartitionLayers()[0][0], pipe.PartitionLayers()[1][0]
    h = (x.numpy() @ fc.vars.w.numpy() + fc.vars.b.numpy()).astype(np.float64)
    self.assertAllClose(bn.vars.moving_mean, 0.1 * h.mean(axis=0), rtol=1e-5)
    self.assertAllClose(bn.vars.moving_variance,
                        0.9 + 0.1 * h.var(axis=0), rtol=1e-5)

  def testMovingStatsEqualTheMicroBatchOracleUnderEveryRecomputeImpl(self):
    """Both partitions normalise (two batch norms); a step updates each
    moving average once, from the statistics of the T micro-batches, as
    the unpipelined layers give them run on each micro-batch and merged
    (count, sum and sum of squares add). With recompute_impl=
    'tf_recompute_grad' bubble ticks run a stage on a clamped micro-batch
    and must add nothing (schedule_engine: masked bubbles); float64, so
    only the order of the sums differs."""
    decay = 0.9
    fc = linear.FCLayer.Params
    bn = normalization.BatchNormLayer.Params
    layer_ps = [fc().Set(name='fc0', input_dim=3, output_dim=4,
                         activation='NONE'),
                bn().Set(name='bn0', dim=4, decay=decay),
                fc().Set(name='fc1', input_dim=4, output_dim=3),
                bn().Set(name='bn1', dim=3, decay=decay)]
    layer_ps = [lp.Copy().Set(dtype=tf.float64) for lp in layer_ps]
    t, size = 4, 4
    x = tf.random.stateless_normal([t * size, 3], seed=[4, 2],
                                   dtype=tf.float64) * 3.0 + 1.0
    ref = Sequential(layer_ps)
    # The oracle: each micro-batch through the unpipelined layers.
    merged = {}
    with py_utils.TrainingMode(True), py_utils.CollectBatchStats() as got:
      for m in range(t):
        ref.FPropDefaultTheta(x[m * size:(m + 1) * size])
    for layer, stats in got:
      name = layer.params.name
      merged[name] = stats.Merge(merged[name]) if name in merged else stats
    self.assertEqual(sorted(merged), ['bn0', 'bn1'])
    want = {}
    for name, stats in merged.items():
      mean, var = (v.numpy() for v in stats.MeanAndVariance())
      want[name] = ((1 - decay) * mean, decay + (1 - decay) * var)
    for impl in ('explicit', 'tf_recompute_grad'):
      with self.subTest(recompute_impl=impl):
        pipe = Pipe(layers=layer_ps, num_partitions=2, num_micro_batches=t,
                    input_shapes=[[t * size, 3]], recompute_impl=impl)
        self.assertEqual([[layer.params.name for layer in part]
                          for part in pipe.PartitionLayers()],
                         [['fc0', 'bn0'], ['fc1', 'bn1']])
        ref_vars = test_utils.VariablesByName(ref)
        for name, var in test_utils.VariablesByName(pipe).items():
          var.assign(ref_vars[name])
        with py_utils.TrainingMode(True):
          test_utils.LossAndGrads(pipe, MeanLoss, x)
        for layer in (pipe.PartitionLayers()[0][1],
                      pipe.PartitionLayers()[1][1]):
          mean, var = want[layer.params.name]
          test_utils.AssertAllCloseScaled(
              self, layer.vars.moving_mean, mean, 1e-12,
              msg=f'{impl}: {layer.params.name} moving_mean')
          test_utils.AssertAllCloseScaled(
              self, layer.vars.moving_variance, var, 1e-12,
              msg=f'{impl}: {layer.params.name} moving_variance')

  def testEvalDoesNotUpdateMovingStats(self):
    pipe = Pipe(layers=[normalization.BatchNormLayer.Params().Set(
        name='bn', dim=2)], num_micro_batches=2)
    with py_utils.EvalMode():
      pipe.FPropDefaultTheta(tf.ones([4, 2]) * 5.0)
    bn = pipe.PartitionLayers()[0][0]
    self.assertAllEqual(bn.vars.moving_mean, [0.0, 0.0])


class StaticLeafLayer(SquareWeightLayer):
  """NestedMap(x, n=None, k=int) -> the same with x = (x @ w) * k."""

  def FProp(self, theta, nm):
    assert nm.n is None, nm.n
    return NestedMap(x=tf.matmul(nm.x, theta.w) * nm.k, n=nm.n, k=nm.k)

  @classmethod
  def FPropMeta(cls, p, nm):
    return base_layer.FPropMetaResult(
        2 * nm.x.num_elements() * p.dim, NestedMap(x=nm.x, n=nm.n, k=nm.k),
        p.dim * p.dim)


class MicroBatchKnobsTest(tf.test.TestCase):

  def testMicroBatchSizeAloneSetsT(self):
    # Batch norm on [N, C] normalises each micro-batch on its own, so the
    # output shows which examples were grouped: micro_batch_size=4 with
    # batch 16 must give T=4 groups of 4 consecutive examples.
    bn = normalization.BatchNormLayer.Params().Set(name='bn', dim=3)
    fc = linear.FCLayer.Params().Set(name='fc', input_dim=3, output_dim=3,
                                     activation='NONE')
    pipe = Pipe(partitions=[[fc], [bn]], micro_batch_size=4)
    self.assertIsNone(pipe.params.num_micro_batches)
    x = tf.random.stateless_normal([16, 3], seed=[3, 1], dtype=tf.float32)
    with py_utils.TrainingMode(True):
      out = pipe.FPropDefaultTheta(x).numpy()
    layer = pipe.PartitionLayers()[0][0]
    h = (x.numpy().astype(np.float64) @ layer.vars.w.numpy() +
         layer.vars.b.numpy()).reshape(4, 4, 3)
    expected = (h - h.mean(1, keepdims=True)) / np.sqrt(
        h.var(1, keepdims=True) + 1e-3)
    self.assertAllClose(expected.reshape(16, 3), out, rtol=1e-4, atol=1e-4)

  def testNeitherKnobMeansOneMicroBatch(self):
    pipe = Pipe(partitions=SplitEven(ConvStack(2), 2))
    self.assertIsNone(pipe.params.num_micro_batches)
    x = tf.random.stateless_normal([3, 8, 8, 1], seed=[1, 2])
    self.assertAllClose(Sequential(ConvStack(2)).FPropDefaultTheta(x),
                        pipe.FPropDefaultTheta(x), rtol=1e-5, atol=1e-6)


class StaticLeavesTest(tf.test.TestCase):
  """None / int leaves of a NestedMap input pass through, as in microbatch."""

  def testStaticLeavesPassThroughAndGradientsMatch(self):
    # float64: the pipeline sums gradients over micro-batches in another
    # order than the oracle; only rounding may differ.
    layer_ps = [StaticLeafLayer.Params().Set(name=f's{i}', dtype=tf.float64)
                for i in range(2)]
    ref = Sequential(layer_ps)
    x = tf.random.stateless_normal([8, 4], seed=[5, 5], dtype=tf.float64)

    def LossAndGrads(layer):
      variables = test_utils.VariablesByName(layer)
      with tf.GradientTape() as tape, py_utils.TrainingMode(True):
        out = layer.FPropDefaultTheta(NestedMap(x=x, n=None, k=3))
        loss = tf.reduce_sum(tf.square(out.x))
      grads = tape.gradient(loss, list(variables.values()))
      return out, dict(zip(variables, grads))
    ref_out, ref_grads = LossAndGrads(ref)
    self.assertLen(ref_grads, 2)
    for parts, t in (([layer_ps], 1), ([layer_ps], 4),
                     ([layer_ps[:1], layer_ps[1:]], 1),
                     ([layer_ps[:1], layer_ps[1:]], 2)):
      with self.subTest(k=len(parts), t=t):
        pipe = Pipe(partitions=parts, num_micro_batches=t)
        out, grads = LossAndGrads(pipe)
        self.assertIsNone(out.n)
        self.assertEqual(out.k, 3)
        self.assertAllClose(ref_out.x, out.x, rtol=1e-12, atol=0)
        self.assertCountEqual(ref_grads, grads)
        for name, g in ref_grads.items():
          self.assertAllClose(g, grads[name], rtol=1e-12,
                              atol=1e-12 * float(tf.reduce_max(tf.abs(g))))


class PlacementTest(tf.test.TestCase):

  def testVariablesAndOpsOnTheirPartitionsDevice(self):
    layer = Pipe(partitions=SplitEven(ConvStack(8), 4), num_micro_batches=4)
    for k, layers in enumerate(layer.PartitionLayers()):
      for l in layers:
        for v in l.vars.values():
          self.assertTrue(v.device.endswith(f'CPU:{k}'), (v.name, v.device))

    @tf.function
    def Step(x):
      with tf.GradientTape() as tape:
        loss = MeanLoss(layer.FPropDefaultTheta(x))
      return tape.gradient(loss, layer.trainable_variables)
    graph = Step.get_concrete_function(
        tf.TensorSpec([8, 8, 8, 1])).graph
    checked = 0
    lib = graph.as_graph_def().library
    for fdef in lib.function:
      for node in fdef.node_def:
        m = re.search(r'(?:^|/)conv(\d)/', node.name)
        if m and node.device and node.op == 'Conv2D':
          k = int(m.group(1)) // 2
          self.assertTrue(node.device.endswith(f'CPU:{k}'),
                          (fdef.signature.name, node.name, node.device))
          checked += 1
    # Forward, recompute and both gradient convs of each of the 8 layers.
    self.assertGreaterEqual(checked, 8 * 2)

  def testGraphSizeDoesNotGrowWithMicroBatches(self):
    def NumNodes(t):
      layer = Pipe(partitions=SplitEven(ConvStack(4), 2),
                   num_micro_batches=t)

      @tf.function
      def Step(x):
        with tf.GradientTape() as tape:
          loss = MeanLoss(layer.FPropDefaultTheta(x))
        return tape.gradient(loss, layer.trainable_variables)
      gdef = Step.get_concrete_function(tf.TensorSpec([16, 8, 8, 1])).graph
      gdef = gdef.as_graph_def()
      return len(gdef.node) + sum(len(f.node_def) for f in gdef.library.function)
    # K=2: T=2 has one busy tick, fewer than unroll_ticks=2, so no busy
    # loop (it joins the ramp-up loop); from T=3 on the loops are the same.
    self.assertEqual(NumNodes(4), NumNodes(8))
    self.assertEqual(NumNodes(4), NumNodes(16))
    self.assertLess(NumNodes(2), NumNodes(8))


class StrategyTest(tf.test.TestCase):

  def testOneDeviceStrategyMatchesDefault(self):
    x = tf.random.stateless_normal([8, 8, 8, 1], seed=[1, 3])
    _, loss, grads = test_utils.LossAndGrads(
        Pipe(partitions=SplitEven(ConvStack(4), 2), num_micro_batches=4),
        MeanLoss, x)
    strategy = tf.distribute.OneDeviceStrategy('/CPU:0')
    with strategy.scope():
      layer = Pipe(partitions=SplitEven(ConvStack(4), 2), num_micro_batches=4)
      variables = layer.trainable_variables

      @tf.function
      def Step(x):
        def Fn(x):
          with tf.GradientTape() as tape:
            l = MeanLoss(layer.FPropDefaultTheta(x))
          return l, tape.gradient(l, variables)
        return strategy.run(Fn, args=(x,))
      s_loss, s_grads = Step(x)
    self.assertAllClose(s_loss, loss, rtol=1e-6)
    for a, b in zip(s_grads, grads):
      self.assertAllClose(a, b, rtol=1e-5, atol=1e-7)


# (layer name, micro-batch in its data, tf.timestamp()) of every eager call.
_CALLS = []


class RecordMicroBatchLayer(base_layer.BaseLayer):
  """x -> x + 0 * w; run eagerly, it logs which micro-batch it was given.

  Example i of the test batch holds the value i, so the micro-batch a call
  processes is read from its data, not from the pipeline's index arithmetic.
  """

  def __init__(self, params):
    super().__init__(params)
    self.CreateVariable('w', base_layer.WeightParams([1]))

  def FProp(self, theta, x):
    if tf.executing_eagerly():
      _CALLS.append((self.params.name, int(x[0, 0]) // int(x.shape[0]),
                     float(tf.timestamp())))
    return x + 0.0 * theta.w

  @classmethod
  def FPropMeta(cls, p, x):
    return base_layer.FPropMetaResult(x.num_elements(), x, 1)


class ScheduleTest(tf.test.TestCase):
  """The loops run the cells of the gpipe table, tick by tick."""

  def _CellsRun(self, k, t):
    """{(phase, tick, micro-batch seen, partition)} of an eager step."""
    del _CALLS[:]
    layer = Pipe(partitions=[[RecordMicroBatchLayer.Params().Set(
        name=f'rec{i}')] for i in range(k)], num_micro_batches=t)
    x = tf.reshape(tf.range(2 * t, dtype=tf.float32), [2 * t, 1])
    # Eagerly, tf.while_loop and tf.cond run their bodies as Python, so the
    # layer sees each cell's data; the timeline says on which tick (row of
    # the loop's log) each partition ran.
    with timeline.Record() as rec:
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer.FPropDefaultTheta(x))
      tape.gradient(loss, layer.trainable_variables)
    events = rec.Events(rec.Tensors())
    self.assertLen(_CALLS, 2 * k * t)  # forward + recompute of every cell
    cells = set()
    for name, seen, stamp in _CALLS:
      part = int(name[len('rec'):])
      runs = [ev for ev in events if ev.k == part and ev.phase != 'backward'
              and ev.start <= stamp <= ev.end]
      self.assertLen(runs, 1, (name, seen, runs))
      cells.add((runs[0].phase, runs[0].tick, seen, part))
    return cells

  def testLoopsRunTheGPipeTablesCells(self):
    for k, t in [(1, 3), (2, 1), (2, 4), (3, 2), (4, 5)]:
      with self.subTest(k=k, t=t):
        # The table's F ticks, then its B ticks (each pass's own tick).
        table = schedule_builders.Build('gpipe', k, t)
        span = table.num_ticks // 2
        want = {('forward' if c < span else 'recompute', c % span,
                 a.micro_batch, a.stage)
                for row in table.grid for c, a in enumerate(row) if a}
        self.assertEqual(self._CellsRun(k, t), want)


class CheckpointTest(tf.test.TestCase):

  def testCheckpointRestoresUnderDifferentPartitionCount(self):
    two = Pipe(layers=ConvStack(8), num_partitions=2, num_micro_batches=2,
               input_shapes=[[4, 8, 8, 1]], random_seed=1)
    path = tf.train.Checkpoint(model=two).save(
        self.get_temp_dir() + '/ckpt')
    four = Pipe(layers=ConvStack(8), num_partitions=4, num_micro_batches=4,
                input_shapes=[[4, 8, 8, 1]], random_seed=2)
    self.assertNotAllClose(four.trainable_variables[0],
                           two.trainable_variables[0])
    tf.train.Checkpoint(model=four).restore(path).assert_consumed()
    a, b = test_utils.VariablesByName(two), test_utils.VariablesByName(four)
    self.assertEqual(sorted(a), sorted(b))
    for name in a:
      self.assertAllEqual(a[name], b[name])
    x = tf.random.stateless_uniform([4, 8, 8, 1], seed=[1, 1])
    self.assertAllClose(two.FPropDefaultTheta(x), four.FPropDefaultTheta(x))


class ErrorsTest(tf.test.TestCase):

  def testBatchNotDivisibleByMicroBatches(self):
    layer = Pipe(partitions=SplitEven(ConvStack(2), 2), num_micro_batches=8)
    with self.assertRaisesRegex(ValueError, r'30.*num_micro_batches=8'):
      layer.FPropDefaultTheta(tf.zeros([30, 8, 8, 1]))

  def testMorePartitionsThanLayers(self):
    with self.assertRaisesRegex(ValueError, r'num_partitions=5.*\(4\).*<= 4'):
      Pipe(layers=ConvStack(4), num_partitions=5, input_shapes=[[8, 8, 8, 1]])

  def testFewerDevicesThanPartitions(self):
    k = test_utils.NUM_TEST_DEVICES + 1
    with self.assertRaisesRegex(ValueError,
                                rf'{k} partitions need {k} devices.*'
                                rf'SetNumLogicalCpuDevices\({k}\)'):
      Pipe(partitions=[[p] for p in ConvStack(k)])

  def testEmptyPartition(self):
    with self.assertRaisesRegex(ValueError, 'partition 1 is empty'):
      Pipe(partitions=[ConvStack(2), []])

  def testUnknownParamsKey(self):
    with self.assertRaisesRegex(AttributeError, 'num_micro_batches'):
      tensorpipe.TensorPipeLayer.Params().Set(num_micro_batchs=4)

  def testWrongTypeForMicroBatchesFailsAtConstruction(self):
    with self.assertRaisesRegex(TypeError, r"num_micro_batches.*'4'.*str"):
      Pipe(partitions=[ConvStack(1)], num_micro_batches='4')
    with self.assertRaisesRegex(TypeError, r'micro_batch_size.*2\.0.*float'):
      Pipe(partitions=[ConvStack(1)], micro_batch_size=2.0)

  def testBothMicroBatchKnobsFailAtConstructionWithTheFix(self):
    with self.assertRaisesRegex(
        ValueError, r'num_micro_batches=8 and micro_batch_size=4; set '
        r'num_micro_batches=None to use micro_batch_size=4'):
      Pipe(partitions=[ConvStack(1)], num_micro_batches=8, micro_batch_size=4)

  def testNumPartitionsMustNotBeABool(self):
    for k in (True, False):
      with self.assertRaisesRegex(ValueError,
                                  rf'num_partitions={k} must be a positive '
                                  'int'):
        Pipe(layers=ConvStack(2), num_partitions=k, input_shapes=[[8, 8, 8, 1]])

  def testDuplicateLayerNamesNameBothPartitions(self):
    with self.assertRaisesRegex(
        ValueError, r"'TensorPipe': layer name 'conv0' is used in partition 0 "
        r'and in partition 1;.*unique.*rename'):
      Pipe(partitions=[ConvStack(2), ConvStack(2)])
    with self.assertRaisesRegex(ValueError, r"'conv0' is used in partition 0 "
                                r'and in partition 1'):
      Pipe(layers=ConvStack(2) + ConvStack(2), num_partitions=2,
           input_shapes=[[8, 8, 8, 1]])
    with self.assertRaisesRegex(ValueError,
                                r"'conv1' is used twice in partition 0"):
      Pipe(partitions=[ConvStack(2) + ConvStack(2)[1:]])

  def testNonexistentDeviceFailsNamingItAndTheDevices(self):
    with self.assertRaisesRegex(
        ValueError, r"device '/CPU:9' does not exist.*'/device:CPU:7'.*"
        r'SetNumLogicalCpuDevices'):
      Pipe(partitions=SplitEven(ConvStack(2), 2), devices=['/CPU:0', '/CPU:9'])

  def testShapesThatDoNotChain(self):
    bad = ConvStack(2) + [conv.Conv2DLayer.Params().Set(
        name='wide', filter_shape=(3, 3, 4, 4))]
    with self.assertRaisesRegex(ValueError, r"layer 2 .*'wide'.*4"):
      Pipe(partitions=[bad[:2], bad[2:]], input_shapes=[[8, 8, 8, 1]])
    layer = Pipe(partitions=[bad[:2], bad[2:]])
    with self.assertRaisesRegex(ValueError, r"layer 2 .*'wide'"):
      layer.FPropDefaultTheta(tf.zeros([8, 8, 8, 1]))

  def testAutomaticPartitioningNeedsInputShapes(self):
    with self.assertRaisesRegex(ValueError, 'input_shapes'):
      Pipe(layers=ConvStack(4), num_partitions=2)



class LayersWithThetaTest(tf.test.TestCase):

  def testListsEveryPartitionsLayersInOrderAndChainsToFProp(self):
    layers = ConvStack(5)
    pipe = Pipe(partitions=[layers[:2], layers[2:]], num_micro_batches=2)
    pairs = pipe.LayersWithTheta()
    self.assertEqual([layer.layer_name for layer, _ in pairs],
                     [p.name for p in layers])
    for layer, theta in pairs:
      self.assertIs(theta.w, layer.vars.w)
    # Chained without the pipeline they compute what FProp does.
    x = tf.random.stateless_normal([4, 8, 8, 1], seed=[1, 2])
    args = (x,)
    for layer, theta in pairs:
      args = composite.AsArgs(layer.FProp(theta, *args))
    self.assertAllClose(composite.FromArgs(args), pipe.FPropDefaultTheta(x),
                        rtol=1e-6, atol=1e-6)


def _SquareSum(out, unused_targets=None):
  return tf.reduce_sum(tf.square(out))


def _ConvertedStep(pipe, schedule):
  """A training step in a tf.function with AutoGraph on (the trainer's)."""

  @tf.function
  def Step(x):
    with tf.GradientTape() as tape:
      if schedule == 'gpipe':
        loss = _SquareSum(pipe.FProp(pipe.theta, x))
      else:
        loss = pipe.FPropLoss(pipe.theta, (x,), None, _SquareSum, 1.0).loss
    return tape.gradient(loss, pipe.trainable_variables)
  return Step


class AutoGraphTest(tf.test.TestCase):

  def testThePipelineIsTracedWithoutAutoGraphInsideAConvertingFunction(self):
    """The trainer's step is a tf.function with AutoGraph on; converting the
    pipeline's own Python (the schedule engine and its tables) was most of
    the first step's time (pipeline.py), so its entry points opt out."""
    # AutoGraph converts each function through this private hook (TF 2.21):
    # record what it converts.
    converted = []
    convert = autograph_api._convert_actual  # pylint: disable=protected-access

    def Record(entity, program_ctx):
      converted.append(getattr(entity, '__module__', None))
      return convert(entity, program_ctx)

    x = tf.random.stateless_normal([8, 8, 8, 2], seed=[1, 2])
    for schedule in ('gpipe', '1f1b'):
      pipe = Pipe(test_utils.ConvTestModel(), num_partitions=2,
                  num_micro_batches=4, input_shapes=[[8, 8, 8, 2]],
                  schedule=schedule)
      step = _ConvertedStep(pipe, schedule)
      converted.clear()
      with mock.patch.object(autograph_api, '_convert_actual', Record), \
          py_utils.TrainingMode(True):
        step(x)
      # The test's own functions were converted (the hook works) ...
      self.assertIn(__name__, converted, schedule)
      # ... nothing the pipeline runs was.
      self.assertEqual(
          sorted({m for m in converted if m and m.startswith('tensorpipe')}),
          [], schedule)


if __name__ == '__main__':
  tf.test.main()
