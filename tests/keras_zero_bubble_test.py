"""Zero-bubble schedules on Keras layers through the Params route.

A Keras Sequential (Conv2D, Dense) and a functional model (EinsumDense,
Dense) made into TensorPipeLayer Params (keras_params.PipelineParams) train
under zb_h1 what GPipe trains on the same stages, bit for bit, and their
kernels' weight gradients run in the W cells (keras_weight_ops), none in I.
"""


import keras
import tensorflow as tf

from tensorpipe import keras_params
from tensorpipe import py_utils
from tensorpipe import test_utils
from tests import weight_op_testlib

test_utils.ConfigureTestDevices()

BATCH = 8


def _Sequential():
  """[conv] | [flatten, dense, dense]: 1 | 2 kernels (Conv2D, Dense).

  The conv has no bias: with oneDNN on (TF's default on x86), a conv
  bias's gradient in GPipe's backward cell (next to the filter gradient)
  differs from ZB-H1's (in I, the filter gradient in W) in the last bit
  (rel 2e-7); with TF_ENABLE_ONEDNN_OPTS=0 they are equal. Measured, the
  rewrite behind it not pinned down.
  """
  return keras.Sequential([
      keras.Input((6, 6, 2)),
      keras.layers.Conv2D(3, 3, padding='same', activation='relu',
                          use_bias=False, name='conv'),
      keras.layers.Flatten(name='flat'),
      keras.layers.Dense(8, activation='tanh', name='fc1'),
      keras.layers.Dense(3, name='fc2')])


def _Functional():
  """[proj (EinsumDense), fc (Dense)] | [out (Dense)], K=2 by cut_after."""
  inp = keras.Input((4, 6))
  h = keras.layers.EinsumDense('bsd,de->bse', output_shape=(None, 5),
                               bias_axes='e', activation='relu',
                               name='proj')(inp)
  h = keras.layers.Dense(5, activation='tanh', name='fc')(h)
  out = keras.layers.Dense(2, name='out')(keras.layers.Add(name='skip')(
      [h, keras.layers.Dense(5, name='side')(inp)]))
  return keras.Model(inp, out)


def _Params(model, schedule, t, **kw):
  return keras_params.PipelineParams(
      model, num_partitions=2, num_micro_batches=t, batch_size=BATCH,
      schedule=schedule, random_seed=3, **kw)


def _SquareLoss(out, unused_targets=None):
  return 0.5 * tf.reduce_sum(tf.square(out))


class KerasZeroBubbleEqualsGPipeTest(tf.test.TestCase):

  def _AssertBitwise(self, model, x, t, **kw):
    want_pipe = _Params(model, 'gpipe', t, **kw).Instantiate()
    got_pipe = _Params(model, 'zb_h1', t, **kw).Instantiate()
    for a, b in zip(want_pipe.variables, got_pipe.variables):
      self.assertEqual(a.name, b.name)
      b.assign(a)

    with py_utils.TrainingMode(True):
      want, got = weight_op_testlib.GPipeAndLossInsideSteps(
          want_pipe, got_pipe, x, _SquareLoss, 16.0)
    # The loss: a sum over the batch against sums of per-micro-batch sums.
    self.assertAllClose(want[0], got[0], rtol=1e-6)
    names = [v.name for v in want_pipe.trainable_variables]
    self.assertLen(got, 1 + len(names))
    for name, a, b in zip(names, want[1:], got[1:]):
      self.assertAllEqual(a, b, msg=name)
      self.assertGreater(float(tf.reduce_max(tf.abs(a))), 0.0, msg=name)

  def testSequentialUnderZeroBubbleTrainsGPipesBits(self):
    """Conv2D | Dense, Dense: ZB-H1, K=2, T=4."""
    self._AssertBitwise(_Sequential(), tf.random.stateless_normal(
        [BATCH, 6, 6, 2], [1, 2]), 4, partition_sizes=[1, 3])

  def testFunctionalUnderZeroBubbleTrainsGPipesBits(self):
    """EinsumDense, Dense | Dense (a KerasGraphSegment each): ZB-H1, K=2,
    T=2."""
    self._AssertBitwise(_Functional(), tf.random.stateless_normal(
        [BATCH, 4, 6], [3, 4]), 2, cut_after=['fc'])


class KerasSplitBackwardGraphTest(tf.test.TestCase):

  def testKerasKernelsTakeTheirWeightGradientsInWCells(self):
    """Per ZB-H1 cell kind, the weight-gradient kernels each cell runs:
    the conv's filter gradient on stage 0, the two Dense matmuls on stage
    1, all in W; none in F or I."""
    pipe = _Params(_Sequential(), 'zb_h1', 2,
                   partition_sizes=[1, 3]).Instantiate()
    x = tf.zeros([4, 6, 6, 2])
    self.assertEqual(weight_op_testlib.WeightGradientKernelsPerCellKind(
        pipe, x, _SquareLoss), {'W': [1, 2]})


if __name__ == '__main__':
  tf.test.main()
