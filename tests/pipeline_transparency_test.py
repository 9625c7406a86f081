"""TensorPipeLayer against oracles beyond the weight gradients.

- Gradients with respect to the pipeline's inputs equal those of the layers
  run unpipelined on each micro-batch (float64).
- bfloat16 activations: gradients equal the float32 pipeline's within the
  rounding that bfloat16 arithmetic explains.
- Batch-norm moving averages after steps with K=3, T=6 and K=4, T=8 equal a
  NumPy computation from the statistics of all micro-batches.
- Recording a timeline changes no output, gradient or moving average (bitwise).
"""

import numpy as np
import tensorflow as tf

import tensorpipe
from tensorpipe import py_utils
from tensorpipe import test_utils
from tensorpipe import timeline
from tensorpipe.layers import composite
from tensorpipe.layers import linear
from tensorpipe.layers import normalization

test_utils.ConfigureTestDevices()


def _Pipe(**kwargs):
  return tensorpipe.TensorPipeLayer.Params().Set(
      name='TensorPipe', **kwargs).Instantiate()


def _InFloat64(layer_ps):
  return [lp.Copy().Set(dtype=tf.float64) for lp in layer_ps]


def _Loss(out):
  # Not a plain mean: the gradient differs from example to example.
  return 0.5 * tf.reduce_sum(tf.square(out)) + tf.reduce_sum(tf.sin(out))


def _OutputAndInputGrad(layer, x, num_micro_batches=None):
  """(outputs, d loss / d x); with num_micro_batches, `layer` is run on each
  micro-batch (plain slices of x) and the outputs concatenated."""

  @tf.function(autograph=False)
  def Step(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      if num_micro_batches is None:
        out = layer.FPropDefaultTheta(x)
      else:
        size = int(x.shape[0]) // num_micro_batches
        outs = []
        for t in range(num_micro_batches):
          with py_utils.ExampleOffset(t * size):
            outs.append(layer.FPropDefaultTheta(x[t * size:(t + 1) * size]))
        out = tf.concat(outs, 0)
      loss = _Loss(out)
    return out, tape.gradient(loss, x)
  with py_utils.TrainingMode(True), py_utils.StepSeed(7):
    return Step(x)


class InputGradientTest(tf.test.TestCase):

  def testInputGradientsEqualUnpipelinedOracleInFloat64(self):
    layer_ps = _InFloat64(test_utils.ConvTestModel())
    x = tf.random.stateless_normal([8, 8, 8, 2], seed=[5, 6], dtype=tf.float64)
    ref = composite.SequentialLayer.Params().Set(
        name='Sequential', sub=layer_ps).Instantiate()
    rtol = test_utils.DEFAULT_RTOL[tf.float64]
    for k, t, settings in [(1, 1, {}), (3, 4, {}), (2, 4, dict(recompute=False)),
                           (2, 2, dict(recompute_impl='tf_recompute_grad'))]:
      with self.subTest(k=k, t=t, **settings):
        pipe = _Pipe(layers=layer_ps, num_partitions=k, num_micro_batches=t,
                     input_shapes=[[8, 8, 8, 2]], **settings)
        out, dx = _OutputAndInputGrad(pipe, x)
        ref_out, ref_dx = _OutputAndInputGrad(ref, x, num_micro_batches=t)
        self.assertEqual(dx.dtype, tf.float64)
        self.assertGreater(test_utils.MaxAbs(ref_dx), 0.0)
        test_utils.AssertAllCloseScaled(self, out, ref_out, rtol, msg='out')
        test_utils.AssertAllCloseScaled(self, dx, ref_dx, rtol, msg='dx')


class Bfloat16Test(tf.test.TestCase):

  def testBfloat16GradientsEqualFloat32PipelineWithinBfloat16Rounding(self):
    num_layers = 4
    layer_ps = [linear.FCLayer.Params().Set(name=f'fc{i}', input_dim=16,
                                            output_dim=16, activation='TANH')
                for i in range(num_layers)]
    x = tf.random.stateless_normal([8, 16], seed=[1, 1])

    def Run(fprop_dtype):
      pipe = _Pipe(layers=layer_ps, num_partitions=2, num_micro_batches=2,
                   input_shapes=[[8, 16]], fprop_dtype=fprop_dtype)
      with py_utils.TrainingMode(True):
        out, _, grads = test_utils.LossAndGrads(
            pipe, lambda o: _Loss(tf.cast(o, tf.float32)), x)
      names = {v.ref(): n for n, v in test_utils.VariablesByName(pipe).items()}
      return out, {names[v.ref()]: g
                   for v, g in zip(pipe.trainable_variables, grads)}

    out16, grads16 = Run(tf.bfloat16)
    out32, grads32 = Run(None)
    self.assertEqual(out16.dtype, tf.bfloat16)
    self.assertEqual(sorted(grads16), sorted(grads32))
    # bfloat16 keeps 8 significant bits: each rounding changes a value by at
    # most u = 2^-8 of its size. Along a forward path a value is rounded
    # about 3 times per layer (input cast, matmul, bias add); the backward
    # pass rounds as often again and multiplies by the forward values. The
    # worst case adds the relative errors: 2 * 3 * num_layers * u = 9.4% of
    # the largest value here, while a real error (a missing micro-batch, a
    # wrong partition's gradient) changes gradients by O(100%).
    u = 2.0 ** -8
    rtol = 2 * 3 * num_layers * u
    test_utils.AssertAllCloseScaled(self, tf.cast(out16, tf.float32), out32,
                                    3 * num_layers * u, msg='outputs')
    scale = test_utils.MaxAbs(list(grads32.values()))
    differs = 0.0
    for name, g32 in grads32.items():
      self.assertEqual(grads16[name].dtype, tf.float32, name)
      test_utils.AssertAllCloseScaled(self, grads16[name], g32, rtol,
                                      msg=name, scale=scale)
      differs = max(differs, float(tf.reduce_max(tf.abs(grads16[name] -
                                                        g32))))
    # The bfloat16 run did compute in bfloat16.
    self.assertGreater(differs, 1e-4 * scale)


def _NumpyBatchNorm(h, num_micro_batches, eps):
  """BN output with each micro-batch's statistics (gamma 1, beta 0)."""
  out = []
  for part in np.split(h, num_micro_batches):
    out.append((part - part.mean(0)) / np.sqrt(part.var(0) + eps))
  return np.concatenate(out)


class MovingAveragesTest(tf.test.TestCase):

  def _Check(self, partitions, num_micro_batches):
    """FC, BN, FC, BN split as `partitions` (lists of layer indices)."""
    decay, eps = 0.9, 1e-3
    layer_ps = [
        linear.FCLayer.Params().Set(name='fc0', input_dim=3, output_dim=3,
                                    activation='NONE'),
        normalization.BatchNormLayer.Params().Set(name='bn0', dim=3,
                                                  decay=decay, epsilon=eps),
        linear.FCLayer.Params().Set(name='fc1', input_dim=3, output_dim=3,
                                    activation='NONE'),
        normalization.BatchNormLayer.Params().Set(name='bn1', dim=3,
                                                  decay=decay, epsilon=eps),
    ]
    pipe = _Pipe(partitions=[[layer_ps[i] for i in part]
                             for part in partitions],
                 num_micro_batches=num_micro_batches)
    layers = {l.layer_name: l for part in pipe.PartitionLayers()
              for l in part}
    w = {name: {k: v.numpy().astype(np.float64) for k, v in l.vars.items()}
         for name, l in layers.items()}
    n = 4 * num_micro_batches
    xs = [tf.random.stateless_normal([n, 3], seed=[s, 2]) * 3.0 + 1.0
          for s in range(2)]

    @tf.function(autograph=False)
    def Step(x):
      with tf.GradientTape() as tape:
        loss = _Loss(pipe.FPropDefaultTheta(x))
      return tape.gradient(loss, pipe.trainable_variables)

    want = {name: (np.zeros(3), np.ones(3)) for name in ('bn0', 'bn1')}
    for x in xs:  # Two steps: the averages accumulate.
      with py_utils.TrainingMode(True):
        Step(x)
      # NumPy: the statistics of the whole mini-batch update the averages;
      # the layers normalise with each micro-batch's own statistics.
      h0 = x.numpy().astype(np.float64) @ w['fc0']['w'] + w['fc0']['b']
      y0 = _NumpyBatchNorm(h0, num_micro_batches, eps)
      h1 = y0 @ w['fc1']['w'] + w['fc1']['b']
      for name, h in (('bn0', h0), ('bn1', h1)):
        mean, var = want[name]
        want[name] = (decay * mean + (1 - decay) * h.mean(0),
                      decay * var + (1 - decay) * h.var(0))
    for name in ('bn0', 'bn1'):
      bn = layers[name]
      # Batch norm reduces in float32 (eps 6e-8) over n <= 32 values.
      self.assertAllClose(bn.vars.moving_mean, want[name][0], rtol=1e-5,
                          atol=1e-5, msg=name)
      self.assertAllClose(bn.vars.moving_variance, want[name][1], rtol=1e-5,
                          atol=1e-5, msg=name)

  def testThreePartitionsSixMicroBatches(self):
    self._Check([[0], [1, 2], [3]], 6)

  def testFourPartitionsEightMicroBatches(self):
    self._Check([[0], [1], [2], [3]], 8)


def _MovingVariables(layer):
  return [v for v in layer.variables if not v.trainable]


class TimelineLeavesResultsUnchangedTest(tf.test.TestCase):

  def testOutputsGradientsAndMovingAveragesAreBitwiseEqual(self):
    x = tf.random.stateless_normal([6, 8, 8, 2], seed=[3, 3])
    for recompute in (True, False):
      with self.subTest(recompute=recompute):
        pipe = _Pipe(layers=test_utils.ConvTestModel(), num_partitions=2,
                     num_micro_batches=3, input_shapes=[[6, 8, 8, 2]],
                     recompute=recompute)
        variables = pipe.trainable_variables
        moving = _MovingVariables(pipe)
        self.assertNotEmpty(moving)
        initial = [v.numpy() for v in moving]

        def Step(x):
          with tf.GradientTape() as tape:
            out = pipe.FPropDefaultTheta(x)
            loss = _Loss(out)
          rec = timeline.Active()
          return (out, tape.gradient(loss, variables),
                  rec.Tensors() if rec else {})

        def Run(record):
          for v, value in zip(moving, initial):
            v.assign(value)
          with py_utils.TrainingMode(True), py_utils.StepSeed(1):
            if record:
              with timeline.Record():
                fn = tf.function(Step).get_concrete_function(x)
            else:
              fn = tf.function(Step).get_concrete_function(x)
          out, grads, stamps = fn(x)
          self.assertEqual(bool(stamps), record)
          return [out] + list(grads) + [v.read_value() for v in moving]

        plain, recorded = Run(False), Run(True)
        self.assertLen(recorded, len(plain))
        for i, (a, b) in enumerate(zip(recorded, plain)):
          self.assertAllEqual(a, b, msg=f'result {i}')


if __name__ == '__main__':
  tf.test.main()
