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


def _DocumentedTree(grads):
  """grad_sum's documented order for any T, written out in NumPy float32:
  the gradients in arrival order (T-1 first) fall into consecutive blocks,
  one per set bit of T, largest first (T = 7: 4, 2, 1); each block is a
  binary tree and the block sums are added largest first:
  T = 7: (((g6 + g5) + (g4 + g3)) + (g2 + g1)) + g0."""
  arrival = list(reversed(range(len(grads))))
  total, start = None, 0
  for i in reversed(range(len(grads).bit_length())):
    if (len(grads) >> i) & 1:
      block = _Tree(grads, arrival[start:start + 2 ** i])
      start += 2 ** i
      total = block if total is None else total + block
  return total


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
  """acc's total with Python int t, eagerly; for 'pairwise' also traced
  into one graph (where Grappler could merge the additions into one AddN),
  which must agree. (The pipelines add the sequential sum one micro-batch
  per loop iteration, never as one traced chain.)"""
  def Sum(*gs):
    state = acc.Init([tf.zeros(grads[0].shape)])
    for t in reversed(range(len(gs))):
      state = acc.Add(state, [gs[t]], t)
    return acc.Total(state)[0]
  consts = [tf.constant(g) for g in grads]
  eager = Sum(*consts).numpy()
  if acc.mode == 'pairwise':
    traced = tf.function(Sum, autograph=False)(*consts).numpy()
    np.testing.assert_array_equal(traced, eager, 'traced vs eager')
  return eager


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

  def testOtherCountsFollowTheDocumentedTreeBitForBit(self):
    # Random magnitudes: unlike powers of two, their sum depends on the
    # order, so any other grouping of the gradients shows in the bits.
    for num in (3, 5, 6, 7, 11):
      with self.subTest(T=num):
        grads = _Grads(num, seed=num)
        want = _DocumentedTree(grads)
        acc = grad_sum.GradSum('pairwise', num)
        self.assertAllEqual(_SumUnrolled(acc, grads), want)
        self.assertAllEqual(_SumInLoop(acc, grads), want)

  def testDocumentedTreeAtSevenIsPinned(self):
    grads = _Grads(7, seed=7)
    g = grads
    want = (((g[6] + g[5]) + (g[4] + g[3])) + (g[2] + g[1])) + g[0]
    self.assertAllEqual(_DocumentedTree(grads), want)
    self.assertAllEqual(_SumInLoop(grad_sum.GradSum('pairwise', 7), grads),
                        want)
    # The check can fail: other orders of the same terms give other bits.
    running = np.zeros_like(g[0])
    for x in reversed(g):
      running = running + x
    smallest_first = g[6] + ((g[5] + g[4]) + ((g[3] + g[2]) + (g[1] + g[0])))
    upward = ((g[6] + g[5]) + (g[4] + g[3])) + ((g[2] + g[1]) + g[0])
    for other in (running, smallest_first, upward):
      self.assertNotAllEqual(other, want)

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


class ApartTest(tf.test.TestCase):

  def testOnlyAnAdditionGoesBehindASnapshot(self):
    """ApartIfSum adds a Snapshot where an addition made the tensor (also
    through an Identity), and no op otherwise."""
    graph = tf.Graph()
    with graph.as_default():
      a, b = tf.ones([2, 2]), tf.ones([2, 2])
      product = tf.matmul(a, b)
      self.assertIs(grad_sum.ApartIfSum(product), product)
      for made in (tf.math.add_n([a, b]), a + b, tf.identity(a + b)):
        kept = grad_sum.ApartIfSum(made)
        self.assertEqual(kept.op.type, 'Snapshot')
        self.assertIs(kept.op.inputs[0], made)


if __name__ == '__main__':
  tf.test.main()
