"""R data-parallel replicas x K pipeline stages: step time and throughput.

Every replica runs the same K-stage pipeline on its own devices
(`simulator.SimulateSchedule`); then stage k's weight gradients are ring
all-reduced among the R copies of stage k (`RingAllReduceTime`: 2 (R - 1) /
R x bytes / bandwidth + 2 (R - 1) latencies). `SimulateDataParallel` gives
one step of R x K from a schedule table and per-stage costs in seconds;
`PlanScaleOut` turns a `model_analysis.Report` (FLOPs and gradient bytes
per partition) and assumed hardware (`ScaleOutAssumptions`) into seconds
and compares several R (tools/model_analysis --replicas).

Usage:
  report = model_analysis.AnalyzeLayers(layers, [[64, 224, 224, 3]],
                                        num_partitions=4, num_micro_batches=16)
  plan = PlanScaleOut(report, [2, 4], ScaleOutAssumptions(
      device_flops=50e12, link_bytes_per_s=12.5e9))
  print(plan.ToText())
"""

import dataclasses
from typing import Any, List, Optional, Sequence, Tuple

from tensorpipe import checks
from tensorpipe import model_analysis
from tensorpipe import schedule_builders
from tensorpipe import schedules
from tensorpipe import simulator


# The simulated cells after which a stage's weight gradients exist: B, or
# W with the I/W split (an I cell makes only the input gradient).
_WEIGHT_GRAD_PHASES = ('backward', 'weight_grad')


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
  checks.CheckPositiveInts('', num_replicas=num_replicas)
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
  pipeline: simulator.SimResult
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


def SimulateDataParallel(table: schedules.Schedule,
                         forward_costs: Sequence[float],
                         backward_costs: Sequence[float],
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
                         ticks_in_flight: int = 1) -> DataParallelResult:
  """Simulates one step of R data-parallel replicas of a K-stage pipeline.

  Every replica runs the same pipeline (`SimulateSchedule`) on its own
  devices; then stage k's weight gradients (grad_bytes[k]) are ring
  all-reduced among the R copies of stage k. By default each stage has its
  own link (stage k of every replica on its own accelerator with its own
  NIC), so the K all-reduces run concurrently and the step waits for the
  slowest; `shared_link` puts them on one link per replica instead.

  The all-reduces start after the whole backward pass, not overlapped with
  it: TensorPipeLayer's backward sums each stage's weight gradients over
  the whole pass (in one process the state of one tf.while_loop), and the
  strategy all-reduces what the pass returns.
  `overlapped_step_time` gives the bound for an implementation that would
  start stage k's all-reduce at the end of its last cell that makes weight
  gradients, a B cell or, with the I/W split, a W cell (stage K - 1
  finishes first: its cell for micro-batch 0 runs K - 1 ticks before stage
  0's).

    pipe = simulator.SimulateSchedule(table, forward_costs, backward_costs, ...)
    A_k = RingAllReduceTime(grad_bytes[k], R, bandwidth, latency)
    step = pipe.backward_end + max_k A_k + fixed_overhead  (own links)
         = pipe.backward_end + sum_k A_k + fixed_overhead  (shared link)

  Args:
    table, forward_costs, backward_costs, recompute, tick_overhead,
      num_cores, ticks_in_flight: as in `SimulateSchedule`, in seconds.
    synchronous_ticks: as there, but True by default (the loop's barrier).
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
  pipe = simulator.SimulateSchedule(table, forward_costs, backward_costs,
                          recompute=recompute, tick_overhead=tick_overhead,
                          fixed_overhead=0.0,
                          synchronous_ticks=synchronous_ticks,
                          num_cores=num_cores,
                          ticks_in_flight=ticks_in_flight)
  gb = simulator.CheckCosts('grad_bytes', grad_bytes)
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
    if c.phase in _WEIGHT_GRAD_PHASES:
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


@dataclasses.dataclass(frozen=True)
class ScaleOutAssumptions:
  """Hardware assumed by `PlanScaleOut` (the model analysis has only FLOPs
  and bytes; these turn them into seconds).

  Attributes:
    device_flops: FLOP/s each stage device achieves (not its peak).
    link_bytes_per_s: bandwidth of each stage's link between replicas.
    link_latency_s: per-message latency of the ring all-reduce.
    shared_link: whether a replica's K stages share one link (else each
      stage's all-reduce has its own link and they run concurrently).
    recompute: whether the backward recomputes the forward (GPipe's
      re-materialisation; TensorPipeLayer's default).
    backward_flops_ratio: backward FLOPs / forward FLOPs (2: the gradients
      with respect to the inputs and to the weights each cost one forward).
  """
  device_flops: float
  link_bytes_per_s: float
  link_latency_s: float = 0.0
  shared_link: bool = False
  recompute: bool = True
  backward_flops_ratio: float = 2.0

  def __post_init__(self):
    for name in ('device_flops', 'link_bytes_per_s', 'backward_flops_ratio'):
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise ValueError(f'{name}={v!r} must be a number > 0')
    if self.link_latency_s < 0:
      raise ValueError(f'link_latency_s={self.link_latency_s!r} must be >= 0')


@dataclasses.dataclass(frozen=True)
class ScaleOutPlan:
  """Step time and throughput of R x K for several R (`PlanScaleOut`).

  Attributes:
    report: the model's analysis (K, T, per-replica batch, stage costs).
    assumptions: the hardware assumed.
    results: (R, DataParallelResult) for each R, R = 1 first.
  """
  report: model_analysis.Report
  assumptions: ScaleOutAssumptions
  results: Tuple[Tuple[int, Any], ...]

  def ToText(self) -> str:
    """The per-stage all-reduce table and the R x K table."""
    rep, a = self.report, self.assumptions
    k, t = rep.num_partitions, rep.num_micro_batches
    base = dict(self.results)[1]
    lines = [
        f'Scale-out plan: R replicas x K={k} stages, {rep.batch_size} '
        f'examples per replica in T={t} micro-batches; assumed '
        f'{a.device_flops / 1e12:.4g} TFLOP/s achieved per device, '
        f'{a.link_bytes_per_s * 8 / 1e9:.4g} Gb/s per '
        + ('replica (one link shared by its stages)' if a.shared_link else
           'stage link') + f', {a.link_latency_s * 1e6:.4g} us latency; '
        f'backward = {a.backward_flops_ratio:g} x forward FLOPs, recompute '
        + ('on' if a.recompute else 'off'), '']
    rs = [r for r, _ in self.results if r > 1]
    header = ['k', 'FLOPs / micro-batch', 'forward ms', 'backward ms',
              'gradient B'] + [f'all-reduce R={r} ms' for r in rs]
    rows = []
    for p in rep.partitions:
      fwd = p.flops / t / a.device_flops
      bwd = fwd * (a.backward_flops_ratio + (1 if a.recompute else 0))
      rows.append([str(p.index), model_analysis.FormatFlops(p.flops / t),
                   _Ms(fwd), _Ms(bwd),
                   model_analysis.FormatBytes(p.grad_bytes)] + [
                       _Ms(dict(self.results)[r].allreduce_times[p.index])
                       for r in rs])
    lines.append('Per stage (backward includes the recomputed forward; ring '
                 'all-reduce 2 (R-1)/R x gradient bytes / bandwidth)')
    lines += model_analysis.FormatTable(header, rows,
                                        right=set(range(1, len(header))))
    lines.append('')
    header = ['R x K', 'devices', 'global batch', 'pipeline ms', 'bubble',
              'all-reduce ms', 'step ms', 'overlapped ms', 'examples/s',
              'speed-up', 'efficiency']
    rows = []
    base_tput = base.Throughput(rep.batch_size)
    for r, res in self.results:
      tput = res.Throughput(rep.batch_size)
      rows.append([f'{r} x {k}', str(r * k), str(r * rep.batch_size),
                   _Ms(res.pipeline.step_time),
                   f'{100 * res.pipeline.bubble_fraction:.1f}%',
                   _Ms(res.exposed_allreduce_time), _Ms(res.step_time),
                   _Ms(res.overlapped_step_time), _Number(tput),
                   f'{tput / base_tput:.2f}x',
                   f'{100 * tput / (r * base_tput):.1f}%'])
    lines += model_analysis.FormatTable(header, rows,
                                        right=set(range(1, len(header))))
    lines += [
        'all-reduce ms = step time the all-reduces add after the backward. '
        'TensorPipe does not overlap them with the backward: its backward is '
        'one tf.while_loop whose weight-gradient sums leave the loop only '
        'when it ends. overlapped ms = the step if stage k could start its '
        "all-reduce when its last backward cell ends. Not modelled: "
        'activation transfers between stages, the weight update, input '
        'pipeline and per-tick overheads (measure them with tools/benchmark).']
    return '\n'.join(lines)


def _Ms(seconds: float) -> str:
  return _Number(seconds * 1e3)


def _Number(v: float) -> str:
  """3 significant digits, or whole numbers with separators from 100 up."""
  return f'{v:,.0f}' if v >= 100 else f'{v:.3g}'


def PlanScaleOut(report: model_analysis.Report, num_replicas: Sequence[int],
                 assumptions: ScaleOutAssumptions) -> ScaleOutPlan:
  """Predicts R x K step time and throughput from an analysis report.

  Each replica runs the report's K-partition pipeline on its own devices:
  partition k costs f_k = FLOPs_k / T / device_flops per micro-batch forward
  and backward_flops_ratio x f_k backward (+ f_k recomputed), simulated with
  `SimulateDataParallel`; stage k's gradients (the report's grad
  bytes) are then ring all-reduced among its R copies.

  Args:
    report: from model_analysis.AnalyzeLayers (per replica: batch_size is
      the per-replica mini-batch).
    num_replicas: the R values to compare; R = 1 is added as the baseline.
    assumptions: the hardware.

  Returns:
    A ScaleOutPlan.

  Raises:
    ValueError: an R < 1.
  """
  for r in num_replicas:
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
      raise ValueError(f'num_replicas={list(num_replicas)!r}: every R must '
                       'be a positive int')
  rs = sorted({1, *num_replicas})
  t = report.num_micro_batches
  fwd = [p.flops / t / assumptions.device_flops for p in report.partitions]
  bwd = [f * assumptions.backward_flops_ratio for f in fwd]
  # What is all-reduced: one gradient per weight (a pairwise sum's extra
  # buffers are collapsed first).
  grads = [p.param_bytes for p in report.partitions]
  table = schedule_builders.Build('gpipe', len(fwd), t)
  results = tuple(
      (r, SimulateDataParallel(
          table, fwd, bwd, grads, r, assumptions.link_bytes_per_s,
          latency_s=assumptions.link_latency_s,
          shared_link=assumptions.shared_link,
          recompute=assumptions.recompute)) for r in rs)
  return ScaleOutPlan(report=report, assumptions=assumptions, results=results)
