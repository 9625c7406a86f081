"""Tests for tensorpipe.layers.keras_layer (Keras 3 layers as TensorPipe layers)."""

import random

import keras
import numpy as np
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import partitioning
from tensorpipe import pipeline
from tensorpipe import py_utils
from tensorpipe import test_utils
from tensorpipe.layers import keras_layer
from tensorpipe.nested_map import NestedMap

test_utils.ConfigureTestDevices()

RTOL = test_utils.DEFAULT_RTOL[tf.float64]


def _Params(name='fc', **kwargs):
  return keras_layer.KerasLayer.Params().Set(name=name, **kwargs)


def _Dense(name='fc', units=3, input_dim=4, **kwargs):
  return _Params(name, keras_factory='keras.layers.Dense',
                 keras_kwargs=dict(units=units, **kwargs),
                 input_shape=[input_dim])


class KerasLayerParamsTest(tf.test.TestCase):

  def testFactoryParamsRoundTripThroughText(self):
    p = _Dense(activation='relu')
    q = keras_layer.KerasLayer.Params().FromText(p.ToText())
    self.assertEqual(p, q)
    self.assertEqual(q.keras_kwargs, {'units': 3, 'activation': 'relu'})
    a, b = p.Instantiate(), q.Instantiate()
    self.assertAllEqual(a.theta.kernel, b.theta.kernel)

  def testConfigParamsRoundTripThroughText(self):
    layer = keras.layers.Conv2D(5, (3, 2), padding='same', name='conv')
    layer.build((None, 6, 6, 2))
    p = _Params('conv', keras_config=keras.saving.serialize_keras_object(
        layer))
    q = keras_layer.KerasLayer.Params().FromText(p.ToText())
    self.assertEqual(p, q)
    built = q.Instantiate()
    # The config's build shape builds it: no input_shape needed.
    self.assertEqual(built.theta.kernel.shape.as_list(), [3, 2, 2, 5])


  def testFunctionalConfigBuildsAgainAndAgain(self):
    # Keras 3.15 empties a functional model's config dict in place when it
    # deserialises it; a KerasLayer rebuilds its object from p.keras_config
    # (FPropMeta, every Instantiate), so each build must see the whole dict.
    inp = keras.Input((4,))
    hidden = keras.layers.Dense(3, name='hidden')(inp)
    out = keras.layers.Add(name='skip')([hidden, keras.layers.Dense(
        3, name='side')(inp)])
    model = keras.Model(inp, out, name='block')
    p = _Params('block', keras_config=keras.saving.serialize_keras_object(
        model))
    before = p.ToText()
    x = tf.constant(np.random.RandomState(0).randn(2, 4), tf.float32)
    outputs = []
    for _ in range(3):
      meta = p.cls.FPropMeta(p, [2, 4])
      self.assertEqual([s.as_list() for s in tf.nest.flatten(
          meta.out_shapes)], [[2, 3]])
      layer = p.Copy().Instantiate()
      layer.AssignFromKeras(model)
      outputs.append(tf.nest.flatten(layer(x))[0].numpy())
    self.assertEqual(p.ToText(), before)
    for out in outputs:
      self.assertAllClose(out, model(x).numpy(), rtol=1e-6)
  def testInitialWeightsSeededByPathAndCallerRandomUntouched(self):
    random.seed(123)
    before = random.getstate()
    a, b = _Dense().Instantiate(), _Dense().Instantiate()
    c = _Dense(name='other').Instantiate()
    self.assertEqual(random.getstate(), before)
    self.assertAllEqual(a.theta.kernel, b.theta.kernel)
    self.assertNotAllClose(a.theta.kernel, c.theta.kernel)

  def testKerasObjectReadsTheTensorPipeVariables(self):
    layer = _Dense().Instantiate()
    x = tf.constant(np.arange(8.0).reshape(2, 4), tf.float32)
    layer.vars.kernel.assign(tf.ones([4, 3]))
    self.assertAllClose(layer.keras_object(x), layer(x))
    self.assertAllClose(layer(x), tf.matmul(x, tf.ones([4, 3])))
    # One copy of the weights: the Keras variable is the TensorPipe one.
    kv, key = layer.KerasWeights()[0]
    self.assertIs(kv.value, layer.vars[key])
    self.assertLen(layer.trainable_variables, 2)

  def testAbstractVariablesAllocateNothing(self):
    with base_layer.AbstractVariables() as weights:
      layer = _Dense(units=7, input_dim=5).Instantiate()
    self.assertEqual({(w.path, w.shape) for w in weights},
                     {('kernel', (5, 7)), ('bias', (7,))})
    self.assertIsInstance(layer.vars.kernel, tf.TensorSpec)


  def testTiedReaderGetsOnlyTheWeightsItReadsAndAnUnreadOneIsNaN(self):
    dense = keras.layers.Dense(3, name='dense')
    dense.build((None, 4))
    reader = keras_layer.KerasLayer.Params().Set(
        name='dense__tied_1', tied_to='dense', tied_weights=[0],
        keras_config=keras.saving.serialize_keras_object(dense)).Instantiate()
    self.assertEqual(reader.TiedWeights(), {'kernel': 'dense/kernel'})
    # Dense reads its bias too: a read missing from tied_weights gives NaN,
    # never the reader's initial (zero) bias.
    out = reader.CallKeras(NestedMap(kernel=tf.ones([4, 3])),
                           (tf.ones([2, 4]),), {})
    self.assertTrue(np.all(np.isnan(out.numpy())))
    with self.assertRaisesRegex(ValueError, 'tied_weights=.*with tied_to'):
      keras_layer.KerasLayer.Params().Set(
          name='d', tied_weights=[0],
          keras_config=keras.saving.serialize_keras_object(dense)
      ).Instantiate()


class KerasLayerMetaTest(tf.test.TestCase):

  def testDenseMetaFromKerasShapesAndCountedFlops(self):
    p = _Dense(units=3, input_dim=4, activation='relu')
    meta = keras_layer.KerasLayer.FPropMeta(p, [5, 4])
    self.assertEqual(meta.out_shapes, (tf.TensorShape([5, 3]),))
    self.assertEqual(meta.num_params, 4 * 3 + 3)
    # matmul 2 * 5 * 4 * 3, bias add and relu one per output element.
    self.assertEqual(meta.flops, 2 * 5 * 4 * 3 + 5 * 3 + 5 * 3)

  def testConvMetaMatchesKerasAndFormula(self):
    layer = keras.layers.Conv2D(6, 3, strides=2, padding='same', name='c')
    layer.build((None, 8, 8, 2))
    p = _Params('c', keras_config=keras.saving.serialize_keras_object(layer))
    meta = keras_layer.KerasLayer.FPropMeta(p, [4, 8, 8, 2])
    self.assertEqual(meta.out_shapes[0].as_list(),
                     [4] + list(layer.compute_output_shape((4, 8, 8, 2))[1:]))
    self.assertEqual(meta.num_params, layer.count_params())
    out = 4 * 4 * 4 * 6
    self.assertEqual(meta.flops, 2 * out * 3 * 3 * 2 + out)  # conv + bias

  def testFlopsPerExampleOverride(self):
    p = _Dense().Set(flops_per_example=1000)
    self.assertEqual(keras_layer.KerasLayer.FPropMeta(p, [6, 4]).flops, 6000)

  def testPipelinePartitionsByKerasCosts(self):
    ps = [_Dense('a', units=4, input_dim=4), _Dense('b', units=512,
                                                      input_dim=4),
          _Dense('c', units=4, input_dim=512), _Dense('d', units=4)]
    pipe = pipeline.TensorPipeLayer.Params().Set(
        name='tp', layers=ps, num_partitions=3, num_micro_batches=2,
        input_shapes=[[8, 4]]).Instantiate()
    # Matmul and bias add of each Dense (linear activation: no op).
    costs = [2 * 8 * 4 * 4 + 8 * 4, 2 * 8 * 4 * 512 + 8 * 512,
             2 * 8 * 512 * 4 + 8 * 4, 2 * 8 * 4 * 4 + 8 * 4]
    expected = partitioning.Partition(costs, 3)
    self.assertEqual(pipe.partition_plan.sizes, expected.sizes)
    self.assertEqual(pipe.partition_plan.partition_costs,
                     expected.partition_costs)
    self.assertEqual(pipe.partition_plan.sizes, [1, 1, 2])


class KerasBatchNormTest(tf.test.TestCase):

  def _Bn(self):
    p = _Params('bn', keras_factory='keras.layers.BatchNormalization',
                keras_kwargs={'momentum': 0.7, 'dtype': 'float64'},
                input_shape=[3, 5])
    return p.Instantiate()

  def testPlainTrainingStepMatchesKerasBatchNormalization(self):
    layer = self._Bn()
    ref = keras.layers.BatchNormalization(momentum=0.7, dtype='float64')
    ref.build((None, 3, 5))
    layer.AssignFromKeras(ref)
    x = tf.constant(np.random.RandomState(0).normal(2.0, 3.0, (8, 3, 5)))
    out = layer.FPropDefaultTheta(x)   # training, no collector: updates now
    ref_out = ref(x, training=True)
    self.assertAllClose(out, ref_out, rtol=RTOL, atol=RTOL)
    for kv, key in layer.KerasWeights():
      self.assertAllClose(layer.vars[key], getattr(ref, kv.name), rtol=RTOL,
                          atol=RTOL, msg=key)
    self.assertNotAllClose(layer.vars.moving_mean, np.zeros(5))

  def testReportsStatisticsInsteadOfUpdatingInsideCollector(self):
    layer = self._Bn()
    x = tf.constant(np.random.RandomState(1).normal(size=(4, 3, 5)))
    with py_utils.CollectBatchStats() as collected:
      layer.FPropDefaultTheta(x)
    self.assertAllEqual(layer.vars.moving_mean, np.zeros(5))
    (reporter, stats), = collected
    self.assertEqual(float(stats.count), 12.0)
    self.assertAllClose(stats.total, tf.reduce_sum(x, [0, 1]))
    self.assertAllClose(stats.total_sq, tf.reduce_sum(x * x, [0, 1]))
    reporter.UpdateMovingStats(stats)
    self.assertAllClose(layer.vars.moving_mean,
                        0.3 * tf.reduce_mean(x, [0, 1]))

  def testEvalUsesMovingAverages(self):
    layer = self._Bn()
    layer.vars.moving_mean.assign(np.full(5, 2.0))
    layer.vars.moving_variance.assign(np.full(5, 4.0))
    x = tf.fill([2, 3, 5], tf.constant(4.0, tf.float64))
    expected = (4.0 - 2.0) / np.sqrt(4.0 + 1e-3)
    self.assertAllClose(layer(x), np.full([2, 3, 5], expected))


def _DropoutStack(rate=0.5):
  """Dense -> Dropout -> Dense in float64, as KerasLayer Params."""
  return [
      _Dense('fc1', units=16, input_dim=6, dtype='float64'),
      _Params('drop', keras_factory='keras.layers.Dropout',
              keras_kwargs={'rate': rate, 'dtype': 'float64'},
              input_shape=[16]),
      _Dense('fc2', units=2, input_dim=16, dtype='float64')]


class KerasDropoutTest(tf.test.TestCase):

  def testMaskIsTheSameForAnyKAndTWithAndWithoutRecompute(self):
    x = tf.constant(np.random.RandomState(2).normal(size=(8, 6)))
    results = []
    for k, t, recompute in ((1, 1, False), (2, 4, True), (3, 2, False)):
      pipe = pipeline.TensorPipeLayer.Params().Set(
          name='tp', layers=_DropoutStack(), num_partitions=k,
          num_micro_batches=t, recompute=recompute,
          input_shapes=[[8, 6]]).Instantiate()

      @tf.function(autograph=False)
      def Step(x, pipe=pipe):
        with tf.GradientTape() as tape:
          tape.watch(x)
          with py_utils.StepSeed(7):
            out = pipe.FPropDefaultTheta(x)
          loss = tf.reduce_sum(out ** 2)
        return out, tape.gradient(loss, [x] + list(pipe.trainable_variables))
      results.append(Step(x))
    (out, grads) = results[0]
    self.assertNotIn(None, grads)
    for other_out, other_grads in results[1:]:
      self.assertAllClose(other_out, out, rtol=RTOL, atol=RTOL)
      test_utils.AssertAllCloseScaled(self, other_grads, grads, RTOL)

  def testRecomputedBackwardUsesTheForwardMask(self):
    # Identity weights around the dropout: d loss / d x is the scaled mask,
    # so a different mask in the recompute pass would show in the gradient.
    layers = _DropoutStack(rate=0.5)
    layers[0].keras_kwargs.update(units=6, kernel_initializer='identity',
                                  use_bias=False)
    layers[1].input_shape = [6]
    layers[2].keras_kwargs.update(units=6, kernel_initializer='identity',
                                  use_bias=False)
    layers[2].input_shape = [6]
    pipe = pipeline.TensorPipeLayer.Params().Set(
        name='tp', layers=layers, num_partitions=3, num_micro_batches=4,
        recompute=True, input_shapes=[[8, 6]]).Instantiate()
    x = tf.ones([8, 6], tf.float64)

    @tf.function(autograph=False)
    def Step(x):
      with tf.GradientTape() as tape:
        tape.watch(x)
        out = pipe.FPropDefaultTheta(x)
        loss = tf.reduce_sum(out)
      return out, tape.gradient(loss, x)
    out, dx = Step(x)
    self.assertAllEqual(out, dx)  # both are mask / keep_prob
    self.assertSetEqual(set(np.unique(out.numpy())), {0.0, 2.0})

  def testEachStepSeedDrawsAnotherMask(self):
    layer = _DropoutStack()[1].Instantiate()
    x = tf.ones([4, 16], tf.float64)
    with py_utils.StepSeed(0):
      a = layer.FPropDefaultTheta(x)
    with py_utils.StepSeed(1):
      b = layer.FPropDefaultTheta(x)
    self.assertNotAllClose(a, b)
    self.assertAllEqual(layer(x), x)  # eval: no dropout

  def testBatchOfUnknownSizeDrawsTheSameMask(self):
    # Keras' fit on arrays traces with an unknown batch size.
    layer = _DropoutStack()[1].Instantiate()
    x = tf.ones([5, 16], tf.float64)
    dynamic = tf.function(
        lambda x: layer.FPropDefaultTheta(x), autograph=False,
        input_signature=[tf.TensorSpec([None, 16], tf.float64)])
    with py_utils.StepSeed(3), py_utils.ExampleOffset(4):
      self.assertAllEqual(dynamic(x), layer.FPropDefaultTheta(x))

  def testGaussianNoiseSeededPerStepAndMicroBatchAndRecomputed(self):
    # Other random layers keep Keras' code; their SeedGenerator state is set
    # per call from the step seed and the micro-batch's example offset.
    noise = _Params('noise', keras_factory='keras.layers.GaussianNoise',
                    keras_kwargs={'stddev': 1.0, 'dtype': 'float64'},
                    input_shape=[16]).Instantiate()
    x = tf.zeros([2, 16], tf.float64)
    with py_utils.StepSeed(0):
      a = noise.FPropDefaultTheta(x)
      with py_utils.ExampleOffset(2):
        b = noise.FPropDefaultTheta(x)
    with py_utils.StepSeed(1):
      c = noise.FPropDefaultTheta(x)
    self.assertNotAllClose(a, b)
    self.assertNotAllClose(a, c)
    layers = _DropoutStack()
    layers[1] = noise.params.Copy()
    grads = []
    for recompute in (False, True):
      pipe = pipeline.TensorPipeLayer.Params().Set(
          name='tp', layers=layers, num_partitions=2, num_micro_batches=2,
          recompute=recompute, input_shapes=[[4, 6]]).Instantiate()
      grads.append(test_utils.LossAndGrads(
          pipe, lambda out: tf.reduce_sum(out ** 3),
          tf.ones([4, 6], tf.float64))[2])
    test_utils.AssertAllCloseScaled(self, grads[1], grads[0], RTOL)


class KerasLayerBadInputTest(tf.test.TestCase):

  def testRaggedOutputCannotCrossABoundary(self):
    rag = _Params('rag', keras_factory='tests.keras_testlib.RaggedRows',
                  input_shape=[4])
    with self.assertRaisesRegex(ValueError, r"KerasLayer 'rag'.*ragged "
                                r'tensor.*cannot cross a pipeline boundary'):
      pipeline.TensorPipeLayer.Params().Set(
          name='tp', layers=[_Dense('fc', units=4), rag], num_partitions=2,
          num_micro_batches=2, input_shapes=[[8, 4]]).Instantiate()
    with self.assertRaisesRegex(ValueError, 'ragged tensor'):
      rag.Instantiate().FPropDefaultTheta(tf.ones([2, 4]))

  def testSparseOutputCannotCrossABoundary(self):
    p = _Params('onehot', keras_factory='keras.layers.CategoryEncoding',
                keras_kwargs={'num_tokens': 5, 'output_mode': 'one_hot',
                              'sparse': True},
                input_shape=[1], input_dtype='int32')
    with self.assertRaisesRegex(ValueError, r"'onehot'.*sparse tensor.*"
                                'sparse=False'):
      keras_layer.KerasLayer.FPropMeta(p, [4, 1])

  def testLayerBuiltForAnotherBatchSize(self):
    p = _Params('fixed', keras_factory='tests.keras_testlib.FixedBatchModel',
                keras_kwargs={'batch_size': 8})
    with self.assertRaisesRegex(
        ValueError, r"built for batch size 8 .*batch 4.*keras.Input\(shape"):
      pipeline.TensorPipeLayer.Params().Set(
          name='tp', layers=[_Dense('fc', units=4), p], num_partitions=2,
          num_micro_batches=2, input_shapes=[[4, 4]]).Instantiate()
    layer = p.Instantiate()
    with self.assertRaisesRegex(ValueError, 'built for batch size 8'):
      layer.FPropDefaultTheta(tf.ones([2, 4]))

  def testNonSerialisableKerasObjectInParams(self):
    with self.assertRaisesRegex(
        TypeError, r"keras_kwargs\['kernel_initializer'\] holds the Keras "
        'object.*serialize_keras_object'):
      _Dense(kernel_initializer=keras.initializers.Ones()).Instantiate()
    with self.assertRaisesRegex(TypeError, 'keras_config holds the Keras '
                                "object Dense 'd'"):
      _Params('x', keras_config=keras.layers.Dense(2, name='d')).Instantiate()
    with self.assertRaisesRegex(TypeError, r'keras_kwargs\[.act.\] holds a '
                                '.*function'):
      _Dense(act=lambda x: x).Instantiate()
    with self.assertRaisesRegex(TypeError, 'must be the dotted name'):
      _Params('x', keras_factory=keras.layers.Dense).Instantiate()

  def testLambdaConfigNeedsARegisteredLayer(self):
    layer = keras.layers.Lambda(lambda x: x * 2, name='double')
    p = _Params('double', keras_config=keras.saving.serialize_keras_object(
        layer), input_shape=[3])
    with self.assertRaisesRegex(ValueError, "'double': keras_config cannot "
                                'be deserialised.*register_keras_serializable'):
      p.Instantiate()

  def testKeras2IsRejectedWithTheFix(self):
    with self.assertRaisesRegex(TypeError, r'Keras 2 \(tf_keras\) Dense.*'
                                'Keras 3.*stateless'):
      _Params('k2', keras_factory='tests.keras_testlib.Keras2Dense',
              input_shape=[4]).Instantiate()

  def testFactoryAndConfigExcludeEachOther(self):
    with self.assertRaisesRegex(ValueError, 'exactly one of keras_factory'):
      _Params('x').Instantiate()
    with self.assertRaisesRegex(ValueError, 'names nothing importable'):
      _Params('x', keras_factory='keras.layers.NoSuchLayer',
              input_shape=[2]).Instantiate()

  def testUnsupportedKerasFeaturesNameTheFix(self):
    with self.assertRaisesRegex(ValueError, 'renorm=True.*set renorm=False'):
      _Params('bn', keras_factory='keras.layers.BatchNormalization',
              keras_kwargs={'renorm': True}, input_shape=[3]).Instantiate()
    with self.assertRaisesRegex(ValueError, 'has a regularizer.*'
                                'l2_regularizer_weight'):
      _Dense(kernel_regularizer='l2').Instantiate()
    with self.assertRaisesRegex(ValueError, 'not built and input_shape is '
                                'not set'):
      _Params('x', keras_factory='keras.layers.Dense',
              keras_kwargs={'units': 2}).Instantiate()
    layer = _Dense().Instantiate()
    with py_utils.BatchAxis(1):
      with self.assertRaisesRegex(ValueError, 'batch on axis 0'):
        layer.FPropDefaultTheta(tf.ones([2, 4]))


if __name__ == '__main__':
  tf.test.main()
