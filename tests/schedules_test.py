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


def _OpTable(k_total, t_total):
  """Per partition, 'F<t>' / 'B<t>' on each 1F1B tick ('.' where it idles),
  from the generator."""
  ticks = schedules.OneFOneBNumClockTicks(k_total, t_total)
  rows = [['.'] * ticks for _ in range(k_total)]
  for clock, cells in enumerate(
      schedules.OneFOneBClockCycles(k_total, t_total)):
    for op, t, k in cells:
      rows[k][clock] = ('F' if op == schedules.FORWARD else 'B') + str(t)
  return [' '.join(f'{c:2s}' for c in row).rstrip() for row in rows]


def _OpTicks(k_total, t_total):
  """Maps each (op, t, k) cell of the 1F1B generator to its tick."""
  return _Ticks(schedules.OneFOneBClockCycles(k_total, t_total))


class OneFOneBClockCyclesTest(unittest.TestCase):
  F, B = schedules.FORWARD, schedules.BACKWARD

  def testThreePartitionsFourMicroBatches(self):
    # The diagram in clock_cycles.py (re-exported by schedules).
    self.assertEqual(_OpTable(3, 4), [
        # 0  1  2  3  4  5  6  7  8  9  10 11
        'F0 F1 F2 .  .  B0 F3 B1 .  B2 .  B3',  # k=0
        '.  F0 F1 .  B0 F2 B1 F3 B2 .  B3 .',   # k=1
        '.  .  F0 B0 F1 B1 F2 B2 F3 B3 .  .',   # k=2
    ])
    f, b = self.F, self.B
    self.assertEqual(list(schedules.OneFOneBClockCycles(3, 4)), [
        [(f, 0, 0)],
        [(f, 1, 0), (f, 0, 1)],
        [(f, 2, 0), (f, 1, 1), (f, 0, 2)],
        [(b, 0, 2)],
        [(b, 0, 1), (f, 1, 2)],
        [(b, 0, 0), (f, 2, 1), (b, 1, 2)],
        [(f, 3, 0), (b, 1, 1), (f, 2, 2)],
        [(b, 1, 0), (f, 3, 1), (b, 2, 2)],
        [(b, 2, 1), (f, 3, 2)],
        [(b, 2, 0), (b, 3, 2)],
        [(b, 3, 1)],
        [(b, 3, 0)],
    ])

  def testOnePartitionAlternatesForwardAndBackward(self):
    # K=1: the loss is inside the pipeline, so each micro-batch's backward
    # follows its forward at once.
    self.assertEqual(_OpTable(1, 3), ['F0 B0 F1 B1 F2 B2'])

  def testOneMicroBatchWalksDownAndBackUp(self):
    self.assertEqual(_OpTable(3, 1), [
        # 0  1  2  3  4  5
        'F0 .  .  .  .  B0',
        '.  F0 .  .  B0 .',
        '.  .  F0 B0 .  .',
    ])

  def testFewerMicroBatchesThanPartitions(self):
    # T < K: partition k's warm-up is cut at T micro-batches.
    self.assertEqual(_OpTable(4, 2), [
        # 0  1  2  3  4  5  6  7  8  9
        'F0 F1 .  .  .  .  .  B0 .  B1',
        '.  F0 F1 .  .  .  B0 .  B1 .',
        '.  .  F0 F1 .  B0 .  B1 .  .',
        '.  .  .  F0 B0 F1 B1 .  .  .',
    ])

  def testEveryCellRunsExactlyOnce(self):
    for k_total, t_total in _SIZES:
      cells = list(itertools.chain.from_iterable(
          schedules.OneFOneBClockCycles(k_total, t_total)))
      expected = {(op, t, k) for op in (self.F, self.B)
                  for t in range(t_total) for k in range(k_total)}
      self.assertEqual(len(cells), len(expected), (k_total, t_total))
      self.assertEqual(set(cells), expected, (k_total, t_total))

  def testOneCellPerPartitionPerTickInPartitionOrder(self):
    for k_total, t_total in _SIZES:
      for cells in schedules.OneFOneBClockCycles(k_total, t_total):
        ks = [k for _, _, k in cells]
        self.assertEqual(ks, sorted(set(ks)), (k_total, t_total))

  def testCellsRunAfterTheirDependencies(self):
    f, b = self.F, self.B
    for k_total, t_total in _SIZES:
      ticks = _OpTicks(k_total, t_total)
      last = k_total - 1
      for t in range(t_total):
        for k in range(k_total):
          if k > 0:
            # f(t, k) > f(t, k - 1): partition k - 1's output.
            self.assertGreater(ticks[(f, t, k)], ticks[(f, t, k - 1)])
          if k < last:
            # b(t, k) > b(t, k + 1): the gradient from partition k + 1.
            self.assertGreater(ticks[(b, t, k)], ticks[(b, t, k + 1)])
          if t > 0:
            # Each partition runs the forwards and the backwards in order.
            self.assertGreater(ticks[(f, t, k)], ticks[(f, t - 1, k)])
            self.assertGreater(ticks[(b, t, k)], ticks[(b, t - 1, k)])
          self.assertGreater(ticks[(b, t, k)], ticks[(f, t, k)])
        # The loss: the last partition's backward right after its forward.
        self.assertEqual(ticks[(b, t, last)], ticks[(f, t, last)] + 1)

  def testTicksMatchTheClosedForm(self):
    # f(t, k) = t + k for t < K - k, else 2 t + k; b(t, k) = 2K - 1 - k + 2t.
    f, b = self.F, self.B
    for k_total, t_total in _SIZES:
      ticks = _OpTicks(k_total, t_total)
      for t in range(t_total):
        for k in range(k_total):
          want_f = t + k if t < k_total - k else 2 * t + k
          self.assertEqual(ticks[(f, t, k)], want_f, (k_total, t_total, t, k))
          self.assertEqual(ticks[(b, t, k)], 2 * k_total - 1 - k + 2 * t)

  def testInFlightBound(self):
    # Micro-batches whose forward ran on partition k and backward not yet:
    # at most min(K - k, T) (the boundary inputs a recomputing stage keeps),
    # where GPipe holds all T before its first backward.
    for k_total, t_total in _SIZES:
      held = [0] * k_total
      peak = [0] * k_total
      for cells in schedules.OneFOneBClockCycles(k_total, t_total):
        for op, _, k in cells:
          held[k] += 1 if op == self.F else -1
          self.assertGreaterEqual(held[k], 0)
          peak[k] = max(peak[k], held[k])
      self.assertEqual(held, [0] * k_total)
      self.assertEqual(
          peak, [schedules.OneFOneBMaxInFlight(k, k_total, t_total)
                 for k in range(k_total)], (k_total, t_total))
      self.assertEqual(peak, [min(k_total - k, t_total)
                              for k in range(k_total)])

  def testSameTicksAndBubbleAsGPipeForwardPlusBackward(self):
    for k_total, t_total in _SIZES:
      ticks = list(schedules.OneFOneBClockCycles(k_total, t_total))
      self.assertEqual(len(ticks), 2 * schedules.NumClockTicks(
          k_total, t_total))
      self.assertEqual(len(ticks), schedules.OneFOneBNumClockTicks(
          k_total, t_total))
      busy = sum(len(cells) for cells in ticks)
      self.assertAlmostEqual(1 - busy / (len(ticks) * k_total),
                             schedules.BubbleFraction(k_total, t_total))

  def testIndexFunctionIdlesOutsideTheStep(self):
    for k_total, t_total in _SIZES:
      ticks = schedules.OneFOneBNumClockTicks(k_total, t_total)
      for k in range(k_total):
        for clock in (-2, -1, ticks, ticks + 1):
          self.assertEqual(
              schedules.OneFOneBCell(clock, k, k_total, t_total),
              (schedules.IDLE, 0), (k_total, t_total, k, clock))

  def testTensorClockInsideATfFunctionGivesTheSameCells(self):
    # The 1F1B loop calls OneFOneBCell with its clock, a scalar int32 tensor
    # of a tf.while_loop traced once for all ticks.
    for k_total, t_total in [(1, 3), (3, 4), (4, 2), (2, 5)]:
      ticks = schedules.OneFOneBNumClockTicks(k_total, t_total)

      @tf.function
      def Table(k_total=k_total, t_total=t_total, ticks=ticks):
        def Body(c, ta):
          row = tf.stack([tf.stack(schedules.OneFOneBCell(
              c, k, k_total, t_total)) for k in range(k_total)])
          return c + 1, ta.write(c, row)
        _, ta = tf.while_loop(
            lambda c, _: c < ticks, Body,
            (tf.constant(0), tf.TensorArray(tf.int32, size=ticks)))
        return ta.stack()

      table = Table().numpy()
      self.assertEqual(table.shape, (ticks, k_total, 2))
      for clock in range(ticks):
        for k in range(k_total):
          self.assertEqual(
              tuple(table[clock, k]),
              schedules.OneFOneBCell(clock, k, k_total, t_total),
              (k_total, t_total, clock, k))


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

  def testOneFOneBFunctionsValidate(self):
    with self.assertRaisesRegex(ValueError, r'num_partitions=0.*>= 1'):
      schedules.OneFOneBClockCycles(0, 4)
    with self.assertRaisesRegex(ValueError, r'num_micro_batches=-1.*>= 1'):
      schedules.OneFOneBClockCycles(2, -1)
    with self.assertRaisesRegex(TypeError, r'2\.5.*float'):
      schedules.OneFOneBClockCycles(2.5, 4)
    with self.assertRaisesRegex(TypeError, r"'4'.*str"):
      schedules.OneFOneBNumClockTicks(2, '4')
    with self.assertRaisesRegex(ValueError, r'k=2 is not in \[0, 2\)'):
      schedules.OneFOneBCell(0, 2, 2, 4)
    with self.assertRaisesRegex(ValueError, r'k=-1'):
      schedules.OneFOneBMaxInFlight(-1, 2, 4)
    with self.assertRaisesRegex(TypeError, r'True.*bool'):
      schedules.OneFOneBMaxInFlight(0, True, 4)


if __name__ == '__main__':
  unittest.main()
