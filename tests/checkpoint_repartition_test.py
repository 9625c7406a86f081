"""A checkpoint written with K partitions restores with K' (weights + slots).

Every weight and every optimizer slot is compared by variable path with the
state that was saved, then one more training step in both runs is compared
again: momentum or Adam moments on the wrong layer show up as a different
update. The models have layers of equal shape (so a slot on the wrong layer
restores without a shape error) and of mixed shapes.
"""

import os
import tempfile

import numpy as np
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import optimizers
from tensorpipe import pipeline
from tensorpipe import test_utils
from tensorpipe.layers import linear

test_utils.ConfigureTestDevices()

_BATCH = 4
_NUM_MICRO_BATCHES = 2
_SAVED_K = 4
_RESTORED_KS = (1, 2, 3, 12)
_LRS = [0.05, 0.02, 0.08, 0.03]  # three steps before saving, one after


def _EqualLayers():
  """16 FC layers [8, 8]: every slot fits every layer."""
  return [linear.FCLayer.Params().Set(name=f'fc{i}', input_dim=8,
                                      output_dim=8, activation='TANH')
          for i in range(16)]


def _MixedLayers():
  """13 FC layers of different shapes, some without bias."""
  dims = [6, 10, 4, 12, 8, 5, 9, 7, 11, 3, 6, 8, 4, 2]
  return [linear.FCLayer.Params().Set(
      name=f'fc{i}', input_dim=dims[i], output_dim=dims[i + 1],
      bias=i % 3 != 1, activation='TANH') for i in range(len(dims) - 1)]


def _Model(layer_ps, num_partitions, seed):
  """A TensorPipeLayer of `layer_ps` in K contiguous partitions."""
  bounds = np.linspace(0, len(layer_ps), num_partitions + 1).astype(int)
  partitions = [layer_ps[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
  return pipeline.TensorPipeLayer.Params().Set(
      name='TensorPipe', partitions=partitions, random_seed=seed,
      num_micro_batches=_NUM_MICRO_BATCHES,
      # What a checkpoint holds does not depend on recompute; without it the
      # K=4 and K=12 steps trace in about half the time.
      recompute=False,
      devices=[f'/CPU:{k % test_utils.NUM_TEST_DEVICES}'
               for k in range(num_partitions)]).Instantiate()


def _Batch(layer_ps):
  rng = np.random.RandomState(0)
  x = rng.randn(_BATCH, layer_ps[0].input_dim).astype(np.float32)
  y = rng.randn(_BATCH, layer_ps[-1].output_dim).astype(np.float32)
  return tf.constant(x), tf.constant(y)


def _NewOptimizer(model, opt_p):
  opt = opt_p.Instantiate()
  opt.Build(base_layer.VariablesByPath(model, trainable_only=True))
  return opt


def _StepFn(model, opt):
  """A training step; returns the gradients by variable path."""
  # tf.Module orders trainable_variables by attribute name (partition_0,
  # partition_1, partition_10, partition_11, partition_2, ...): a different
  # order for every K.
  variables = model.trainable_variables
  path_of = {v.ref(): p for p, v in base_layer.VariablesByPath(model).items()}
  paths = [path_of[v.ref()] for v in variables]

  @tf.function(autograph=False)
  def Step(lr, x, y):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(model.FPropDefaultTheta(x) - y))
    grads = tape.gradient(loss, variables)
    opt.Apply(lr, grads, variables)
    return dict(zip(paths, grads))
  return Step


def _State(model, opt):
  """{path: value} of every weight and every slot ('<path>:<slot>')."""
  state = {}
  for path, var in base_layer.VariablesByPath(model).items():
    state[path] = var.numpy()
    for slot, value in opt.slots.get(path, {}).items():
      state[f'{path}:{slot}'] = value.numpy()
  state['iterations'] = opt.iterations.numpy()
  return state


class CheckpointRepartitionTest(tf.test.TestCase):

  def _AssertSameState(self, got, want, what):
    self.assertEqual(sorted(got), sorted(want), msg=what)
    differ = [k for k in want if not np.array_equal(got[k], want[k])]
    self.assertEqual(differ, [], msg=f'{what}: {len(differ)} of {len(want)} '
                     'tensors differ')

  # (layers, optimizer) -> _TrainAndSave's result: the K=4 run (its trace
  # is most of a test's time) is shared by the tests that restore it.
  _SAVED = {}

  def _TrainAndSave(self, layer_ps, opt_p):
    """K=4: trains, saves, steps once more; returns what restores compare."""
    key = (tuple((p.name, p.input_dim, p.output_dim, p.bias)
                 for p in layer_ps), opt_p.cls.__name__)
    if key not in self._SAVED:
      self._SAVED[key] = self._TrainAndSaveOnce(layer_ps, opt_p)
    return self._SAVED[key]

  def _TrainAndSaveOnce(self, layer_ps, opt_p):
    x, y = _Batch(layer_ps)
    model = _Model(layer_ps, _SAVED_K, seed=1)
    opt = _NewOptimizer(model, opt_p)
    step = _StepFn(model, opt)
    for lr in _LRS[:-1]:
      step(tf.constant(lr), x, y)
    path = tf.train.Checkpoint(model=model, optimizer=opt).save(
        os.path.join(tempfile.mkdtemp(), 'ckpt'))
    saved = _State(model, opt)
    grads = step(tf.constant(_LRS[-1]), x, y)
    stepped = _State(model, opt)
    self.assertNotAllClose(saved['fc0/w'], stepped['fc0/w'])
    return path, saved, grads, stepped

  def _Restore(self, layer_ps, opt_p, k, path, saved):
    # Another seed: the restore, not the initialisation, must set weights.
    model = _Model(layer_ps, k, seed=2)
    self.assertLen(model.PartitionLayers(), k)
    self.assertNotAllClose(base_layer.VariablesByPath(model)['fc0/w'],
                           saved['fc0/w'])
    opt = _NewOptimizer(model, opt_p)
    tf.train.Checkpoint(model=model, optimizer=opt).restore(
        path).assert_consumed()
    what = f'{opt_p.cls.__name__} K={_SAVED_K} -> {k}'
    self._AssertSameState(_State(model, opt), saved, what)
    return model, opt

  def _CheckRestoresUnderEveryK(self, layer_ps, opt_p):
    path, saved, grads, stepped = self._TrainAndSave(layer_ps, opt_p)
    for k in _RESTORED_KS:
      model, opt = self._Restore(layer_ps, opt_p, k, path, saved)
      # The saved run's next step, applied to this model's variables in its
      # own order (tracing the pipeline for every K would take minutes).
      by_path = base_layer.VariablesByPath(model)
      path_of = {v.ref(): p for p, v in by_path.items()}
      variables = model.trainable_variables
      opt.Apply(tf.constant(_LRS[-1]),
                [grads[path_of[v.ref()]] for v in variables], variables)
      self._AssertSameState(_State(model, opt), stepped,
                            f'{opt_p.cls.__name__} K={_SAVED_K} -> {k}, one '
                            'step later')

  def testRestoredPipelineTakesTheSameStep(self):
    # The whole step in the restored K=12 pipeline: its gradients too.
    layer_ps, opt_p = _EqualLayers(), optimizers.Adam.Params()
    path, saved, _, stepped = self._TrainAndSave(layer_ps, opt_p)
    model, opt = self._Restore(layer_ps, opt_p, 12, path, saved)
    _StepFn(model, opt)(tf.constant(_LRS[-1]), *_Batch(layer_ps))
    self._AssertSameState(_State(model, opt), stepped, 'K=4 -> 12, a step of '
                          'the restored pipeline')

  def testVariablePathsDoNotDependOnK(self):
    layer_ps = _MixedLayers()
    want = ([f'fc{i}/w' for i in range(len(layer_ps))] +
            [f'fc{i}/b' for i in range(len(layer_ps)) if i % 3 != 1])
    orders = set()
    for k in (1, 4, 12):
      model = _Model(layer_ps, k, seed=1)
      by_path = base_layer.VariablesByPath(model)
      self.assertCountEqual(by_path, want)
      self.assertEqual(base_layer.VariablePath(
          model.PartitionLayers()[-1][-1], 'w'), f'fc{len(layer_ps) - 1}/w')
      self.assertCountEqual([v.ref() for v in by_path.values()],
                            [v.ref() for v in model.trainable_variables])
      path_of = {v.ref(): p for p, v in by_path.items()}
      orders.add(tuple(path_of[v.ref()] for v in model.trainable_variables))
    # Position in trainable_variables is no key: it changes with K (so the
    # restores below do meet variables in another order).
    self.assertGreater(len(orders), 1)
    with self.assertRaisesRegex(ValueError, "has no variable 'x'; it has "
                                r"\['b', 'w'\]"):
      base_layer.VariablePath(model.PartitionLayers()[0][0], 'x')

  def testSgdMomentumEqualLayers(self):
    self._CheckRestoresUnderEveryK(_EqualLayers(), optimizers.SGD.Params())

  def testAdamEqualLayers(self):
    self._CheckRestoresUnderEveryK(_EqualLayers(), optimizers.Adam.Params())

  def testSgdMomentumMixedShapes(self):
    self._CheckRestoresUnderEveryK(_MixedLayers(), optimizers.SGD.Params())

  def testAdamMixedShapes(self):
    self._CheckRestoresUnderEveryK(_MixedLayers(), optimizers.Adam.Params())


if __name__ == '__main__':
  tf.test.main()
