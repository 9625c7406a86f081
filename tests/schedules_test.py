"""Tests for tensorpipe.schedules and the registry in schedule_builders:
GPipe's and 1F1B's tables as literal grids, their bubble, the sizes `Build`
checks, and the per-cell checks of CSV tables."""

import os
import tempfile
import unittest

from tensorpipe import schedule_builders
from tensorpipe import schedules


def _Rows(schedule):
  """The grid as one line per device, cells 3 wide, '.' idle (not trailing)."""
  rows = []
  for row in schedule.grid:
    cells = [str(a) if a else '.' for a in row]
    while cells and cells[-1] == '.':
      cells.pop()
    rows.append(' '.join(f'{x:<3}' for x in cells).rstrip())
  return rows


class GPipeAndOneFOneBGridTest(unittest.TestCase):
  """The two tables at the edges of their closed forms (K=3, T=4 is in
  schedule_table_test): F(t, k) on tick t + k and GPipe's mirrored
  backward; 1F1B's warm-up, alternation and cool-down."""

  def testOnePartitionRunsMicroBatchesInTurn(self):
    self.assertEqual(_Rows(schedule_builders.Build('gpipe', 1, 3)), [
        # 0 1   2   3   4   5
        '0F0 0F1 0F2 0B2 0B1 0B0'])
    self.assertEqual(_Rows(schedule_builders.Build('1f1b', 1, 3)), [
        '0F0 0B0 0F1 0B1 0F2 0B2'])

  def testOneMicroBatchWalksDownAndBackUp(self):
    # Both schedules are the same table for T=1.
    for name in ('gpipe', '1f1b'):
      self.assertEqual(_Rows(schedule_builders.Build(name, 4, 1)), [
          # 0 1   2   3   4   5   6   7
          '0F0 .   .   .   .   .   .   0B0',
          '.   1F0 .   .   .   .   1B0',
          '.   .   2F0 .   .   2B0',
          '.   .   .   3F0 3B0',
      ], name)

  def testTwoPartitionsThreeMicroBatches(self):
    self.assertEqual(_Rows(schedule_builders.Build('gpipe', 2, 3)), [
        # 0 1   2   3   4   5   6   7
        '0F0 0F1 0F2 .   .   0B2 0B1 0B0',
        '.   1F0 1F1 1F2 1B2 1B1 1B0',
    ])
    self.assertEqual(_Rows(schedule_builders.Build('1f1b', 2, 3)), [
        '0F0 0F1 .   0B0 0F2 0B1 .   0B2',
        '.   1F0 1B0 1F1 1B1 1F2 1B2',
    ])

  def testOneFOneBWithFewerMicroBatchesThanPartitions(self):
    self.assertEqual(_Rows(schedule_builders.Build('1f1b', 4, 2)), [
        # 0 1   2   3   4   5   6   7   8   9
        '0F0 0F1 .   .   .   .   .   0B0 .   0B1',
        '.   1F0 1F1 .   .   .   1B0 .   1B1',
        '.   .   2F0 2F1 .   2B0 .   2B1',
        '.   .   .   3F0 3B0 3F1 3B1',
    ])

  def testBothTakeTwiceTPlusKMinusOneTicks(self):
    for kk, tt, ticks in [(3, 4, 12), (1, 5, 10), (4, 1, 8), (2, 8, 18)]:
      for name in ('gpipe', '1f1b'):
        self.assertEqual(schedule_builders.Build(name, kk, tt).num_ticks,
                         ticks, (name, kk, tt))


class BubbleTest(unittest.TestCase):

  def testBubbleFractionOfGPipeAndOneFOneB(self):
    for kk, tt, want in [(3, 4, 2 / 6), (1, 8, 0.0), (4, 1, 3 / 4),
                         (8, 32, 7 / 39)]:
      for name in ('gpipe', '1f1b'):
        self.assertEqual(
            schedule_builders.Build(name, kk, tt).BubbleFraction(), want)

  def testBubbleShrinksWithMoreMicroBatches(self):
    fractions = [schedule_builders.Build('gpipe', 4, t).BubbleFraction()
                 for t in (1, 4, 16, 64)]
    self.assertEqual(fractions, sorted(fractions, reverse=True))
    self.assertLess(fractions[-1], 0.05)

  def testZeroBubbleH1HasLessBubbleThanOneFOneB(self):
    # Unit cells: ZB-H1's W cells fill 1F1B's cool-down.
    self.assertLess(schedule_builders.Build('zb_h1', 3, 6).BubbleFraction(),
                    schedule_builders.Build('1f1b', 3, 6).BubbleFraction())


class BuildSizeArgumentsTest(unittest.TestCase):

  def testRaisesOnSizesBelowOne(self):
    with self.assertRaisesRegex(ValueError, r'num_devices=0.*>= 1'):
      schedule_builders.Build('gpipe', 0, 4)
    with self.assertRaisesRegex(ValueError, r'num_micro_batches=-2.*>= 1'):
      schedule_builders.Build('1f1b', 3, -2)
    with self.assertRaisesRegex(ValueError,
                                r'num_stages_per_device=0.*>= 1'):
      schedule_builders.Build('1f1b', 3, 2, 0)

  def testRaisesOnNonIntegers(self):
    with self.assertRaisesRegex(TypeError, r'2\.5.*float'):
      schedule_builders.Build('gpipe', 2.5, 4)
    with self.assertRaisesRegex(TypeError, r"'4'.*str"):
      schedule_builders.Build('1f1b', 2, '4')
    with self.assertRaisesRegex(TypeError, r'True.*bool'):
      schedule_builders.Build('gpipe', True, 4)


class BuildChecksTheBuildersTableTest(unittest.TestCase):
  """`Build` refuses a registered builder's table that is not what was asked."""

  def _Refuses(self, builder, regex, kk=2, tt=4, v=1):
    schedule_builders.Register('test_bad_builder', builder, replace=True)
    with self.assertRaisesRegex(ValueError, regex) as ctx:
      schedule_builders.Build('test_bad_builder', kk, tt, v)
    self.assertNotIn('\n', str(ctx.exception))

  def testWrongMicroBatches(self):
    # The repro: trained on 3 of the 4 micro-batches, silently.
    self._Refuses(
        lambda kk, tt, v: schedule_builders.Build('1f1b', kk, tt - 1),
        r"^schedule builder 'test_bad_builder' returned a table with 3 "
        r'micro-batches for num_micro_batches=4; make it build T=4 '
        r'micro-batches$')

  def testWrongDevices(self):
    self._Refuses(
        lambda kk, tt, v: schedule_builders.Build('1f1b', kk + 1, tt),
        r"^schedule builder 'test_bad_builder' returned a table with 3 rows "
        r'\(devices\) for num_devices=2; make it build one row per device$')

  def testWrongStagesPerDevice(self):
    self._Refuses(
        lambda kk, tt, v: schedule_builders.Build('1f1b', kk, tt),
        r"^schedule builder 'test_bad_builder' returned a table with 2 "
        r'stages, but K=2 devices x num_stages_per_device=2 makes 4; make it '
        r'build K v = 4 stages \(or refuse v=2 with a ValueError\)$', v=2)

  def testNotASchedule(self):
    self._Refuses(
        lambda kk, tt, v: '0F0,0B0',
        r"^schedule builder 'test_bad_builder' returned '0F0,0B0' \(a str\), "
        r'not a schedules.Schedule; return a Schedule')


# 1F1B at K=2, T=2 as per-row orders (a CSV is retimed, so ticks need not
# line up); the cases below break one cell of it.
_CSV_1F1B = 'csv:0F0,0F1,0B0,0B1/1F0,1B0,1F1,1B1'


class CsvCellChecksTest(unittest.TestCase):
  """A CSV table's cells are checked before it is retimed: each error names
  the row and column of the cell, and a short label of the table."""

  def _Refuses(self, value, regex, kk=2, tt=2, v=1):
    with self.assertRaisesRegex(ValueError, regex) as ctx:
      schedule_builders.FromParam(value, kk, tt, v)
    self.assertNotIn('\n', str(ctx.exception))
    self.assertNotIn('csv:', str(ctx.exception))

  def testTheUnbrokenTableReads(self):
    self.assertEqual(schedule_builders.FromParam(_CSV_1F1B, 2, 2).grid,
                     schedule_builders.Build('1f1b', 2, 2).grid)

  def testStageOutOfRange(self):
    self._Refuses(
        'csv:0F0,0B0/1F0,1B0/2F0,2B0/7F0,3B0',
        r"^schedule 'csv table \(4 rows\)': row 3 \(device 3\), column 0: "
        r'7F0: stage 7 is not in \[0, 4\) \(K=4 devices x '
        r'num_stages_per_device=1\); use stages 0 \.\. 3$', kk=4, tt=1)

  def testWeightGradientAfterAFullBackward(self):
    self._Refuses(
        'csv:0F0,0F1,0B0,0B1,0W1/1F0,1B0,1F1,1B1',
        r"^schedule 'csv table \(2 rows\)': row 0 \(device 0\), column 4: "
        r'0W1 follows the full backward 0B1 \(row 0, column 3\); a W needs '
        r'an I: write 0I1 for 0B1, or drop 0W1$')

  def testWeightGradientWithoutItsInputGradient(self):
    self._Refuses(
        'csv:0F0,0F1,0B0,0W1/1F0,1B0,1F1,1B1',
        r"row 0 \(device 0\), column 3: 0W1 has no 0I1 in the table; a W "
        r'needs the I of its micro-batch and stage: add 0I1 before it')

  def testMicroBatchOutOfRange(self):
    self._Refuses(
        'csv:0F0,0F99999999,0B0,0B1/1F0,1B0,1F1,1B1',
        r"^schedule 'csv table \(2 rows\)': row 0 \(device 0\), column 1: "
        r'0F99999999: micro-batch 99999999 is not in \[0, 2\); use '
        r'micro-batches 0 \.\. 1$')

  def testMicroBatchOutOfRangeWhenTheStepSizeIsNotGiven(self):
    # The layer's constructor reads the table before T is known.
    with self.assertRaisesRegex(
        ValueError, r"row 0 \(device 0\), column 1: 0F99999999: micro-batch "
        r'99999999 is not in \[0, 3\) \(the table names 3 micro-batches\); '
        r'number them 0 \.\. 2$'):
      schedule_builders.FromParam(
          'csv:0F0,0F99999999,0B0,0B1/1F0,1B0,1F1,1B1', 2)

  def testActionTwice(self):
    self._Refuses(
        'csv:0F0,0F1,0F1,0B0,0B1/1F0,1B0,1F1,1B1',
        r'row 0 \(device 0\), column 2: 0F1 already appears at row 0, '
        r'column 1; run each action once$')

  def testFullAndSplitBackwardOfOneMicroBatch(self):
    self._Refuses(
        'csv:0F0,0F1,0B0,0I0,0W0,0B1/1F0,1B0,1F1,1B1',
        r'row 0 \(device 0\), column 3: 0I0: micro-batch 0 of stage 0 '
        r'already has 0B0 \(row 0, column 2\); use either one B or one I '
        r'and one W per micro-batch$')

  def testStageInTwoRows(self):
    self._Refuses(
        'csv:0F0,0F1,0B0,0B1/1F0,1B0,1F1,1B1,0W0',
        r'row 1 \(device 1\), column 4: 0W0: stage 0 runs in row 0; keep '
        r'each stage in one row \(device\)$')

  def testMissingForward(self):
    self._Refuses(
        'csv:0F0,0B0,0B1/1F0,1B0,1F1,1B1',
        r"^schedule 'csv table \(2 rows\)': 0F1 never appears: stage 0 "
        r'\(row 0\) runs one F per micro-batch; add 0F1 to row 0$')

  def testMissingBackward(self):
    self._Refuses(
        'csv:0F0,0F1,0B0/1F0,1B0,1F1,1B1',
        r'0B1 never appears: stage 0 \(row 0\) runs one B \(or one I and '
        r'one W\) per micro-batch; add 0B1 to row 0$')

  def testInputGradientWithoutItsWeightGradient(self):
    self._Refuses(
        'csv:0F0,0F1,0B0,0I1/1F0,1B0,1F1,1B1',
        r'0W1 never appears: stage 0 \(row 0\) runs 0I1, so it needs 0W1 '
        r'too; add 0W1 to row 0 after 0I1$')

  def testTableSizesStillSayWhatToSet(self):
    # A whole table of another size is named as such, not cell by cell.
    self._Refuses(_CSV_1F1B, r"^schedule 'csv table \(2 rows\)' has 2 "
                  r'micro-batches but the step has 4; set num_micro_batches=2',
                  tt=4)
    self._Refuses(_CSV_1F1B, r"^schedule 'csv table \(2 rows\)' has 2 "
                  r'stages, but K=2 devices x num_stages_per_device=2 makes 4',
                  v=2)
    self._Refuses(_CSV_1F1B, r"^schedule 'csv table \(2 rows\)' has 2 rows "
                  r'\(devices\) but the pipeline has 3', kk=3)

  def testAFileIsNamedByItsPath(self):
    path = os.path.join(tempfile.mkdtemp(), 'mine.csv')
    with open(path, 'w') as f:
      f.write('0F0,0F1,0B0\n1F0,1B0,1F1,1B1\n')
    with self.assertRaisesRegex(ValueError, rf"^schedule '{path}': 0B1 "
                                'never appears'):
      schedule_builders.FromParam(path, 2, 2)

  def testLabel(self):
    self.assertEqual(schedules.Label(_CSV_1F1B), 'csv table (2 rows)')
    self.assertEqual(schedules.Label('1f1b'), '1f1b')
    self.assertEqual(schedules.Label('runs/z.csv'), 'runs/z.csv')


if __name__ == '__main__':
  unittest.main()
