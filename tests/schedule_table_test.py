"""Tests for schedules as data: tensorpipe.schedules and schedule_builders."""

import os
import unittest

from tensorpipe import schedule_builders
from tensorpipe import schedules
from tensorpipe.schedules import Action, Schedule

_FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                         'testdata', 'torch_schedules')


def _Rows(schedule):
  """The grid as one line per device, cells 3 wide, '.' idle (not trailing)."""
  rows = []
  for row in schedule.grid:
    cells = [str(a) if a else '.' for a in row]
    while cells and cells[-1] == '.':
      cells.pop()
    rows.append(' '.join(f'{x:<3}' for x in cells).rstrip())
  return rows


def _Table(rows, num_micro_batches=None, num_stages=None, slots=None):
  """A Schedule from diagram rows like '0F0 .   0B0' ('.' idle)."""
  grid = [[Action.FromStr('' if x == '.' else x) for x in r.split()]
          for r in rows]
  return Schedule(grid, num_micro_batches, num_stages, name='test',
                  slots=slots)


def _Fixture(name):
  with open(os.path.join(_FIXTURES, name), newline='') as f:
    return f.read()


class BuilderGridTest(unittest.TestCase):
  """Each builder against a grid written out by hand."""

  def testGPipe(self):
    self.assertEqual(_Rows(schedule_builders.Build('gpipe', 3, 4)), [
        # 0 1   2   3   4   5   6   7   8   9   10  11
        '0F0 0F1 0F2 0F3 .   .   .   .   0B3 0B2 0B1 0B0',
        '.   1F0 1F1 1F2 1F3 .   .   1B3 1B2 1B1 1B0',
        '.   .   2F0 2F1 2F2 2F3 2B3 2B2 2B1 2B0',
    ])

  def testOneFOneB(self):
    self.assertEqual(_Rows(schedule_builders.Build('1f1b', 3, 4)), [
        # 0 1   2   3   4   5   6   7   8   9   10  11
        '0F0 0F1 0F2 .   .   0B0 0F3 0B1 .   0B2 .   0B3',
        '.   1F0 1F1 .   1B0 1F2 1B1 1F3 1B2 .   1B3',
        '.   .   2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3',
    ])

  def testInterleavedOneFOneB(self):
    # Stages 0, 2 on device 0; 1, 3 on device 1 (round-robin).
    self.assertEqual(_Rows(schedule_builders.Build('interleaved_1f1b', 2, 4, 2)), [
        # 0 1   2   3   4   5   6   7   8   9   10  11  12  13  14  15  16  17
        '0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 .   2B2 .   2B3 0B2 0B3',
        '.   1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3',
    ])

  def testZeroBubbleH1(self):
    self.assertEqual(_Rows(schedule_builders.Build('zb_h1', 3, 3)), [
        # 0 1   2   3   4   5   6   7   8   9   10
        '0F0 0F1 0F2 .   .   0I0 0W0 0I1 0W1 0I2 0W2',
        '.   1F0 1F1 .   1I0 1F2 1I1 1W0 1I2 1W1 1W2',
        '.   .   2F0 2I0 2F1 2I1 2F2 2I2 2W0 2W1 2W2',
    ])

  def testZeroBubbleV(self):
    # Device 0 holds stages 0 and 3, device 1 stages 1 and 2 (a V).
    self.assertEqual(_Rows(schedule_builders.Build('zb_v', 2, 3, 2)), [
        # 0 1   2   3   4   5   6   7   8   9   10  11  12  13  14  15  16  17  18
        '0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0I0 0W0 3F2 3I2 3W2 0I1 0W1 0I2 0W2',
        '.   1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1I1 2I2 1I2 1W1 2W2 1W2',
    ])

  def testEveryBuilderValidatesAndIsAsEarlyAsItsOrderAllows(self):
    for name, v in [('gpipe', 1), ('1f1b', 1), ('interleaved_1f1b', 2),
                    ('interleaved_1f1b', 3), ('zb_h1', 1), ('zb_v', 2)]:
      for kk in range(1, 6):
        for tt in range(1, 10):
          if ((name == 'interleaved_1f1b' and tt % kk) or
              (name == 'zb_v' and tt < 2 * kk - 1)):
            continue
          s = schedule_builders.Build(name, kk, tt, v)   # validates
          self.assertEqual(s.num_stages, kk * v)
          self.assertEqual(s.Retimed().grid, s.grid, (name, kk, tt, v))

  def testOneFOneBNeedsFewerSlotsThanGPipe(self):
    self.assertEqual(schedule_builders.Build('gpipe', 3, 4).SlotsPerDevice(),
                     [4, 4, 4])
    self.assertEqual(schedule_builders.Build('1f1b', 3, 4).SlotsPerDevice(),
                     [3, 2, 1])
    self.assertEqual(schedule_builders.Build('1f1b', 3, 2).SlotsPerDevice(),
                     [2, 2, 1])
    # ZB-H1 keeps 1F1B's boundary inputs; its stash holds I-to-W pairs.
    zb = schedule_builders.Build('zb_h1', 3, 3)
    self.assertEqual(zb.SlotsPerDevice(), [3, 2, 1])
    self.assertEqual(zb.StashSlots(), {0: 1, 1: 2, 2: 3})
    self.assertEqual(
        schedule_builders.Build('interleaved_1f1b', 2, 4, 2).NumSlots(),
                     {0: 4, 1: 3, 2: 2, 3: 1})

  def testDerivedSlotsEqualTheEnginesSlotRule(self):
    # The lowest-free slot of each F is 1F1B's m mod min(K - k, T).
    for kk in range(1, 6):
      for tt in range(1, 10):
        for name in ('1f1b', 'gpipe'):
          s = schedule_builders.Build(name, kk, tt)
          bare = Schedule(s.grid, tt, kk)
          self.assertEqual(bare.Slots(), s.slots, (name, kk, tt))


class RefusalTest(unittest.TestCase):
  """Builders refuse what they do not support, in one line."""

  def _Refuses(self, regex, *args):
    with self.assertRaisesRegex(ValueError, regex) as ctx:
      schedule_builders.Build(*args)
    self.assertNotIn('\n', str(ctx.exception))

  def testRefusals(self):
    self._Refuses(r"'gpipe' runs one stage per device.*=2; use 1",
                  'gpipe', 2, 4, 2)
    self._Refuses(r"'1f1b' runs one stage.*=3", '1f1b', 2, 4, 3)
    self._Refuses(r"'zb_h1' runs one stage", 'zb_h1', 2, 4, 2)
    self._Refuses(r'interleaved_1f1b needs num_stages_per_device >= 2, got 1',
                  'interleaved_1f1b', 2, 4, 1)
    self._Refuses(r'multiple of num_devices=4, got 6; use T=8',
                  'interleaved_1f1b', 4, 6, 2)
    self._Refuses(r'zb_v holds exactly 2 stages.*=1; use 2', 'zb_v', 2, 4, 1)
    self._Refuses(r'zb_v needs num_micro_batches >= 2K-1 = 7 at K=4, got 6',
                  'zb_v', 4, 6, 2)
    self._Refuses(r"unknown schedule 'zb_h3'; use one of", 'zb_h3', 2, 4)
    self._Refuses(r'num_micro_batches=0', '1f1b', 2, 0)


class ValidateTest(unittest.TestCase):
  """Broken tables are refused, naming device and tick, with the grid."""

  def _Broken(self, rows, regex, **kw):
    with self.assertRaisesRegex(ValueError, regex) as ctx:
      _Table(rows, **kw).Validate()
    first, *grid = str(ctx.exception).split('\n')
    self.assertRegex(first, r'device \d+, tick \d+')
    self.assertTrue(grid[0].startswith('tick'), grid)
    self.assertIn('<-- device', '\n'.join(grid))
    return first

  def testBackwardBeforeItsForward(self):
    self._Broken(['0B0 0F0'], r'device 0, tick 0: 0B0 runs before 0F0')

  def testForwardOnTheSameTickAsTheStageBefore(self):
    self._Broken(['0F0 .   .   0B0',
                  '1F0 1B0'], r'device 1, tick 0: 1F0 runs before 0F0')

  def testBackwardBeforeTheNextStagesBackward(self):
    self._Broken(['0F0 .   0B0',
                  '.   1F0 .   1B0'],
                 r'device 0, tick 2: 0B0 runs before 1B0 or 1I0')

  def testWeightGradientBeforeItsInputGradient(self):
    self._Broken(['0F0 0W0 0I0'], r'device 0, tick 1: 0W0 runs before 0I0')

  def testActionRunsTwice(self):
    self._Broken(['0F0 0F0 0B0'], r'device 0, tick 1: 0F0 already ran on '
                 r'tick 0')

  def testBothFullAndInputBackward(self):
    self._Broken(['0F0 0I0 0B0 0W0'],
                 r'device 0, tick 2: 0B0: micro-batch 0 of stage 0 already '
                 r'ran 0I0 on tick 1')

  def testMissingBackward(self):
    self._Broken(['0F0 0F1 0B0'], r'device 0, tick 2: 0B1 never runs',
                 num_micro_batches=2)

  def testInputGradientWithoutWeightGradient(self):
    self._Broken(['0F0 0I0'], r'device 0, tick 1: 0W0 never runs')

  def testStageOnTwoDevices(self):
    self._Broken(['0F0 .   .   0B1',
                  '.   0F1 0B0'],
                 r'device 1, tick 1: 0F1: stage 0 already runs on device 0')

  def testMicroBatchOutOfRange(self):
    self._Broken(['0F0 0F2 0B0'],
                 r'device 0, tick 1: 0F2: micro-batch 2 is not in \[0, 2\)',
                 num_micro_batches=2)

  def testStageOutOfRange(self):
    self._Broken(['0F0 1F0'], r'device 0, tick 1: 1F0: stage 1 is not in '
                 r'\[0, 1\)', num_stages=1)

  def testStageNeverRuns(self):
    self._Broken(['0F0'], r'device 0, tick 0: stage 1 never runs; give '
                 r'stage 1 a device', num_stages=2)

  def testExplicitSlotReusedWhileHeld(self):
    rows = ['0F0 0F1 0B0 0B1']
    _Table(rows, slots={(0, 0): 0, (0, 1): 1}).Validate()
    self._Broken(rows, r'device 0, tick 1: 0F1 writes boundary slot 0 of '
                 r'stage 0 while micro-batch 0 holds it until tick 2',
                 slots={(0, 0): 0, (0, 1): 0})

  def testGridMarksTheTick(self):
    with self.assertRaises(ValueError) as ctx:
      _Table(['0F0 .   .   0B0',
              '1F0 1B0']).Validate()
    self.assertEqual(str(ctx.exception).split('\n')[1:], [
        'tick    0   1   2   3',
        'dev 0   0F0 .   .   0B0',
        'dev 1   1F0 1B0 .   .     <-- device 1, tick 0',
        '        ^^^',
    ])

  def testFromOrdersNamesADeadlock(self):
    with self.assertRaisesRegex(ValueError, r'deadlock at tick 1 \(device 0: '
                                r'0B0, device 1: 1B0 wait on each other\); reorder them'):
      schedules.FromOrders([[Action('F', 0, 0), Action('B', 0, 0)],
                            [Action('B', 0, 1), Action('F', 0, 1)]])


class CsvTest(unittest.TestCase):
  """torch.distributed.pipelining's compute-only CSV."""

  def testWritesTorchsText(self):
    s = schedule_builders.Build('zb_h1', 2, 2)
    self.assertEqual(s.ToCsv(), '0F0,0F1,,0I0,0W0,0I1,0W1\r\n'
                                ',1F0,1I0,1F1,1I1,1W0,1W1\r\n')

  def testRoundTripOfEveryBuilder(self):
    for name, kk, tt, v in [('gpipe', 3, 4, 1), ('1f1b', 4, 3, 1),
                            ('interleaved_1f1b', 2, 4, 2), ('zb_h1', 3, 5, 1),
                            ('zb_v', 3, 5, 2)]:
      s = schedule_builders.Build(name, kk, tt, v)
      back = Schedule.FromCsv(s.ToCsv(), num_micro_batches=tt,
                              num_stages=kk * v)
      self.assertEqual(back, s, name)
      self.assertEqual(back.ToCsv(), s.ToCsv())

  def testTorchFixturesLoadValidateAndMatchOurBuilders(self):
    cases = [
        ('Interleaved1F1B_ranks2_stages4_mb4.csv', 'interleaved_1f1b', 2, 4, 2),
        ('Interleaved1F1B_ranks4_stages8_mb8.csv', 'interleaved_1f1b', 4, 8, 2),
        ('InterleavedZeroBubble_ranks2_stages2_mb4.csv', 'zb_h1', 2, 4, 1),
        ('InterleavedZeroBubble_ranks4_stages4_mb8.csv', 'zb_h1', 4, 8, 1),
        ('ZBVZeroBubble_ranks2_stages4_mb4.csv', 'zb_v', 2, 4, 2),
        ('ZBVZeroBubble_ranks4_stages8_mb8.csv', 'zb_v', 4, 8, 2),
    ]
    for fixture, name, kk, tt, v in cases:
      text = _Fixture(fixture)
      theirs = Schedule.FromCsv(text, name=fixture).Validate()
      self.assertEqual(theirs.ToCsv(), text, fixture)
      ours = schedule_builders.Build(name, kk, tt, v)
      self.assertEqual((theirs.num_devices, theirs.num_stages,
                        theirs.num_micro_batches), (kk, kk * v, tt))
      self.assertEqual(theirs.Orders(), ours.Orders(), fixture)
      self.assertEqual(theirs.Retimed().grid, ours.grid, fixture)
      self.assertEqual(theirs.grid == ours.grid, name == 'zb_v', fixture)

  def testTorchInterleavedFixtureAsADiagram(self):
    # torch leaves the cool-down's odd steps idle; Retimed() closes them.
    s = Schedule.FromCsv(_Fixture('Interleaved1F1B_ranks2_stages4_mb4.csv'))
    self.assertEqual(_Rows(s), [
        '0F0 0F1 2F0 2F1 .   .   0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 .   2B2 .'
        '   2B3 .   0B2 .   0B3',
        '.   1F0 1F1 .   3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 .'
        '   1B2 .   1B3',
    ])

  def testRefusesCommunicationActionsInOneLine(self):
    for cell in ('1SEND_F0', '0RECV_F1', '1SEND_B0', '0RECV_B0', '0UNSHARD',
                 '0RESHARD', '0REDUCE_GRAD', '(0F1;1B0)OVERLAP_F_B'):
      with self.assertRaisesRegex(
          ValueError, r"row 1 \(device 1\), column 2 \(tick 2\): '.*' is a "
          r"communication or overlap action.*format='compute_only'") as ctx:
        Schedule.FromCsv(f'0F0,0B0\r\n,1F0,"{cell}"\r\n')
      self.assertNotIn('\n', str(ctx.exception))

  def testRefusesTextThatIsNoAction(self):
    for cell in ('F0', '0X0', '0F', '0Fa'):
      with self.assertRaisesRegex(ValueError, rf"column 0 \(tick 0\): "
                                  rf"'{cell}' is not an action; write"):
        Schedule.FromCsv(cell + '\r\n')


class RegistryTest(unittest.TestCase):

  def testBuiltins(self):
    for name in ('gpipe', '1f1b', 'interleaved_1f1b', 'zb_h1', 'zb_v'):
      self.assertIn(name, schedule_builders.Names())

  def testRegisterABuilder(self):
    def Reverse1F1B(kk, tt, v):
      s = schedule_builders.Build('1f1b', kk, tt, v)
      return Schedule(s.grid, tt, kk, name='')

    schedule_builders.Register('test_copy_1f1b', Reverse1F1B)
    s = schedule_builders.Build('test_copy_1f1b', 2, 3)
    self.assertEqual(s.name, 'test_copy_1f1b')
    self.assertEqual(s.grid, schedule_builders.Build('1f1b', 2, 3).grid)
    with self.assertRaisesRegex(ValueError, r"'test_copy_1f1b' is already "
                                r'registered; pick another name or pass '
                                r'replace=True'):
      schedule_builders.Register('test_copy_1f1b', Reverse1F1B)
    schedule_builders.Register('test_copy_1f1b', Reverse1F1B, replace=True)
    with self.assertRaisesRegex(ValueError, r"'gpipe' is already registered"):
      schedule_builders.Register('gpipe', Reverse1F1B)
    with self.assertRaisesRegex(ValueError, r'non-empty string, got \'\''):
      schedule_builders.Register('', Reverse1F1B)

  def testARegisteredScheduleStatesItsOwnStagesPerDevice(self):
    schedule_builders.Register('test_own_v', schedule_builders.ZeroBubbleV,
                               replace=True, stages_per_device=2)
    self.assertEqual(
        schedule_builders.NumStagesPerDevice(_Params('test_own_v')), 2)
    self.assertEqual(schedule_builders.StagesPerDevice('zb_v'), 2)
    for name in ('gpipe', 'zb_h1', 'test_copy_1f1b', 'csv:0F0,0B0', None):
      self.assertEqual(schedule_builders.StagesPerDevice(name), 1, name)
    with self.assertRaisesRegex(ValueError, r"schedule 'test_bad_v': "
                                r'stages_per_device=0 must be a positive int'):
      schedule_builders.Register('test_bad_v', schedule_builders.GPipe,
                                 stages_per_device=0)

  def testBuildValidatesARegisteredTable(self):
    schedule_builders.Register('test_broken',
                               lambda kk, tt, v: _Table(['0B0 0F0']),
                               replace=True)
    with self.assertRaisesRegex(ValueError, r"schedule 'test': device 0, "
                                r'tick 0: 0B0 runs before 0F0'):
      schedule_builders.Build('test_broken', 1, 1)


class ForwardOnlyTest(unittest.TestCase):

  def testTwoStagesPerDeviceRunGPipesForwardOrderAsEarlyAsTheyCan(self):
    # Stages 0, 2 on device 0; 1, 3 on device 1 (interleaved placement).
    table = schedule_builders.ForwardOnly([0, 1, 0, 1], 2, 3)
    self.assertEqual(table.name, 'gpipe_forward')
    self.assertEqual(_Rows(table), [
        # 0 1   2   3   4   5   6     (t + s ascending, then t)
        '0F0 0F1 2F0 0F2 2F1 2F2',
        '.   1F0 1F1 3F0 1F2 3F1 3F2',
    ])


class _Params:
  """The TensorPipeLayer Params fields the schedule facts read."""

  def __init__(self, schedule, v=None, **kwargs):
    self.name, self.schedule, self.num_stages_per_device = 'pipe', schedule, v
    self.num_micro_batches, self.grad_sum = 4, 'sequential'
    self.recompute_impl = 'explicit'
    self.__dict__.update(kwargs)


class ScheduleFactsTest(unittest.TestCase):

  def testOnlyGPipeHasTheLossOutside(self):
    self.assertFalse(schedules.LossInside('gpipe'))
    self.assertFalse(schedule_builders.Build('gpipe', 2, 2).loss_inside)
    for name in ('1f1b', 'interleaved_1f1b', 'zb_h1', 'zb_v'):
      self.assertTrue(schedules.LossInside(name), name)
    table = schedule_builders.Build('1f1b', 2, 2)
    self.assertTrue(table.loss_inside)
    self.assertTrue(schedules.LossInside(
        schedules.CSV_PREFIX + table.ToCsv().replace('\n', '/')))

  def testStagesPerDeviceAndTheirDevices(self):
    self.assertEqual(schedule_builders.NumStagesPerDevice(_Params('zb_v')), 2)
    self.assertEqual(schedule_builders.NumStagesPerDevice(_Params('1f1b')), 1)
    self.assertEqual(
        schedule_builders.NumStagesPerDevice(_Params('interleaved_1f1b', 3)),
        3)
    with self.assertRaisesRegex(ValueError, r'num_stages_per_device=0 must '
                                r'be an int >= 1'):
      schedule_builders.NumStagesPerDevice(_Params('1f1b', 0))
    self.assertEqual(schedule_builders.StageDevices(_Params('gpipe'), 3),
                     [0, 1, 2])
    self.assertEqual(
        schedule_builders.StageDevices(_Params('interleaved_1f1b', 2), 2),
        [0, 1, 0, 1])
    self.assertEqual(schedule_builders.StageDevices(_Params('zb_v'), 2),
                     [0, 1, 1, 0])

  def testPlacementReportSaysWhichDeviceHoldsWhichStage(self):
    zb_v = schedule_builders.StageDevices(_Params('zb_v'), 2)
    self.assertEqual(
        schedule_builders.PlacementReport(zb_v, ['/CPU:0', '/CPU:1'], 'zb_v'),
        "4 stages on 2 devices, 2 per device (schedule 'zb_v'):\n"
        '  device 0 (/CPU:0): stages 0, 3\n'
        '  device 1 (/CPU:1): stages 1, 2')
    self.assertEqual(
        schedule_builders.PlacementReport([0, 1], ['/GPU:0', '/GPU:1'],
                                          'gpipe'),
        "2 stages on 2 devices, 1 per device (schedule 'gpipe'):\n"
        '  device 0 (/GPU:0): stage 0\n'
        '  device 1 (/GPU:1): stage 1')

  def testCheckScheduleParamsRefusals(self):
    schedule_builders.CheckScheduleParams(_Params('gpipe'), 2)
    schedule_builders.CheckScheduleParams(_Params('zb_h1'), 2)
    with self.assertRaisesRegex(ValueError, r"schedule='gpipe' runs one "
                                r'stage per device'):
      schedule_builders.CheckScheduleParams(_Params('gpipe', 2), 2)
    with self.assertRaisesRegex(ValueError, r"schedule='nope' is not one "
                                r'of'):
      schedule_builders.CheckScheduleParams(_Params('nope'), 2)
    with self.assertRaisesRegex(ValueError, r"grad_sum='pairwise' needs "
                                r'whole backward cells'):
      schedule_builders.CheckScheduleParams(
          _Params('zb_h1', grad_sum='pairwise'), 2)
    with self.assertRaisesRegex(ValueError, r"recompute_impl="
                                r"'tf_recompute_grad' does not apply"):
      schedule_builders.CheckScheduleParams(
          _Params('1f1b', recompute_impl='tf_recompute_grad'), 2)


if __name__ == '__main__':
  unittest.main()
