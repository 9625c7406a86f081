"""Tests for tensorpipe.pipeline_stage (boundary specs, flat stage calls)
and tensorpipe.cell_algebra (what the executors' cells compute)."""

import dataclasses

import tensorflow as tf

from tensorpipe import cell_algebra
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


def _FcStage():
  """One FCLayer stage (3 -> 4, a py_utils.WeightOp matmul), its theta and
  specs for micro-batches of 2."""
  stage = _Stages()[0]
  theta = [stage.layers[0].theta]
  x = tf.random.stateless_normal([2, 3], seed=[3, 4])
  spec, = pipeline_stage.InferSpecs([stage], [theta], (x[None],), 2)
  return stage, theta, spec, x


class CellAlgebraTest(tf.test.TestCase):

  def testTapedCallVjpEqualsTapeGradient(self):
    stage, theta, spec, x = _FcStage()
    dy = tf.random.stateless_normal([2, 4], seed=[5, 6])
    flat = tf.nest.flatten(theta)
    cell = cell_algebra.TapedCall(
        stage, spec, theta, [x], tf.constant(0), 2, watch_inputs=True,
        watched=range(len(flat)), split=False,
        head=cell_algebra.FloatOutputs(spec), dys=[dy])
    dxs, dws = cell_algebra.Vjp(cell.tape, cell.ys, (cell.xs, flat),
                                cell.dys)
    with tf.GradientTape() as tape:
      tape.watch([x] + flat)
      y = stage.layers[0].FProp(theta[0], x)
    want = tape.gradient(y, [x] + flat, output_gradients=dy)
    self.assertAllClose(dxs[0], want[0])
    for got, w in zip(dws, want[1:], strict=True):
      self.assertAllClose(got, w)

  def testVjpGivesZerosForAnUnconnectedSource(self):
    a, b = tf.constant([1.0, 2.0]), tf.constant(3.0)
    with tf.GradientTape() as tape:
      tape.watch([a, b])
      y = 2.0 * a
    da, db = cell_algebra.Vjp(tape, [y], [a, b], None)
    self.assertAllEqual(da, [2.0, 2.0])
    self.assertAllEqual(db, 0.0)

  def testSplitBackwardThenWeightGradsEqualsTheWholeBackward(self):
    """I (no dw of the weight op) + W (dw from the kept x and dz) give the
    weight gradients of one whole backward cell."""
    stage, theta, spec, x = _FcStage()
    dy = tf.random.stateless_normal([2, 4], seed=[7, 8])
    flat = tf.nest.flatten(theta)
    ops = cell_algebra.TraceWeightOps(stage, spec, theta, 2)
    self.assertLen(ops, 1)
    self.assertEqual(flat[ops[0].index].shape, [3, 4])
    whole = cell_algebra.Watched(len(flat), ops, split=False)
    watched = cell_algebra.Watched(len(flat), ops, split=True)
    self.assertEqual(whole, list(range(len(flat))))
    self.assertNotIn(ops[0].index, watched)
    zeros = [tf.zeros_like(w) for w in flat]

    def Backward(watched, split):
      cell = cell_algebra.TapedCall(
          stage, spec, theta, [x], tf.constant(0), 2, watch_inputs=False,
          watched=watched, split=split,
          head=cell_algebra.FloatOutputs(spec), dys=[dy])
      zs = [call.z for call in cell.calls] if split else []
      _, dzs, dws = cell_algebra.Vjp(
          cell.tape, cell.ys, ([], zs, [flat[i] for i in watched]),
          cell.dys)
      return cell, dzs, cell_algebra.AccumulateAt(zeros, watched, dws)
    _, _, want = Backward(whole, False)
    cell, dzs, dtheta = Backward(watched, True)
    self.assertAllEqual(dtheta[ops[0].index], zeros[ops[0].index])
    got = cell_algebra.WeightGrads(ops, theta, [c.x for c in cell.calls],
                                   dzs, dtheta)
    for g, w in zip(got, want, strict=True):
      self.assertAllClose(g, w)

  def testCellCallAutodiffVariantsGiveThePlainGradient(self):
    stage, theta, spec, x = _FcStage()
    flat = tf.nest.flatten(theta)
    grads = []
    for autodiff in cell_algebra.AUTODIFF:
      call = cell_algebra.CellCall(stage, spec, theta, 2, autodiff)
      with tf.GradientTape() as tape:
        tape.watch([x] + flat)
        (y,), _ = call([x], tf.constant(0))
        loss = tf.reduce_sum(tf.sin(y))
      grads.append(tape.gradient(loss, [x] + flat))
    for other in grads[1:]:
      for g, w in zip(other, grads[0], strict=True):
        self.assertAllClose(g, w)

  def testCellCallRejectsAnUnknownAutodiff(self):
    stage, theta, spec, _ = _FcStage()
    with self.assertRaisesRegex(ValueError, "autodiff='tape'"):
      cell_algebra.CellCall(stage, spec, theta, 2, 'tape')

  def testAddAndZeros(self):
    zeros = cell_algebra.Zeros([tf.TensorSpec([2]), tf.TensorSpec([])])
    self.assertAllEqual(zeros[0], [0.0, 0.0])
    got = cell_algebra.Add([zeros, [zeros[1]]],
                           [[tf.ones([2]), 2.0], [3.0]])
    self.assertAllEqual(got[0][0], [1.0, 1.0])
    self.assertAllEqual(got[0][1], 2.0)
    self.assertAllEqual(got[1][0], 3.0)


if __name__ == '__main__':
  tf.test.main()
