"""Predicts pipeline step time, bubble, busy time and in-flight micro-batches.

GPipe (Huang et al. 2018, section 2.2) runs partition k on device k. With
per-partition costs f_k (forward of one micro-batch) and b_k (its backward)
the step is a dependency graph of cells (phase, t, k):

  forward  (t, k) after (t, k - 1)  (its input)   and (t - 1, k)  (same device)
  backward (t, k) after (t, k + 1)  (its dy)      and (t + 1, k)  (same device)
  every backward cell after every forward cell    (the loss needs all outputs)

A backward cell costs r_k + b_k where r_k = f_k with recompute (the forward is
rematerialised first) and 0 without. `synchronous_ticks=True` adds the clock
barrier of TensorPipeLayer's tf.while_loop (parallel_iterations=1): every
cell of tick c waits for all cells of tick c - 1. `ticks_in_flight=n`
models parallel_iterations=n: tick c waits for all of tick c - n only. A per-tick overhead (loop
bookkeeping, op dispatch, copies) delays each tick's start, and a fixed
overhead (input split, loss, output merge, weight update) is added once.

With `num_cores` < K the devices share the cores (processor sharing: n busy
devices on C cores each progress at min(1, C / n)), which is how K logical CPU
devices behave on a machine with fewer cores.

For equal costs and no overhead the idle share of each device is the
schedule's bubble (K - 1) / (T + K - 1) (schedules.BubbleFraction).

`schedule='1f1b'` (one forward, one backward; PipeDream-flush) simulates the
cells of `schedules.OneFOneBClockCycles` instead: forward and backward share
one clock of 2 (T + K - 1) ticks, and the loss is inside the pipeline, so

  forward  (t, k) after (t, k - 1)  and the cell before it on device k
  backward (t, k) after (t, k + 1)  (for k = K - 1: after its own forward)
                  and the cell before it on device k

where "the cell before it on device k" is the schedule's order on that
partition (warm-up forwards, then backward / forward alternately, then the
remaining backwards). As dataflow (`synchronous_ticks=False`) with costs equal
over partitions the step is (T + K - 1)(f + r + b), GPipe's. With the clock
barrier a steady-state tick holds a forward and a backward cell, so it lasts
max(f, r + b) where GPipe's ticks last f or r + b: 1F1B in lock step is only
as fast as GPipe when f = r + b. The 1F1B loop (pipeline_1f1b.py) therefore
runs two ticks in flight (`ticks_in_flight=2`).

Memory: `SimResult.max_in_flight[k]` is the most micro-batches partition k
holds (forward started, backward not finished): T for GPipe, min(K - k, T)
for 1F1B. `ActivationPeak` turns it into bytes.

Usage:
  res = Simulate(forward_costs=[1., 1.], backward_costs=[2., 2.],
                 num_micro_batches=4)
  res.step_time, res.bubble_fraction, res.busy, res.cells
  res = Simulate([1., 1.], [2., 2.], 4, schedule='1f1b')
  res.max_in_flight                               # [2, 1]

Pure Python; no TensorFlow.
"""

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

from tensorpipe import schedules

SCHEDULES = ('gpipe', '1f1b')


@dataclasses.dataclass(frozen=True)
class SimCell:
  """One simulated stage call."""
  phase: str      # 'forward' or 'backward' (backward includes any recompute)
  t: int
  k: int
  start: float
  end: float
  recompute: float = 0.0   # the part of [start, end] spent recomputing


@dataclasses.dataclass
class SimResult:
  """Prediction for one step.

  Attributes:
    step_time: predicted wall time of one step.
    forward_time: span of the forward pass (first cell start to last end;
      for 1F1B, whose passes interleave, the end of the last forward cell).
    backward_time: span of the backward pass (for 1F1B: from the end of
      the last forward cell to the end of the last backward cell).
    busy: per device, time spent in stage calls (wall time).
    bubble_fraction: mean over devices of the idle share of the forward plus
      backward spans.
    cells: every simulated cell, in start order.
    schedule: 'gpipe' or '1f1b'.
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


def _CheckCosts(name: str, costs: Sequence[float]) -> List[float]:
  costs = list(costs)
  if not costs:
    raise ValueError(f'{name} is empty; give one cost per partition')
  for c in costs:
    if isinstance(c, bool) or not isinstance(c, (int, float)) or c < 0:
      raise ValueError(f'{name}={costs!r}: every cost must be a number >= 0')
  return [float(c) for c in costs]


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


def Simulate(forward_costs: Sequence[float], backward_costs: Sequence[float],
             num_micro_batches: int, recompute: bool = True,
             tick_overhead: float = 0.0, fixed_overhead: float = 0.0,
             synchronous_ticks: bool = True,
             num_cores: Optional[float] = None,
             schedule: str = 'gpipe', ticks_in_flight: int = 1) -> SimResult:
  """Simulates one training step of the GPipe or the 1F1B schedule.

  Args:
    forward_costs: f_k, seconds (or any unit) of partition k's forward on one
      micro-batch; K = len(forward_costs).
    backward_costs: b_k, its backward without recompute.
    num_micro_batches: T.
    recompute: whether each backward cell first recomputes the forward.
    tick_overhead: added before every cell (per clock tick).
    fixed_overhead: added once per step (setup, loss, weight update).
    synchronous_ticks: clock barrier between ticks (TensorPipeLayer's loop);
      False gives pure dataflow.
    num_cores: cores shared by the K devices; None means one per device.
    schedule: 'gpipe' (all forwards, then all backwards: two passes of
      T + K - 1 ticks) or '1f1b' (one clock of 2 (T + K - 1) ticks,
      schedules.OneFOneBClockCycles).
    ticks_in_flight: with `synchronous_ticks`, tick c waits for all cells of
      tick c - ticks_in_flight (the loop's parallel_iterations).

  Returns:
    A SimResult.

  Raises:
    ValueError: mismatched or negative costs, bad T, num_cores or schedule.
  """
  f = _CheckCosts('forward_costs', forward_costs)
  b = _CheckCosts('backward_costs', backward_costs)
  if len(f) != len(b):
    raise ValueError(f'forward_costs has {len(f)} entries but backward_costs '
                     f'{len(b)}; give one of each per partition')
  if schedule not in SCHEDULES:
    raise ValueError(f'schedule={schedule!r} is not one of {SCHEDULES}; use '
                     "schedule='gpipe' or schedule='1f1b'")
  kk = len(f)
  tt = num_micro_batches
  schedules.NumClockTicks(kk, tt)   # checks T
  cores = float(kk if num_cores is None else num_cores)
  if cores <= 0:
    raise ValueError(f'num_cores={num_cores!r} must be > 0')
  if isinstance(ticks_in_flight, bool) or not isinstance(
      ticks_in_flight, int) or ticks_in_flight < 1:
    raise ValueError(f'ticks_in_flight={ticks_in_flight!r} must be an int '
                     '>= 1 (a loop\'s parallel_iterations)')
  for name, v in (('tick_overhead', tick_overhead),
                  ('fixed_overhead', fixed_overhead)):
    if v < 0:
      raise ValueError(f'{name}={v!r} must be >= 0')

  rc = [fk if recompute else 0.0 for fk in f]
  run = dict(tick_overhead=tick_overhead, synchronous=synchronous_ticks,
             num_cores=cores, ticks_in_flight=ticks_in_flight)
  if schedule == '1f1b':
    cells = _OneFOneBCells(f, b, rc, tt, run)
  else:
    cells = _GPipeCells(f, b, rc, tt, run)
  cells.sort(key=lambda c: (c.start, c.k))
  fwd_end = max(c.end for c in cells if c.phase == 'forward')
  bwd_end = max(c.end for c in cells)
  busy = [0.0] * kk
  for c in cells:
    busy[c.k] += c.end - c.start
  span = bwd_end
  bubble = (sum(1.0 - bk / span for bk in busy) / kk) if span > 0 else 0.0
  return SimResult(step_time=bwd_end + fixed_overhead, forward_time=fwd_end,
                   backward_time=bwd_end - fwd_end, busy=busy,
                   bubble_fraction=bubble, cells=cells, schedule=schedule,
                   max_in_flight=_MaxInFlight(cells, kk))


def _BackwardCell(t, k, start, end, recompute_cost, cost) -> SimCell:
  share = recompute_cost / cost if cost else 0.0
  return SimCell('backward', t, k, start, end,
                 recompute=(end - start) * share)


def _GPipeCells(f, b, rc, tt, run) -> List[SimCell]:
  """GPipe: the forward pass, then the backward pass after all of it."""
  kk = len(f)
  fwd_ticks = list(schedules.GPipeClockCycles(kk, tt))
  bwd_ticks = list(schedules.GPipeBackwardClockCycles(kk, tt))
  fwd_cost = {(t, k): f[k] for t in range(tt) for k in range(kk)}
  bwd_cost = {(t, k): rc[k] + b[k] for t in range(tt) for k in range(kk)}

  def FwdDeps(t, k):
    return [c for c in ((t, k - 1), (t - 1, k)) if c[0] >= 0 and c[1] >= 0]

  def BwdDeps(t, k):
    return [c for c in ((t, k + 1), (t + 1, k)) if c[0] < tt and c[1] < kk]

  fwd = _RunPhase(fwd_ticks, fwd_cost, FwdDeps, t0=0.0, **run)
  fwd_end = max(e for _, e in fwd.values())
  bwd = _RunPhase(bwd_ticks, bwd_cost, BwdDeps, t0=fwd_end, **run)
  cells = [SimCell('forward', t, k, s, e) for (t, k), (s, e) in fwd.items()]
  cells += [_BackwardCell(t, k, s, e, rc[k], bwd_cost[(t, k)])
            for (t, k), (s, e) in bwd.items()]
  return cells


def _OneFOneBCells(f, b, rc, tt, run) -> List[SimCell]:
  """1F1B: one clock; each device runs its cells in the schedule's order."""
  kk = len(f)
  ticks = list(schedules.OneFOneBClockCycles(kk, tt))
  fwd_op, bwd_op = schedules.FORWARD, schedules.BACKWARD
  cost = {}
  before = {}                       # cell -> the previous cell on its device
  last_on = [None] * kk
  for cells in ticks:
    for cell in cells:
      op, _, k = cell
      cost[cell] = f[k] if op == fwd_op else rc[k] + b[k]
      before[cell] = last_on[k]
      last_on[k] = cell

  def Deps(op, t, k):
    if op == fwd_op:
      data = (fwd_op, t, k - 1) if k > 0 else None
    else:
      data = (bwd_op, t, k + 1) if k < kk - 1 else (fwd_op, t, k)
    return [c for c in (data, before[(op, t, k)]) if c is not None]

  done = _RunPhase(ticks, cost, Deps, t0=0.0, **run)
  out = []
  for (op, t, k), (s, e) in done.items():
    if op == fwd_op:
      out.append(SimCell('forward', t, k, s, e))
    else:
      out.append(_BackwardCell(t, k, s, e, rc[k], cost[(op, t, k)]))
  return out


def _MaxInFlight(cells: Sequence[SimCell], num_partitions: int) -> List[int]:
  """Per device, the most micro-batches whose forward has started and whose
  backward has not ended (a cell ending frees before one starting at the
  same time takes)."""
  peak = []
  for k in range(num_partitions):
    events = sorted(
        [(c.start, 1) for c in cells if c.k == k and c.phase == 'forward'] +
        [(c.end, -1) for c in cells if c.k == k and c.phase == 'backward'])
    held = top = 0
    for _, delta in events:
      held += delta
      top = max(top, held)
    peak.append(top)
  return peak


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
  bnd = _CheckCosts('boundary_bytes', boundary_bytes)
  internal = _CheckCosts('internal_bytes', internal_bytes)
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


# -- R data-parallel replicas x K stages ---------------------------------------


def RingAllReduceTime(num_bytes: float, num_replicas: int,
                      bytes_per_second: float,
                      latency_s: float = 0.0) -> float:
  """Time of a ring all-reduce of `num_bytes` over R replicas.

  A ring all-reduce is a reduce-scatter then an all-gather, each R - 1 steps
  in which every replica sends one 1/R chunk to its neighbour over its own
  link: 2 (R - 1) / R x bytes / bandwidth, plus 2 (R - 1) message latencies.
  0 for R = 1.

  Args:
    num_bytes: bytes each replica contributes (its gradient bytes).
    num_replicas: R.
    bytes_per_second: bandwidth of each replica's link, one direction.
    latency_s: per-message latency (alpha).
  """
  if isinstance(num_replicas, bool) or not isinstance(
      num_replicas, int) or num_replicas < 1:
    raise ValueError(f'num_replicas={num_replicas!r} must be a positive int')
  if num_bytes < 0 or latency_s < 0:
    raise ValueError(f'num_bytes={num_bytes!r} and latency_s={latency_s!r} '
                     'must be >= 0')
  if bytes_per_second <= 0:
    raise ValueError(f'bytes_per_second={bytes_per_second!r} must be > 0')
  steps = 2 * (num_replicas - 1)
  return (steps / num_replicas * num_bytes / bytes_per_second +
          steps * latency_s)


@dataclasses.dataclass(frozen=True)
class DataParallelResult:
  """Prediction for one step of R replicas of a K-stage pipeline.

  Attributes:
    num_replicas: R.
    pipeline: each replica's pipeline (all replicas run the same schedule).
    allreduce_times: per stage, its ring all-reduce on its link alone.
    allreduce_start: per stage, when its all-reduce starts in the model
      (after the whole backward: see SimulateDataParallel).
    allreduce_end: per stage, when it ends.
    step_time: predicted step: the last all-reduce's end + fixed overhead.
    overlapped_step_time: the same if stage k's all-reduce could start when
      stage k's last backward cell ends (a lower bound for an
      implementation that overlaps; not what TensorPipe does today).
  """
  num_replicas: int
  pipeline: SimResult
  allreduce_times: Tuple[float, ...]
  allreduce_start: Tuple[float, ...]
  allreduce_end: Tuple[float, ...]
  step_time: float
  overlapped_step_time: float

  @property
  def exposed_allreduce_time(self) -> float:
    """Step time added by the all-reduces over the pipeline alone."""
    return self.step_time - self.pipeline.step_time

  def Throughput(self, examples_per_replica: float) -> float:
    """Examples per unit of time: R x per-replica mini-batch / step."""
    return self.num_replicas * examples_per_replica / self.step_time


def _LinkSchedule(ready: Sequence[float], durations: Sequence[float],
                  shared_link: bool) -> Tuple[List[float], List[float]]:
  """Start and end of each stage's all-reduce given when it may start.

  Own links: each starts when ready. One shared link: one at a time at full
  bandwidth, in order of readiness (the same total time as sharing the
  bandwidth among concurrent ones).
  """
  starts, ends = [0.0] * len(ready), [0.0] * len(ready)
  link_free = 0.0
  for k in sorted(range(len(ready)), key=lambda k: (ready[k], -k)):
    starts[k] = max(ready[k], link_free) if shared_link else ready[k]
    ends[k] = starts[k] + durations[k]
    link_free = ends[k]
  return starts, ends


def SimulateDataParallel(forward_costs: Sequence[float],
                         backward_costs: Sequence[float],
                         num_micro_batches: int,
                         grad_bytes: Sequence[float],
                         num_replicas: int,
                         bytes_per_second: float,
                         latency_s: float = 0.0,
                         shared_link: bool = False,
                         recompute: bool = True,
                         tick_overhead: float = 0.0,
                         fixed_overhead: float = 0.0,
                         synchronous_ticks: bool = True,
                         num_cores: Optional[float] = None,
                         schedule: str = 'gpipe', ticks_in_flight: int = 1
                         ) -> DataParallelResult:
  """Simulates one step of R data-parallel replicas of a K-stage pipeline.

  Every replica runs the same pipeline (`Simulate`) on its own devices; then
  stage k's weight gradients (grad_bytes[k]) are ring all-reduced among the
  R copies of stage k. By default each stage has its own link (stage k of
  every replica on its own accelerator with its own NIC), so the K
  all-reduces run concurrently and the step waits for the slowest;
  `shared_link` puts them on one link per replica instead.

  The all-reduces start after the whole backward pass, not overlapped with
  it: TensorPipeLayer's backward is one tf.while_loop whose weight-gradient
  sums are loop state, so no stage's gradient exists outside the loop before
  the loop ends, and the strategy all-reduces what the loop returns.
  `overlapped_step_time` gives the bound for an implementation that would
  start stage k's all-reduce at the end of its last backward cell (stage
  K - 1 finishes first: its cell for micro-batch 0 runs K - 1 ticks before
  stage 0's).

    pipe = Simulate(forward_costs, backward_costs, T, ...)
    A_k = RingAllReduceTime(grad_bytes[k], R, bandwidth, latency)
    step = pipe.backward_end + max_k A_k + fixed_overhead  (own links)
         = pipe.backward_end + sum_k A_k + fixed_overhead  (shared link)

  Args:
    forward_costs, backward_costs, num_micro_batches, recompute,
      tick_overhead, synchronous_ticks, num_cores, schedule,
      ticks_in_flight: as in `Simulate`, in seconds.
    grad_bytes: per stage, bytes of its weight gradients.
    num_replicas: R.
    bytes_per_second: each link's bandwidth.
    latency_s: per-message latency of the ring.
    shared_link: whether the K stages of a replica share one link.
    fixed_overhead: added once per step (after the all-reduce: the update).

  Returns:
    A DataParallelResult.

  Raises:
    ValueError: grad_bytes not one per stage, or bad values.
  """
  pipe = Simulate(forward_costs, backward_costs, num_micro_batches,
                  recompute=recompute, tick_overhead=tick_overhead,
                  fixed_overhead=0.0, synchronous_ticks=synchronous_ticks,
                  num_cores=num_cores, schedule=schedule,
                  ticks_in_flight=ticks_in_flight)
  gb = _CheckCosts('grad_bytes', grad_bytes)
  if len(gb) != len(pipe.busy):
    raise ValueError(f'grad_bytes has {len(gb)} entries for {len(pipe.busy)} '
                     'stages; give one per stage')
  if fixed_overhead < 0:
    raise ValueError(f'fixed_overhead={fixed_overhead!r} must be >= 0')
  times = [RingAllReduceTime(b, num_replicas, bytes_per_second, latency_s)
           for b in gb]
  backward_end = pipe.forward_time + pipe.backward_time
  last_cell = [0.0] * len(gb)
  for c in pipe.cells:
    if c.phase == 'backward':
      last_cell[c.k] = max(last_cell[c.k], c.end)
  starts, ends = _LinkSchedule([backward_end] * len(gb), times, shared_link)
  _, early_ends = _LinkSchedule(last_cell, times, shared_link)
  pipe = dataclasses.replace(pipe, step_time=backward_end + fixed_overhead)
  return DataParallelResult(
      num_replicas=num_replicas, pipeline=pipe,
      allreduce_times=tuple(times), allreduce_start=tuple(starts),
      allreduce_end=tuple(ends),
      step_time=max([backward_end] + ends) + fixed_overhead,
      overlapped_step_time=max([backward_end] + early_ends) + fixed_overhead)
