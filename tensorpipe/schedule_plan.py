"""Every pipeline schedule side by side for one model: step, bubble, memory.

`tools/model_analysis --schedules=all` prints this table. For each schedule
(gpipe, 1f1b, interleaved_1f1b with v=2, zb_h1, zb_v) the model's layers are
cut into S = K v stages of balanced forward FLOPs (`partitioning`, the
report's method), the schedule's table (`schedule_builders.Build`) is
simulated as dataflow with one core per device (`simulator.SimulateSchedule`)
and each device's activation memory is read off the table's slots. Every
row is a schedule TensorPipeLayer trains with. Stated assumptions:

- costs: a stage's forward costs its FLOPs, its full backward twice that,
  split evenly into I and W (t_I = t_W) for the zero-bubble tables; with
  recompute B and I first redo the forward;
- memory per device, per micro-batch sizes of its stages s:
    recompute:     sum_s slots_s x input_s + max_s internal_s
                   + sum_s stash_s x internal_s
    no recompute:  sum_s slots_s x (input_s + internal_s)
                   + sum_s stash_s x internal_s
  where slots_s (`Schedule.NumSlots`) counts the boundary inputs stage s
  keeps, stash_s (`Schedule.StashSlots`) its I-to-W pairs, input_s its
  input and internal_s its layers' outputs; the stash of one micro-batch is
  taken as the stage's layer outputs (the weight ops' inputs and output
  gradients), at layer granularity like `model_analysis`.

A schedule that does not apply (v > 1 with more stages than layers, T not a
multiple of K for interleaved, T < 2K - 1 for ZB-V) gets a row that says
why. Pure Python apart from the report's layer sizes; no TensorFlow op.
"""

import dataclasses
import math
from typing import List, Sequence, Tuple

from tensorpipe import model_analysis
from tensorpipe import partitioning
from tensorpipe import schedule_builders
from tensorpipe import schedules
from tensorpipe import simulator

# (schedule, stages per device) compared by default.
ALL: Tuple[Tuple[str, int], ...] = (('gpipe', 1), ('1f1b', 1),
                                    ('interleaved_1f1b', 2), ('zb_h1', 1),
                                    ('zb_v', 2))


@dataclasses.dataclass(frozen=True)
class ScheduleRow:
  """One schedule's prediction; `refused` says why it does not apply."""
  name: str
  num_stages_per_device: int
  step: float = 0.0                 # seconds (FLOPs / device_flops)
  ratio_to_1f1b: float = 0.0        # step / 1F1B's step
  bubble: float = 0.0               # mean idle share of the devices
  activation_bytes: Tuple[int, ...] = ()   # per device
  stash_bytes: Tuple[int, ...] = ()        # per device, I-to-W pairs
  refused: str = ''


def CompareSchedules(report: model_analysis.Report,
                     which: Sequence[Tuple[str, int]] = ALL,
                     recompute: bool = True,
                     device_flops: float = 1e12) -> List[ScheduleRow]:
  """Predicts each schedule in `which` for the model of `report`.

  Args:
    report: `model_analysis.AnalyzeLayers`' report (K, T, layers, dtypes).
    which: (schedule name, stages per device) pairs.
    recompute: whether B and I cells recompute the stage's forward.
    device_flops: FLOP/s of one device, to turn FLOPs into seconds.

  Returns:
    One `ScheduleRow` per entry of `which`, in order.
  """
  kk, tt = report.num_partitions, report.num_micro_batches
  flops = [r.flops for r in report.layers]
  rows = []
  for name, v in which:
    if kk * v > len(flops):
      rows.append(ScheduleRow(name, v, refused=(
          f'K*v = {kk * v} stages need at least {kk * v} layers, the model '
          f'has {len(flops)}')))
      continue
    try:
      table = schedule_builders.Build(name, kk, tt, v)
    except ValueError as e:
      rows.append(ScheduleRow(name, v, refused=str(e)))
      continue
    plan = partitioning.Partition(flops, kk * v, method=report.method)
    f = [c / device_flops for c in plan.partition_costs]
    res = simulator.SimulateSchedule(table, f, [2 * x for x in f],
                                     recompute=recompute)
    act, stash = TableMemory(report, table, plan.boundaries, recompute)
    rows.append(ScheduleRow(name, v, step=res.step_time,
                            bubble=res.bubble_fraction,
                            activation_bytes=tuple(act),
                            stash_bytes=tuple(stash)))
  base = next((r.step for r in rows if r.name == '1f1b' and not r.refused),
              None)
  if base:
    rows = [dataclasses.replace(r, ratio_to_1f1b=r.step / base)
            if not r.refused else r for r in rows]
  return rows


def TableMemory(report: model_analysis.Report, table: schedules.Schedule,
                boundaries: Sequence[Tuple[int, int]],
                recompute: bool) -> Tuple[List[int], List[int]]:
  """Per device (activation bytes, stash bytes) of `table` with the
  report's layers cut at `boundaries` (the module docstring's model)."""
  a_bytes = model_analysis.DtypeBytes(report.activation_dtype)
  inputs = [model_analysis.NumElements(report.input_shapes) * a_bytes] + [
      r.activation_bytes for r in report.layers]
  return _Memory(table, boundaries, inputs,
                 [r.activation_bytes for r in report.layers],
                 table.num_micro_batches, recompute)


def _Memory(table: schedules.Schedule, boundaries, inputs: List[int],
            outputs: List[int], num_mb: int,
            recompute: bool) -> Tuple[List[int], List[int]]:
  """Per device (activation bytes, stash bytes); see the module docstring."""
  slots, stash = table.NumSlots(), table.StashSlots()
  device = table.StageDevice()
  act = [0] * table.num_devices
  peak = [0] * table.num_devices
  held = [0] * table.num_devices
  for s, (start, end) in enumerate(boundaries):
    d = device[s]
    x = int(math.ceil(inputs[start] / num_mb))
    internal = int(math.ceil(sum(outputs[start:end]) / num_mb))
    act[d] += slots[s] * (x if recompute else x + internal)
    peak[d] = max(peak[d], internal)
    held[d] += stash[s] * internal
  if recompute:
    act = [a + p for a, p in zip(act, peak)]
  return [a + h for a, h in zip(act, held)], held


def FormatTime(seconds: float) -> str:
  for scale, unit in ((1.0, 's'), (1e-3, 'ms'), (1e-6, 'us')):
    if seconds >= scale:
      return f'{seconds / scale:.3g} {unit}'
  return f'{seconds / 1e-9:.3g} ns'


def CompareText(rows: Sequence[ScheduleRow], num_partitions: int,
                num_micro_batches: int, recompute: bool) -> str:
  """The printed table of `CompareSchedules`' rows."""
  lines = [f'Schedules side by side (K={num_partitions}, '
           f'T={num_micro_batches}, {"" if recompute else "no "}recompute; '
           'simulated as dataflow, t_F : t_I : t_W = 1 : 1 : 1)']
  header = ['schedule', 'v', 'step', 'vs 1F1B', 'bubble',
            'act. peak (max device)', 'of it stash']
  table = []
  for r in rows:
    if r.refused:
      table.append([r.name, str(r.num_stages_per_device), '-', '-', '-',
                    '-', f'n/a: {r.refused}'])
      continue
    top = max(range(len(r.activation_bytes)),
              key=lambda d: r.activation_bytes[d])
    table.append([r.name, str(r.num_stages_per_device),
                  FormatTime(r.step),
                  f'{r.ratio_to_1f1b:.3f}' if r.ratio_to_1f1b else '-',
                  f'{100 * r.bubble:.1f}%',
                  model_analysis.FormatBytes(r.activation_bytes[top]),
                  model_analysis.FormatBytes(r.stash_bytes[top])])
  lines += model_analysis.FormatTable(header, table,
                                      right={1, 2, 3, 4, 5, 6})
  lines.append('Every schedule here trains in TensorPipeLayer '
               "(schedule='<name>', num_stages_per_device=v); the figures are "
               'what its table predicts, not a measurement.')
  return '\n'.join(lines)
