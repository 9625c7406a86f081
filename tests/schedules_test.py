"""Tests for tensorpipe.schedules."""

import itertools
import unittest

import tensorflow as tf

from tensorpipe import schedules

# Sizes (K, T) the property tests sweep over.
_SIZES = [(k, t) for k in range(1, 7) for t in range(1, 9)]


def _Ticks(schedule):
  """Maps each (t, k) cell of a schedule to the tick it runs on."""
  ticks = {}
  for clock, cells in enumerate(schedule):
    for cell in cells:
      ticks[cell] = clock
  return ticks


def _IndexTable(index_fn, k_total, t_total):
  """Per partition, the index_fn value on each tick ('.' where it idles)."""
  rows = []
  for k in range(k_total):
    ts = [index_fn(c, k, k_total, t_total)
          for c in range(schedules.NumClockTicks(k_total, t_total))]
    rows.append(' '.join(str(t) if 0 <= t < t_total else '.' for t in ts))
  return rows


class IndexFunctionTest(unittest.TestCase):

  def testForwardIndicesOfThreePartitionsFourMicroBatches(self):
    self.assertEqual(
        _IndexTable(schedules.GPipeForwardMicroBatch, 3, 4), [
            # clock 0 1 2 3 4 5
            '0 1 2 3 . .',  # k=0
            '. 0 1 2 3 .',  # k=1
            '. . 0 1 2 3',  # k=2
        ])

  def testBackwardIndicesOfThreePartitionsFourMicroBatches(self):
    self.assertEqual(
        _IndexTable(schedules.GPipeBackwardMicroBatch, 3, 4), [
            # clock 0 1 2 3 4 5
            '. . 3 2 1 0',  # k=0
            '. 3 2 1 0 .',  # k=1
            '3 2 1 0 . .',  # k=2
        ])

  def testTicksOutsideThePassAreIdle(self):
    for k_total, t_total in _SIZES:
      ticks = schedules.NumClockTicks(k_total, t_total)
      for fn in (schedules.GPipeForwardMicroBatch,
                 schedules.GPipeBackwardMicroBatch):
        for k in range(k_total):
          for clock in (-1, ticks):
            t = fn(clock, k, k_total, t_total)
            self.assertFalse(0 <= t < t_total, (fn, k_total, t_total, k))

  def testTensorClockGivesTheSameIndices(self):
    # The pipeline's while-loop bodies call the functions with their clock,
    # a scalar int32 tensor.
    for k_total, t_total in [(1, 3), (3, 4), (4, 2)]:
      for fn in (schedules.GPipeForwardMicroBatch,
                 schedules.GPipeBackwardMicroBatch):
        for clock in range(schedules.NumClockTicks(k_total, t_total)):
          for k in range(k_total):
            t = fn(tf.constant(clock), k, k_total, t_total)
            self.assertIsInstance(t, tf.Tensor)
            self.assertEqual(t.dtype, tf.int32)
            self.assertEqual(int(t), fn(clock, k, k_total, t_total))

  def testRaisesOnABadPartitionIndex(self):
    with self.assertRaisesRegex(ValueError, r'k=3 is not in \[0, 3\)'):
      schedules.GPipeForwardMicroBatch(0, 3, 3, 4)
    with self.assertRaisesRegex(ValueError, r'k=-1'):
      schedules.GPipeBackwardMicroBatch(0, -1, 3, 4)
    with self.assertRaisesRegex(TypeError, r'1\.0.*float'):
      schedules.GPipeForwardMicroBatch(0, 1.0, 3, 4)
    with self.assertRaisesRegex(ValueError, r'num_micro_batches=0'):
      schedules.GPipeBackwardMicroBatch(0, 0, 3, 0)


class GPipeClockCyclesTest(unittest.TestCase):

  def testThreePartitionsFourMicroBatches(self):
    # clock  0      1      2      3      4      5
    # k=0   (0,0)  (1,0)  (2,0)  (3,0)
    # k=1          (0,1)  (1,1)  (2,1)  (3,1)
    # k=2                 (0,2)  (1,2)  (2,2)  (3,2)
    expected = [
        [(0, 0)],
        [(1, 0), (0, 1)],
        [(2, 0), (1, 1), (0, 2)],
        [(3, 0), (2, 1), (1, 2)],
        [(3, 1), (2, 2)],
        [(3, 2)],
    ]
    self.assertEqual(list(schedules.GPipeClockCycles(3, 4)), expected)

  def testOnePartitionRunsMicroBatchesInTurn(self):
    expected = [
        [(0, 0)],
        [(1, 0)],
        [(2, 0)],
    ]
    self.assertEqual(list(schedules.GPipeClockCycles(1, 3)), expected)

  def testOneMicroBatchWalksDownThePartitions(self):
    expected = [
        [(0, 0)],
        [(0, 1)],
        [(0, 2)],
        [(0, 3)],
    ]
    self.assertEqual(list(schedules.GPipeClockCycles(4, 1)), expected)

  def testEveryCellRunsExactlyOnce(self):
    for k_total, t_total in _SIZES:
      cells = list(
          itertools.chain.from_iterable(
              schedules.GPipeClockCycles(k_total, t_total)))
      expected = {(t, k) for t in range(t_total) for k in range(k_total)}
      self.assertEqual(len(cells), len(expected), (k_total, t_total))
      self.assertEqual(set(cells), expected, (k_total, t_total))

  def testCellsRunAfterTheirDependencies(self):
    for k_total, t_total in _SIZES:
      ticks = _Ticks(schedules.GPipeClockCycles(k_total, t_total))
      for t in range(t_total):
        for k in range(k_total):
          if k > 0:
            # Partition k needs partition k - 1's output for micro-batch t.
            self.assertGreater(ticks[(t, k)], ticks[(t, k - 1)])
          if t > 0:
            # A partition processes micro-batches in order.
            self.assertGreater(ticks[(t, k)], ticks[(t - 1, k)])

  def testCellsAreInIncreasingPartitionOrder(self):
    for k_total, t_total in _SIZES:
      for cells in schedules.GPipeClockCycles(k_total, t_total):
        ks = [k for _, k in cells]
        self.assertEqual(ks, sorted(ks))
        self.assertEqual(len(set(ks)), len(ks))

  def testNumberOfTicksMatchesNumClockTicks(self):
    for k_total, t_total in _SIZES:
      self.assertEqual(
          len(list(schedules.GPipeClockCycles(k_total, t_total))),
          schedules.NumClockTicks(k_total, t_total))


class GPipeBackwardClockCyclesTest(unittest.TestCase):

  def testThreePartitionsFourMicroBatches(self):
    # clock  0      1      2      3      4      5
    # k=2   (3,2)  (2,2)  (1,2)  (0,2)
    # k=1          (3,1)  (2,1)  (1,1)  (0,1)
    # k=0                 (3,0)  (2,0)  (1,0)  (0,0)
    expected = [
        [(3, 2)],
        [(2, 2), (3, 1)],
        [(1, 2), (2, 1), (3, 0)],
        [(0, 2), (1, 1), (2, 0)],
        [(0, 1), (1, 0)],
        [(0, 0)],
    ]
    self.assertEqual(list(schedules.GPipeBackwardClockCycles(3, 4)), expected)

  def testOnePartitionRunsMicroBatchesInReverse(self):
    expected = [
        [(2, 0)],
        [(1, 0)],
        [(0, 0)],
    ]
    self.assertEqual(list(schedules.GPipeBackwardClockCycles(1, 3)), expected)

  def testOneMicroBatchWalksUpThePartitions(self):
    expected = [
        [(0, 3)],
        [(0, 2)],
        [(0, 1)],
        [(0, 0)],
    ]
    self.assertEqual(list(schedules.GPipeBackwardClockCycles(4, 1)), expected)

  def testEveryCellRunsExactlyOnce(self):
    for k_total, t_total in _SIZES:
      cells = list(
          itertools.chain.from_iterable(
              schedules.GPipeBackwardClockCycles(k_total, t_total)))
      expected = {(t, k) for t in range(t_total) for k in range(k_total)}
      self.assertEqual(len(cells), len(expected), (k_total, t_total))
      self.assertEqual(set(cells), expected, (k_total, t_total))

  def testCellsRunAfterTheirDependencies(self):
    for k_total, t_total in _SIZES:
      ticks = _Ticks(schedules.GPipeBackwardClockCycles(k_total, t_total))
      for t in range(t_total):
        for k in range(k_total):
          if k < k_total - 1:
            # Partition k needs the gradient from partition k + 1.
            self.assertGreater(ticks[(t, k)], ticks[(t, k + 1)])
          if t < t_total - 1:
            # A partition processes micro-batches in reverse order.
            self.assertGreater(ticks[(t, k)], ticks[(t + 1, k)])

  def testIsTheMirrorOfTheForwardSchedule(self):
    # Played backwards in time, the forward schedule is the backward one: the
    # gradient of each cell is computed in the reverse order of its output.
    for k_total, t_total in _SIZES:
      forward = list(schedules.GPipeClockCycles(k_total, t_total))
      backward = list(schedules.GPipeBackwardClockCycles(k_total, t_total))
      mirrored = [list(reversed(cells)) for cells in reversed(forward)]
      self.assertEqual(backward, mirrored, (k_total, t_total))

  def testCellsAreInDecreasingPartitionOrder(self):
    for k_total, t_total in _SIZES:
      for cells in schedules.GPipeBackwardClockCycles(k_total, t_total):
        ks = [k for _, k in cells]
        self.assertEqual(ks, sorted(ks, reverse=True))


class BubbleTest(unittest.TestCase):

  def testNumClockTicks(self):
    self.assertEqual(schedules.NumClockTicks(3, 4), 6)
    self.assertEqual(schedules.NumClockTicks(1, 5), 5)
    self.assertEqual(schedules.NumClockTicks(4, 1), 4)

  def testBubbleFractionFormula(self):
    self.assertAlmostEqual(schedules.BubbleFraction(3, 4), 2 / 6)
    self.assertEqual(schedules.BubbleFraction(1, 8), 0.0)
    self.assertAlmostEqual(schedules.BubbleFraction(4, 1), 3 / 4)
    self.assertAlmostEqual(schedules.BubbleFraction(8, 32), 7 / 39)

  def testBubbleFractionMatchesIdleCellsOfTheSchedule(self):
    for k_total, t_total in _SIZES:
      ticks = list(schedules.GPipeClockCycles(k_total, t_total))
      busy = sum(len(cells) for cells in ticks)
      idle = len(ticks) * k_total - busy
      self.assertAlmostEqual(
          schedules.BubbleFraction(k_total, t_total),
          idle / (len(ticks) * k_total))

  def testBubbleShrinksWithMoreMicroBatches(self):
    fractions = [schedules.BubbleFraction(4, t) for t in (1, 4, 16, 64)]
    self.assertEqual(fractions, sorted(fractions, reverse=True))
    self.assertLess(fractions[-1], 0.05)


class ValidationTest(unittest.TestCase):

  def testRaisesOnZeroPartitions(self):
    with self.assertRaisesRegex(ValueError, r'num_partitions=0.*>= 1'):
      schedules.GPipeClockCycles(0, 4)

  def testRaisesOnNegativeMicroBatches(self):
    with self.assertRaisesRegex(ValueError, r'num_micro_batches=-2.*>= 1'):
      schedules.GPipeBackwardClockCycles(3, -2)

  def testRaisesAtCallTimeNotOnFirstNext(self):
    # The generators validate eagerly, so a bad config fails where it is made.
    with self.assertRaises(ValueError):
      schedules.GPipeClockCycles(2, 0)

  def testRaisesOnNonIntegers(self):
    with self.assertRaisesRegex(TypeError, r'2\.5.*float'):
      schedules.GPipeClockCycles(2.5, 4)
    with self.assertRaisesRegex(TypeError, r"'4'.*str"):
      schedules.NumClockTicks(2, '4')
    with self.assertRaisesRegex(TypeError, r'True.*bool'):
      schedules.BubbleFraction(True, 4)

  def testBubbleFunctionsValidate(self):
    with self.assertRaisesRegex(ValueError, r'num_partitions=0'):
      schedules.BubbleFraction(0, 4)
    with self.assertRaisesRegex(ValueError, r'num_micro_batches=0'):
      schedules.NumClockTicks(2, 0)


if __name__ == '__main__':
  unittest.main()
