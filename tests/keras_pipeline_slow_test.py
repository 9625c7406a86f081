"""Bigger grids of the Keras front door's transparency (slow tier).

keras_pipeline_test.py checks K=2 and K=4 at T=4 with recompute; here the
same plain-Keras oracle (tests/keras_testlib.py) is checked for K in
{1, 2, 4}, T in {1, 2, 8}, recompute on and off, and `fit` with a Keras
optimizer that keeps slots (SGD with Nesterov momentum) for K=4, T=8.
"""

import itertools

import keras
import tensorflow as tf

from tensorpipe import keras_params
from tensorpipe import keras_pipeline
from tensorpipe import test_utils
from tests import keras_testlib

test_utils.ConfigureTestDevices()

RTOL = test_utils.DEFAULT_RTOL[tf.float64]
LOGGED_RTOL = 1e-6  # Keras logs losses through a float32 metric
N = 32


class KerasPipelineGridTest(tf.test.TestCase):

  def testWrapperMatchesPlainKerasOnTheGrid(self):
    x, y = keras_testlib.Batch(N, seed=7)
    for k, t, recompute in itertools.product((1, 2, 4), (1, 2, 8),
                                             (True, False)):
      with self.subTest(k=k, t=t, recompute=recompute):
        model = keras_testlib.MakeSequential(seed=3)
        pipe = keras_params.BuildPipeline(model, k, t, batch_size=N,
                                            recompute=recompute)
        variables = keras_testlib.PipelineVariables(pipe)
        names = sorted(n for n, v in variables.items() if v.trainable)

        @tf.function(autograph=False)
        def Step(x, y, pipe=pipe, variables=variables, names=names):
          with tf.GradientTape() as tape:
            out = pipe.FPropDefaultTheta(x)
            loss = keras_testlib.Loss()(y, out)
          return out, loss, tape.gradient(loss, [variables[n] for n in names])
        out, loss, grads = Step(tf.constant(x), tf.constant(y))
        ref = keras_testlib.OracleStep(model, x, y, t, 0,
                                       keras_testlib.DropoutSeeds(pipe))
        paths = {n: w.path for n, w in keras_testlib.KerasPath(model).items()}
        test_utils.AssertAllCloseScaled(self, out, ref.outputs, RTOL)
        test_utils.AssertAllCloseScaled(self, loss, ref.loss, RTOL)
        scale = test_utils.MaxAbs(list(ref.grads.values()))
        for name, grad in zip(names, grads):
          test_utils.AssertAllCloseScaled(self, grad, ref.grads[paths[name]],
                                          RTOL, msg=name, scale=scale)
        for bn, stats in ref.moving.items():
          for stat, value in stats.items():
            test_utils.AssertAllCloseScaled(
                self, variables[f'{bn}/{stat}'], value, RTOL, msg=stat)

  def testFitWithMomentumMatchesReferenceLoopK4T8(self):
    steps, k, t = 10, 4, 8
    model = keras_testlib.MakeSequential(seed=4)
    pipe = keras_pipeline.TensorPipeModel(model, num_partitions=k,
                                          num_micro_batches=t, batch_size=N)

    def Optimizer():
      return keras.optimizers.SGD(0.125, momentum=0.5, nesterov=True)
    pipe.compile(Optimizer(), keras_testlib.Loss())
    xs, ys = keras_testlib.Batch(N * steps, seed=8)
    data = tf.data.Dataset.from_tensor_slices((xs, ys)).batch(
        N, drop_remainder=True).repeat()
    history = pipe.fit(data, epochs=steps, steps_per_epoch=1, verbose=0)
    ref_model = keras_testlib.MakeSequential(seed=4)
    optimizer = Optimizer()
    seeds = keras_testlib.DropoutSeeds(pipe.pipeline)
    losses = []
    for s in range(steps):
      ref = keras_testlib.OracleStep(ref_model, xs[s * N:(s + 1) * N],
                                     ys[s * N:(s + 1) * N], t, s, seeds)
      losses.append(ref.loss)
      optimizer.apply([ref.grads[v.path] for v in ref_model.trainable_weights],
                      ref_model.trainable_weights)
      keras_testlib.SetMovingStats(ref_model, ref.moving)
    test_utils.AssertAllCloseScaled(self, history.history['loss'], losses,
                                    LOGGED_RTOL)
    theirs = keras_testlib.KerasPath(ref_model)
    for name, var in keras_testlib.PipelineVariables(pipe.pipeline).items():
      test_utils.AssertAllCloseScaled(self, var, theirs[name].numpy(), RTOL,
                                      msg=name)


if __name__ == '__main__':
  tf.test.main()
