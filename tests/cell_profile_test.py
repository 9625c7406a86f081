"""tensorpipe.cell_profile: what a profile holds (no timing asserted)."""

import tensorflow as tf

from tensorpipe import cell_profile
from tensorpipe import cost_model
from tensorpipe import pipeline
from tensorpipe import schedule_builders
from tensorpipe import test_utils
from tensorpipe.layers import linear

test_utils.ConfigureTestDevices()


def _FcPipe(num_layers, dim=8, batch=8):
  """(a TensorPipeLayer of FC dim -> dim layers, K=1, T=4; its batch)."""
  layers = [linear.FCLayer.Params().Set(name=f'fc{i}', input_dim=dim,
                                        output_dim=dim)
            for i in range(num_layers)]
  layer = pipeline.TensorPipeLayer.Params().Set(
      name=f'pipe{dim}', layers=layers, num_partitions=1,
      num_micro_batches=4, input_shapes=[[batch, dim]]).Instantiate()
  return layer, tf.random.stateless_uniform([batch, dim], seed=[1, 2])


def _Fc8Pipe(num_layers):
  return _FcPipe(num_layers)


def _WidePipe(num_layers):
  """FC 256 -> 256 on 64 rows: cells long enough to measure above a call's
  cost (an 8 -> 8 layer's cells can time as 0, which leaves nothing to
  calibrate)."""
  return _FcPipe(num_layers, dim=256, batch=64)


class ProfileLayerTest(tf.test.TestCase):

  def testOneCostPerLayerWithSizesAndEqualLayersTimedOnce(self):
    layer, x = _Fc8Pipe(3)
    prof = cell_profile.ProfileLayer(layer, (x,), reps=2, tick=False)
    self.assertIsInstance(prof, cost_model.Profile)
    self.assertLen(prof.layers, 3)
    # Micro-batches of 2 rows: 2 x 8 float32 = 64 B in and out.
    self.assertEqual(prof.micro_batch_rows, 2)
    self.assertEqual(prof.input_bytes, 64.0)
    self.assertEqual([c.out_bytes for c in prof.layers], [64.0] * 3)
    # fc2 has fc1's Params but for the name, device and watched input: it
    # is timed once (fc0 takes no input gradient: timed on its own).
    self.assertIs(prof.layers[2], prof.layers[1])
    self.assertIsNot(prof.layers[1], prof.layers[0])
    self.assertEqual(prof.transfer_s_per_byte, 0.0)   # one device
    self.assertEqual(prof.tick_s, 0.0)
    for c in prof.layers:
      for v in (c.forward, c.backward, c.input_grad, c.weight_grad):
        self.assertGreaterEqual(v, 0.0)
    self.assertGreater(prof.num_cores, 0.0)
    self.assertLessEqual(prof.num_cores, cell_profile.NumCores())

  def testTheUpdateIsSplitByWeightBytes(self):
    # FC 8 -> 8 then 8 -> 16: weights (w, b) of 72 and 144 floats. The
    # chained update is split in that proportion, 1 : 2.
    layers = [linear.FCLayer.Params().Set(name='fc0', input_dim=8,
                                          output_dim=8),
              linear.FCLayer.Params().Set(name='fc1', input_dim=8,
                                          output_dim=16)]
    layer = pipeline.TensorPipeLayer.Params().Set(
        name='pipe', layers=layers, num_partitions=1, num_micro_batches=4,
        input_shapes=[[8, 8]]).Instantiate()
    prof = cell_profile.ProfileLayer(layer, (tf.ones([8, 8]),), reps=2,
                                     tick=False)
    u0, u1 = prof.layers[0].update, prof.layers[1].update
    self.assertGreaterEqual(u0, 0.0)
    self.assertAlmostEqual(u1, 2 * u0, delta=1e-12 + 1e-9 * u1)

  def testOtherMicroBatchSizesArePointsOfTheCurve(self):
    layer, x = _Fc8Pipe(2)
    prof = cell_profile.ProfileLayer(layer, (x,), reps=2, tick=False,
                                     micro_batch_sizes=(8, 2, 1))
    # The layer's own size (2 rows) is the profile; 1 and 8 rows are points
    # with their own bytes (8 float32 per row).
    self.assertEqual(prof.measured_rows, (1, 2, 8))
    self.assertEqual([q.micro_batch_rows for q in prof.points], [1, 8])
    self.assertEqual([q.input_bytes for q in prof.points], [32.0, 256.0])
    self.assertEqual([q.layers[1].out_bytes for q in prof.points],
                     [32.0, 256.0])
    for size in (3, 0, 2.0):
      with self.assertRaisesRegex(ValueError, f'{size!r} must be a positive '
                                  'int dividing the mini-batch of 8'):
        cell_profile.ProfileLayer(layer, (x,), reps=2, tick=False,
                                  micro_batch_sizes=(size,))


class CalibrationTest(tf.test.TestCase):

  def testProfileIsFittedToTheLayersOwnStep(self):
    """calibrate=True fits the cells to StepTime of the layer's own table
    (here K=1 GPipe, FProp under a tape): predicted again, that table's
    work plus ticks is the step's CPU time."""
    layer, x = _WidePipe(3)
    plain = cell_profile.ProfileLayer(layer, (x,), reps=2, tick=False)
    measured = []
    real = cell_profile.StepTime

    def Fake(lay, inputs, reps):
      measured.append(real(lay, inputs, reps))   # runs: GPipe's step
      return 0.02, 0.03
    cell_profile.StepTime = Fake
    try:
      got = cell_profile.ProfileLayer(layer, (x,), reps=2, tick=False,
                                      calibrate=True)
    finally:
      cell_profile.StepTime = real
    wall, cpu = measured[0]
    self.assertGreater(wall, 0.0)
    self.assertGreater(cpu, 0.0)
    table = schedule_builders.Build('gpipe', 1, 4)
    pred = cost_model.Predict(table, got, [(0, 3)], True, 'shared')
    self.assertAlmostEqual(pred.work_s, 0.03, places=9)
    self.assertAlmostEqual(got.num_cores,
                           min(1.5, cell_profile.NumCores()), places=9)
    self.assertNotEqual(got.cell_scale, 1.0)
    self.assertEqual(plain.cell_scale, 1.0)

  def testEachMicroBatchSizeIsFittedToAStepAtItsT(self):
    """With micro_batch_sizes each point is fitted to a step at its own
    T: predicted at that size (`Profile.Scaled`), the table's work plus
    ticks is that step's CPU time."""
    layer, x = _WidePipe(2)   # 64 rows, T=4: 16 rows per micro-batch
    ts = []
    real = cell_profile.StepTime

    def Fake(lay, inputs, reps):
      del inputs, reps
      tt = lay.params.num_micro_batches
      ts.append(tt)
      return 0.01 * tt, 0.02 * tt
    cell_profile.StepTime = Fake
    try:
      prof = cell_profile.ProfileLayer(layer, (x,), reps=2, tick=False,
                                       calibrate=True,
                                       micro_batch_sizes=(8, 32))
    finally:
      cell_profile.StepTime = real
    self.assertEqual(ts, [4, 8, 2])   # the layer's own, then each point
    for rows, tt in ((16, 4), (8, 8), (32, 2)):
      table = schedule_builders.Build('gpipe', 1, tt)
      pred = cost_model.Predict(table, prof.Scaled(rows), [(0, 2)], True,
                                'shared')
      self.assertAlmostEqual(pred.work_s, 0.02 * tt, places=9)

  def testEachModeMeasuredGetsAFactor(self):
    layer, x = _WidePipe(2)
    prof = cell_profile.ProfileLayer(
        layer, (x,), reps=2, tick=False, calibrate=True,
        calibrate_modes=('gpipe_norc', 'split_rc', 'gpipe_rc'))
    # gpipe_rc is the layer's own mode: the calibration itself.
    self.assertEqual(sorted(dict(prof.mode_scales)),
                     ['gpipe_norc', 'split_rc'])
    with self.assertRaisesRegex(ValueError, "'nope' is not one of"):
      cell_profile.ProfileLayer(layer, (x,), reps=1, tick=False,
                                calibrate=True, calibrate_modes=('nope',))
    with self.assertRaisesRegex(ValueError, 'needs calibrate=True'):
      cell_profile.ProfileLayer(layer, (x,), reps=1, tick=False,
                                calibrate_modes=('split_rc',))

  def testStepTimeTrainsAndRestoresTheVariables(self):
    layer, x = _WidePipe(2)
    p = layer.params.Copy().Set(name='wide_1f1b', schedule='1f1b',
                                num_partitions=2)
    pipe = p.Instantiate()
    before = [v.numpy() for v in pipe.variables]
    wall, cpu = cell_profile.StepTime(pipe, (x,), reps=2)
    self.assertGreater(wall, 0.0)
    self.assertGreater(cpu, 0.0)
    for v, b in zip(pipe.variables, before):
      self.assertAllEqual(v, b, msg=v.name)
    # The step does update them (else the restore above proves nothing):
    # one more step by hand moves a weight.
    grads = pipe.FPropLossAndGrads(
        pipe.theta, (x,), None,
        lambda y, _: 0.5 * tf.reduce_sum(tf.square(y)), 1.0).grads
    self.assertGreater(float(tf.reduce_max(tf.abs(
        tf.nest.flatten(grads)[0]))), 0.0)

  def testHandGivenPartitionsAreCutAsGiven(self):
    fc = lambda i: linear.FCLayer.Params().Set(
        name=f'fc{i}', input_dim=256, output_dim=256)
    layer = pipeline.TensorPipeLayer.Params().Set(
        name='hand', partitions=[[fc(0)], [fc(1), fc(2)]],
        num_micro_batches=4, input_shapes=[[64, 256]]).Instantiate()
    self.assertIsNone(layer.partition_plan)
    self.assertEqual(cell_profile.StageCut(layer), [(0, 1), (1, 3)])
    x = tf.random.stateless_uniform([64, 256], seed=[1, 2])
    prof = cell_profile.ProfileLayer(layer, (x,), reps=2, tick=False,
                                     calibrate=True)
    self.assertLen(prof.layers, 3)
    self.assertNotEqual(prof.cell_scale, 1.0)

if __name__ == '__main__':
  tf.test.main()
