"""Calibrated step-time model of a schedule table, from per-layer cell costs.

A `Profile` holds, per layer and for one micro-batch, the time of the
engine's four cells (forward F, full backward B, input gradient I, weight
gradient W; `cell_profile.ProfileLayer` measures them, `FlopProfile` makes
them from FLOPs when nothing was measured), each layer's output bytes, the
wall time of one clock tick of the engine's loop, the time per byte of a
boundary transfer and the cores the devices run on. `Predict` turns it into
the step time of any table (`schedule_builders.Build`: any schedule, K, T,
v), any cut of the layers into the table's stages and either recompute
setting, in one of two regimes:

  shared    the K devices are logical devices of one process and share its
            thread pools (TF's logical CPU devices): one device's ready ops
            fill another's bubble, so a step costs its total cell work over
            the cores, bounded below by the table's critical path (the
            dataflow of the table with every cell spread over all cores):

              step = max(work / C, critical path) + ticks x tick

  separate  each device has its own executor (GPUs, stages in other
            processes): the table's dataflow with its bubbles
            (`simulator.SimulateSchedule`, one core per device), each cell
            started one tick cost after its inputs.

After the cells each device updates its weights (LayerCost.update: work
in the shared regime, on the device's own time in the separate one).

Cell costs per stage s (layers l in the stage, r_s = f_s with recompute,
else 0), with x_s the bytes crossing to another device and rate the
transfer time per byte:

  F  f_s = sum_l t_F(l) + out_bytes(s) x rate     (if s+1 is elsewhere)
  B  r_s + sum_l t_B(l) + in_bytes(s) x rate      (if s-1 is elsewhere)
  I  r_s + sum_l t_I(l) + in_bytes(s) x rate;  W  sum_l t_W(l)

  the split costing what it was measured to cost: I + W is 0.92-0.96 of B
  for dense16's cells and 1.01-1.11 for conv16's, and in the engine's
  steps ZB-H1 did 0.84-0.99 and 1.04-1.14 of 1F1B's CPU work
  (tools/benchmark --plan_check). (An earlier model took I + W = B.)

The work of a step is the sum over the table's cells; ticks are the
table's columns.

Calibration (`Profile.Calibrated`): cells timed on their own miss what the
engine's graph does to them (Grappler's fusions, weights in or out of the
cache as stages follow one another: conv16's cells cost 5-35% less in the
engine than alone) and the cores a step really gets. One short run of a
real step of the engine (cell_profile.StepTime: wall and CPU time) fixes
both: every cell and update is scaled by one factor so that the predicted
work of that table is the step's CPU time, and the cores are that work
over the step's wall time. Other tables, T and recompute settings are then
predicted from the calibrated profile. The execution modes (`Mode`: GPipe's
own loops, the engine with the loss inside, the split I/W tables, each
with and without recompute) run the same cells at different cost (GPipe
without recompute differentiates its loop with TF's autodiff: 1.1-1.8x
1F1B's step); one measured step per mode (`Profile.WithMode`) gives that
mode a factor on its cells. `Applied` carries a calibration measured at
one micro-batch size to a profile taken at another.

Pure Python; no TensorFlow.

Usage:
  prof = cost_model.Profile(layers=(cost_model.LayerCost(1e-3, 2e-3, 1e-3,
                                                         1e-3, 4096),) * 4,
                            micro_batch_rows=8, tick_s=1e-4, num_cores=2)
  table = schedule_builders.Build('1f1b', 2, 4)
  pred = cost_model.Predict(table, prof, boundaries=[(0, 2), (2, 4)],
                            recompute=True, regime='shared')
  pred.step_s, pred.work_s, pred.critical_s, pred.ticks
"""

import dataclasses
import json
import math
from typing import Dict, List, Sequence, Tuple

from tensorpipe import schedules
from tensorpipe import simulator

REGIMES = ('shared', 'separate')
_CELL_FIELDS = ('forward', 'backward', 'input_grad', 'weight_grad',
                'out_bytes', 'update')


@dataclasses.dataclass(frozen=True)
class LayerCost:
  """One layer's cells on one micro-batch (seconds) and its output size.

  Attributes:
    forward: t_F, the forward call.
    backward: t_B, the full backward (input and weight gradients) without
      the recompute.
    input_grad: t_I, the backward without the weight ops' weight gradients.
    weight_grad: t_W, the weight ops' weight gradients from the kept (x,
      dz).
    out_bytes: bytes of the layer's outputs for one micro-batch.
    update: the update of its weights, once per step (an SGD step's
      traffic, w - lr g: optimizers with state read and write more).
  """
  forward: float
  backward: float
  input_grad: float
  weight_grad: float
  out_bytes: float = 0.0
  update: float = 0.0


@dataclasses.dataclass(frozen=True)
class Profile:
  """Per-layer cell costs and the run's overheads (module docstring).

  Attributes:
    layers: one LayerCost per layer, in order.
    micro_batch_rows: the micro-batch size the costs were measured at.
    tick_s: wall time one clock tick of the engine's loop adds.
    transfer_s_per_byte: time per byte of a boundary tensor sent to another
      device.
    input_bytes: bytes of the first layer's input for one micro-batch.
    num_cores: cores the devices' ops run on (the shared regime's C; a
      measured profile holds the cores the process got, which may be a
      fraction).
    source: 'measured' (cell_profile) or 'flops' (FlopProfile).
    cell_scale: the factor `Calibrated` applied to every cell (1.0: not
      calibrated on a step of the engine).
    mode_scales: (mode, factor) pairs from `WithMode`: the cells of a table
      run in that execution mode (`Mode`) cost the factor times the
      calibrated cells (1.0 for a mode not measured).
    points: the same layers' cells measured at other micro-batch sizes
      (their own tick, transfer and core figures unused): the curve
      `Scaled` interpolates, and the sizes num_micro_batches='auto' may
      choose from.
  """
  layers: Tuple[LayerCost, ...]
  micro_batch_rows: int
  tick_s: float = 0.0
  transfer_s_per_byte: float = 0.0
  input_bytes: float = 0.0
  num_cores: float = 1
  source: str = 'measured'
  points: Tuple['Profile', ...] = ()
  cell_scale: float = 1.0
  mode_scales: Tuple[Tuple[str, float], ...] = ()

  @property
  def measured_rows(self) -> Tuple[int, ...]:
    """The micro-batch sizes measured, ascending."""
    return tuple(sorted({q.micro_batch_rows for q in (self,) + self.points}))

  def Scaled(self, micro_batch_rows: int) -> 'Profile':
    """This profile at another micro-batch size (one size, no points).

    Between two measured sizes each cell cost and byte count is
    interpolated linearly in the rows: the measured curve, which knows that
    a small micro-batch costs more per row (bound by reading the weights).
    Outside them the nearest measured size is scaled in proportion to the
    rows, which underestimates smaller micro-batches.

    Raises:
      ValueError: a point of another layer count.
    """
    if micro_batch_rows == self.micro_batch_rows and not self.points:
      return self
    measured = sorted((self,) + self.points,
                      key=lambda q: q.micro_batch_rows)
    if any(len(q.layers) != len(self.layers) for q in measured):
      raise ValueError('a profile\'s points must measure the same '
                       f'{len(self.layers)} layers; profile again with '
                       'tools/benchmark --profile')
    rows = micro_batch_rows
    exact = [q for q in measured if q.micro_batch_rows == rows]
    below = [q for q in measured if q.micro_batch_rows < rows]
    above = [q for q in measured if q.micro_batch_rows > rows]
    if exact:
      lo = hi = exact[0]
      mix = lambda v, _: v
    elif below and above:
      lo, hi = below[-1], above[0]
      a = (rows - lo.micro_batch_rows) / (hi.micro_batch_rows -
                                          lo.micro_batch_rows)
      mix = lambda v, w: v + a * (w - v)
    else:
      lo = hi = below[-1] if below else above[0]
      x = rows / lo.micro_batch_rows
      mix = lambda v, _: v * x
    layers = tuple(LayerCost(*[mix(getattr(c, f), getattr(d, f))
                               for f in _CELL_FIELDS])
                   for c, d in zip(lo.layers, hi.layers))
    return dataclasses.replace(
        self, layers=layers, micro_batch_rows=rows,
        input_bytes=mix(lo.input_bytes, hi.input_bytes), points=())

  def Calibrated(self, table: schedules.Schedule,
                 boundaries: Sequence[Tuple[int, int]], recompute: bool,
                 wall_s: float, cpu_s: float, max_cores: float
                 ) -> 'Profile':
    """This profile fitted to one measured training step of `table`
    (module docstring: calibration): every cell and update (at every
    point) scaled by one factor so that the shared regime's work plus the
    ticks is `cpu_s`, and the cores set to that work over the step's wall
    time less its ticks, within [0.05, max_cores]. A measurement the ticks
    alone exceed leaves the profile as it is. For an uncalibrated profile
    (`cell_profile.ProfileLayer` calibrates first, then `WithMode`): mode
    factors it holds are dropped.
    """
    bare = dataclasses.replace(self, mode_scales=())
    pred = Predict(table, bare, boundaries, recompute, 'shared')
    ticks = pred.ticks * self.tick_s
    if pred.work_s <= 0 or cpu_s <= ticks or wall_s <= ticks:
      return self
    k = (cpu_s - ticks) / pred.work_s
    cores = min(max(0.05, (cpu_s - ticks) / (wall_s - ticks)),
                float(max_cores))
    return bare.Applied(k, cores, ())

  def WithMode(self, table: schedules.Schedule,
               boundaries: Sequence[Tuple[int, int]], recompute: bool,
               cpu_s: float) -> 'Profile':
    """This calibrated profile with the factor of `table`'s execution mode
    (`Mode`) fitted to one measured step's CPU time (module docstring:
    calibration). A measurement the ticks and update exceed leaves it."""
    mode = Mode(table, recompute)
    rest = tuple((m, x) for m, x in self.mode_scales if m != mode)
    pred = Predict(table, dataclasses.replace(self, mode_scales=rest),
                   boundaries, recompute, 'shared')
    cells = pred.work_s - pred.update_s
    measured = cpu_s - pred.ticks * self.tick_s - pred.update_s
    if cells <= 0 or measured <= 0:
      return self
    return dataclasses.replace(
        self, mode_scales=rest + ((mode, measured / cells),))

  def Calibration(self) -> Dict:
    """This profile's calibration as `Applied` takes it (JSON-ready)."""
    return dict(cell_scale=self.cell_scale, num_cores=self.num_cores,
                mode_scales=[list(m) for m in self.mode_scales])

  def Applied(self, cell_scale: float, num_cores: float,
              mode_scales: Sequence[Tuple[str, float]]) -> 'Profile':
    """This (uncalibrated) profile with another profile's calibration:
    cells and updates (at every point) times `cell_scale`, its cores and
    mode factors (a calibration at one micro-batch size carried to
    another)."""
    k = cell_scale

    def Scale(q):
      return dataclasses.replace(q, layers=tuple(
          dataclasses.replace(c, forward=c.forward * k,
                              backward=c.backward * k,
                              input_grad=c.input_grad * k,
                              weight_grad=c.weight_grad * k,
                              update=c.update * k)
          for c in q.layers), cell_scale=q.cell_scale * k)
    return dataclasses.replace(
        Scale(self), num_cores=num_cores,
        mode_scales=tuple(tuple(m) for m in mode_scales),
        points=tuple(Scale(q) for q in self.points))

  def ToJson(self) -> Dict:
    d = dataclasses.asdict(self)
    d['layers'] = [dataclasses.asdict(c) for c in self.layers]
    d['points'] = [q.ToJson() for q in self.points]
    return d

  @classmethod
  def FromJson(cls, d: Dict) -> 'Profile':
    d = dict(d)
    d['layers'] = tuple(LayerCost(**c) for c in d['layers'])
    d['points'] = tuple(cls.FromJson(q) for q in d.get('points', ()))
    d['mode_scales'] = tuple((str(m), float(x))
                             for m, x in d.get('mode_scales', ()))
    return cls(**d)

  def Save(self, path: str) -> None:
    with open(path, 'w') as f:
      json.dump(self.ToJson(), f, indent=1)

  @classmethod
  def Load(cls, path: str) -> 'Profile':
    """Reads a profile written by `Save` (tools/benchmark --profile).

    Raises:
      ValueError: the file cannot be read or is not a profile, naming it.
    """
    try:
      with open(path) as f:
        return cls.FromJson(json.load(f))
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise ValueError(f'plan_profile={path!r} is not a readable profile '
                       f'({e}); write one with tools/benchmark --profile') \
          from None


def InterpolatedCalibration(points: Sequence[Tuple[int, Dict]],
                            rows: int) -> Dict:
  """A calibration (`Profile.Calibration()`, what `Applied` takes) at
  micro-batches of `rows`, from calibrations fitted at other sizes
  (points: (rows, calibration)): each factor (cells, cores, each mode's)
  linear in log(rows) between the two nearest sizes, the nearest size's
  outside them. One calibration does not carry across sizes: the cells'
  engine-over-alone factor drifts with the micro-batch (conv16's 0.94 at
  16 rows, 0.83 at 4), so conv16 at 4 rows was over-predicted by 13-30%
  from a calibration at 8 (tools/benchmark --plan_check).

  Raises:
    ValueError: no points, or a size that is not a positive int.
  """
  pts = sorted(points, key=lambda p: p[0])
  if not pts or any(isinstance(r, bool) or not isinstance(r, int) or r < 1
                    for r, _ in pts):
    raise ValueError(f'points={[r for r, _ in pts]!r} must be one or more '
                     '(rows > 0, calibration) pairs')
  below = [p for p in pts if p[0] <= rows]
  above = [p for p in pts if p[0] >= rows]
  lo = below[-1] if below else above[0]
  hi = above[0] if above else below[-1]
  a = (0.0 if lo[0] == hi[0] else
       (math.log(rows) - math.log(lo[0])) / (math.log(hi[0]) -
                                              math.log(lo[0])))
  mix = lambda u, v: u + a * (v - u)
  lo_m, hi_m = dict(lo[1]['mode_scales']), dict(hi[1]['mode_scales'])
  modes = [[m, mix(lo_m.get(m, hi_m.get(m)), hi_m.get(m, lo_m.get(m)))]
           for m in sorted(lo_m.keys() | hi_m.keys())]
  return dict(cell_scale=mix(lo[1]['cell_scale'], hi[1]['cell_scale']),
              num_cores=mix(lo[1]['num_cores'], hi[1]['num_cores']),
              mode_scales=modes)


def FlopProfile(flops: Sequence[float], out_bytes: Sequence[float],
                micro_batch_rows: int, input_bytes: float = 0.0,
                device_flops: float = 1e12, num_cores: int = 1) -> Profile:
  """A profile from forward FLOPs of one micro-batch per layer:
  t_F = flops / device_flops, t_B = 2 t_F, t_I = t_W = t_F (schedule_plan's
  stated assumptions); no tick or transfer cost."""
  layers = tuple(LayerCost(f / device_flops, 2 * f / device_flops,
                           f / device_flops, f / device_flops, b)
                 for f, b in zip(flops, out_bytes))
  return Profile(layers, micro_batch_rows, input_bytes=input_bytes,
                 num_cores=num_cores, source='flops')


@dataclasses.dataclass(frozen=True)
class Prediction:
  """One table's predicted step (seconds)."""
  step_s: float
  work_s: float          # sum of the cells' costs and the update
  critical_s: float      # the table's dataflow with cells over all cores
  ticks: int             # the table's columns
  regime: str
  update_s: float = 0.0  # the weights' update (in work_s)


def _Sum(values: Sequence[float], start: int, end: int) -> float:
  return float(sum(values[start:end]))


def StageCosts(table: schedules.Schedule, profile: Profile,
               boundaries: Sequence[Tuple[int, int]]
               ) -> Tuple[List[float], List[float], List[float]]:
  """Per stage (f, b, w) of `Predict`'s cells without the recompute: the
  layers' costs summed over `boundaries` ([start, end) per stage), the
  transfers to and from another device added to F and to B (I).

  Raises:
    ValueError: boundaries that are not one per stage, or that reach past
      the profile's layers.
  """
  ss, n = table.num_stages, len(profile.layers)
  if len(boundaries) != ss or any(e > n for _, e in boundaries):
    raise ValueError(f'boundaries={list(boundaries)!r} must give one [start, '
                     f'end) per stage of {table.name!r} ({ss}) within the '
                     f'profile\'s {n} layers; cut the same layers the profile '
                     'measured')
  c = profile.layers
  split = {a.stage for row in table.grid for a in row
           if a is not None and a.op == 'I'}
  dev = table.StageDevice()
  rate = profile.transfer_s_per_byte
  f, b, w = [], [], []
  for s, (start, end) in enumerate(boundaries):
    out_b = c[end - 1].out_bytes
    in_b = profile.input_bytes if start == 0 else c[start - 1].out_bytes
    send = out_b * rate if s + 1 < ss and dev[s + 1] != dev[s] else 0.0
    recv = in_b * rate if s > 0 and dev[s - 1] != dev[s] else 0.0
    f.append(_Sum([x.forward for x in c], start, end) + send)
    # A stage that runs I cells: b is I + W as measured, w is W (module
    # docstring).
    if s in split:
      w.append(_Sum([x.weight_grad for x in c], start, end))
      b.append(_Sum([x.input_grad for x in c], start, end) + w[-1] + recv)
    else:
      w.append(0.0)
      b.append(_Sum([x.backward for x in c], start, end) + recv)
  return f, b, w


def Work(table: schedules.Schedule, f: Sequence[float], b: Sequence[float],
         w: Sequence[float], recompute: bool) -> float:
  """The sum of the table's cell costs (simulator's cell costs)."""
  total = 0.0
  for row in table.grid:
    for a in row:
      if a is None:
        continue
      s, r = a.stage, (f[a.stage] if recompute else 0.0)
      total += {'F': f[s], 'B': r + b[s], 'I': r + b[s] - w[s],
                'W': w[s]}[a.op]
  return total


# The execution modes `Mode` names, and the (schedule, recompute) whose
# step measures each (cell_profile.ProfileLayer's calibrate_modes).
MODES = {'gpipe_rc': ('gpipe', True), 'gpipe_norc': ('gpipe', False),
         'inside_rc': ('1f1b', True), 'inside_norc': ('1f1b', False),
         'split_rc': ('zb_h1', True), 'split_norc': ('zb_h1', False)}


def Mode(table: schedules.Schedule, recompute: bool) -> str:
  """The execution mode a table runs its cells in: 'gpipe' (GPipe's own
  loops, the loss outside), 'split' (a table with I and W cells) or
  'inside' (the engine with the loss inside), with '_rc' (recompute) or
  '_norc' (without: TF's autodiff of GPipe's loop; the engine's unrolled
  cells)."""
  kind = ('gpipe' if not table.loss_inside else
          'split' if any(a is not None and a.op in 'IW'
                         for row in table.grid for a in row) else 'inside')
  return f'{kind}_{"rc" if recompute else "norc"}'


def Predict(table: schedules.Schedule, profile: Profile,
            boundaries: Sequence[Tuple[int, int]], recompute: bool,
            regime: str) -> Prediction:
  """The step time of `table` with the layers cut at `boundaries`.

  Raises:
    ValueError: an unknown regime, or boundaries that do not fit.
  """
  if regime not in REGIMES:
    raise ValueError(f'regime={regime!r} is not one of {REGIMES}; use '
                     "'shared' (logical devices of one process) or "
                     "'separate' (own executors)")
  f, b, w = StageCosts(table, profile, boundaries)
  m = dict(profile.mode_scales).get(Mode(table, recompute), 1.0)
  f, b, w = ([x * m for x in xs] for xs in (f, b, w))
  ticks = len(table.grid[0]) if table.grid else 0
  dev = table.StageDevice()
  updates = [0.0] * table.num_devices
  for s, (start, end) in enumerate(boundaries):
    updates[dev[s]] += _Sum([c.update for c in profile.layers], start, end)
  update = sum(updates)
  work = Work(table, f, b, w, recompute) + update
  if regime == 'separate':
    res = simulator.SimulateSchedule(table, f, b, recompute, w,
                                     tick_overhead=profile.tick_s)
    # Each device updates its own weights once its cells are done.
    step = res.step_time + max(updates or [0.0])
    return Prediction(step, work, step, ticks, regime, update)
  cores = max(0.05, profile.num_cores)
  spread = lambda xs: [x / cores for x in xs]
  crit = simulator.SimulateSchedule(table, spread(f), spread(b), recompute,
                                    spread(w)).step_time + update / cores
  step = max(work / cores, crit) + ticks * profile.tick_s
  return Prediction(step, work, crit, ticks, regime, update)
