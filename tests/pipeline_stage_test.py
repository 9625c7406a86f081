"""Tests for tensorpipe.pipeline_stage: boundary specs and flat stage calls."""

import dataclasses

import tensorflow as tf

from tensorpipe import microbatch
from tensorpipe import pipeline_stage
from tensorpipe import test_utils
from tensorpipe.layers import linear
from tensorpipe.layers import normalization

test_utils.ConfigureTestDevices()


def _Stages():
  """fc (3 -> 4) | batch norm (4) + int-cast ids: two stages on two devices."""
  fc = linear.FCLayer.Params().Set(
      name='fc', input_dim=3, output_dim=4, activation='NONE').Instantiate()
  bn = normalization.BatchNormLayer.Params().Set(
      name='bn', dim=4).Instantiate()
  return [pipeline_stage.Stage(0, [fc], '/CPU:0'),
          pipeline_stage.Stage(1, [bn], '/CPU:1')]


class InferSpecsTest(tf.test.TestCase):

  def testSpecsChainThroughTheStages(self):
    stages = _Stages()
    thetas = [[layer.theta for layer in s.layers] for s in stages]
    stacked = microbatch.Split((tf.zeros([64, 3]),), 4, 0)
    specs = pipeline_stage.InferSpecs(stages, thetas, stacked, 16)
    self.assertLen(specs, 2)
    self.assertEqual(specs[0].in_specs, (tf.TensorSpec([16, 3]),))
    self.assertEqual(specs[0].out_specs, (tf.TensorSpec([16, 4]),))
    self.assertEqual(specs[1].in_specs, specs[0].out_specs)
    self.assertEqual(specs[0].stats_layers, ())
    self.assertEqual(specs[1].stats_layers, (stages[1].layers[0],))
    # count (scalar), total and total of squares per channel.
    self.assertEqual([s.shape.as_list() for s in specs[1].stats_specs[0]],
                     [[], [4], [4]])
    self.assertEqual(specs[1].float_in, [0])
    self.assertEqual(specs[1].DxSpecs(), [tf.TensorSpec([16, 4])])
    self.assertEqual(specs[1].StatsSpecs(), [list(specs[1].stats_specs[0])])

  def testSpecsAreFrozen(self):
    stages = _Stages()[:1]
    thetas = [[stages[0].layers[0].theta]]
    stacked = microbatch.Split((tf.zeros([4, 3]),), 2, 0)
    spec, = pipeline_stage.InferSpecs(stages, thetas, stacked, 2)
    with self.assertRaises(dataclasses.FrozenInstanceError):
      spec.in_specs = ()  # pytype: disable=not-writable

  def testIntegerInputsGetNoGradient(self):
    specs = pipeline_stage.StageSpecs(
        in_struct=None, in_specs=(tf.TensorSpec([2], tf.int32),
                                  tf.TensorSpec([2, 3], tf.bfloat16)),
        out_struct=None, out_specs=(tf.TensorSpec([2], tf.int64),),
        stats_layers=(), stats_specs=())
    self.assertEqual(specs.float_in, [1])
    self.assertEqual(specs.float_out, [])


class FlatCallTest(tf.test.TestCase):

  def testFlatCallEqualsCall(self):
    stages = _Stages()
    thetas = [[layer.theta for layer in s.layers] for s in stages]
    x = tf.random.stateless_normal([64, 3], seed=[1, 2])
    stacked = microbatch.Split((x,), 4, 0)
    specs = pipeline_stage.InferSpecs(stages, thetas, stacked, 16)
    flat_in = [x[32:48]]
    for stage, spec, theta in zip(stages, specs, thetas):
      out, collected = stage.Call(theta, (flat_in[0],), 32)
      flat_out, stats = stage.FlatCall(spec.in_struct, theta, flat_in,
                                       tf.constant(2), 16)
      self.assertAllEqual(flat_out, [out])
      self.assertEqual(len(stats), len(collected))
      for got, (_, want) in zip(stats, collected):
        for g, w in zip(got, want.Flatten(), strict=True):
          self.assertAllEqual(g, w)
      flat_in = flat_out


if __name__ == '__main__':
  tf.test.main()
