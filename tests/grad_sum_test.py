"""Tests of tensorpipe/grad_sum.py: the two ways to sum micro-batch grads."""

import numpy as np
import tensorflow as tf

from tensorpipe import grad_sum


def _Grads(num, seed=0):
  """num float32 [4, 3] arrays of very different magnitudes (so that the
  order of the sum changes its rounding)."""
  rng = np.random.RandomState(seed)
  return [(rng.randn(4, 3) * 10 ** rng.uniform(-3, 3)).astype(np.float32)
          for _ in range(num)]


def _Tree(grads, order):
  """The float32 binary tree over grads in `order` (len a power of two)."""
  if len(order) == 1:
    return grads[order[0]]
  half = len(order) // 2
  return _Tree(grads, order[:half]) + _Tree(grads, order[half:])


def _SumInLoop(acc, grads):
  """acc's total over grads added T-1 .. 0 inside a tf.while_loop."""
  num = len(grads)
  stacked = tf.constant(np.stack(grads))

  @tf.function
  def Loop():
    state = acc.Init([tf.zeros(grads[0].shape)])

    def Body(t, state):
      return t - 1, acc.Add(state, [tf.gather(stacked, t)], t)
    _, state = tf.while_loop(lambda t, _: t >= 0, Body,
                             (tf.constant(num - 1), state))
    return acc.Total(state)[0]
  return Loop().numpy()


def _SumUnrolled(acc, grads):
  state = acc.Init([tf.zeros(grads[0].shape)])
  for t in reversed(range(len(grads))):
    state = acc.Add(state, [tf.constant(grads[t])], t)
  return acc.Total(state)[0].numpy()


class GradSumTest(tf.test.TestCase):

  def testPairwiseIsTheTreeOverTheArrivalOrder(self):
    for num in (1, 2, 4, 8, 16):
      with self.subTest(T=num):
        grads = _Grads(num)
        acc = grad_sum.GradSum('pairwise', num)
        self.assertEqual(acc.num_levels, num.bit_length())
        want = _Tree(grads, list(reversed(range(num))))
        self.assertAllEqual(_SumUnrolled(acc, grads), want)   # int t
        self.assertAllEqual(_SumInLoop(acc, grads), want)     # tensor t

  def testTwoHalvesAddUpToTheWhole(self):
    # What makes R = 2 replicas of T / 2 equal one process of T: each
    # replica's tree is a subtree, and the all-reduce adds the two roots.
    grads = _Grads(8, seed=3)
    whole = _SumInLoop(grad_sum.GradSum('pairwise', 8), grads)
    half = grad_sum.GradSum('pairwise', 4)
    first, second = _SumInLoop(half, grads[:4]), _SumInLoop(half, grads[4:])
    self.assertAllEqual(first + second, whole)
    self.assertAllEqual(second + first, whole)
    # The running sum does not split that way (these magnitudes round).
    seq = grad_sum.GradSum('sequential', 8)
    seq_half = grad_sum.GradSum('sequential', 4)
    self.assertNotAllEqual(
        _SumInLoop(seq_half, grads[:4]) + _SumInLoop(seq_half, grads[4:]),
        _SumInLoop(seq, grads))

  def testOtherCountsSumEveryGradientOnce(self):
    for num in (3, 5, 6, 7):
      with self.subTest(T=num):
        grads = [np.full([2], 2.0 ** t, np.float32) for t in range(num)]
        want = np.full([2], 2.0 ** num - 1.0, np.float32)  # exact in float32
        acc = grad_sum.GradSum('pairwise', num)
        self.assertAllEqual(_SumUnrolled(acc, grads), want)
        self.assertAllEqual(_SumInLoop(acc, grads), want)

  def testSequentialIsTheRunningSum(self):
    grads = _Grads(5, seed=1)
    want = np.zeros_like(grads[0])
    for g in reversed(grads):
      want = want + g
    acc = grad_sum.GradSum('sequential', 5)
    self.assertEqual(acc.num_levels, 1)
    self.assertAllEqual(_SumUnrolled(acc, grads), want)

  def testUnknownModeRaises(self):
    with self.assertRaisesRegex(ValueError, r"grad_sum='tree' is not one of "
                                r"\('sequential', 'pairwise'\)"):
      grad_sum.GradSum('tree', 4)


if __name__ == '__main__':
  tf.test.main()
