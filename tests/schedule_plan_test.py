"""tensorpipe.schedule_plan and model_analysis --schedules: every schedule."""

from absl import app
from absl import flags
import tensorflow as tf

from tensorpipe import model_analysis
from tensorpipe import schedule_builders
from tensorpipe import schedule_plan
from tensorpipe import schedule_program
from tensorpipe.layers import linear
from tools import model_analysis as model_analysis_tool


def _FcLayers(n=4, dim=8):
  return [linear.FCLayer.Params().Set(name=f'fc{i}', input_dim=dim,
                                      output_dim=dim) for i in range(n)]


def _Rows(num_layers=4, kk=2, tt=4, recompute=True):
  report = model_analysis.AnalyzeLayers(
      _FcLayers(num_layers), [[2 * tt, 8]], num_partitions=kk,
      num_micro_batches=tt)
  rows = schedule_plan.CompareSchedules(report, recompute=recompute)
  return report, {r.name: r for r in rows}


class CompareSchedulesTest(tf.test.TestCase):

  def testMemoryWalkByHand(self):
    # One stage per micro-batch: input 10 B, output 20, layer outputs 100,
    # weight layers' outputs 60 and inputs 50, working set 7, weights 1000.
    st = schedule_plan._Stage(x=10, out=20, internal=100, dz=60, xs=50,
                              work=7, weights=1000)

    def Peak(name, recompute, kk=1, stages=(st,)):
      table = schedule_builders.Build(name, kk, 2, 1)
      return schedule_plan._Memory(table, list(stages), recompute, 2)
    # 1F1B, K=1, T=2: F0 B0 F1 B1. A B cell with recompute holds the
    # larger of the recompute (100) and, at its end, the weight ops' output
    # gradients (60) with the new gradient sums (1000) beside the old ones
    # (1000, held from the first B on), + the gathered input 10 and its
    # working set 7.
    self.assertEqual(Peak('1f1b', True), ([1000 + 1060 + 17], [0]))
    # Without recompute the table is unrolled, one cell at a time; a
    # micro-batch's tapes (10 + 100) are held from its F through its B.
    self.assertEqual(Peak('1f1b', False), ([1000 + 110 + 17], [0]))
    # ZB-H1 without recompute, one cell at a time: its I holds the tapes
    # (110), dz (60) and its own working set (7); then the stash (50 + 60)
    # until W.
    self.assertEqual(Peak('zb_h1', False), ([1000 + 110 + 60 + 7], [110]))
    # ZB-H1 with recompute: the I cell's outputs leave its function
    # together, the weight ops' inputs (within the recompute's 100) and dz
    # (60): 1000 + 110 + 60 + 7; the stash (50 + 60) lives from I to W.
    self.assertEqual(Peak('zb_h1', True), ([1000 + 170 + 7], [110]))
    # GPipe, K=1, T=2: F0 F1 B1 B0. In B0 it holds the outputs' gradients
    # (2 x 20), B1's input gradient (10), the B cell's 1060 + 17, and the
    # gradient sums from its first B on.
    self.assertEqual(Peak('gpipe', True),
                     ([1000 + 40 + 10 + 1060 + 17], [0]))
    # Two devices, 1F1B, T=2: stage 1 (input 20, layers 200, no weight
    # op, weights 3000) keeps its input from F to B: 3000 + 20 + 3000 + 9.
    # Each device also holds its ring of depth 1 the whole run: stage 0
    # its last output (20), stage 1 its last input gradient (its input's
    # size, 20). The table is all ramp: with fixed ramps (the default) one
    # pass with a barrier at every tick of a device (LoopBarriers), or a
    # switching loop (schedule_program.RampTicks(0)): one cell at a time
    # either way.
    st1 = schedule_plan._Stage(x=20, out=30, internal=200, dz=0, xs=0,
                               work=9, weights=3000)
    self.assertEqual(Peak('1f1b', True, kk=2, stages=(st, st1)),
                     ([1000 + 1060 + 17 + 20, 3000 + 20 + 3000 + 9 + 20],
                      [0, 0]))
    # ZB-V, K=1, T=4, v=2: its steady iteration (F1 I1 W1 F0 I0 W0) waits
    # after W1 (schedule_program.LoopBarriers), so a W cell's stash entry,
    # freed when its run of cells ends, is gone before I0: at I0 the
    # device holds I0's 10 + 100 + 60 + 7, both stages' sums and the rings
    # between them (20 + 10); one entry (110) at a time.
    table = schedule_builders.Build('zb_v', 1, 4, 2)
    self.assertEqual(schedule_plan._Memory(table, [st, st], True, 2),
                     ([2000 + 177 + 30], [110]))

  def testABarrierOrdersTheCellsOfAnIteration(self):
    # Interleaved 1F1B, K=2, v=2, T=8: the steady iteration has 8 ticks
    # (device 0: F0 B2 F0 B2 F2 B0 F2 B0), and device 0, with two stages,
    # waits for its previous tick after each B cell (ticks 1, 3 and 5;
    # the iteration's end after 7: schedule_program.LoopBarriers), so no
    # two of its B cells share a run (before the wait after B cells, only
    # before repeats: runs of 2 and 4, two B cells in one).
    table = schedule_builders.Build('interleaved_1f1b', 2, 8, 2)
    program = schedule_program.Compile(table)
    windows = schedule_plan._Windows(program, 1)
    loop = max(schedule_program.Loops(program.branch, 0, table.num_ticks),
               key=lambda x: len(x.steady))
    self.assertLen(loop.steady, 8)
    steady = [w for w in windows[0] if len(w) > 1 and
              loop.first <= w[0] < loop.end]
    self.assertTrue(steady)
    self.assertEqual({len(w) for w in steady}, {2})
    self.assertEqual([w[0] - steady[0][0] for w in steady[:4]], [0, 2, 4, 6])
    for w in steady:
      self.assertEqual([program.table.grid[0][c].op for c in w], ['F', 'B'])

  def testARampWaitsAtEveryTickOfADevice(self):
    # 1F1B, K=2, T=2 is all ramp (one loop that runs once):
    #   device 0: F0 F1 .  B0 .  B1     device 1: .  F0 B0 F1 B1 .
    # A device waits after each cell it ran (schedule_program.
    # LoopBarriers), so no two of its cells share a window; waiting only
    # before repeats would give device 0 the window [1, 2, 3, 4] (F1, B0).
    # With fixed ramps (schedule_program.RAMP_TICKS, the default):
    program = schedule_program.Compile(schedule_builders.Build('1f1b', 2, 2))
    self.assertEqual(
        schedule_plan._Windows(program, 1),
        [[[0], [1, 2], [3, 4], [5]], [[0, 1], [2], [3], [4, 5]]])
    # Switching ramps: a window per tick.
    with schedule_program.RampTicks(0):
      self.assertEqual(schedule_plan._Windows(program, 1),
                       [[[c] for c in range(6)]] * 2)

  def testAForwardOnlyTableIsRefused(self):
    table = schedule_builders.ForwardOnly([0, 1, 0, 1], 2, 4)
    st = schedule_plan._Stage(x=10, out=20, internal=100, dz=0, xs=0,
                              work=7, weights=1000)
    with self.assertRaisesRegex(ValueError, 'has no backward cell'):
      schedule_plan._Memory(table, [st] * 4, True, 2)

  def testOneStageOneMicroBatchIsNotRecomputed(self):
    # K=1, T=1: the step runs the stage once under a tape (as without
    # recompute), so with and without recompute predict the same.
    st = schedule_plan._Stage(x=10, out=20, internal=100, dz=60, xs=50,
                              work=7, weights=1000)
    table = schedule_builders.Build('1f1b', 1, 1, 1)
    self.assertEqual(schedule_plan._Memory(table, [st], True, 2),
                     schedule_plan._Memory(table, [st], False, 2))

  def testMemoryFromTheReport(self):
    # 4 FC layers 8 -> 8, batch 8 in T=4 micro-batches of 2, float32, K=2:
    # per micro-batch a layer's input or output is 2 x 8 x 4 = 64 B, its
    # weights 72 x 4 = 288 B; a stage of 2 layers: internal 128, weights
    # 576, working set 64 + 64 + 288 = 416.
    report, rows = _Rows()
    del report
    # 1F1B device 1 (the last stage), in its B cell: the gradient sums
    # 576 + its input 64 + the larger of the recompute 128 and the weight
    # ops' output gradients 128 with the new sums 576 + the working set
    # 416 + its input-gradient ring 64.
    self.assertEqual(rows['1f1b'].activation_bytes[1],
                     576 + 64 + 704 + 416 + 64)
    self.assertEqual(rows['gpipe'].stash_bytes, (0, 0))
    self.assertGreater(min(rows['zb_h1'].stash_bytes), 0)

  def testStepRatiosAreTheSimulatorsIdeals(self):
    # Equal layers: t_F = t_I = t_W per device, as in the ideals.
    _, rows = _Rows()
    self.assertEqual({n: round(r.ratio_to_1f1b, 3) for n, r in rows.items()},
                     {'gpipe': 1.0, '1f1b': 1.0, 'interleaved_1f1b': 0.9,
                      'zb_h1': 0.9, 'zb_v': 0.85})
    self.assertAlmostEqual(rows['gpipe'].bubble, 1 / 5)

  def testRefusedSchedulesSayWhy(self):
    _, rows = _Rows(tt=3)
    self.assertIn('multiple of num_devices=2, got 3',
                  rows['interleaved_1f1b'].refused)
    self.assertFalse(rows['zb_v'].refused)
    _, rows = _Rows(num_layers=2, tt=4)
    self.assertEqual(rows['zb_v'].refused, 'K*v = 4 stages need at least 4 '
                     'layers, the model has 2')
    self.assertFalse(rows['zb_h1'].refused)


class ToolTest(tf.test.TestCase):

  def _Run(self, *argv):
    fv = flags.FlagValues()
    model_analysis_tool.DefineFlags(fv)
    fv(['model_analysis'] + list(argv))
    return model_analysis_tool.Run(fv)

  def testSchedulesAll(self):
    text = self._Run('--model=consistency', '--num_partitions=2',
                     '--num_micro_batches=4', '--batch_size=8',
                     '--schedules=all')
    self.assertIn('Schedules side by side (K=2, T=4, recompute', text)
    for name in ('gpipe', '1f1b', 'interleaved_1f1b', 'zb_h1', 'zb_v'):
      self.assertRegex(text, rf'\n{name} +[12] ')

  def testSaysEveryScheduleRunsInTheLayer(self):
    text = self._Run('--model=consistency', '--num_partitions=2',
                     '--num_micro_batches=4', '--batch_size=8',
                     '--schedules=gpipe,zb_v')
    self.assertNotIn('Only gpipe and 1f1b run', text)
    self.assertIn('Every schedule here trains in TensorPipeLayer '
                  "(schedule='<name>', num_stages_per_device=v)", text)

  def testUnknownScheduleIsRefused(self):
    fv = flags.FlagValues()
    model_analysis_tool.DefineFlags(fv)
    fv(['model_analysis', '--model=consistency', '--schedules=zb_h2'])
    with self.assertRaisesRegex(app.UsageError, r"'zb_h2' is not one of"):
      model_analysis_tool.main(['model_analysis'], flag_values=fv)


if __name__ == '__main__':
  tf.test.main()
