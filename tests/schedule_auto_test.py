"""tensorpipe.schedule_auto: the planner behind schedule='auto'."""

import dataclasses
import os
import tempfile

from absl import flags
import tensorflow as tf

from tensorpipe import base_experiment
from tensorpipe import cost_model
from tensorpipe import hyperparams
from tensorpipe import logdir as logdir_lib
from tensorpipe import model_analysis
from tensorpipe import pipeline
from tensorpipe import schedule_auto
from tensorpipe import synthetic_input
from tensorpipe import tasks
from tensorpipe import test_utils
from tensorpipe import trainer_lib
from tensorpipe.layers import linear
from tools import model_analysis as model_analysis_tool

test_utils.ConfigureTestDevices()


def _FcLayers(n=4, dim=8):
  return [linear.FCLayer.Params().Set(name=f'fc{i}', input_dim=dim,
                                      output_dim=dim) for i in range(n)]


def _Report(kk=2, tt=4):
  return model_analysis.AnalyzeLayers(_FcLayers(), [[2 * tt, 8]],
                                      num_partitions=kk, num_micro_batches=tt,
                                      exact_optimizer_state=False)


def _Profile(tick=0.0, cores=2):
  # t_F = 1, t_B = 2, t_I = t_W = 1 per layer: two layers per stage at v=1.
  return cost_model.Profile(
      (cost_model.LayerCost(1.0, 2.0, 1.0, 1.0),) * 4, 2, tick_s=tick,
      num_cores=cores)


def _Pipe(**kw):
  p = pipeline.TensorPipeLayer.Params().Set(
      name='pipe', layers=_FcLayers(), num_partitions=2, num_micro_batches=4,
      input_shapes=[[8, 8]], schedule='auto')
  return p.Set(**kw)


class RankTest(tf.test.TestCase):

  def testSeparateExecutorsRankByBubble(self):
    # K=2, T=4, no recompute, per layer t_F = t_I = t_W = 1: every device
    # works 4 x (2 layers) x 3 = 24, plus its bubble as dataflow. 1F1B and
    # GPipe: (K - 1)(f + b) = 6 (30); interleaved: 3 (27); ZB-H1: device 1
    # waits one forward of 2 layers, then runs back to back (26); ZB-V:
    # one forward of 1 layer (25). 1F1B before GPipe: same ticks, less
    # memory.
    plan = schedule_auto.Rank(_Report(), _Profile(), recompute=False,
                              regime='separate')
    self.assertEqual([(r.name, r.num_stages_per_device) for r in plan.rows],
                     [('zb_v', 2), ('zb_h1', 1), ('interleaved_1f1b', 2),
                      ('1f1b', 1), ('gpipe', 1)])
    self.assertEqual([round(r.step_s, 6) for r in plan.rows],
                     [25.0, 26.0, 27.0, 30.0, 30.0])
    self.assertEqual({r.work_s for r in plan.rows}, {48.0})
    self.assertEqual(plan.best.name, 'zb_v')

  def testSharedPoolRanksByTicksWhenTheWorkIsEqual(self):
    # Every table does 4 x 4 x (1 + 2) = 48 of work, 24 on 2 cores; a tick
    # costs 0.5: GPipe and 1F1B 10 ticks (29), ZB-H1 13 (30.5),
    # interleaved 18 (33), ZB-V 25 (36.5).
    plan = schedule_auto.Rank(_Report(), _Profile(tick=0.5),
                              recompute=False, regime='shared')
    self.assertEqual([r.name for r in plan.rows],
                     ['1f1b', 'gpipe', 'zb_h1', 'interleaved_1f1b', 'zb_v'])
    self.assertEqual([r.step_s for r in plan.rows],
                     [29.0, 29.0, 30.5, 33.0, 36.5])
    self.assertEqual([r.ticks for r in plan.rows], [10, 10, 13, 18, 25])

  def testMemoryBudgetRefusesWhatDoesNotFit(self):
    # The fullest device's step peak without recompute (schedule_plan's
    # walk, its rules checked by hand in schedule_plan_test): 1F1B 1440 B,
    # ZB-H1 and ZB-V 1568, interleaved 1696, GPipe 2016. 1F1B's device 0,
    # by hand: two micro-batches' tapes (input 64 + two layer outputs 128,
    # each) + F's working set (64 + 64 + the largest weight 288) and its
    # gathered input 64 + the gradient sums 576 = 2 x 192 + 480 + 576.
    # A budget of 1600 B leaves ZB-V, ZB-H1 and 1F1B.
    plan = schedule_auto.Rank(_Report(), _Profile(), recompute=False,
                              regime='separate', memory_budget=1600)
    self.assertEqual([r.name for r in plan.rows if not r.refused],
                     ['zb_v', 'zb_h1', '1f1b'])
    self.assertEqual([r.memory_bytes for r in plan.rows if not r.refused],
                     [1568, 1568, 1440])
    refused = {r.name: r.refused for r in plan.rows if r.refused}
    self.assertEqual(sorted(refused), ['gpipe', 'interleaved_1f1b'])
    self.assertEqual(refused['interleaved_1f1b'], 'memory peak 1.66 KiB is '
                     'over the budget of 1.56 KiB per device')

  def testRefusesScheduleThatDoesNotApply(self):
    # T=3 is no multiple of K=2: interleaved is refused with the builder's
    # reason; K v = 4 stages fit the 4 layers.
    plan = schedule_auto.Rank(_Report(tt=3), _Profile(), recompute=True,
                              regime='shared')
    refused = {r.name: r.refused for r in plan.rows if r.refused}
    self.assertEqual(list(refused), ['interleaved_1f1b'])

  def testProfileOfAnotherModelIsRefused(self):
    prof = cost_model.Profile((cost_model.LayerCost(1, 2, 1, 1),) * 3, 2)
    with self.assertRaisesRegex(ValueError, 'the profile has 3 layers, the '
                                'model 4'):
      schedule_auto.Rank(_Report(), prof, True, 'shared')


class ResolveTest(tf.test.TestCase):

  def testCandidatesFollowTheLayerSettings(self):
    self.assertEqual(schedule_auto.Candidates(_Pipe(grad_sum='pairwise')),
                     [('gpipe', 1), ('1f1b', 1), ('interleaved_1f1b', 2)])
    self.assertEqual(schedule_auto.Candidates(
        _Pipe(recompute_impl='tf_recompute_grad')), [('gpipe', 1)])
    self.assertEqual(schedule_auto.Candidates(_Pipe(num_stages_per_device=2)),
                     [('interleaved_1f1b', 2), ('zb_v', 2)])

  def testRegime(self):
    self.assertEqual(schedule_auto.Regime(['/CPU:0', '/CPU:1']), 'shared')
    self.assertEqual(schedule_auto.Regime(['/GPU:0', '/GPU:1']), 'separate')
    self.assertEqual(schedule_auto.Regime(
        ['/job:worker/replica:0/task:0/device:CPU:0',
         '/job:worker/replica:0/task:1/device:CPU:0']), 'separate')
    # This process's CPU and a server's: two processes.
    self.assertEqual(schedule_auto.Regime(
        ['/CPU:0', '/job:worker/replica:0/task:0/device:CPU:0']),
                     'separate')
    self.assertEqual(schedule_auto.Regime(
        ['/CPU:0', '/job:localhost/replica:0/task:0/device:CPU:1']),
                     'shared')

  def testResolveAutoWithFlopCostsPicks1F1BAndSaysWhy(self):
    lines = []
    q = schedule_auto.ResolveAuto(_Pipe(), lines.append)
    self.assertEqual((q.schedule, q.num_stages_per_device), ('1f1b', 1))
    self.assertIn("schedule='auto' -> '1f1b'", lines[0])
    self.assertIn('FLOP-based costs, no profile', lines[0])
    self.assertIn('shared regime', lines[0])
    p = _Pipe()
    self.assertIs(schedule_auto.ResolveAuto(p.Set(schedule='gpipe')), p)

  def testResolveAutoNeedsLayersAndShapes(self):
    p = _Pipe(layers=None, partitions=[_FcLayers(2), _FcLayers(2)])
    with self.assertRaisesRegex(ValueError, "schedule='auto' plans the cut "
                                'itself and needs `layers`'):
      schedule_auto.ResolveAuto(p)

  def testBadPlanSettingsNameTheValue(self):
    with self.assertRaisesRegex(ValueError, "plan_regime='gpu' is not one "
                                'of'):
      schedule_auto.ResolveAuto(_Pipe(plan_regime='gpu'))
    with self.assertRaisesRegex(ValueError, 'plan_memory_budget=-1 must be '
                                'bytes > 0'):
      schedule_auto.ResolveAuto(_Pipe(plan_memory_budget=-1))

  def testABudgetAtSeveralDevicesWithRecomputeWarns(self):
    # The memory model under-counts GPipe and 1F1B with recompute at K > 1
    # (README): the planner says so where a budget relies on it.
    with self.assertLogs(level='WARNING') as logs:
      schedule_auto.ResolveAuto(_Pipe(plan_memory_budget=1 << 30))
    self.assertIn('plan_memory_budget at K=2 with recompute',
                  '\n'.join(logs.output))
    with self.assertNoLogs(level='WARNING'):
      schedule_auto.ResolveAuto(_Pipe(plan_memory_budget=1 << 30,
                                      recompute=False))

  def testLayerBuiltWithAutoHoldsTheConcreteSchedule(self):
    layer = _Pipe(plan_regime='separate').Instantiate()
    self.assertEqual(layer.params.schedule, 'zb_v')
    self.assertEqual(layer.params.num_stages_per_device, 2)
    self.assertEqual(layer.num_stages, 4)

  def testResolveAutoInSetsTheTreeForParamsTxt(self):
    root = hyperparams.Params()
    root.Define('model', _Pipe(), 'The model.')
    self.assertEqual(schedule_auto.ResolveAutoIn(root, lambda _: None),
                     ['pipe'])
    self.assertIn("model.schedule : '1f1b'", root.ToText())
    self.assertIn('model.num_stages_per_device : 1', root.ToText())


class PartitionCostsTest(tf.test.TestCase):
  """The cut on given or measured per-layer costs instead of FLOPs."""

  def _Sizes(self, layer):
    return [len(s.layers) for s in layer.stages]

  def testTheLayerCutsOnTheGivenCosts(self):
    # Four equal FC layers: FLOPs cut 2 + 2; costs 3, 1, 1, 1 cut 1 + 3.
    self.assertEqual(self._Sizes(_Pipe(schedule='1f1b').Instantiate()),
                     [2, 2])
    layer = _Pipe(schedule='1f1b', partition_costs=[3, 1, 1, 1]).Instantiate()
    self.assertEqual(self._Sizes(layer), [1, 3])
    # No input shapes needed for the cut then.
    layer = _Pipe(schedule='1f1b', input_shapes=None,
                  partition_costs=[1, 1, 1, 3]).Instantiate()
    self.assertEqual(self._Sizes(layer), [3, 1])

  def testBadCostsNameTheValueAndTheFix(self):
    for costs, what in (([1, 1, 1], 'not one number per layer'),
                        ([1, 1, True, 1], 'not one number per layer'),
                        ('1111', 'not one number per layer'),
                        ([1, -1, 1, 1], 'negative, infinite or NaN'),
                        ([1, float('nan'), 1, 1], 'negative, infinite or NaN'),
                        ([0, 0, 0, 0], 'all 0')):
      with self.subTest(costs=costs):
        with self.assertRaisesRegex(ValueError, rf'partition_costs=.*{what}.*'
                                    'give 4 numbers >= 0'):
          _Pipe(schedule='1f1b', partition_costs=costs).Instantiate()
    # One stage: nothing to cut, the costs are still checked.
    with self.assertRaisesRegex(ValueError, 'give 4 numbers'):
      _Pipe(schedule='1f1b', num_partitions=1,
            partition_costs=[1, 1]).Instantiate()
    with self.assertRaisesRegex(ValueError, 'partitions` are given by hand; '
                                'drop one of them'):
      _Pipe(schedule='1f1b', layers=None, partition_costs=[1, 1],
            partitions=[_FcLayers(2), _FcLayers(2)]).Instantiate()

  def testTheRankingAndTheLayerUseTheMeasuredCut(self):
    # Measured: the first layer costs 5x the others (FLOPs: all equal).
    heavy = cost_model.LayerCost(5.0, 10.0, 5.0, 5.0)
    light = cost_model.LayerCost(1.0, 2.0, 1.0, 1.0)
    prof = cost_model.Profile((heavy, light, light, light), 2, num_cores=2)
    path = os.path.join(self.get_temp_dir(), 'uneven.json')
    prof.Save(path)
    p = _Pipe(plan_regime='separate', plan_profile=path)
    # The cut balances F + its recompute + B: 20, 4, 4, 4.
    self.assertEqual(schedule_auto.CutCosts(prof, True), (20, 4, 4, 4))
    self.assertEqual(schedule_auto.CutCosts(prof, False), (15, 3, 3, 3))
    self.assertIsNone(schedule_auto.CutCosts(
        dataclasses.replace(prof, source='flops'), True))
    plan = schedule_auto.PlanFor(p)
    q = schedule_auto.ResolveAuto(p)
    self.assertEqual(q.partition_costs, [20, 4, 4, 4])
    layer = p.Instantiate()
    self.assertEqual(layer.params.partition_costs, [20, 4, 4, 4])
    sizes = self._Sizes(layer)
    self.assertEqual(sizes[0], 1)   # the heavy layer alone
    # The prediction of the pick was made on the cut the layer made.
    best = plan.best
    table = schedule_auto.schedule_builders.Build(
        best.name, 2, 4, best.num_stages_per_device)
    cut, start = [], 0
    for n in sizes:
      cut.append((start, start + n))
      start += n
    self.assertAlmostEqual(
        cost_model.Predict(table, schedule_auto.ProfileFor(
            _Report(), prof), cut, True, 'separate').step_s, best.step_s)
    # Given costs win over the profile's.
    q = schedule_auto.ResolveAuto(p.Copy().Set(partition_costs=[1, 1, 1, 1]))
    self.assertEqual(q.partition_costs, [1.0, 1.0, 1.0, 1.0])
    # The trainer's resolution writes the cut's costs to params.txt.
    root = hyperparams.Params()
    root.Define('model', p.Copy(), 'The model.')
    schedule_auto.ResolveAutoIn(root, lambda _: None)
    self.assertIn('model.partition_costs : [20.0, 4.0, 4.0, 4.0]',
                  root.ToText())


class RecomputeAutoTest(tf.test.TestCase):
  """recompute='auto': both settings ranked, the budget decides."""

  def testWithoutABudgetTheStepWithoutRecomputeWins(self):
    p = _Pipe(recompute='auto', plan_regime='separate')
    plan = schedule_auto.PlanFor(p)
    self.assertEqual({r.recompute for r in plan.rows}, {True, False})
    self.assertFalse(plan.best.recompute)
    # Each schedule's row without recompute is faster (no forward again).
    by = {(r.name, r.recompute): r.step_s for r in plan.rows}
    for name, _ in schedule_auto.schedule_plan.ALL:
      self.assertLess(by[name, False], by[name, True])
    self.assertIn(f'{plan.best.name} norc', plan.Text())
    lines = []
    q = schedule_auto.ResolveAuto(p, lines.append)
    self.assertIs(q.recompute, False)
    self.assertIn("recompute='auto' -> ", lines[0])
    self.assertIn('recompute=False)', lines[0])
    self.assertIs(p.Instantiate().params.recompute, False)

  def testABudgetOnlyRecomputeMeetsTurnsItOn(self):
    # Activations above the weights (batch 512: 4 KiB per layer and
    # micro-batch, 288 B of weights): recompute saves memory. (At batch 8
    # it costs some: a B cell with recompute holds the gradient sums
    # twice, schedule_plan.)
    pipe = lambda **kw: _Pipe(recompute='auto', input_shapes=[[512, 8]],
                              **kw)
    plan = schedule_auto.PlanFor(pipe())
    on = min(r.memory_bytes for r in plan.rows if r.recompute)
    off = min(r.memory_bytes for r in plan.rows if not r.recompute)
    self.assertLess(on, off)
    q = schedule_auto.ResolveAuto(pipe(plan_memory_budget=on))
    self.assertIs(q.recompute, True)
    refused = [r for r in schedule_auto.PlanFor(pipe(
        plan_memory_budget=on)).rows if r.refused]
    self.assertTrue(refused)
    self.assertTrue(all('over the budget' in r.refused for r in refused))
    self.assertIn(False, {r.recompute for r in refused})

  def testPairwiseSumsNeedRecompute(self):
    plan = schedule_auto.PlanFor(_Pipe(recompute='auto', grad_sum='pairwise'))
    self.assertEqual({r.recompute for r in plan.rows}, {True})

  def testParamsTxtHoldsTheChoice(self):
    root = hyperparams.Params()
    root.Define('model', _Pipe(schedule='1f1b', recompute='auto'), 'm')
    self.assertEqual(schedule_auto.ResolveAutoIn(root, lambda _: None),
                     ['pipe'])
    self.assertIn('model.recompute : False', root.ToText())
    self.assertIn("model.schedule : '1f1b'", root.ToText())

  def testHandCutPartitionsNameTheAutoSetting(self):
    with self.assertRaisesRegex(ValueError, "recompute='auto' plans the cut "
                                'itself.*name the schedule, T and '
                                'recompute'):
      _Pipe(schedule='1f1b', recompute='auto', layers=None,
            partitions=[_FcLayers(2), _FcLayers(2)]).Instantiate()

  def testARecomputeThatIsNotABoolIsRefused(self):
    for bad in ('yes', 1, None):
      with self.subTest(recompute=bad):
        with self.assertRaisesRegex(ValueError, rf"recompute={bad!r} must be "
                                    "True, False or 'auto'"):
          _Pipe(schedule='1f1b', recompute=bad).Instantiate()


def _CurveFile(test, cost_at_1, cost_at_8, low=1):
  """A profile of the 4 FC layers measured at `low` (1) and 8 rows: per
  layer t_F = c, t_B = 2c, t_I = t_W = c, with c given at each size."""
  def At(rows, c):
    return cost_model.Profile(
        (cost_model.LayerCost(c, 2 * c, c, c),) * 4, rows, num_cores=2)
  prof = dataclasses.replace(At(8, cost_at_8),
                             points=(At(low, cost_at_1),))
  path = os.path.join(test.get_temp_dir(), 'curve.json')
  prof.Save(path)
  return path


class MicroBatchesAutoTest(tf.test.TestCase):

  def testWeightBoundMicroBatchesPickOne(self):
    # A micro-batch costs the same at 1 row as at 8 (bound by reading the
    # weights): in a shared pool the work grows with T, so T=1 wins
    # (T in 1, 2, 4, 8: the sizes between the measured 1 and 8 rows).
    lines = []
    q = schedule_auto.ResolveAuto(_Pipe(
        num_micro_batches='auto', plan_regime='shared',
        plan_profile=_CurveFile(self, 1.0, 1.0)), lines.append)
    self.assertEqual(q.num_micro_batches, 1)
    self.assertIn("schedule='auto', num_micro_batches='auto' -> ",
                  lines[0])
    self.assertIn('num_micro_batches=1, recompute=True)', lines[0])

  def testCostsLinearInRowsOnSeparateExecutorsPickTheMostMicroBatches(self):
    # Cost proportional to the rows: the step is (T + K - 1) x f(N / T), so
    # the bubble shrinks with T: T=8. A named schedule is kept.
    p = _Pipe(num_micro_batches='auto', schedule='1f1b',
              plan_regime='separate',
              plan_profile=_CurveFile(self, 1.0 / 8, 1.0))
    plan = schedule_auto.PlanFor(p)
    self.assertEqual([r.num_micro_batches for r in plan.rows], [8, 4, 2, 1])
    self.assertEqual({r.name for r in plan.rows}, {'1f1b'})
    self.assertIn('1f1b              1   8', plan.Text())
    q = schedule_auto.ResolveAuto(p)
    self.assertEqual((q.schedule, q.num_micro_batches), ('1f1b', 8))
    layer = p.Instantiate()
    self.assertEqual(layer.params.num_micro_batches, 8)
    root = hyperparams.Params()
    root.Define('model', p.Copy(), 'The model.')
    schedule_auto.ResolveAutoIn(root, lambda _: None)
    self.assertIn('model.num_micro_batches : 8', root.ToText())

  def testWhatCannotBePlannedIsNamedWithTheFix(self):
    with self.assertRaisesRegex(ValueError, 'needs measured costs at '
                                'several micro-batch sizes'):
      schedule_auto.ResolveAuto(_Pipe(num_micro_batches='auto'))
    one = os.path.join(self.get_temp_dir(), 'one.json')
    _Profile().Save(one)
    with self.assertRaisesRegex(ValueError, r'has \[2\] rows only.*'
                                '--profile_micro_batch_sizes'):
      schedule_auto.ResolveAuto(_Pipe(num_micro_batches='auto',
                                      plan_profile=one))
    with self.assertRaisesRegex(ValueError, 'micro_batch_size=2 cannot be '
                                'set too'):
      schedule_auto.ResolveAuto(_Pipe(
          num_micro_batches='auto', micro_batch_size=2,
          plan_profile=_CurveFile(self, 1.0, 1.0)))
    with self.assertRaisesRegex(ValueError, 'no T splits the mini-batch of '
                                '11 into micro-batches of 2 to 8 rows'):
      schedule_auto.ResolveAuto(_Pipe(
          num_micro_batches='auto', input_shapes=[[11, 8]],
          plan_profile=_CurveFile(self, 1.0, 1.0, low=2)))


class _AutoExperiment(base_experiment.BaseExperiment):
  """Flatten and 3 FC layers on 8x8 synthetic images, schedule='auto'."""

  def Train(self):
    return synthetic_input.SyntheticImageInput.Params().Set(
        name='train', batch_size=8, num_examples=16)

  def Test(self):
    return self.Train().Set(name='test', split='test')

  def Task(self):
    layers = [linear.FlattenLayer.Params().Set(name='flat'),
              linear.FCLayer.Params().Set(name='fc0', input_dim=64,
                                          output_dim=8)] + _FcLayers(3)[1:]
    layers[-1].output_dim = 4
    model = _Pipe(name='TensorPipe', input_shapes=[[8, 8, 8, 1]],
                  layers=layers)
    return tasks.ClassificationTask.Params().Set(name='task', model=model,
                                                 num_classes=4)


class TrainerTest(tf.test.TestCase):

  def testParamsTxtHoldsTheConcreteScheduleAndAResumeReadsIt(self):
    logdir = self.get_temp_dir()
    log = []
    trainer = trainer_lib.Trainer(_AutoExperiment().ModelParams(), logdir,
                                  log_fn=log.append)
    self.assertEqual(trainer.params.task.model.schedule, '1f1b')
    self.assertEqual(trainer.task.children.model.params.schedule, '1f1b')
    self.assertTrue(any("schedule='auto' -> '1f1b'" in line for line in log))
    # What Train writes; a resume resolves the same and changes nothing.
    text = trainer.params.ToText()
    self.assertIsNone(logdir_lib.WriteParams(logdir, text, 0, log.append))
    again = trainer_lib.Trainer(_AutoExperiment().ModelParams(), logdir,
                                log_fn=log.append)
    self.assertIsNone(logdir_lib.WriteParams(
        logdir, again.params.ToText(), 3, log.append))
    restored = _AutoExperiment().ModelParams()
    with open(os.path.join(logdir, logdir_lib.PARAMS_FILE)) as f:
      restored.FromText(f.read())
    self.assertEqual((restored.task.model.schedule,
                      restored.task.model.num_stages_per_device), ('1f1b', 1))


class PlanToolTest(tf.test.TestCase):

  def _Run(self, *argv):
    fv = flags.FlagValues()
    model_analysis_tool.DefineFlags(fv)
    fv(['model_analysis', '--model=consistency', '--num_partitions=2',
        '--num_micro_batches=4', '--batch_size=8', '--L=4', '--plan']
       + list(argv))
    return model_analysis_tool.Run(fv)

  def _Order(self, text):
    rows = text[text.index('rank  schedule'):].splitlines()[1:]
    return [line.split()[1] for line in rows if line.split()[0].isdigit()]

  def testFlopPlanOnSeparateExecutorsPutsZeroBubbleFirst(self):
    text = self._Run('--plan_regime=separate')
    self.assertIn('Schedule plan (flops costs, separate regime)', text)
    self.assertIn('FLOP-based costs', text)
    self.assertEqual(self._Order(text), ['zb_v', 'zb_h1', 'interleaved_1f1b',
                                         '1f1b', 'gpipe'])

  def testProfilePlanInASharedPoolRanksByTicks(self):
    # testSharedPoolRanksByTicksWhenTheWorkIsEqual's profile, 4 layers.
    with tempfile.TemporaryDirectory() as d:
      path = os.path.join(d, 'profile.json')
      _Profile(tick=0.5).Save(path)
      text = self._Run(f'--plan_profile={path}', '--norecompute')
    self.assertIn('Schedule plan (measured costs, shared regime, 2 cores)',
                  text)
    self.assertEqual(self._Order(text), ['1f1b', 'gpipe', 'zb_h1',
                                         'interleaved_1f1b', 'zb_v'])
    self.assertRegex(text, r'1  1f1b +1 +4 +29 s +48 s +10 ')

  def testRecomputeAutoRanksBothSettings(self):
    text = self._Run('--plan_regime=separate', '--plan_recompute_auto')
    rows = text[text.index('rank  schedule'):].splitlines()[1:]
    ranked = [line.split()[1:3] for line in rows
              if line.split() and line.split()[0].isdigit()]
    self.assertLen(ranked, 10)   # five schedules, recompute on and off
    self.assertEqual(ranked[0], ['zb_v', 'norc'])
    self.assertEqual(sum(r[1] == 'norc' for r in ranked), 5)

  def testMemoryBudgetRefusesInTheTable(self):
    text = self._Run('--plan_memory_budget_mib=0.0001')
    self.assertEqual(self._Order(text), [])
    self.assertIn('n/a: memory peak', text)


if __name__ == '__main__':
  tf.test.main()
