"""Tests of BaseLayer, WeightInit and the FProp context (py_utils)."""

import os
import threading

import numpy as np
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import py_utils
from tensorpipe.layers import composite
from tensorpipe.layers import dropout
from tensorpipe.layers import linear
from tensorpipe.layers import normalization


class ToyLayer(base_layer.BaseLayer):
  """y = x @ w, with an FC child: exercises variables, children and theta."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 3, 'Feature dimension.')
    p.Define('child_tpl', linear.FCLayer.Params().Set(activation='NONE'),
             'Template of the child.')
    return p

  def __init__(self, params):
    super().__init__(params)
    d = self.params.dim
    self.CreateVariable('w', base_layer.WeightParams([d, d]))
    self.CreateChild('fc', self.params.child_tpl.Copy().Set(
        input_dim=d, output_dim=d))

  def FProp(self, theta, x):
    return self.children.fc.FProp(theta.fc, tf.matmul(x, theta.w))


class BaseLayerTest(tf.test.TestCase):

  def testThetaHoldsOwnAndChildVariables(self):
    layer = ToyLayer.Params().Set(name='toy').Instantiate()
    self.assertEqual(sorted(layer.theta.keys()), ['fc', 'w'])
    self.assertEqual(sorted(layer.theta.fc.keys()), ['b', 'w'])
    self.assertLen(layer.trainable_variables, 3)

  def testFPropIsFunctionalInTheta(self):
    layer = ToyLayer.Params().Set(name='toy').Instantiate()
    x = tf.ones([2, 3])
    theta = layer.theta.Transform(tf.zeros_like)
    self.assertAllEqual(layer.FProp(theta, x), tf.zeros([2, 3]))
    self.assertNotAllClose(layer.FPropDefaultTheta(x), tf.zeros([2, 3]))

  def testChildInheritsDtypeAndSeedOnlyWhereNone(self):
    child = linear.FCLayer.Params().Set(random_seed=7)
    layer = ToyLayer.Params().Set(name='toy', dtype=tf.float64,
                                  random_seed=3, child_tpl=child).Instantiate()
    fc = layer.children.fc
    self.assertEqual(fc.params.dtype, tf.float64)
    self.assertEqual(fc.params.random_seed, 7)
    self.assertEqual(fc.vars.w.dtype, tf.float64)

  def testParamsAreFrozenAfterConstruction(self):
    layer = ToyLayer.Params().Set(name='toy').Instantiate()
    with self.assertRaisesRegex(TypeError, 'frozen'):
      layer.params.dim = 4

  def testInitIsRepeatableAndSeedDependent(self):
    def W(seed, name='toy'):
      return ToyLayer.Params().Set(name=name, random_seed=seed).Instantiate(
      ).vars.w.numpy()
    self.assertAllEqual(W(1), W(1))
    self.assertNotAllClose(W(1), W(2))

  def testSameLayersGiveSameWeightsInAnyContainer(self):
    sub = [linear.FCLayer.Params().Set(name=f'fc{i}', input_dim=4,
                                       output_dim=4) for i in range(3)]
    a = composite.SequentialLayer.Params().Set(name='a', sub=sub).Instantiate()
    b = composite.SequentialLayer.Params().Set(name='b', sub=sub).Instantiate()
    self.assertLen(a.trainable_variables, 6)
    for va, vb in zip(a.trainable_variables, b.trainable_variables):
      self.assertAllEqual(va, vb)

  def testMissingNameIsAClearError(self):
    with self.assertRaisesRegex(ValueError, 'name is empty'):
      ToyLayer.Params().Instantiate()

  def testDuplicateChildNamesRejected(self):
    sub = [linear.FCLayer.Params().Set(name='fc', input_dim=2, output_dim=2)
           for _ in range(2)]
    with self.assertRaisesRegex(ValueError, "two children are named 'fc'"):
      composite.SequentialLayer.Params().Set(name='s', sub=sub).Instantiate()

  def testCheckpointRestoresByLayerNames(self):
    layer = ToyLayer.Params().Set(name='toy', random_seed=1).Instantiate()
    path = tf.train.Checkpoint(model=layer).save(
        os.path.join(self.get_temp_dir(), 'ckpt'))
    other = ToyLayer.Params().Set(name='toy', random_seed=2).Instantiate()
    self.assertNotAllClose(other.vars.w, layer.vars.w)
    tf.train.Checkpoint(model=other).restore(path).assert_consumed()
    for a, b in zip(layer.trainable_variables, other.trainable_variables):
      self.assertAllEqual(a, b)

  def testCastThetaCastsOnlyTrainableOwnWeights(self):
    bn = normalization.BatchNormLayer.Params().Set(
        name='bn', dim=2, fprop_dtype=tf.bfloat16).Instantiate()
    theta = bn.CastTheta(bn.theta)
    self.assertEqual(theta.gamma.dtype, tf.bfloat16)
    self.assertEqual(theta.moving_mean.dtype, tf.float32)


class WeightInitTest(tf.test.TestCase):

  def testConstant(self):
    v = base_layer.WeightInit.Constant(0.5).Initialize([3], tf.float32, 1)
    self.assertAllEqual(v, [0.5, 0.5, 0.5])

  def testGaussianScale(self):
    v = base_layer.WeightInit.Gaussian(2.0).Initialize([200, 200],
                                                       tf.float32, 1)
    self.assertAllClose(np.std(v.numpy()), 2.0, rtol=0.02)

  def testUniformBounds(self):
    v = base_layer.WeightInit.Uniform(0.3).Initialize([1000], tf.float32, 1)
    self.assertLessEqual(np.abs(v.numpy()).max(), 0.3)
    self.assertGreater(np.abs(v.numpy()).max(), 0.29)

  def testXavierBound(self):
    v = base_layer.WeightInit.Xavier().Initialize([100, 50], tf.float32, 1)
    bound = np.sqrt(6.0 / 150)
    self.assertLessEqual(np.abs(v.numpy()).max(), bound)
    self.assertGreater(np.abs(v.numpy()).max(), 0.95 * bound)


class PlainCallModeTest(tf.test.TestCase):
  """`layer(x)` is inference unless a TrainingMode / EvalMode block is open."""

  def _Model(self):
    return composite.SequentialLayer.Params().Set(name='m', sub=[
        normalization.BatchNormLayer.Params().Set(name='bn', dim=3),
        dropout.DropoutLayer.Params().Set(name='drop', keep_prob=0.5),
    ]).Instantiate()

  def testPlainCallUsesAndKeepsMovingStatsWithoutDropout(self):
    model = self._Model()
    bn = model.children.sub[0]
    bn.vars.moving_mean.assign([1.0, -2.0, 0.5])
    bn.vars.moving_variance.assign([4.0, 1.0, 0.25])
    x = tf.random.stateless_normal([16, 3], seed=[2, 7])
    self.assertFalse(py_utils.ModeIsSet())
    for _ in range(3):
      out = model(x)
    self.assertAllEqual([1.0, -2.0, 0.5], bn.vars.moving_mean)
    self.assertAllEqual([4.0, 1.0, 0.25], bn.vars.moving_variance)
    # The oracle: eval-mode batch norm, no dropout.
    gamma, beta = bn.vars.gamma.numpy(), bn.vars.beta.numpy()
    expected = ((x.numpy() - [1.0, -2.0, 0.5]) / np.sqrt(
        np.array([4.0, 1.0, 0.25]) + 1e-3)) * gamma + beta
    self.assertAllClose(expected, out, rtol=1e-5, atol=1e-5)
    self.assertFalse(py_utils.ModeIsSet())  # the call left no block open

  def testPlainCallFollowsAnOpenModeBlock(self):
    model = self._Model()
    bn = model.children.sub[0]
    x = tf.random.stateless_normal([16, 3], seed=[2, 7]) + 5.0
    with py_utils.EvalMode():
      model(x)
    self.assertAllEqual([0.0, 0.0, 0.0], bn.vars.moving_mean)
    with py_utils.TrainingMode(True):
      out = model(x)
    self.assertAllClose(0.001 * x.numpy().mean(0), bn.vars.moving_mean,
                        rtol=1e-5)
    # Training: dropout zeroes about half of the values.
    self.assertBetween(float(tf.reduce_mean(tf.cast(out == 0, tf.float32))),
                       0.2, 0.8)

  def testFPropDefaultThetaOutsideABlockTrains(self):
    # The functional API keeps Lingvo's default: a task's loss is built on it.
    model = self._Model()
    bn = model.children.sub[0]
    x = tf.random.stateless_normal([16, 3], seed=[2, 7]) + 5.0
    model.FPropDefaultTheta(x)
    self.assertAllClose(0.001 * x.numpy().mean(0), bn.vars.moving_mean,
                        rtol=1e-5)



class PyUtilsTest(tf.test.TestCase):

  def testModeContexts(self):
    self.assertTrue(py_utils.IsTraining())
    self.assertFalse(py_utils.ModeIsSet())
    with py_utils.EvalMode():
      self.assertFalse(py_utils.IsTraining())
      with py_utils.TrainingMode(True):
        self.assertTrue(py_utils.IsTraining())
    self.assertTrue(py_utils.IsTraining())

  def testStatelessUniformMicroBatchEqualsWholeBatchRows(self):
    whole = py_utils.StatelessUniform([10, 3, 5], layer_seed=11)
    for offset, size in [(0, 4), (3, 2), (7, 3), (9, 1)]:
      with py_utils.ExampleOffset(offset):
        part = py_utils.StatelessUniform([size, 3, 5], layer_seed=11)
      self.assertAllEqual(part, whole[offset:offset + size])

  def testStatelessUniformDependsOnStepAndLayerSeed(self):
    a = py_utils.StatelessUniform([4, 4], layer_seed=1)
    with py_utils.StepSeed(5):
      b = py_utils.StatelessUniform([4, 4], layer_seed=1)
    c = py_utils.StatelessUniform([4, 4], layer_seed=2)
    self.assertNotAllClose(a, b)
    self.assertNotAllClose(a, c)

  def testBatchStatsMergeGivesWholeBatchMoments(self):
    x = np.random.RandomState(0).randn(12, 3).astype(np.float32) * 2 + 1

    def Stats(v):
      return py_utils.BatchStats(tf.constant(float(len(v))),
                                 tf.reduce_sum(v, 0),
                                 tf.reduce_sum(tf.square(v), 0))
    merged = Stats(x[:5]).Merge(Stats(x[5:]))
    mean, var = merged.MeanAndVariance()
    self.assertAllClose(mean, x.mean(0), rtol=1e-5)
    self.assertAllClose(var, x.var(0), rtol=1e-5)


class AbstractVariablesTest(tf.test.TestCase):

  def _Params(self):
    return composite.SequentialLayer.Params().Set(name='seq', sub=[
        linear.FCLayer.Params().Set(name='fc', input_dim=3, output_dim=4),
        normalization.BatchNormLayer.Params().Set(name='bn', dim=4,
                                                  dtype=tf.float64)])

  def testRecordsWhatABuildWouldCreateAndAllocatesNothing(self):
    real = self._Params().Instantiate()
    with base_layer.AbstractVariables() as weights:
      abstract = self._Params().Instantiate()
    self.assertEmpty(abstract.variables)
    want = sorted((v.name.split(':')[0], tuple(v.shape), v.dtype, v.trainable)
                  for v in real.variables)
    # Variables are named by their paths.
    got = sorted((w.path, w.shape, w.dtype, w.trainable) for w in weights)
    self.assertEqual(got, want)
    self.assertIn(base_layer.AbstractVariable('fc/w', (3, 4), tf.float32,
                                              True), weights)
    self.assertTrue(any(w.path.startswith('bn/') and not w.trainable
                        for w in weights))   # moving statistics
    # The layer keeps specs of the shape and dtype instead of variables.
    spec = abstract.children.sub[0].vars.w
    self.assertEqual((spec.shape.as_list(), spec.dtype), ([3, 4], tf.float32))

  def testModeIsPerThreadNestsAndEnds(self):
    built = {}

    def BuildReal():
      built['other'] = self._Params().Instantiate()
    with base_layer.AbstractVariables() as outer:
      thread = threading.Thread(target=BuildReal)
      thread.start()
      thread.join()
      with base_layer.AbstractVariables() as inner:
        self._Params().Instantiate()
      self.assertEmpty(outer)        # the inner block had its own list
      self._Params().Instantiate()
    self.assertLen(outer, len(inner))
    # Another thread, meanwhile, and this one afterwards build real layers.
    self.assertNotEmpty(built['other'].variables)
    self.assertNotEmpty(self._Params().Instantiate().variables)


if __name__ == '__main__':
  tf.test.main()
