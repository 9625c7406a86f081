"""Tests for tensorpipe.keras_graph: functional Keras models as pipelines.

The oracle is the user's own functional model run by Keras, unpipelined, on
the same T micro-batches a pipeline makes (batch norm normalises each
micro-batch with its own statistics), in float64.
"""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import keras_graph
from tensorpipe import keras_graph_costs
from tensorpipe import keras_graph_mixing
from tensorpipe import keras_graph_params
from tensorpipe import keras_graph_segment
from tensorpipe import keras_params
from tensorpipe import keras_pipeline
from tensorpipe import keras_utils
from tensorpipe import py_utils
from tensorpipe import test_utils

test_utils.ConfigureTestDevices()

RTOL = 1e-9
BATCH, T = 8, 2


def _Init(seed):
  return keras.initializers.GlorotUniform(seed=seed)


def _Chain(dtype='float64'):
  """x -> h1 -> h2 -> m2 = h2 + h1 -> h3 -> m3 = h3 + h1 -> h4 -> m4 -> out.

  Every node depends on the one before, so the node order is fixed; h1 is
  read in three later places and x at the end.
  """
  kw = dict(dtype=dtype)
  x = keras.Input((5,), name='x', dtype=dtype)
  h1 = keras.layers.Dense(5, 'tanh', kernel_initializer=_Init(1), name='h1',
                          **kw)(x)
  h2 = keras.layers.Dense(5, 'tanh', kernel_initializer=_Init(2), name='h2',
                          **kw)(h1)
  m2 = keras.layers.Add(name='m2', **kw)([h2, h1])
  h3 = keras.layers.Dense(5, 'tanh', kernel_initializer=_Init(3), name='h3',
                          **kw)(m2)
  m3 = keras.layers.Add(name='m3', **kw)([h3, h1])
  h4 = keras.layers.Dense(5, 'tanh', kernel_initializer=_Init(4), name='h4',
                          **kw)(m3)
  m4 = keras.layers.Add(name='m4', **kw)([h4, h1, x])
  out = keras.layers.Dense(2, kernel_initializer=_Init(5), name='out',
                           **kw)(m4)
  return keras.Model(x, out, name='chain')


def _Rich(dtype='float64'):
  """Two inputs, two outputs, a shared layer called twice, a keras.ops add,
  a trained and a frozen batch norm, a long skip."""
  kw = dict(dtype=dtype)
  a = keras.Input((6,), name='a', dtype=dtype)
  b = keras.Input((6,), name='b', dtype=dtype)
  shared = keras.layers.Dense(6, 'tanh', kernel_initializer=_Init(1),
                              bias_initializer='ones', name='shared', **kw)
  s1 = shared(a)
  mid = keras.layers.Dense(6, 'tanh', kernel_initializer=_Init(2),
                           name='mid', **kw)(s1)
  s2 = shared(mid)
  s = keras.ops.add(s2, b)
  bn = keras.layers.BatchNormalization(
      momentum=0.8, gamma_initializer=keras.initializers.RandomUniform(
          0.5, 1.5, seed=3), beta_initializer=keras.initializers.RandomUniform(
              -0.5, 0.5, seed=4), name='bn', **kw)(s)
  h = keras.layers.Dense(8, 'tanh', kernel_initializer=_Init(5), name='h',
                         **kw)(bn)
  # Frozen as Keras 3 freezes: trainable=False (a recorded training=False
  # is replaced by the mode of the call, in Keras and in the pipeline).
  frozen = keras.layers.BatchNormalization(name='frozen', trainable=False,
                                           **kw)(h, training=False)
  proj = keras.layers.Dense(8, kernel_initializer=_Init(6), name='proj',
                            **kw)(a)
  skip = keras.layers.Add(name='skip', **kw)([frozen, proj])
  logits = keras.layers.Dense(3, kernel_initializer=_Init(7), name='logits',
                              **kw)(skip)
  aux = keras.layers.Dense(2, kernel_initializer=_Init(8), name='aux',
                           **kw)(s1)
  model = keras.Model([a, b], [logits, aux], name='rich')
  rng = np.random.RandomState(9)
  layer = model.get_layer('frozen')
  layer.moving_mean.assign(rng.uniform(-0.5, 0.5, 8))
  layer.moving_variance.assign(rng.uniform(0.5, 2.0, 8))
  return model


def _Inputs(n, seed=0, names=('a', 'b'), width=6):
  # float32 values: Keras' input adapter casts float arrays to float32.
  rng = np.random.RandomState(seed)
  return [rng.normal(size=(n, width)).astype(np.float32).astype(np.float64)
          for _ in names]


def _OracleForward(model, xs, t):
  """Keras' own forward in training mode, one micro-batch at a time."""
  n = xs[0].shape[0] // t
  outs = [model([x[i * n:(i + 1) * n] for x in xs], training=True)
          for i in range(t)]
  outs = [o if isinstance(o, (list, tuple)) else [o] for o in outs]
  return [tf.concat([o[j] for o in outs], 0) for j in range(len(outs[0]))]


def _Loss(outs, seed=1):
  rng = np.random.RandomState(seed)
  return tf.add_n([tf.reduce_sum(o * rng.normal(size=o.shape))
                   for o in outs])


class GraphReadingTest(tf.test.TestCase):

  def testNodesInTopologicalOrderAndBoundariesHoldWhatLaterStagesRead(self):
    graph = keras_graph.ReadGraph(_Chain().get_config())
    self.assertEqual([n.layer for n in graph.nodes],
                     ['h1', 'h2', 'm2', 'h3', 'm3', 'h4', 'm4', 'out'])
    costs = keras_graph_costs.Analyse(graph)
    plan = keras_graph.PlanCuts(graph, costs, 4,
                                cut_after=['h1', 'm2', 'm3'])
    # h1 is read by three later stages and x by the last: both travel
    # through every cut; nothing else that is dead by then does.
    self.assertEqual(plan.boundaries, (
        ('t_x__0_0', 't_h1__0_0'),
        ('t_x__0_0', 't_h1__0_0', 't_m2__0_0'),
        ('t_x__0_0', 't_h1__0_0', 't_m3__0_0')))
    self.assertEqual(plan.starts, (0, 1, 3, 5))
    report = plan.Report(graph, costs, 8)
    self.assertIn('cut 1: 3 tensor(s), 960 bytes', report)  # 3 x 8 x 5 x 8
    self.assertIn('t_m2__0_0 [None, 5] float64 (320 bytes)', report)

  def testFlopsCountedPerNode(self):
    graph = keras_graph.ReadGraph(_Chain().get_config())
    costs = keras_graph_costs.Analyse(graph)
    by_layer = dict(zip([n.layer for n in graph.nodes], costs.flops))
    # A 5x5 Dense: 2 m k n for the matmul, + bias, + tanh on 5 outputs.
    self.assertGreaterEqual(by_layer['h1'], 2 * 5 * 5)
    self.assertLess(by_layer['h1'], 2 * 5 * 5 + 5 * 10)
    self.assertEqual(by_layer['m4'], 10)  # two adds of 5 elements
    self.assertEqual(costs.num_params[0], 30)

  def testSharedLayerCallsMayFallInSeveralSegments(self):
    graph = keras_graph.ReadGraph(_Rich().get_config())
    costs = keras_graph_costs.Analyse(graph)
    self.assertLen(graph.NodesOf('shared'), 2)
    plan = keras_graph.PlanCuts(graph, costs, 2, cut_after=['mid'])
    self.assertEqual(keras_graph.TiedLayers(graph, plan), {'shared': [0, 1]})
    self.assertIn('tied: shared (42 weights) is held on the devices of '
                  'segments 0, 1 (segment 0 owns it); its gradient crosses '
                  'once per step from each of segments 1 to segment 0',
                  plan.Report(graph, costs, BATCH))
    # The reader holds no variables of its own.
    seg = keras_graph_segment.SegmentParams(graph, costs, plan, 1)
    (reader,) = [sp for sp in seg.sub if sp.tied_to]
    self.assertEqual((reader.name, reader.tied_to), ('shared__tied_1',
                                                     'shared'))

  def testRefusalsNameTheLayerAndTheFix(self):
    x = keras.Input((4,), name='x')
    masked = keras.Model(x, keras.layers.Dense(2)(
        keras.layers.Masking(name='mask')(x)))
    with self.assertRaisesRegex(ValueError, "'mask' \\(Masking\\).*mask"):
      keras_graph.ReadGraph(masked.get_config())
    dict_in = keras.Model({'x': x}, keras.layers.Dense(2)(x))
    with self.assertRaisesRegex(ValueError, 'dict.*list of inputs'):
      keras_graph.ReadGraph(dict_in.get_config())
    graph = keras_graph.ReadGraph(_Chain().get_config())
    costs = keras_graph_costs.Analyse(graph)
    with self.assertRaisesRegex(ValueError, 'num_partitions=9.*<= 8'):
      keras_graph.PlanCuts(graph, costs, 9)
    # With v stages per device the line names K and v, as the user set them.
    with self.assertRaisesRegex(
        ValueError, r'num_partitions=5 x 2 stages per device = 10 stages but '
        r".*'chain'.*only 8 pieces.*num_partitions x stages per device <= 8"):
      keras_graph_params.GraphPlan(_Chain(), 5, 5,
                                   schedule='interleaved_1f1b',
                                   num_stages_per_device=2)
    with self.assertRaisesRegex(ValueError, "'nope', which is no layer"):
      keras_graph.PlanCuts(graph, costs, 2, cut_after=['nope'])
    with self.assertRaisesRegex(ValueError, 'model order'):
      keras_graph.PlanCuts(graph, costs, 3, cut_after=['m3', 'h1'])

    class Sub(keras.Model):

      def call(self, x):
        return x
    with self.assertRaisesRegex(TypeError, 'subclassed.*functionally'):
      keras_pipeline.TensorPipeModel(Sub(), num_partitions=1)
    with self.assertRaisesRegex(ValueError, 'cut_after'):
      keras_params.PipelineParams(_Chain(), 2, 2, partition_sizes=[4, 4])
    with self.assertRaisesRegex(ValueError, 'num_micro_batches=0'):
      keras_pipeline.TensorPipeModel(_Chain(), 2, 0)

  def testOpsReducingOverTheBatchWarnOnceNamingTheNode(self):
    kw = dict(dtype='float64')
    x = keras.Input((5,), name='x', **kw)
    h = keras.layers.Dense(5, 'tanh', kernel_initializer=_Init(1),
                           name='h', **kw)(x)
    # Per example (axis -1): no warning. Over the batch: one each.
    h = h - keras.ops.max(h, axis=-1, keepdims=True)
    mixed = h - keras.ops.mean(h, axis=0) + keras.ops.sum(h)
    model = keras.Model(x, keras.layers.Dense(2, name='out', **kw)(mixed))
    graph = keras_graph.ReadGraph(model.get_config())
    mixing = keras_graph_mixing.BatchMixingOps(
        graph, keras_graph_costs.Analyse(graph))
    self.assertEqual([(m.op, m.axis) for m in mixing],
                     [('Mean', 0), ('Sum', None)])
    with self.assertLogs('absl', 'WARNING') as logs:
      pm = keras_pipeline.TensorPipeModel(model, num_partitions=2,
                                          num_micro_batches=T,
                                          batch_size=BATCH, cut_after=['h'])
    self.assertLen(logs.output, 2)
    self.assertRegex(logs.output[0], f"node '{mixing[0].layer}'.*Mean, "
                     'axis=0.*per micro-batch')
    xs = _Inputs(BATCH, width=5, names=('x',))
    # What it warns of: predictions differ from Keras'.
    self.assertNotAllClose(pm.predict(xs[0], batch_size=BATCH, verbose=0),
                           model.predict(xs[0], batch_size=BATCH, verbose=0))
    with self.assertNoLogs('absl', 'WARNING'):  # once per process
      keras_pipeline.TensorPipeModel(model, num_partitions=2,
                                     num_micro_batches=T, batch_size=BATCH,
                                     cut_after=['h'])
      keras_pipeline.TensorPipeModel(_Chain(), num_partitions=2,
                                     num_micro_batches=T, batch_size=BATCH)


class ParamsBeforeDevicesTest(tf.test.TestCase):

  def testParamsOfAFunctionalModelLeaveTensorFlowUninitialised(self):
    # Experiments make their Params (cost model included) before the
    # trainer creates its logical devices, which TF refuses once it runs.
    script = textwrap.dedent("""
        import tensorflow as tf
        from models import keras_models
        from tensorpipe import keras_params
        p = keras_params.PipelineParams(
            lambda: keras_models.FashionMnistResNet(4, 1), 4, 2,
            batch_size=8)
        assert len(p.partitions) == 4
        cpu = tf.config.list_physical_devices('CPU')[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
        print('devices', len(tf.config.list_logical_devices('CPU')))
        """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, '-c', script], cwd=root,
                         env=dict(os.environ, PYTHONPATH=root),
                         capture_output=True, text=True, timeout=300,
                         check=False)
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    self.assertIn('devices 4', out.stdout)


class GraphPipelineTest(tf.test.TestCase):

  def _Pipe(self, model, k, **kwargs):
    pipe = keras_params.BuildPipeline(model, k, T, batch_size=BATCH,
                                        **kwargs)
    return pipe

  def testChainForwardAndGradientsEqualKerasForEveryCut(self):
    model = _Chain()
    x = _Inputs(BATCH, width=5, names=('x',))
    with tf.GradientTape() as tape:
      want = model(x[0], training=True)
      want_loss = _Loss([want])
    want_grads = tape.gradient(want_loss, model.trainable_weights)
    for k, cuts in ((1, None), (2, None), (4, ['h1', 'm2', 'm3'])):
      pipe = self._Pipe(model, k, cut_after=cuts)
      order = keras_utils.WeightOrder(model)
      layers = {l.layer_name: l for l in keras_params.KerasLayersOf(pipe)}
      variables = [layers[n].vars[layers[n].KerasWeights()[j][1]]
                   for n, j in order]
      with tf.GradientTape() as tape, py_utils.TrainingMode(True):
        got = pipe.FProp(pipe.theta, tf.constant(x[0]))
        loss = _Loss([got])
      grads = tape.gradient(loss, variables)
      self.assertAllClose(got, want, rtol=RTOL, atol=0, msg=f'K={k}')
      for g, w in zip(grads, want_grads):
        self.assertAllClose(g, w, rtol=RTOL, atol=1e-15, msg=f'K={k}')

  def testRichModelMatchesKerasPerMicroBatch(self):
    model = _Rich()
    xs = _Inputs(BATCH)
    start = model.get_weights()
    want_eval = model(xs, training=False)
    with tf.GradientTape() as tape:
      want = _OracleForward(model, xs, T)  # moves Keras' moving averages
      want_loss = _Loss(want)
    want_grads = tape.gradient(want_loss, model.weights)
    # cut_after=['mid']: layer 'shared' is called in both stages (tied).
    for k, cuts in ((1, None), (2, None), (3, None), (2, ['mid'])):
      model.set_weights(start)
      pm = keras_pipeline.TensorPipeModel(
          model, num_partitions=k, num_micro_batches=T, batch_size=BATCH,
          cut_after=cuts)
      variables = pm.KerasOrderVariables()
      with tf.GradientTape() as tape:
        got = pm(xs, training=True)
        loss = _Loss(got)
      grads = tape.gradient(loss, variables)
      for g, w in zip(got, want):
        self.assertAllClose(g, w, rtol=RTOL, atol=1e-14, msg=f'K={k}')
      for v, kv, g, w in zip(variables, model.weights, grads, want_grads):
        self.assertEqual(v.trainable, kv.trainable, msg=v.name)
        if not kv.trainable:  # moving statistics, the frozen layer
          self.assertIsNone(g, msg=v.name)
          continue
        self.assertAllClose(g, w, rtol=RTOL, atol=1e-14, msg=v.name)
      # Inference: moving averages (the model's own, before training).
      pm.set_weights(start)
      for g, w in zip(pm(xs), want_eval):
        self.assertAllClose(g, w, rtol=RTOL, atol=1e-14)

  def testNestedModelIsOneNodeKeptWhole(self):
    inner_in = keras.Input((5,), dtype='float64')
    inner = keras.Model(inner_in, keras.layers.Dense(
        5, 'tanh', kernel_initializer=_Init(11), name='inner_fc',
        dtype='float64')(inner_in), name='block')
    x = keras.Input((5,), name='x', dtype='float64')
    h = keras.layers.Dense(5, kernel_initializer=_Init(12), name='pre',
                           dtype='float64')(x)
    out = keras.layers.Dense(2, kernel_initializer=_Init(13), name='post',
                             dtype='float64')(
                                 keras.layers.Add(dtype='float64')(
                                     [inner(h), x]))
    model = keras.Model(x, out)
    graph = keras_graph.ReadGraph(model.get_config())
    self.assertIn('block', [n.layer for n in graph.nodes])
    xs = _Inputs(BATCH, width=5, names=('x',))
    for k in (1, 2, 3):
      pm = keras_pipeline.TensorPipeModel(model, num_partitions=k,
                                          num_micro_batches=T,
                                          batch_size=BATCH)
      self.assertAllClose(pm(xs[0]), model(xs[0]), rtol=RTOL, atol=1e-14)
      paths = [v.name for v in pm.weights]
      self.assertIn('block/inner_fc__kernel:0', paths)

  def testFrozenBatchNormKeepsItsStatisticsWhileTheOtherUpdates(self):
    model = _Rich()
    pm = keras_pipeline.TensorPipeModel(model, num_partitions=2,
                                        num_micro_batches=T, batch_size=BATCH)
    pm.compile(keras.optimizers.SGD(0.0), loss=['mse', 'mse'])
    before = {n: w for n, w in zip(
        [f'{l.name}/{i}' for l in model.layers for i in range(
            len(l.weights))], pm.get_weights())}
    xs = _Inputs(BATCH)
    pm.fit(xs, [np.zeros((BATCH, 3)), np.zeros((BATCH, 2))],
           batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
    after = pm.to_keras()
    frozen, bn = after.get_layer('frozen'), after.get_layer('bn')
    self.assertAllEqual(frozen.moving_mean.numpy(), before['frozen/2'])
    self.assertAllEqual(frozen.moving_variance.numpy(), before['frozen/3'])
    self.assertNotAllClose(bn.moving_mean.numpy(), before['bn/2'])

  def testReversibleEmbeddingInTwoStagesTiedOrNotFitsLikeKeras(self):
    # keras.layers.ReversibleEmbedding called at both ends, cut between the
    # calls: tie_weights=True (GPT-2: one table) and False (Llama: its own
    # reverse_embeddings, one layer in two stages); the reader holds none.
    def Lm(tie):
      keras.utils.set_random_seed(4)
      ids = keras.Input((5,), dtype='int32', name='ids')
      emb = keras.layers.ReversibleEmbedding(
          20, 6, tie_weights=tie, name='emb', dtype='float64')
      h = keras.layers.Dense(6, 'tanh', kernel_initializer=_Init(1),
                             name='mid', dtype='float64')(emb(ids))
      return keras.Model(ids, emb(h, reverse=True))
    rng = np.random.RandomState(6)
    x = rng.randint(0, 20, size=(2 * BATCH, 5)).astype('int32')
    y = rng.randint(0, 20, size=(2 * BATCH, 5))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    # Untied under ZB-H1 too: its weight-gradient cells route the reverse
    # call's matmul on reverse_embeddings (keras_weight_ops), the one
    # weight the reader is given.
    for tie, schedule in ((True, 'gpipe'), (False, 'gpipe'),
                          (False, 'zb_h1')):
      twin = Lm(tie)
      twin.compile(keras.optimizers.SGD(0.5), loss)
      twin.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
      model = Lm(tie)
      pm = keras_pipeline.TensorPipeModel(
          model, num_partitions=2, num_micro_batches=T, batch_size=BATCH,
          cut_after=['mid'], schedule=schedule)
      self.assertIn('tied: emb', pm.graph_pipeline.Report())
      self.assertLen(pm.weights, len(model.weights))  # 1 (tied) or 2 + 2
      # The reader's stage gets only what its reverse call reads: the
      # table (tied) or reverse_embeddings (untied), not the input table.
      (reader,) = [l for l in base_layer.Layers(pm.pipeline)
                   if getattr(l.params, 'tied_to', None) == 'emb']
      read = [path.split('/')[-1] for path in reader.TiedWeights().values()]
      self.assertEqual(read, ['embeddings'] if tie else ['reverse_embeddings'])
      self.assertIn(f'the later segments read {20 * 6} of its weights',
                    pm.graph_pipeline.Report())
      pm.compile(keras.optimizers.SGD(0.5), loss)
      pm.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
      for got, want in zip(pm.get_weights(), twin.get_weights()):
        self.assertAllClose(got, want, rtol=RTOL, atol=1e-15,
                            msg=f'tie_weights={tie} {schedule}')

  def testOutputMadeBeforeTheLastCutIsCarriedAcrossIt(self):
    kw = dict(dtype='float64')
    x = keras.Input((5,), name='x', **kw)
    a = keras.layers.Dense(5, 'tanh', kernel_initializer=_Init(1),
                           name='a', **kw)(x)
    early = keras.layers.Dense(2, kernel_initializer=_Init(2), name='early',
                               **kw)(a)
    b = keras.layers.Dense(5, 'tanh', kernel_initializer=_Init(3),
                           name='b', **kw)(a)
    late = keras.layers.Dense(3, kernel_initializer=_Init(4), name='late',
                              **kw)(b)
    model = keras.Model(x, [early, late])
    pm = keras_pipeline.TensorPipeModel(
        model, num_partitions=3, num_micro_batches=T, batch_size=BATCH,
        cut_after=['b', 'early'])
    plan = pm.graph_pipeline.plan
    # Node order a, b, early, late (Keras' config lists layers by depth):
    # 'early' is made in the middle segment and read by no later node; it
    # crosses the last cut because it is an output.
    self.assertEqual([n.layer for n in pm.graph_pipeline.graph.nodes],
                     ['a', 'b', 'early', 'late'])
    self.assertEqual(plan.boundaries[-1], ('t_b__0_0', 't_early__0_0'))
    xs = _Inputs(BATCH, width=5, names=('x',))
    for g, w in zip(pm.predict(xs[0], batch_size=BATCH, verbose=0),
                    model.predict(xs[0], batch_size=BATCH, verbose=0)):
      self.assertAllClose(g, w, rtol=RTOL, atol=0)

  def testCallsModeReplacesARecordedTrainingFalseAsInKeras(self):
    # Keras 3.15: fit and `model(x, training=True)` pass training=True to
    # every node, replacing a recorded training=False (functional.py,
    # operation_fn); `model(x)` and predict keep it off. A trainable batch
    # norm and a dropout recorded with training=False.
    kw = dict(dtype='float64')
    x = keras.Input((6,), name='x', **kw)
    h = keras.layers.Dense(6, kernel_initializer=_Init(1), name='h',
                           **kw)(x)
    bn = keras.layers.BatchNormalization(name='bn', **kw)(h, training=False)
    drop = keras.layers.Dropout(0.5, name='drop', **kw)(bn, training=False)
    model = keras.Model(x, drop)
    self.assertTrue(model.get_layer('bn').trainable)
    xs = _Inputs(BATCH, names=('x',))
    dropped = model(xs[0], training=True).numpy() == 0
    self.assertBetween(dropped.mean(), 0.2, 0.8)  # Keras' dropout is on
    # Keras' batch norm output in training mode (per micro-batch
    # statistics), before the dropout, whose masks differ from Keras'.
    normed = _OracleForward(keras.Model(x, bn), xs, T)[0].numpy()
    pm = keras_pipeline.TensorPipeModel(
        model, num_partitions=2, num_micro_batches=T, batch_size=BATCH,
        cut_after=['bn'])
    # Inference: moving averages, no dropout, in Keras and the pipeline.
    self.assertAllClose(pm(xs[0]), model(xs[0]), rtol=RTOL, atol=0)
    self.assertAllClose(pm.predict(xs[0], batch_size=BATCH, verbose=0),
                        model.predict(xs[0], batch_size=BATCH, verbose=0),
                        rtol=RTOL, atol=0)
    got = pm(xs[0], training=True).numpy()  # moves the moving averages
    kept = got != 0
    self.assertBetween(kept.mean(), 0.2, 0.8)  # the dropout is on
    self.assertAllClose(got[kept], 2 * normed[kept], rtol=RTOL, atol=0)

  def testCheckpointKeysDoNotDependOnK(self):
    model = _Rich()
    paths = {k: sorted(base_layer.VariablesByPath(self._Pipe(model, k)))
             for k in (1, 3)}
    self.assertEqual(paths[1], paths[3])
    self.assertIn('shared/kernel', paths[1])
    three = self._Pipe(model, 3)
    for v in base_layer.VariablesByPath(three).values():
      v.assign(v + 1.0)
    prefix = tf.train.Checkpoint(model=three).write(
        os.path.join(self.get_temp_dir(), 'ckpt'))
    one = self._Pipe(model, 1)
    tf.train.Checkpoint(model=one).read(prefix).assert_consumed()
    for path, v in base_layer.VariablesByPath(one).items():
      self.assertAllEqual(v, base_layer.VariablesByPath(three)[path])
      self.assertEqual(v.name, path + ':0')


class GraphModelTest(tf.test.TestCase):

  def testFitPredictSaveExportAndBackToKeras(self):
    model = _Rich()
    pm = keras_pipeline.TensorPipeModel(model, num_partitions=2,
                                        num_micro_batches=T, batch_size=BATCH)
    pm.compile(keras.optimizers.SGD(0.05), loss=['mse', 'mse'])
    xs = _Inputs(2 * BATCH, seed=3)
    rng = np.random.RandomState(4)
    ys = [rng.normal(size=(2 * BATCH, 3)), rng.normal(size=(2 * BATCH, 2))]
    history = pm.fit(xs, ys, batch_size=BATCH, epochs=2, verbose=0,
                     shuffle=False)
    self.assertLess(history.history['loss'][-1], history.history['loss'][0])
    # Predict on a partial batch (5 rows: padded, pipelined, sliced).
    part = [x[:5] for x in xs]
    got = pm.predict(part, batch_size=BATCH, verbose=0)
    back = pm.to_keras()
    want = back.predict(part, verbose=0)
    for g, w in zip(got, want):
      self.assertAllClose(g, w, rtol=RTOL, atol=1e-14)
    # Keras' own set_weights takes the pipeline's get_weights.
    model.set_weights(pm.get_weights())
    for g, w in zip(got, model.predict(part, verbose=0)):
      self.assertAllClose(g, w, rtol=RTOL, atol=1e-14)
    # save / load_model.
    path = os.path.join(self.get_temp_dir(), 'rich.keras')
    pm.save(path)
    loaded = keras.models.load_model(path)
    for g, w in zip(loaded.predict(part, batch_size=BATCH, verbose=0), got):
      self.assertAllEqual(g, w)
    # export: one named input per keras.Input, one output per model output,
    # served in a process without tensorpipe.
    export_dir = os.path.join(self.get_temp_dir(), 'export')
    pm.export(export_dir)
    np.save(os.path.join(self.get_temp_dir(), 'a.npy'), part[0])
    np.save(os.path.join(self.get_temp_dir(), 'b.npy'), part[1])
    script = (
        'import sys, numpy as np, tensorflow as tf\n'
        'assert "tensorpipe" not in sys.modules\n'
        f'd = {self.get_temp_dir()!r}\n'
        'f = tf.saved_model.load(d + "/export").signatures["serving_default"]\n'
        'print(sorted(f.structured_input_signature[1]))\n'
        'out = f(a=tf.constant(np.load(d + "/a.npy")),\n'
        '        b=tf.constant(np.load(d + "/b.npy")))\n'
        'np.save(d + "/logits.npy", out["logits"].numpy())\n'
        'np.save(d + "/aux.npy", out["aux"].numpy())\n')
    env = dict(os.environ, PYTHONPATH='')
    proc = subprocess.run([sys.executable, '-c', script], env=env,
                          cwd=self.get_temp_dir(), capture_output=True,
                          text=True, timeout=120, check=False)
    self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
    self.assertIn("['a', 'b']", proc.stdout)
    self.assertAllClose(np.load(os.path.join(self.get_temp_dir(),
                                             'logits.npy')), got[0],
                        rtol=RTOL, atol=1e-14)
    self.assertAllClose(np.load(os.path.join(self.get_temp_dir(),
                                             'aux.npy')), got[1],
                        rtol=RTOL, atol=1e-14)

  def testSetWeightsRefusesAnotherModelsWeights(self):
    pm = keras_pipeline.TensorPipeModel(_Chain(), num_partitions=2,
                                        num_micro_batches=T, batch_size=BATCH)
    weights = pm.get_weights()
    with self.assertRaisesRegex(ValueError, 'got 3 arrays.*has 10 weights'):
      pm.set_weights(weights[:3])
    weights[0] = np.zeros((4, 5))
    with self.assertRaisesRegex(ValueError, r'weight 0 has shape \[4, 5\]'):
      pm.set_weights(weights)


if __name__ == '__main__':
  tf.test.main()
