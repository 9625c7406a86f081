"""Tests of tensorpipe.optimizers against NumPy oracles."""

import os
import tempfile

import numpy as np
import tensorflow as tf

from tensorpipe import optimizers


def _NumpyAdafactor(w, grads, lr, beta1=0.9, decay=-0.8, eps=1e-30,
                    clip=1.0, factored=True):
  """Reference Adafactor (module docstring) in NumPy."""
  w = w.astype(np.float64).copy()
  m = np.zeros_like(w)
  vr = np.zeros(w.shape[:-1])
  vc = np.zeros(w.shape[:-2] + w.shape[-1:])
  v = np.zeros_like(w)
  for t, g in enumerate(grads, 1):
    beta2 = 1.0 - t ** decay
    g2 = g * g + eps
    if factored:
      vr = beta2 * vr + (1 - beta2) * g2.mean(-1)
      vc = beta2 * vc + (1 - beta2) * g2.mean(-2)
      vhat = np.outer(vr / vr.mean(), vc)
    else:
      v = beta2 * v + (1 - beta2) * g2
      vhat = v
    u = g / np.sqrt(vhat)
    u = u / max(1.0, np.sqrt(np.mean(u * u)) / clip)
    m = beta1 * m + (1 - beta1) * u
    w -= lr * m
  return w


class OptimizersTest(tf.test.TestCase):

  def _Run(self, opt, w0, grads, lr):
    v = tf.Variable(w0)
    for g in grads:
      opt.Apply(lr, [tf.constant(g)], [v])
    return v.numpy()

  def testRMSPropMatchesNumpy(self):
    opt = optimizers.RMSProp.Params().Instantiate()  # decay 0.9, eps 0.1
    w0 = np.array([1.0, -2.0, 3.0], np.float32)
    grads = [np.array([0.5, -1.0, 2.0], np.float32),
             np.array([0.1, 0.3, -0.2], np.float32)]
    w, ms = w0.astype(np.float64), np.zeros(3)
    for g in grads:
      ms = 0.9 * ms + 0.1 * g * g
      w = w - 0.01 * g / np.sqrt(ms + 0.1)
    self.assertAllClose(self._Run(opt, w0, grads, 0.01), w, rtol=1e-5)

  def testSgdMomentumMatchesNumpy(self):
    opt = optimizers.SGD.Params().Set(momentum=0.9).Instantiate()
    w0 = np.array([1.0, -2.0], np.float32)
    grads = [np.array([1.0, 2.0], np.float32)] * 3
    w, m = w0.astype(np.float64), np.zeros(2)
    for g in grads:
      m = 0.9 * m - 0.1 * g
      w = w + m
    self.assertAllClose(self._Run(opt, w0, grads, 0.1), w, rtol=1e-6)

  def testAdamFirstStepIsLrTimesSign(self):
    opt = optimizers.Adam.Params().Instantiate()
    w = self._Run(opt, np.zeros(2, np.float32),
                  [np.array([3.0, -0.5], np.float32)], 0.01)
    self.assertAllClose(w, [-0.01, 0.01], rtol=1e-4)

  def testAdafactorFactoredMatchesNumpy(self):
    rng = np.random.RandomState(0)
    w0 = rng.randn(4, 6).astype(np.float32)
    grads = [rng.randn(4, 6).astype(np.float32) for _ in range(4)]
    opt = optimizers.Adafactor.Params().Set(
        min_dim_size_to_factor=2).Instantiate()
    got = self._Run(opt, w0, grads, 0.05)
    self.assertEqual(sorted(opt.slot_list[0]), ['m', 'vc', 'vr'])
    self.assertAllClose(got, _NumpyAdafactor(w0, grads, 0.05), rtol=1e-4,
                        atol=1e-6)

  def testAdafactorUnfactoredAndClipping(self):
    rng = np.random.RandomState(1)
    w0 = rng.randn(5).astype(np.float32)
    # A huge first gradient: the clipped update has RMS <= 1.
    grads = [rng.randn(5).astype(np.float32) * 1e3 for _ in range(3)]
    opt = optimizers.Adafactor.Params().Instantiate()
    got = self._Run(opt, w0, grads, 0.1)
    self.assertEqual(sorted(opt.slot_list[0]), ['m', 'v'])
    want = _NumpyAdafactor(w0, grads, 0.1, factored=False)
    self.assertAllClose(got, want, rtol=1e-4, atol=1e-6)
    # Factored second moments only for both dims >= min_dim_size_to_factor.
    big = optimizers.Adafactor.Params().Instantiate()
    big.Build([tf.Variable(tf.zeros([128, 130]))])
    self.assertIn('vr', big.slot_list[0])
    self.assertEqual(big.slot_list[0]['vr'].shape, [128])

  def testSlotsAreCheckpointed(self):
    rng = np.random.RandomState(2)
    grads = [rng.randn(3, 3).astype(np.float32) for _ in range(4)]
    for make in (lambda: optimizers.Adafactor.Params().Set(
        min_dim_size_to_factor=2).Instantiate(),
                 lambda: optimizers.RMSProp.Params().Instantiate()):
      v = tf.Variable(np.ones([3, 3], np.float32))
      opt = make()
      for g in grads[:2]:
        opt.Apply(0.1, [g], [v])
      ckpt = tf.train.Checkpoint(v=v, opt=opt)
      path = ckpt.save(os.path.join(tempfile.mkdtemp(), 'c'))
      for g in grads[2:]:
        opt.Apply(0.1, [g], [v])
      want = v.numpy()
      v2 = tf.Variable(np.zeros([3, 3], np.float32))
      opt2 = make()
      opt2.Build([v2])
      tf.train.Checkpoint(v=v2, opt=opt2).restore(path).assert_consumed()
      for g in grads[2:]:
        opt2.Apply(0.1, [g], [v2])
      self.assertAllClose(v2.numpy(), want, rtol=0, atol=0)

  def testErrors(self):
    with self.assertRaisesRegex(ValueError, 'decay_exponent=0.5'):
      optimizers.Adafactor.Params().Set(decay_exponent=0.5).Instantiate()
    opt = optimizers.SGD.Params().Instantiate()
    with self.assertRaisesRegex(ValueError, 'no gradient'):
      opt.Apply(0.1, [None], [tf.Variable(1.0)])


if __name__ == '__main__':
  tf.test.main()
