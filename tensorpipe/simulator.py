"""Predicts pipeline step time, bubble, busy time and in-flight micro-batches.

Any schedule table (`schedule_builders.Build`, a torch CSV) is simulated by
one cell builder (`_TableCells`): `SimulateSchedule(table, f_s, b_s)` with
costs per (virtual) stage. Each action of the table is a cell that waits
for what it needs (`schedules.Needs`: F(m, s) for F(m, s - 1); B or I for
its F and the input gradient from stage s + 1; W for its I) and for the
cell before it on its device:

  F (m, s)  after F (m, s - 1)            and the cell before it on its device
  B (m, s)  after F (m, s), B/I (m, s + 1) and the cell before it
  I (m, s)  as B;  W (m, s) after I (m, s)

A B cell costs r_s + b_s where r_s = f_s with recompute (the forward is
rematerialised first) and 0 without; with the I/W split an I cell costs
r_s + (b_s - w_s) and a W cell w_s (w_s = b_s / 2 unless given). For a table
whose loss is outside the pipeline (GPipe: every backward cell after every
forward cell) the ticks up to the first backward run as one pass and the rest
as a second pass. `synchronous_ticks=True` adds the clock barrier of a
tf.while_loop with parallel_iterations=1: every cell of tick c waits for all
cells of tick c - 1; `ticks_in_flight=n` models parallel_iterations=n. A
per-tick overhead (loop bookkeeping, op dispatch, copies) delays each cell's
start, and a fixed overhead (input split, loss, output merge, weight update)
is added once.

With `num_cores` < K the devices share the cores (processor sharing: n busy
devices on C cores each progress at min(1, C / n)), which is how K logical CPU
devices behave on a machine with fewer cores.

For equal costs and no overhead the idle share of each device is the
table's bubble (`Schedule.BubbleFraction`; (K - 1) / (T + K - 1) for GPipe
and 1F1B). With the clock barrier a 1F1B steady-state tick holds a forward
and a backward cell, so it lasts max(f, r + b) where GPipe's ticks last f or
r + b: 1F1B in lock step is only as fast as GPipe when f = r + b, which is
why the engine runs two ticks in flight. At t_F = t_I = t_W, as dataflow, it
gives issue 22's ideals over 1F1B (K=2, T=4: interleaved v=2 0.900, ZB-H1
0.900, ZB-V 0.850).

Memory: `SimResult.max_in_flight[k]` is the most micro-batches device k
holds (forward started, backward not finished): T for GPipe, min(K - k, T)
for 1F1B. `ActivationPeak` turns it into bytes.

Usage:
  table = schedule_builders.Build('1f1b', 2, 4)
  res = SimulateSchedule(table, forward_costs=[1., 1.],
                         backward_costs=[2., 2.], synchronous_ticks=True)
  res.step_time, res.bubble_fraction, res.busy, res.cells
  res.max_in_flight                               # [2, 1]

Pure Python; no TensorFlow.
"""

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

from tensorpipe import schedules


@dataclasses.dataclass(frozen=True)
class SimCell:
  """One simulated stage call."""
  phase: str      # 'forward' or 'backward' (backward includes any recompute)
  t: int
  k: int
  start: float
  end: float
  recompute: float = 0.0   # the part of [start, end] spent recomputing
  stage: int = -1          # the (virtual) stage; k is its device


@dataclasses.dataclass
class SimResult:
  """Prediction for one step.

  Attributes:
    step_time: predicted wall time of one step.
    forward_time: the end of the last forward cell (for GPipe the forward
      pass's span).
    backward_time: from the end of the last forward cell to the end of the
      last cell.
    busy: per device, time spent in stage calls (wall time).
    bubble_fraction: mean over devices of the idle share of the forward plus
      backward spans.
    cells: every simulated cell, in start order.
    schedule: the table's name.
    max_in_flight: per device, the most micro-batches held at once (forward
      started, backward not ended): their boundary inputs (with recompute)
      or all their activations (without) are alive together.
  """
  step_time: float
  forward_time: float
  backward_time: float
  busy: List[float]
  bubble_fraction: float
  cells: List[SimCell]
  schedule: str = 'gpipe'
  max_in_flight: List[int] = dataclasses.field(default_factory=list)
  max_stash: List[int] = dataclasses.field(default_factory=list)


def CheckCosts(name: str, costs: Sequence[float]) -> List[float]:
  """`costs` as floats; raises unless a non-empty list of numbers >= 0."""
  costs = list(costs)
  if not costs:
    raise ValueError(f'{name} is empty; give one cost per partition')
  for c in costs:
    if isinstance(c, bool) or not isinstance(c, (int, float)) or c < 0:
      raise ValueError(f'{name}={costs!r}: every cost must be a number >= 0')
  return [float(c) for c in costs]


def _CheckRun(num_cores, ticks_in_flight, tick_overhead,
              fixed_overhead) -> None:
  """Raises on run settings no simulation can use."""
  if num_cores is not None and num_cores <= 0:
    raise ValueError(f'num_cores={num_cores!r} must be > 0')
  if isinstance(ticks_in_flight, bool) or not isinstance(
      ticks_in_flight, int) or ticks_in_flight < 1:
    raise ValueError(f'ticks_in_flight={ticks_in_flight!r} must be an int '
                     '>= 1 (a loop\'s parallel_iterations)')
  for name, v in (('tick_overhead', tick_overhead),
                  ('fixed_overhead', fixed_overhead)):
    if v < 0:
      raise ValueError(f'{name}={v!r} must be >= 0')


def _RunPhase(ticks: List[List[Tuple[int, ...]]], cost: Dict[Tuple[int, ...],
                                                               float],
              deps, t0: float, tick_overhead: float, synchronous: bool,
              num_cores: float, ticks_in_flight: int = 1
              ) -> Dict[Tuple[int, ...], Tuple[float, float]]:
  """Event-driven processor-sharing simulation of one pass.

  Args:
    ticks: the schedule, per tick its cells: (t, k) (GPipe) or (op, t, k)
      (1F1B); the partition k is always last.
    cost: work of each cell.
    deps: function (*cell) -> cells it waits for (within this pass).
    t0: time the pass may start.
    tick_overhead: delay between a cell's dependencies finishing (or its
      tick's barrier) and its start.
    synchronous: whether tick c waits for all of tick c - ticks_in_flight.
    num_cores: cores shared by the running cells.
    ticks_in_flight: see `synchronous`.

  Returns:
    cell -> (start, end).
  """
  tick_of = {cell: c for c, cells in enumerate(ticks) for cell in cells}
  # The barrier of tick c is the last tick <= c - ticks_in_flight that ran
  # a cell.
  last_busy, last = [], None
  for c, cells in enumerate(ticks):
    if cells:
      last = c
    last_busy.append(last)
  prev_busy = [last_busy[c - ticks_in_flight] if c >= ticks_in_flight
               else None for c in range(len(ticks))]
  pending = set(tick_of)
  done: Dict[Tuple[int, int], Tuple[float, float]] = {}
  running: Dict[Tuple[int, int], float] = {}     # cell -> remaining work
  started: Dict[Tuple[int, int], float] = {}
  tick_end = [None] * len(ticks)                 # last end per tick
  now = t0

  def ReadyTime(cell) -> Optional[float]:
    ends = []
    for d in deps(*cell):
      if d not in done:
        return None
      ends.append(done[d][1])
    c = prev_busy[tick_of[cell]]
    if synchronous and c is not None:
      if tick_end[c] is None:
        return None
      ends.append(tick_end[c])
    return max([t0] + ends) + tick_overhead

  while pending or running:
    # Start every cell whose dependencies are met by `now`.
    next_ready = None
    for cell in sorted(pending, key=lambda x: (tick_of[x], x[-1])):
      ready = ReadyTime(cell)
      if ready is None:
        continue
      if ready <= now + 1e-15:
        running[cell] = cost[cell]
        started[cell] = now
        pending.discard(cell)
      elif next_ready is None or ready < next_ready:
        next_ready = ready
    if not running:
      assert next_ready is not None, 'schedule deadlock'
      now = next_ready
      continue
    rate = min(1.0, num_cores / len(running))
    cell, rem = min(running.items(), key=lambda kv: (kv[1], kv[0]))
    dt = rem / rate
    if next_ready is not None and next_ready - now < dt:
      dt = next_ready - now
    for c in running:
      running[c] -= dt * rate
    now += dt
    for c in [c for c, r in running.items() if r <= 1e-12]:
      del running[c]
      done[c] = (started[c], now)
      tc = tick_of[c]
      if all(x in done for x in ticks[tc]):
        tick_end[tc] = max(done[x][1] for x in ticks[tc])
  return done


def _Result(cells: List[SimCell], num_devices: int, fixed_overhead: float,
            schedule: str) -> SimResult:
  """The SimResult of simulated cells."""
  cells.sort(key=lambda c: (c.start, c.k))
  fwd_end = max(c.end for c in cells if c.phase == 'forward')
  bwd_end = max(c.end for c in cells)
  busy = [0.0] * num_devices
  for c in cells:
    busy[c.k] += c.end - c.start
  span = bwd_end
  bubble = (sum(1.0 - bk / span for bk in busy) / num_devices
            if span > 0 else 0.0)
  return SimResult(step_time=bwd_end + fixed_overhead, forward_time=fwd_end,
                   backward_time=bwd_end - fwd_end, busy=busy,
                   bubble_fraction=bubble, cells=cells, schedule=schedule,
                   max_in_flight=_MaxInFlight(cells, num_devices),
                   max_stash=_MaxStash(cells, num_devices))


def SimulateSchedule(table: schedules.Schedule,
                     forward_costs: Sequence[float],
                     backward_costs: Sequence[float], recompute: bool = True,
                     weight_grad_costs: Optional[Sequence[float]] = None,
                     loss_outside: Optional[bool] = None,
                     tick_overhead: float = 0.0, fixed_overhead: float = 0.0,
                     synchronous_ticks: bool = False,
                     num_cores: Optional[float] = None,
                     ticks_in_flight: int = 1) -> SimResult:
  """Simulates one step of a schedule table (`schedule_builders.Build`, a CSV).

  Costs are per stage (the table's S = K v stages). A B cell costs
  r_s + b_s (r_s = f_s with recompute, else 0); with the I/W split an I
  cell costs r_s + (b_s - w_s) and a W cell w_s, where w_s defaults to
  b_s / 2 (the stated assumption t_I = t_W). Cells run as dataflow by
  default (each waits for its inputs and the cell before it on its device);
  `synchronous_ticks` adds the loop's barrier (module docstring).

  Args:
    table: the schedule.
    forward_costs: f_s per stage.
    backward_costs: b_s per stage, the full backward without recompute.
    recompute: whether B and I cells first recompute the stage's forward.
    weight_grad_costs: w_s per stage (default b_s / 2).
    loss_outside: the loss follows the whole forward pass (GPipe); default:
      True for a table named 'gpipe'.
    tick_overhead: added before every cell (per clock tick).
    fixed_overhead: added once per step (setup, loss, weight update).
    synchronous_ticks: the loop's clock barrier; False gives pure dataflow.
    num_cores: cores shared by the K devices; None means one per device.
    ticks_in_flight: with `synchronous_ticks`, tick c waits for all cells of
      tick c - ticks_in_flight (the loop's parallel_iterations).

  Returns:
    A SimResult; `max_in_flight` counts each device's boundary inputs held
    (over all its stages), `max_stash` its I-to-W pairs held.

  Raises:
    ValueError: cost lists whose length is not the table's number of
      stages, negative costs or overheads, num_cores <= 0, or
      ticks_in_flight not an int >= 1.
  """
  ss = table.num_stages
  _CheckRun(num_cores, ticks_in_flight, tick_overhead, fixed_overhead)
  f = CheckCosts('forward_costs', forward_costs)
  b = CheckCosts('backward_costs', backward_costs)
  w = ([x / 2 for x in b] if weight_grad_costs is None else
       CheckCosts('weight_grad_costs', weight_grad_costs))
  for name, costs in (('forward_costs', f), ('backward_costs', b),
                      ('weight_grad_costs', w)):
    if len(costs) != ss:
      raise ValueError(f'{name} has {len(costs)} entries but schedule '
                       f'{table.name!r} has {ss} stages; give one per stage')
  rc = [x if recompute else 0.0 for x in f]
  cost = {'F': f, 'B': [r + x for r, x in zip(rc, b)],
          'I': [r + x - y for r, x, y in zip(rc, b, w)], 'W': w}
  run = dict(tick_overhead=tick_overhead, synchronous=synchronous_ticks,
             num_cores=float(num_cores or table.num_devices),
             ticks_in_flight=ticks_in_flight)
  if loss_outside is None:
    loss_outside = not table.loss_inside
  cells = _TableCells(table, cost, rc, run, loss_outside)
  return _Result(cells, table.num_devices, fixed_overhead, table.name)


_PHASES = {'F': 'forward', 'B': 'backward', 'I': 'input_grad',
           'W': 'weight_grad'}


def _TableCells(table: schedules.Schedule, cost: Dict[str, List[float]],
                recompute_cost: List[float], run, loss_outside: bool
                ) -> List[SimCell]:
  """Simulates any schedule table: one cell builder for every schedule.

  Each action waits for what it needs (`schedules.Needs`) and for the
  action before it on its device; `run['synchronous']` adds the loop's
  tick barrier. With `loss_outside` (GPipe: the loss follows the whole
  forward pass) the ticks up to the first backward run as one pass and the
  rest as a second pass that starts when the first has ended.

  Args:
    table: the schedule.
    cost: op ('F', 'B', 'I', 'W') -> per stage, the cell's work (B and I
      include the recompute).
    recompute_cost: per stage, the part of a B or I cell that recomputes.
    run: _RunPhase's keyword arguments.
    loss_outside: see above.
  """
  ticks = [[(a.op, a.micro_batch, a.stage, d)
            for d, a in enumerate(col) if a is not None]
           for col in zip(*table.grid)]
  cell_of = {schedules.Action(*cell[:3]): cell for cells in ticks
             for cell in cells}
  before, last_on = {}, {}
  for cells in ticks:
    for cell in cells:
      before[cell] = last_on.get(cell[-1])
      last_on[cell[-1]] = cell
  split = len(ticks)
  if loss_outside:
    split = next((c for c, cells in enumerate(ticks)
                  if any(cell[0] != 'F' for cell in cells)), len(ticks))
  out, t0 = [], 0.0
  for phase in (ticks[:split], ticks[split:]):
    if not any(phase):
      continue
    here = {cell for cells in phase for cell in cells}

    def Deps(*cell, here=here):
      deps = [before[cell]]
      for need in schedules.Needs(schedules.Action(*cell[:3]),
                                  table.num_stages):
        deps += [cell_of.get(a) for a in need]
      return [d for d in deps if d in here]

    done = _RunPhase(phase, {c: cost[c[0]][c[2]] for c in here}, Deps,
                     t0=t0, **run)
    t0 = max(e for _, e in done.values())
    for (op, m, stage, k), (start, end) in done.items():
      work = cost[op][stage]
      share = recompute_cost[stage] / work if op in 'BI' and work else 0.0
      out.append(SimCell(_PHASES[op], m, k, start, end,
                         recompute=(end - start) * share, stage=stage))
  return out


def _PeakHeld(num_devices: int, takes: Sequence[Tuple[int, float]],
              frees: Sequence[Tuple[int, float]]) -> List[int]:
  """Per device, the most items held at once: each (k, time) of `takes`
  takes one on device k, each of `frees` frees one (at the same time a
  free comes before a take)."""
  peak = []
  for k in range(num_devices):
    events = sorted([(t, 1) for d, t in takes if d == k] +
                    [(t, -1) for d, t in frees if d == k])
    held = top = 0
    for _, delta in events:
      held += delta
      top = max(top, held)
    peak.append(top)
  return peak


def _MaxInFlight(cells: Sequence[SimCell], num_devices: int) -> List[int]:
  """Per device, the most micro-batches whose forward has started and whose
  backward (B or I) has not ended."""
  return _PeakHeld(
      num_devices, [(c.k, c.start) for c in cells if c.phase == 'forward'],
      [(c.k, c.end) for c in cells if c.phase in ('backward', 'input_grad')])


def _MaxStash(cells: Sequence[SimCell], num_devices: int) -> List[int]:
  """Per device, the most I-to-W stashes held: from an I's end to its W's
  end."""
  return _PeakHeld(
      num_devices, [(c.k, c.end) for c in cells if c.phase == 'input_grad'],
      [(c.k, c.end) for c in cells if c.phase == 'weight_grad'])


def ActivationPeak(max_in_flight: Sequence[int],
                   boundary_bytes: Sequence[float],
                   internal_bytes: Sequence[float],
                   recompute: bool) -> List[float]:
  """Per device, its peak activation memory from its in-flight micro-batches.

  With recompute a stage keeps only its input (the boundary activation) of
  every micro-batch in flight, plus the activations of the one micro-batch
  it recomputes and back-propagates; without, all activations of every
  micro-batch in flight:

    recompute:     n_k x boundary_k + internal_k
    no recompute:  n_k x (boundary_k + internal_k)

  with n_k = `max_in_flight[k]` (T for GPipe, min(K - k, T) for 1F1B:
  `SimResult.max_in_flight`).

  Args:
    max_in_flight: n_k per device.
    boundary_bytes: per device, its input for ONE micro-batch.
    internal_bytes: per device, its layers' outputs for ONE micro-batch.
    recompute: whether the backward recomputes the forward.

  Returns:
    Bytes per device.

  Raises:
    ValueError: lists of different lengths or negative sizes.
  """
  bnd = CheckCosts('boundary_bytes', boundary_bytes)
  internal = CheckCosts('internal_bytes', internal_bytes)
  if not len(bnd) == len(internal) == len(max_in_flight):
    raise ValueError(f'max_in_flight, boundary_bytes and internal_bytes have '
                     f'{len(max_in_flight)}, {len(bnd)} and {len(internal)} '
                     'entries; give one of each per partition')
  if recompute:
    return [n * x + a for n, x, a in zip(max_in_flight, bnd, internal)]
  return [n * (x + a) for n, x, a in zip(max_in_flight, bnd, internal)]


@dataclasses.dataclass(frozen=True)
class Calibration:
  """Overheads fitted from measured K=1 runs (see `CalibrateFromK1`)."""
  tick_overhead: float
  fixed_overhead: float
  residual: float       # largest |prediction - measurement| on the fit data


def CalibrateFromK1(runs: Sequence[Tuple[int, float, float, float]],
                    recompute: bool) -> Calibration:
  """Fits tick and fixed overhead to K=1 runs by least squares.

  With K=1 nothing overlaps, so step = T (f + r + b) + 2T o + F exactly in
  the model; given measured (T, f, b, step) for two or more T the fit of o
  (per tick) and F (fixed) is linear. With a single run o = 0.

  Args:
    runs: (T, f, b, measured step) of K=1 runs (f, b per micro-batch).
    recompute: whether those runs recomputed.

  Returns:
    A Calibration; overheads are clipped at 0.
  """
  if not runs:
    raise ValueError('CalibrateFromK1 needs at least one K=1 run')
  xs, ys = [], []
  for t, f, b, step in runs:
    work = t * ((2 * f if recompute else f) + b)
    xs.append(2.0 * t)
    ys.append(step - work)
  n = len(xs)
  mx, my = sum(xs) / n, sum(ys) / n
  var = sum((x - mx) ** 2 for x in xs)
  o = (sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var) if var else 0.0
  o = max(0.0, o)
  fixed = max(0.0, my - o * mx)
  resid = max(abs(fixed + o * x - y) for x, y in zip(xs, ys))
  return Calibration(o, fixed, resid)
