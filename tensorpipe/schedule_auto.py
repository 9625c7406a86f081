"""schedule='auto': the planner that picks a TensorPipeLayer's schedule.

For a model given as layer Params (`TensorPipeLayer.Params().layers`, with
`input_shapes`), K devices and T micro-batches, `Rank` predicts every
schedule of `schedule_plan.ALL` that applies (GPipe, 1F1B, interleaved 1F1B
with v=2, ZB-H1, ZB-V) with the calibrated cost model (`cost_model.Predict`)
on the cut TensorPipeLayer itself will make (`partitioning.Partition` of the
layers' FLOPs into K v stages, or of their measured cells: `CutCosts`,
which `ResolveAuto` hands the layer as partition_costs) and ranks them by
predicted step time, ties
(within 0.1%) broken by fewer ticks, then by the smaller memory peak
(`schedule_plan.TableMemory`). A schedule over the per-device memory budget
is refused, as is one the layer's other settings cannot run (the I/W split
needs grad_sum='sequential'; every schedule but GPipe needs
recompute_impl='explicit'; a given num_stages_per_device keeps that v).

recompute='auto' ranks every candidate with and without recompute, so
the planner recomputes only where the activations without it do not fit
plan_memory_budget (`schedule_plan.TableMemory`) or where its costs say
recomputing is faster (a calibrated profile knows that GPipe without
recompute, TF's autodiff of its loop, can cost more than GPipe with it).
AdaPipe plans recomputation and the cut together too; the cut here
follows the recompute setting (`CutCosts`).

num_micro_batches='auto' (with schedule='auto' or a named schedule) ranks
every T too: those that split the mini-batch into micro-batches of a size
the profile measured or lies between two measured sizes
(`MicroBatchChoices`), each priced from the measured curve
(`cost_model.Profile.Scaled`: a micro-batch of a few rows costs more per
row than a linear scaling says, so more micro-batches, less bubble, can
lose). It needs a profile measured at several sizes (plan_profile; FLOP
costs scale linearly and would always pick the most micro-batches).

`ResolveAuto(p)` turns the 'auto' settings into the winner (schedule,
num_stages_per_device, num_micro_batches, recompute and, with a measured
profile, partition_costs set in a copy of the Params)
and logs the choice with its prediction and the runner-up. Costs come
from:

  plan_profile=None   FLOPs (`cost_model.FlopProfile`: t_B = 2 t_F,
                      t_I = t_W, no tick or transfer cost). Construction
                      stays cheap (Params only, no TF op), but in the shared
                      regime every schedule then has the same work, so the
                      pick falls to ticks and memory: 1F1B or GPipe.
  plan_profile=path   a profile measured by `tools/benchmark --profile`
                      (`cell_profile.ProfileLayer`: the engine's own cells,
                      tick and transfer cost), scaled to this micro-batch
                      size if it was measured at another.

The regime (`cost_model.REGIMES`) is `plan_regime`, or by default 'shared'
when every device is a CPU device of this process (TF's logical CPU
devices share its thread pools) and 'separate' otherwise; C is the
profile's cores (FLOP costs: this machine's CPU count).

The trainer resolves 'auto' in the experiment's Params before it writes
params.txt (`ResolveAutoIn`), so params.txt, a resume and an export read
the concrete schedule; a TensorPipeLayer built directly resolves its own.
The resolution is deterministic: the same Params, profile and machine give
the same schedule.
"""

import dataclasses
import os
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

from absl import logging

from tensorpipe import cost_model
from tensorpipe import model_analysis
from tensorpipe import partitioning
from tensorpipe import pipeline_partitions
from tensorpipe import schedule_builders
from tensorpipe import schedule_plan

AUTO = 'auto'
# The TensorPipeLayer settings the planner resolves when 'auto'.
AUTO_SETTINGS = ('schedule', 'num_micro_batches', 'recompute')


@dataclasses.dataclass(frozen=True)
class PlanRow:
  """One candidate's prediction; `refused` says why it cannot run."""
  name: str
  num_stages_per_device: int
  num_micro_batches: int = 0
  step_s: float = 0.0
  work_s: float = 0.0
  ticks: int = 0
  memory_bytes: int = 0        # step's memory peak, fullest device
  refused: str = ''
  cut_costs: Tuple[float, ...] = ()   # what the cut balanced; (): FLOPs
  recompute: bool = True


@dataclasses.dataclass(frozen=True)
class Plan:
  """`Rank`'s result: usable rows fastest first, then the refused ones."""
  rows: Tuple[PlanRow, ...]
  regime: str
  source: str                  # the profile's source: 'measured', 'flops'
  num_cores: float

  @property
  def best(self) -> Optional[PlanRow]:
    return next((r for r in self.rows if not r.refused), None)

  def Text(self) -> str:
    """The ranking as a table (tools/model_analysis --plan)."""
    # With recompute='auto' both settings are ranked: 'norc' marks off.
    mixed = len({r.recompute for r in self.rows}) > 1
    width = 22 if mixed else 17
    lines = [f'Schedule plan ({self.source} costs, {self.regime} regime'
             + (f', {self.num_cores:.3g} cores' if self.regime == 'shared'
                else '') + '):',
             f'{"rank":>4}  {"schedule":<{width}}{"v":>2}{"T":>4}  '
             f'{"step":>10}  {"work":>10}  {"ticks":>5}  {"mem. peak":>10}']
    for i, r in enumerate(self.rows):
      name = f'{r.name} norc' if mixed and not r.recompute else r.name
      head = (f'{name:<{width}}{r.num_stages_per_device:>2}'
              f'{r.num_micro_batches:>4}')
      if r.refused:
        lines.append(f'{"-":>4}  {head}  n/a: {r.refused}')
        continue
      lines.append(f'{i + 1:>4}  {head}  '
                   f'{schedule_plan.FormatTime(r.step_s):>10}  '
                   f'{schedule_plan.FormatTime(r.work_s):>10}  '
                   f'{r.ticks:>5}  '
                   f'{model_analysis.FormatBytes(r.memory_bytes):>10}')
    return '\n'.join(lines)


def CutCosts(profile: cost_model.Profile, recompute: bool,
             given: Optional[Sequence[float]] = None
             ) -> Optional[Tuple[float, ...]]:
  """The per-layer costs the layers' cut balances: `given` (the layer's
  partition_costs), else a measured profile's cells of one micro-batch
  (forward, its recompute, backward: a stage's share of the critical
  path), to 4 significant digits (params.txt stays readable; the layer
  cuts on the same rounded numbers the prediction did), else None:
  the layers' FLOPs. A FLOP count misprices small layers: conv layers of 8
  to 16 channels cost more per FLOP than of 32 (taperconv16's FLOP cut
  was slower than cutting by count)."""
  if given is not None:
    return tuple(float(c) for c in given)
  if profile.source != 'measured':
    return None
  return tuple(float(f'{c.forward * (2 if recompute else 1) + c.backward:.4g}')
               for c in profile.layers)


def _Row(report: model_analysis.Report, profile: cost_model.Profile,
         name: str, v: int, recompute: bool, regime: str,
         budget: Optional[float],
         cut_costs: Optional[Sequence[float]] = None) -> PlanRow:
  """One candidate: its table, cut, prediction and memory, or a refusal."""
  kk, tt = report.num_partitions, report.num_micro_batches
  if kk * v > len(report.layers):
    return PlanRow(name, v, tt, refused=f'K*v = {kk * v} stages need at '
                   f'least {kk * v} layers, the model has '
                   f'{len(report.layers)}', recompute=recompute)
  try:
    table = schedule_builders.Build(name, kk, tt, v)
  except ValueError as e:
    return PlanRow(name, v, tt, refused=str(e), recompute=recompute)
  plan = partitioning.Partition(
      [r.flops for r in report.layers] if cut_costs is None else cut_costs,
      kk * v, method=report.method)
  pred = cost_model.Predict(table, profile, plan.boundaries, recompute,
                            regime)
  act, _ = schedule_plan.TableMemory(report, table, plan.boundaries,
                                     recompute)
  row = PlanRow(name, v, tt, pred.step_s, pred.work_s, pred.ticks, max(act),
                cut_costs=tuple(cut_costs or ()), recompute=recompute)
  if budget is not None and max(act) > budget:
    return dataclasses.replace(row, refused=(
        f'memory peak {model_analysis.FormatBytes(max(act))} is over '
        f'the budget of {model_analysis.FormatBytes(budget)} per device'))
  return row


def Rank(report: model_analysis.Report, profile: cost_model.Profile,
         recompute: bool, regime: str,
         which: Sequence[Tuple[str, int]] = schedule_plan.ALL,
         memory_budget: Optional[float] = None,
         cut_costs: Optional[Sequence[float]] = None) -> Plan:
  """Predicts and ranks the schedules of `which` (module docstring).

  Args:
    report: `model_analysis.AnalyzeLayers` of the model at K and T.
    profile: per-layer costs (one LayerCost per report layer).
    recompute: whether B and I cells recompute the forward.
    regime: 'shared' or 'separate' (`cost_model.REGIMES`).
    which: (schedule, stages per device) candidates.
    memory_budget: bytes of activations per device; None: no limit.
    cut_costs: per-layer costs the layers are cut by (`CutCosts`); None:
      their FLOPs.

  Raises:
    ValueError: a profile of another layer count.
  """
  if len(profile.layers) != len(report.layers):
    raise ValueError(f'the profile has {len(profile.layers)} layers, the '
                     f'model {len(report.layers)}; profile this model '
                     '(tools/benchmark --profile)')
  rows = [_Row(report, profile, name, v, recompute, regime, memory_budget,
               cut_costs)
          for name, v in which]
  return _Ranked(rows, regime, profile)


def _Ranked(rows: Sequence[PlanRow], regime: str,
            profile: cost_model.Profile) -> Plan:
  """`rows` fastest first; steps within 0.1% of each other are a tie:
  fewer ticks, then less memory, then more rows per micro-batch."""
  usable = [r for r in rows if not r.refused]
  fastest = min((r.step_s for r in usable), default=0.0)
  usable.sort(key=lambda r: (round(r.step_s / fastest, 3) if fastest else 0,
                             r.ticks, r.memory_bytes, r.num_micro_batches))
  return Plan(tuple(usable + [r for r in rows if r.refused]), regime,
              profile.source, profile.num_cores)


def MicroBatchChoices(batch: int, profile: cost_model.Profile) -> List[int]:
  """num_micro_batches='auto': the T that split `batch` into micro-batches
  of a size within the profile's measured ones (interpolated, never
  extrapolated: the curve says nothing outside them).

  Raises:
    ValueError: a profile of one size, or none of its sizes fits.
  """
  rows = profile.measured_rows
  if len(rows) < 2:
    raise ValueError(
        "num_micro_batches='auto' plans from measured costs at several "
        f'micro-batch sizes; the profile has {list(rows)} rows only. '
        'Profile with tools/benchmark --profile '
        '--profile_micro_batch_sizes=4,8,16,32 (sizes dividing the '
        'mini-batch), or name num_micro_batches')
  ts = [t for t in range(1, batch + 1)
        if batch % t == 0 and rows[0] <= batch // t <= rows[-1]]
  if not ts:
    raise ValueError(
        f"num_micro_batches='auto': no T splits the mini-batch of {batch} "
        f'into micro-batches of {rows[0]} to {rows[-1]} rows (the '
        'profile\'s measured sizes); profile at sizes that divide it')
  return ts


def DefinePlanParams(p: Any) -> None:
  """TensorPipeLayer's Params of schedule='auto'."""
  p.Define('plan_profile', None, "schedule='auto': path of a cost profile "
           'written by tools/benchmark --profile (measured cell, tick and '
           'transfer costs); None plans from FLOPs.')
  p.Define('plan_memory_budget', None, "schedule='auto' or recompute="
           "'auto': most bytes a training step may allocate per device "
           'beyond its weights and optimizer state (activations, saved '
           'inputs, stash, gradient sums: schedule_plan.TableMemory; '
           'against TF\'s allocator see tools/benchmark --memory_check '
           'and the README: with recompute within 10% on one device in '
           '23 of 30 settings, up to 1.6x where TF ran two stages\' '
           'cells of a device side by side; leave headroom). None: no '
           'limit.')
  p.Define('plan_regime', None, "schedule='auto': 'shared' (devices share "
           "one process's thread pools) or 'separate' (own executors); None: "
           'shared for CPU devices of this process, else separate.')


def Candidates(p: Any) -> List[Tuple[str, int]]:
  """The (schedule, v) pairs of `schedule_plan.ALL` a TensorPipeLayer with
  Params `p` (schedule='auto') can run with its other settings; its own
  schedule when that is named."""
  if p.schedule != AUTO:
    return [(p.schedule, schedule_builders.NumStagesPerDevice(p))]
  out = []
  for name, v in schedule_plan.ALL:
    if p.num_stages_per_device not in (None, v):
      continue
    if name != 'gpipe' and p.recompute_impl != 'explicit':
      continue
    if name.startswith('zb') and p.grad_sum != 'sequential':
      continue
    out.append((name, v))
  return out


def RecomputeChoices(p: Any) -> List[bool]:
  """The recompute settings the planner ranks: `p.recompute`, or with
  recompute='auto' both (only on with grad_sum='pairwise', which sums in
  the recompute loops).

  Raises:
    ValueError: a recompute that is neither a bool nor 'auto'.
  """
  if p.recompute == AUTO:
    return [True] if p.grad_sum == 'pairwise' else [True, False]
  CheckRecompute(p)
  return [p.recompute]


def CheckRecompute(p: Any) -> None:
  """ValueError unless TensorPipeLayer Params `p` have recompute True or
  False (a string such as 'no' would read as on)."""
  if not isinstance(p.recompute, bool):
    raise ValueError(f'TensorPipeLayer {p.name!r}: recompute='
                     f'{p.recompute!r} must be True, False or '
                     f"'auto' (the planner's choice; with "
                     'plan_memory_budget it recomputes only if the '
                     'activations do not fit)')


def Regime(device_names: Sequence[str]) -> str:
  """'shared' when every device is a CPU device of one process
  (`devices.NumProcesses`), else 'separate'."""
  from tensorpipe import devices as devices_lib  # pylint: disable=g-import-not-at-top
  if (all('CPU' in d.upper() for d in device_names) and
      devices_lib.NumProcesses(device_names) <= 1):
    return 'shared'
  return 'separate'


def _Devices(p: Any, num: int) -> List[str]:
  """The devices the layer will take (needs TF for the defaults)."""
  if p.devices:
    return list(p.devices)
  from tensorpipe import devices as devices_lib  # pylint: disable=g-import-not-at-top
  return devices_lib.DefaultDevices(num)


def ProfileFor(report: model_analysis.Report,
               profile: Union[str, cost_model.Profile, None] = None
               ) -> cost_model.Profile:
  """The plan's costs at the report's micro-batch size: the profile (a
  loaded one, or the path of its file) interpolated between its measured
  sizes and scaled outside them (`Profile.Scaled`), or without one the
  layers' FLOPs with this machine's CPU count as the cores."""
  tt = report.num_micro_batches
  rows = report.batch_size // tt
  if isinstance(profile, str) and profile:
    profile = cost_model.Profile.Load(profile)
  if isinstance(profile, cost_model.Profile):
    return profile.Scaled(rows)
  a_bytes = model_analysis.DtypeBytes(report.activation_dtype)
  return cost_model.FlopProfile(
      [r.flops / tt for r in report.layers],
      [r.activation_bytes / tt for r in report.layers], rows,
      model_analysis.NumElements(report.input_shapes) * a_bytes / tt,
      num_cores=os.cpu_count() or 1)


def PlanFor(p: Any) -> Plan:
  """The ranking for TensorPipeLayer Params `p` with 'auto' settings
  (`IsAuto`).

  Raises:
    ValueError: Params the planner cannot plan for, naming the fix.
  """
  if p.plan_regime not in (None,) + cost_model.REGIMES:
    raise ValueError(f'TensorPipeLayer {p.name!r}: plan_regime='
                     f'{p.plan_regime!r} is not one of {cost_model.REGIMES}; '
                     'leave it None to take it from the devices')
  budget = p.plan_memory_budget
  if budget is not None and (isinstance(budget, bool) or not isinstance(
      budget, (int, float)) or budget <= 0):
    raise ValueError(f'TensorPipeLayer {p.name!r}: plan_memory_budget='
                     f'{budget!r} must be bytes > 0 per device, or None')
  if budget is not None and p.num_partitions > 1 and p.recompute is not False:
    logging.warning(
        'TensorPipeLayer %r: plan_memory_budget at K=%d with recompute: on '
        'two logical devices TF allocated up to 1.26x the model\'s sum of '
        'both devices (1F1B; README, "Memory against TF\'s allocator"); '
        'leave headroom in the budget', p.name,
        p.num_partitions)
  what = _AutoNames(p)
  if p.partitions is not None or not p.layers or p.input_shapes is None:
    raise ValueError(f'TensorPipeLayer {p.name!r}: {what} plans the cut '
                     'itself and needs `layers`, `num_partitions` and '
                     '`input_shapes`; give those, or name the schedule, T '
                     'and recompute')
  from tensorpipe import microbatch  # pylint: disable=g-import-not-at-top
  report = model_analysis.AnalyzeLayers(
      list(p.layers), p.input_shapes, num_partitions=p.num_partitions,
      method=p.partition_method, exact_optimizer_state=False)
  if p.num_micro_batches == AUTO:
    if p.micro_batch_size is not None:
      raise ValueError(f"TensorPipeLayer {p.name!r}: num_micro_batches="
                       "'auto' picks T, so micro_batch_size="
                       f'{p.micro_batch_size!r} cannot be set too; drop '
                       'one of them')
    if not p.plan_profile:
      raise ValueError(
          f"TensorPipeLayer {p.name!r}: num_micro_batches='auto' needs "
          'measured costs at several micro-batch sizes (FLOP counts say '
          'nothing of what a smaller micro-batch costs per row): set '
          'plan_profile to a tools/benchmark --profile '
          '--profile_micro_batch_sizes=... file, or name num_micro_batches')
    measured = cost_model.Profile.Load(p.plan_profile)  # read once
    ts = MicroBatchChoices(report.batch_size, measured)
  else:
    measured = p.plan_profile
    ts = [microbatch.NumMicroBatches(report.batch_size, p.num_micro_batches,
                                     p.micro_batch_size)]
  regime = p.plan_regime or Regime(_Devices(p, p.num_partitions))
  given = (None if p.partition_costs is None else
           pipeline_partitions.CheckCosts(p.name, p.partition_costs,
                                          len(p.layers)))
  return RankOverT(report, lambda r: ProfileFor(r, measured), ts,
                   RecomputeChoices(p), regime, Candidates(p),
                   p.plan_memory_budget,
                   lambda prof, rc: CutCosts(prof, rc, given))


def RankOverT(report: model_analysis.Report,
              profile_at: Callable[[model_analysis.Report],
                                   cost_model.Profile],
              ts: Sequence[int], recompute: Union[bool, Sequence[bool]],
              regime: str, which: Sequence[Tuple[str, int]],
              memory_budget: Optional[float] = None,
              cut_costs_at: Optional[Callable[[cost_model.Profile, bool],
                                              Optional[Sequence[float]]]]
              = None) -> Plan:
  """`Rank` at each T of `ts` and each recompute setting of `recompute`
  (the report at that T, its costs from `profile_at(report)`, its cut by
  `cut_costs_at(those costs, recompute)`, default FLOPs), the rows ranked
  together."""
  rcs = (recompute,) if isinstance(recompute, bool) else tuple(recompute)
  rows, profile = [], None
  for tt in ts:
    at_t = dataclasses.replace(report, num_micro_batches=tt)
    profile = profile_at(at_t)
    for rc in rcs:
      rows += Rank(at_t, profile, rc, regime, which, memory_budget,
                   cut_costs_at(profile, rc) if cut_costs_at else None).rows
  return _Ranked(rows, regime, profile)


def _AutoNames(p: Any) -> str:
  """The 'auto' settings of `p`, for messages: "schedule='auto', ..."."""
  return ', '.join(f"{k}='auto'" for k in AUTO_SETTINGS if p.Get(k) == AUTO)


def ResolveAuto(p: Any, log: Callable[[str], None] = logging.info) -> Any:
  """`p` if none of its AUTO_SETTINGS is 'auto', else a copy with the
  planner's schedule, num_stages_per_device, T, recompute and (measured
  profile) partition_costs (module docstring); logs the choice.

  Raises:
    ValueError: no candidate fits (with each one's reason).
  """
  if not IsAuto(p):
    return p
  plan = PlanFor(p)
  best = plan.best
  what = _AutoNames(p)
  if best is None:
    why = '; '.join(f'{r.name} T={r.num_micro_batches}'
                    f'{"" if r.recompute else " norc"}: {r.refused}'
                    for r in plan.rows)
    raise ValueError(f'TensorPipeLayer {p.name!r}: {what} found no '
                     f'setting that fits ({why}); raise plan_memory_budget, '
                     'use more partitions or name a schedule and T')
  q = p.Copy()
  q.schedule, q.num_stages_per_device = best.name, best.num_stages_per_device
  if p.num_micro_batches == AUTO:
    q.num_micro_batches = best.num_micro_batches
  if p.recompute == AUTO:
    q.recompute = best.recompute
  if best.cut_costs:    # the cut the prediction was made on
    q.partition_costs = list(best.cut_costs)
  runner_up = next((r for r in plan.rows[1:] if not r.refused), None)
  how = ('measured costs of ' + p.plan_profile if plan.source == 'measured'
         else 'FLOP-based costs, no profile: set plan_profile to a '
         'tools/benchmark --profile file for measured costs')
  log(f'TensorPipeLayer {p.name!r}: {what} -> {best.name!r} '
      f'(num_stages_per_device={best.num_stages_per_device}, '
      f'num_micro_batches={best.num_micro_batches}, '
      f'recompute={best.recompute}), predicted '
      f'{best.step_s * 1e3:.3g} ms/step'
      + (f' (next: {runner_up.name} T={runner_up.num_micro_batches}'
         f'{"" if runner_up.recompute else " norc"} '
         f'{runner_up.step_s * 1e3:.3g} ms)' if runner_up else '')
      + f'; {plan.regime} regime, {how}')
  return q


def IsAuto(p: Any) -> bool:
  """Whether TensorPipeLayer Params `p` leave the schedule, T or the
  recompute setting to the planner."""
  return any(p.Get(k) == AUTO for k in AUTO_SETTINGS)


def ResolveAutoIn(params: Any,
                  log: Callable[[str], None] = logging.info) -> List[str]:
  """Resolves the 'auto' settings (AUTO_SETTINGS) of every TensorPipeLayer
  in a Params tree in place (the trainer, before it writes params.txt);
  returns the names resolved."""
  from tensorpipe import distribute  # pylint: disable=g-import-not-at-top
  done = []
  for mp in distribute.PipelineParamsIn(params):
    if IsAuto(mp):
      q = ResolveAuto(mp, log)
      mp.schedule, mp.num_stages_per_device = (q.schedule,
                                               q.num_stages_per_device)
      mp.num_micro_batches = q.num_micro_batches  # a number when 'auto'
      mp.recompute, mp.partition_costs = q.recompute, q.partition_costs
      done.append(mp.name)
  return done
