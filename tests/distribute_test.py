"""Tests of tensorpipe/distribute.py: R data-parallel replicas x K stages."""

import numpy as np
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import distribute
from tensorpipe import optimizers
from tensorpipe import pipeline
from tensorpipe import py_utils
from tensorpipe import tasks
from tensorpipe import test_utils
from tensorpipe.layers import composite
from tensorpipe.layers import dropout
from tensorpipe.layers import linear
from tensorpipe.layers import losses
from tensorpipe.layers import normalization
from tensorpipe.nested_map import NestedMap

test_utils.ConfigureTestDevices()

R, K, T = 2, 2, 2          # replicas, partitions, micro-batches per replica
BATCH = 16                 # global batch: R x T micro-batches of 4
CLASSES = 3
LR = 0.1
SMOOTHING = 0.1
# Weight decay: train.l2_regularizer_weight of the replicated task; the
# oracle adds L2 * sum(w^2) / 2 over the weight matrices itself.
L2 = 1e-2


def Layers():
  """FC -> batch norm -> dropout -> FC, in float64 (exactness is claimed)."""
  return [
      linear.FCLayer.Params().Set(name='fc0', input_dim=5, output_dim=6),
      normalization.BatchNormLayer.Params().Set(name='bn', dim=6, decay=0.5),
      dropout.DropoutLayer.Params().Set(name='drop', keep_prob=0.6),
      linear.FCLayer.Params().Set(name='fc1', input_dim=6,
                                  output_dim=CLASSES, activation='NONE'),
  ]


def TaskParams(num_micro_batches=T):
  pipe = pipeline.TensorPipeLayer.Params().Set(
      name='TensorPipe', layers=Layers(), num_partitions=K,
      num_micro_batches=num_micro_batches, input_shapes=[[BATCH // R, 5]])
  p = tasks.ClassificationTask.Params().Set(
      name='task', model=pipe, num_classes=CLASSES, input_key='image',
      label_smoothing=SMOOTHING, dtype=tf.float64)
  p.train.l2_regularizer_weight = L2
  return p


def Batch(step):
  x = tf.random.stateless_normal([BATCH, 5], seed=[step, 1], dtype=tf.float64)
  labels = tf.random.stateless_uniform([BATCH], seed=[step, 2], maxval=CLASSES,
                                       dtype=tf.int32)
  return NestedMap(image=x, label=labels)


def Sgd():
  return optimizers.SGD.Params().Set(momentum=0.9).Instantiate()


class OracleModel:
  """The unreplicated, unpipelined model on the R x T micro-batches.

  Batch norm normalises each micro-batch with its own statistics and the
  moving averages are updated once per step from all micro-batches; dropout
  draws the masks of each example's position in the global batch.
  """

  def __init__(self):
    # Inside a task, as the replicas' pipelines are: the layer paths (which
    # seed dropout) are then the same, 'model/drop'.
    p = TaskParams()
    p.model = composite.SequentialLayer.Params().Set(name='model',
                                                     sub=Layers())
    self.model = p.Instantiate().children.model
    self.opt = Sgd()
    self.variables = self.model.trainable_variables
    self.opt.Build(base_layer.VariablesByPath(self.model, trainable_only=True))
    self._step = tf.function(self._Step, autograph=False)

  def Outputs(self, x, step):
    with py_utils.TrainingMode(True), py_utils.StepSeed(step):
      return self._Forward(x)[0]

  def _Forward(self, x):
    size = BATCH // (R * T)
    outs = []
    with py_utils.CollectBatchStats() as collected:
      for t in range(R * T):
        with py_utils.ExampleOffset(t * size):
          outs.append(self.model.FPropDefaultTheta(
              test_utils.SliceBatch(x, t * size, size, 0)))
    return tf.concat(outs, 0), collected

  def _Step(self, batch, step):
    with py_utils.TrainingMode(True), py_utils.StepSeed(step):
      with tf.GradientTape() as tape:
        logits, collected = self._Forward(batch.image)
        # float64 throughout, as the task's loss in a float64 model.
        loss = tf.reduce_mean(losses.SoftmaxCrossEntropyLoss(
            logits, batch.label, SMOOTHING, CLASSES))
        # The regulariser of the whole model, once (not once per replica);
        # weight matrices only (rank >= 2), as l2_regularize_all=False.
        reg = L2 * tf.add_n([0.5 * tf.reduce_sum(tf.square(v))
                             for v in self.variables if v.shape.rank >= 2])
        total = loss + reg
    grads = tape.gradient(total, self.variables)
    merged = {}
    for layer, stats in collected:
      merged[layer] = stats if layer not in merged else merged[layer].Merge(
          stats)
    for layer, stats in merged.items():
      layer.UpdateMovingStats(stats)
    self.opt.Apply(LR, grads, self.variables)
    return loss, reg, grads

  def Step(self, batch, step):
    return self._step(batch, tf.constant(step, tf.int64))


def Replicated():
  return test_utils.ReplicatedSgdStep(
      TaskParams(), [['/CPU:0', '/CPU:1'], ['/CPU:2', '/CPU:3']], lr=LR)


def ByPath(layer, trainable_only=False):
  return {k.split('/', 1)[1] if k.startswith('model/') else k: v
          for k, v in base_layer.VariablesByPath(
              layer, trainable_only=trainable_only).items()}


class ReplicatedPipelineTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.oracle = OracleModel()
    cls.topology, cls.replicas, cls.opts, cls.step = Replicated()
    # The oracle's weights are the replicas' (same layer paths, same seeds).
    for path, var in ByPath(cls.oracle.model).items():
      var.assign(ByPath(cls.replicas[0])[path])
    cls.history, cls.regs = [], []
    for step in range(3):
      batch = Batch(step)
      got = cls.step(batch, tf.constant(step, tf.int64))
      want_loss, want_reg, want_grads = cls.oracle.Step(batch, step)
      cls.history.append((got, want_loss, want_grads))
      cls.regs.append(want_reg)

  def testReplicasAreOnTheirOwnDeviceGroups(self):
    """Stage k's weights and slots are on device k of their replica's group."""
    for r, task in enumerate(self.replicas):
      pipe = task.children.model
      self.assertEqual(pipe.devices, [f'/CPU:{r * K + k}' for k in range(K)])
      paths = {v.ref(): p for p, v in base_layer.VariablesByPath(task).items()}
      checked = 0
      for k, layers in enumerate(pipe.PartitionLayers()):
        want = f'/job:localhost/replica:0/task:0/device:CPU:{r * K + k}'
        for layer in layers:
          for var in base_layer.VariablesByPath(layer).values():
            self.assertEqual(var.device, want, msg=var.name)
            for slot in self.opts[r].slots.get(paths[var.ref()], {}).values():
              self.assertEqual(slot.device, want, msg=paths[var.ref()])
              checked += 1
      # One momentum slot per trainable variable.
      self.assertEqual(checked, len(task.trainable_variables))

  def testLossEqualsTheMicroBatchOracle(self):
    for step, (got, want_loss, _) in enumerate(self.history):
      test_utils.AssertAllCloseScaled(self, got['loss'], want_loss,
                                      test_utils.DEFAULT_RTOL[tf.float64],
                                      msg=f'step {step}')

  def testRegulariserIsAddedOnceToTheLoss(self):
    rtol = test_utils.DEFAULT_RTOL[tf.float64]
    for step, ((got, want_loss, _), want_reg) in enumerate(
        zip(self.history, self.regs)):
      self.assertGreater(float(want_reg), 1e-3 * float(want_loss))
      test_utils.AssertAllCloseScaled(self, got['l2_loss'], want_reg, rtol,
                                      msg=f'step {step}')
      test_utils.AssertAllCloseScaled(
          self, got['total_loss'], want_loss + want_reg,
          rtol, msg=f'step {step}')

  def testGradientNormEqualsTheOracle(self):
    for step, (got, _, want_grads) in enumerate(self.history):
      test_utils.AssertAllCloseScaled(
          self, got['grad_norm'], tf.linalg.global_norm(want_grads),
          test_utils.DEFAULT_RTOL[tf.float64], msg=f'step {step}')

  def testWeightsAfterThreeStepsEqualOracleAndAcrossReplicas(self):
    want = ByPath(self.oracle.model)
    for r, task in enumerate(self.replicas):
      got = ByPath(task)
      self.assertEqual(sorted(got), sorted(want))
      for path, var in got.items():
        # Weights and batch norm's moving statistics, all float64 (the
        # statistics of the R replicas added by the all-reduce instead of
        # in micro-batch order: float64 rounding).
        test_utils.AssertAllCloseScaled(self, var, want[path],
                                        test_utils.DEFAULT_RTOL[tf.float64],
                                        msg=f'replica {r} {path}')
    for a, b in zip(*[list(ByPath(t).values()) for t in self.replicas]):
      self.assertAllEqual(a, b)
    names = list(ByPath(self.replicas[0]))
    distribute.CheckReplicasEqual(
        self.topology, [list(ByPath(t).values()) for t in self.replicas],
        names, 'after 3 steps')

  def testReplicaDropoutMasksAreTheGlobalBatchRows(self):
    """Replica r's outputs (masks included) are rows [r n, (r+1) n)."""
    batch = Batch(7)
    want = self.oracle.Outputs(batch.image, 7)

    def Replica(x):
      local = distribute.LocalReplicaIndex(self.topology)
      rows = distribute.ShardRows(x, local, R)
      # Collected and dropped: this forward must not move the averages that
      # testWeightsAfterThreeSteps compares.
      with py_utils.ReplicaExampleOffset(BATCH // R), \
          py_utils.CollectBatchStats():
        return self.replicas[local].children.model.FPropDefaultTheta(rows)

    @tf.function(autograph=False)
    def Run(x):
      with py_utils.TrainingMode(True), py_utils.StepSeed(7):
        ctx = py_utils.CaptureContext()
        return self.topology.strategy.run(py_utils.WithContext(ctx, Replica),
                                          args=(x,))
    outs = self.topology.strategy.experimental_local_results(Run(batch.image))
    # The oracle's weights equal the replicas' (checked above).
    test_utils.AssertAllCloseScaled(self, tf.concat(outs, 0), want,
                                    test_utils.DEFAULT_RTOL[tf.float64])
    # Dropout is on: half the masks of replica 1 differ from replica 0's.
    self.assertNotAllClose(outs[0], outs[1])

  def testCheckReplicasEqualNamesTheDifferingVariable(self):
    topology, replicas, _, _ = Replicated()
    variables = [list(ByPath(t).values()) for t in replicas]
    names = list(ByPath(replicas[0]))
    distribute.CheckReplicasEqual(topology, variables, names, 'at init')
    index = names.index('fc1/w')
    variables[1][index].assign_add(tf.ones_like(variables[1][index]) * 1e-12)
    with self.assertRaisesRegex(RuntimeError, r'after a test.*fc1/w'):
      distribute.CheckReplicasEqual(topology, variables, names,
                                    'after a test')


class ReplicaParamsTest(tf.test.TestCase):

  def testRejectsExplicitDevices(self):
    p = TaskParams()
    p.model.devices = ['/CPU:0', '/CPU:1']
    with self.assertRaisesRegex(ValueError, 'leave devices=None'):
      distribute.ReplicaParams(p, ['/CPU:2', '/CPU:3'])

  def testRejectsTooSmallGroup(self):
    with self.assertRaisesRegex(ValueError, '2 partitions but the device '
                                'group'):
      distribute.ReplicaParams(TaskParams(), ['/CPU:2'])

  def testNumPartitionsIsTheDevicesOfEachPipeline(self):
    fc = [linear.FCLayer.Params().Set(name=f'fc{i}', input_dim=2,
                                      output_dim=2) for i in range(4)]
    auto = pipeline.TensorPipeLayer.Params().Set(
        name='auto', layers=fc, num_partitions=3)
    manual = pipeline.TensorPipeLayer.Params().Set(
        name='manual', partitions=[fc[:1], fc[1:2], fc[2:3], fc[3:]])
    interleaved = manual.Copy().Set(name='inter', schedule='interleaved_1f1b',
                                    num_stages_per_device=2)
    zb_v = manual.Copy().Set(name='zbv', schedule='zb_v')
    self.assertEqual([distribute.NumPartitions(pipe)
                      for pipe in (auto, manual, interleaved, zb_v)],
                     [3, 4, 2, 2])
    p = TaskParams()
    self.assertEqual(distribute.MaxNumPartitions(p), 2)
    p.model = manual
    self.assertEqual(distribute.MaxNumPartitions(p), 4)
    p.model = fc[0]
    self.assertEqual(distribute.MaxNumPartitions(p), 1)

  def testShardRowsRejectsIndivisibleBatch(self):
    with self.assertRaisesRegex(ValueError, 'global batch size 6 is not '
                                'divisible by 4 replicas'):
      distribute.ShardRows(NestedMap(x=tf.zeros([6, 2])), 0, 4)

  def testMakeTopologyRejectsReplicasWithACluster(self):
    from tensorpipe import cluster  # pylint: disable=g-import-not-at-top
    workers = cluster.FromFlags('127.0.0.1:1,127.0.0.1:2', 0)
    with self.assertRaisesRegex(ValueError, r'--num_replicas=2 with a '
                                r'cluster.*\(2\); drop --num_replicas'):
      distribute.MakeTopology(2, 2, workers)
    for bad in (0, True, 1.5):
      with self.assertRaisesRegex(
          ValueError, f'num_replicas={bad!r} must be a positive int'):
        distribute.MakeTopology(bad, 2)

  def testMakeTopologyNeedsRTimesKDevices(self):
    with self.assertRaisesRegex(ValueError, r'need 18 devices.*'
                                r'--num_cpu_devices=18'):
      distribute.MakeTopology(9, 2)

  def testTrainerChecksTheGlobalBatchAgainstTheReplicas(self):
    # pylint: disable=g-import-not-at-top
    from tensorpipe import model_registry
    from tensorpipe import overrides
    from tensorpipe import trainer_lib
    topology = distribute.LocalTopology([['/CPU:0', '/CPU:1'],
                                         ['/CPU:2', '/CPU:3']])
    for override, error in (
        ('input.batch_size=15', r'input.batch_size=15 is not divisible by '
         r'the 2 replicas'),
        ('task.model.num_micro_batches=16', r'batch_size=8 does not fit the '
         r'pipeline.*16')):
      p = model_registry.GetExperiment('consistency.Consistency16'
                                      ).ModelParams()
      overrides.ApplyOverrides(p, 'task.model.num_partitions=2; ' + override)
      trainer = trainer_lib.Trainer(p, self.get_temp_dir(), topology=topology)
      with self.assertRaisesRegex(ValueError, error):
        trainer.CheckInputs(train=True, evaluate=False)

  def testChecksumsSeeOneUlp(self):
    a = tf.Variable(tf.ones([3, 3], tf.float32))
    b = tf.Variable(tf.ones([3, 3], tf.float32))
    self.assertAllEqual(distribute.Checksums([a]), distribute.Checksums([b]))
    b.assign(tf.tensor_scatter_nd_update(
        b, [[2, 1]], [np.nextafter(np.float32(1), np.float32(2))]))
    self.assertNotAllEqual(distribute.Checksums([a]),
                           distribute.Checksums([b]))


class PairwiseSumTest(tf.test.TestCase):
  """grad_sum='pairwise': R = 2 replicas x T = 4 train bit for bit like one
  process with T = 8 (grad_sum.py), in float32, with batch norm, dropout
  and an L2 regulariser; the sequential sum does not."""

  def _Run(self, grad_sum, groups, num_micro_batches):
    batch = 32   # micro-batches of 4 either way
    pipe = pipeline.TensorPipeLayer.Params().Set(
        name='TensorPipe', layers=Layers(), num_partitions=K,
        num_micro_batches=num_micro_batches,
        input_shapes=[[batch // len(groups), 5]], grad_sum=grad_sum)
    p = tasks.ClassificationTask.Params().Set(
        name='task', model=pipe, num_classes=CLASSES, input_key='image',
        label_smoothing=SMOOTHING)
    p.train.l2_regularizer_weight = 1e-2
    _, replicas, _, step = test_utils.ReplicatedSgdStep(p, groups, lr=LR)
    losses = []
    for i in range(3):
      x = tf.random.stateless_normal([batch, 5], seed=[i, 1])
      labels = tf.random.stateless_uniform([batch], seed=[i, 2],
                                           maxval=CLASSES, dtype=tf.int32)
      out = step(NestedMap(image=x, label=labels), tf.constant(i, tf.int64))
      losses.append(float(out['loss']))
    return losses, [{k: v.numpy() for k, v in ByPath(r, True).items()}
                    for r in replicas]

  def testTwoReplicasEqualOneProcessBitForBit(self):
    one, two = [['/CPU:0', '/CPU:1']], [['/CPU:0', '/CPU:1'],
                                         ['/CPU:2', '/CPU:3']]
    _, (want,) = self._Run('pairwise', one, 8)
    _, got = self._Run('pairwise', two, 4)
    for r, weights in enumerate(got):
      self.assertEqual(sorted(weights), sorted(want))
      for path, value in weights.items():
        self.assertAllEqual(value, want[path], msg=f'replica {r} {path}')
    # The control: summed sequentially, the replicas' halves are added in
    # another order than the single process's running sum.
    _, (seq_one,) = self._Run('sequential', one, 8)
    _, seq_two = self._Run('sequential', two, 4)
    self.assertTrue(any(not np.array_equal(seq_two[0][k], seq_one[k])
                        for k in seq_one))

  def testPairwiseWithoutExplicitRecomputeIsRejected(self):
    for settings in (dict(recompute=False),
                     dict(recompute_impl='tf_recompute_grad')):
      with self.subTest(**settings):
        with self.assertRaisesRegex(ValueError, "grad_sum='pairwise' sums in "
                                    'the explicit recompute loops'):
          pipeline.TensorPipeLayer.Params().Set(
              name='p', layers=Layers(), num_partitions=2,
              num_micro_batches=2, input_shapes=[[8, 5]],
              grad_sum='pairwise', **settings).Instantiate()
    with self.assertRaisesRegex(ValueError, "grad_sum='tree' is not one of"):
      pipeline.TensorPipeLayer.Params().Set(
          name='p', layers=Layers(), num_partitions=2, num_micro_batches=2,
          input_shapes=[[8, 5]], grad_sum='tree').Instantiate()


if __name__ == '__main__':
  tf.test.main()
