"""Tests of tensorpipe.lr_schedules against closed-form values."""

import math

import tensorflow as tf

from tensorpipe import lr_schedules


class LrSchedulesTest(tf.test.TestCase):

  def testConstant(self):
    s = lr_schedules.Constant.Params().Set(value=0.3).Instantiate()
    self.assertAllClose([float(s(i)) for i in (0, 10, 10**6)], [0.3] * 3)

  def testExponentialDecayIsThePaperRecipe(self):
    # 0.00125 x batch 256 = 0.32, x0.97 every 3 epochs of 100 steps.
    s = lr_schedules.ExponentialDecay.Params().Set(
        batch_size=256, steps_per_epoch=100).Instantiate()
    for step in (0, 1, 299, 300, 301, 599, 600, 3000, 29999):
      want = 0.00125 * 256 * 0.97 ** math.floor(step / 300)
      self.assertAllClose(float(s(step)), want, rtol=1e-6)
    smooth = lr_schedules.ExponentialDecay.Params().Set(
        initial_value=1.0, decay_rate=0.5, decay_epochs=1.0,
        steps_per_epoch=10, staircase=False).Instantiate()
    self.assertAllClose(float(smooth(5)), 0.5 ** 0.5, rtol=1e-6)

  def testWarmupRsqrtDecay(self):
    s = lr_schedules.WarmupRsqrtDecay.Params().Set(
        peak=2e-3, warmup_steps=100).Instantiate()
    for step in (0, 49, 99, 100, 399, 9999):
      n = step + 1
      want = 2e-3 * min(n / 100, math.sqrt(100 / n))
      self.assertAllClose(float(s(step)), want, rtol=1e-6)
    self.assertAllClose(float(s(99)), 2e-3)  # the peak ends the warm-up
    self.assertAllClose(float(s(399)), 1e-3)  # peak * sqrt(100 / 400)

  def testWarmupCosineDecay(self):
    s = lr_schedules.WarmupCosineDecay.Params().Set(
        peak=1.0, warmup_steps=10, total_steps=110).Instantiate()
    self.assertAllClose(float(s(0)), 0.1)
    self.assertAllClose(float(s(9)), 1.0)
    self.assertAllClose(float(s(10)), 1.0)
    self.assertAllClose(float(s(60)), 0.5, atol=1e-6)
    self.assertAllClose(float(s(110)), 0.0, atol=1e-6)
    self.assertAllClose(float(s(500)), 0.0, atol=1e-6)

  def testWorksOnTensorSteps(self):
    s = lr_schedules.WarmupRsqrtDecay.Params().Set(
        peak=1.0, warmup_steps=4).Instantiate()
    fn = tf.function(s)
    self.assertAllClose(float(fn(tf.constant(15, tf.int64))), 0.5)

  def testBadParamsRaise(self):
    with self.assertRaisesRegex(ValueError, 'warmup_steps=0'):
      lr_schedules.WarmupRsqrtDecay.Params().Set(warmup_steps=0).Instantiate()
    with self.assertRaisesRegex(ValueError, 'decay_rate=-1'):
      lr_schedules.ExponentialDecay.Params().Set(decay_rate=-1).Instantiate()
    with self.assertRaisesRegex(ValueError, 'warmup_steps=200'):
      lr_schedules.WarmupCosineDecay.Params().Set(
          warmup_steps=200, total_steps=100).Instantiate()


if __name__ == '__main__':
  tf.test.main()
