"""Every pipeline schedule side by side for one model: step, bubble, memory.

`tools/model_analysis --schedules=all` prints this table. For each schedule
(gpipe, 1f1b, interleaved_1f1b with v=2, zb_h1, zb_v) the model's layers are
cut into S = K v stages of balanced forward FLOPs (`partitioning`, the
report's method), the schedule's table (`schedule_builders.Build`) is
simulated as dataflow with one core per device (`simulator.SimulateSchedule`)
and each device's peak memory found by a walk over the table. Every
row is a schedule TensorPipeLayer trains with. Stated assumptions:

- costs: a stage's forward costs its FLOPs, its full backward twice that,
  split evenly into I and W (t_I = t_W) for the zero-bubble tables; with
  recompute B and I first redo the forward;
- memory per device: the most bytes a training step allocates there
  beyond its weights, optimizer state and inputs (`TableMemory`), from a
  walk over the device's cells in tick order. Per micro-batch, a stage
  s has its input x_s, what its layers' backward keeps of their forward
  internal_s (traced on specs, `saved_activations`: a Transformer block
  keeps many times its output; an untraced layer counts its output), and
  its weight ops' inputs xs_s and outputs dz_s. Held from cell to cell:
    gradient sums      the weights of its stages (from its first B or I)
    saved inputs       x_s of stage s > 0 from F to B or I (GPipe: to the
                       step's end; stage 0 reads the data)
    no recompute       x_s + internal_s from F to B or I (the tapes)
    stash              xs_s + dz_s from I to W (to the end of its run)
    rings              the engine's boundary rings: a stage's last outputs
                       and input gradients (`schedule_program.Ring`)
    GPipe's ends       the last stage's outputs until the backward, then
                       their gradients (all T); stage 0's input gradients
                       (gathered at the end: twice the batch's input)
  and at each cell what it holds while it runs, one cell at a time (a
  cell is a function of its own, `schedule_cells.Cells._Cell`): each its
  largest layer input + output + weight (+ x_s gathered on stage 0 by an
  F cell, and by a B or I cell with recompute), and with recompute:
    I   internal_s + dz_s: the function's outputs, the weight ops'
        inputs (within internal_s: the full backward reads them) and
        their output gradients, leave it together;
    B   the larger of internal_s and dz_s + the stage's weights: at its
        end the output gradients wait for their weight reductions beside
        a second copy of the sums (made beside the function's input,
        `Cells.sums_in_cell`; where the sums are added after the call,
        the weight gradients leaving it together);
  without recompute a B cell nothing more (its tapes are held), an I
  cell dz_s. A W cell's stash entry counts until the end of its run of
  cells (up to a barrier on the device, `schedule_program.LoopBarriers`;
  `_Windows`): its ops run in the loop body, beside any later cell that
  does not wait for it. A steady loop waits after each W cell, so the
  entry is gone before the device's next cell. One stage and one
  micro-batch run without recompute. Measured against TF's
  allocator, one process per setting: tools/benchmark --memory_check
  (one device; two against a bracket).

A schedule that does not apply (v > 1 with more stages than layers, T not a
multiple of K for interleaved, T < 2K - 1 for ZB-V) gets a row that says
why. Pure Python apart from the report's layer sizes and, for memory,
what each layer keeps (traced once on specs: `model_analysis.Report.Saved`);
no TensorFlow op runs.
"""

import dataclasses
import math
from typing import List, NamedTuple, Optional, Sequence, Tuple

from tensorpipe import model_analysis
from tensorpipe import partitioning
from tensorpipe import saved_activations
from tensorpipe import schedule_builders
from tensorpipe import schedule_program
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
  activation_bytes: Tuple[int, ...] = ()   # per device: the step's peak
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
                boundaries: Sequence[Tuple[int, int]], recompute: bool,
                unroll_ticks: int = 2) -> Tuple[List[int], List[int]]:
  """Per device (peak bytes a training step allocates, of it the I-to-W
  stash) of `table` with the report's layers cut at `boundaries` (the
  module docstring's model; unroll_ticks: GPipe's, `TensorPipeLayer`)."""
  a_bytes = model_analysis.DtypeBytes(report.activation_dtype)
  p_bytes = model_analysis.DtypeBytes(report.param_dtype)
  outputs = [r.activation_bytes for r in report.layers]
  inputs = [model_analysis.NumElements(report.input_shapes) * a_bytes
           ] + outputs[:-1]
  layers = [_Layer(x, y, r.num_params * p_bytes, saved) for x, y, r, saved
            in zip(inputs, outputs, report.layers, report.Saved())]
  return _Memory(table, [_StageBytes(layers[start:end],
                                     table.num_micro_batches)
                         for start, end in boundaries],
                 recompute, unroll_ticks)


class _Layer(NamedTuple):
  """One layer's bytes for the whole batch (weights: per step)."""
  x: int
  y: int
  weights: int
  saved: Optional[saved_activations.Saved]  # None: not traced


class _Stage(NamedTuple):
  """One stage's bytes per micro-batch (weights: per step)."""
  x: int          # its input
  out: int        # its output (the last layer's)
  internal: int   # what its backward keeps of its layers' forward
  dz: int         # its weight ops' outputs (their gradients: the stash)
  xs: int         # its weight ops' inputs
  work: int       # the largest layer input + output, + the largest weight
  weights: int    # its weights (their gradient sums)


def _StageBytes(layers: Sequence[_Layer], num_mb: int) -> _Stage:
  """A stage's bytes: what each layer's backward keeps where it was
  traced (its own tensors, and its input or output where read; a
  boundary between two layers once), else one output per layer, and its
  weight ops' inputs and outputs (untraced: a weighted layer's)."""
  mb = lambda b: int(math.ceil(b / num_mb))
  internal = dz = xs = 0
  for j, layer in enumerate(layers):
    saved = layer.saved
    if saved is None:
      internal += mb(layer.y)
      dz += mb(layer.y) if layer.weights else 0
      xs += mb(layer.x) if layer.weights else 0
      continue
    nxt = layers[j + 1].saved if j + 1 < len(layers) else None
    out_kept = saved.output_kept or (j + 1 < len(layers) and (
        nxt is None or nxt.input_kept))
    internal += mb(saved.own_bytes) + (mb(layer.y) if out_kept else 0)
    traced_ops = saved.weight_out_bytes is not None
    dz += mb(saved.weight_out_bytes if traced_ops else
             layer.y if layer.weights else 0)
    xs += mb(saved.weight_in_bytes if traced_ops else
             layer.x if layer.weights else 0)
  return _Stage(
      mb(layers[0].x), mb(layers[-1].y), internal, dz, xs,
      max(mb(l.x) + mb(l.y) for l in layers) + max(
          l.weights for l in layers), sum(l.weights for l in layers))


def _Windows(program: schedule_program.Program,
             unroll_ticks: int) -> List[List[List[int]]]:
  """Per device, the runs of ticks whose cells may overlap (the walk
  frees a W cell's stash entry at the end of its run): one iteration of
  a loop with its cells fixed (the steady loop; a loss-inside table's
  ramps), cut where the device waits for its previous tick
  (`schedule_program.LoopBarriers`); else one tick."""
  table = program.table
  out = [[] for _ in range(table.num_devices)]
  ramps = schedule_program.RampTicksOf(table)
  for loop in schedule_program.Loops(program.branch, 0, table.num_ticks,
                                     unroll_ticks=unroll_ticks,
                                     unroll_ramps=ramps):
    if not loop.steady:
      for d in range(table.num_devices):
        out[d] += [[c] for c in range(loop.first, loop.end)]
      continue
    barriers = schedule_program.LoopBarriers(loop, program.cells)
    for c in range(loop.first, loop.end, len(loop.steady)):
      for d in range(table.num_devices):
        run = []
        for i in range(len(loop.steady)):
          run.append(c + i)
          if barriers[i][d]:
            out[d].append(run)
            run = []
        if run:
          out[d].append(run)
  return out


def _Memory(table: schedules.Schedule, stages: Sequence[_Stage],
            recompute: bool,
            unroll_ticks: int) -> Tuple[List[int], List[int]]:
  """Per device (peak bytes, stash bytes); see the module docstring."""
  if not any(a and a.op in 'BI' for row in table.grid for a in row):
    raise ValueError(f'table {table.name!r} has no backward cell; '
                     'TableMemory models a training step: give the table '
                     'the layer trains with (schedule_builders.Build)')
  inside, num_mb, last = table.loss_inside, table.num_micro_batches, len(
      stages) - 1
  if last == 0 and num_mb == 1:
    recompute = False  # one stage, one micro-batch: nothing is recomputed
  unrolled = inside and not recompute
  program = schedule_program.Compile(table)
  per_tick = [[[c] for c in range(table.num_ticks)]] * table.num_devices
  windows = (per_tick if unrolled else
             _Windows(program, 1 if inside else unroll_ticks))
  device = table.StageDevice()
  peaks, stashes = [], []
  for d, row in enumerate(table.grid):
    mine = [s for s, e in device.items() if e == d]
    first_b = min((c for c, a in enumerate(row) if a and a.op in 'BI'),
                  default=None)
    grads = sum(stages[s].weights for s in mine)
    # The engine's rings: each stage's last outputs and input gradients,
    # in its loop state the whole run.
    rings = 0 if unrolled else sum(
        (stages[s].out * program.out_rings[s].depth
         if program.out_rings[s] else 0) +
        (stages[s].x * program.dx_rings[s].depth
         if recompute and program.dx_rings[s] else 0) for s in mine)
    held = {}  # what outlives its cell: (kind, stage, micro-batch) -> bytes
    peak = stash = 0
    for window in windows[d]:
      freed_at_end = []  # W cells' stash entries: freed when the run ends
      for c in window:
        a = row[c]
        if a is None:
          continue
        st, key = stages[a.stage], (a.stage, a.micro_batch)
        x0 = st.x if a.stage == 0 else 0   # stage 0 gathers its input
        after = []
        if a.op == 'F':
          if not recompute:
            held[('act',) + key] = st.x + st.internal
          elif a.stage > 0:
            held[('slot',) + key] = st.x
          if not inside and a.stage == last:
            held[('out',) + key] = st.out
          cell = st.work + x0
        elif a.op in 'BI':
          if not inside and a.stage == last:
            held = {k: v for k, v in held.items() if k[0] != 'out'}
            held[('dys', 0, 0)] = st.out * num_mb
          if a.op == 'I':
            cell = st.dz + (st.internal + x0 if recompute else 0)
          elif recompute:
            cell = max(st.internal, st.dz + st.weights) + x0
          else:
            cell = 0
          cell += st.work
          after = [(('act',) + key, 0)] + (
              [(('slot',) + key, 0)] if inside else [])
          if a.op == 'I':
            after.append((('stash',) + key, st.xs + st.dz))
          if not inside and a.stage == 0:
            after.append((('dx',) + key, st.x))
        else:  # W
          cell = st.work
          freed_at_end.append((('stash',) + key, 0))
        in_b = inside or (first_b is not None and c >= first_b)
        peak = max(peak, sum(held.values()) + cell + rings +
                   (grads if in_b else 0))
        for k, size in after:  # size 0: freed
          held[k] = size
        stash = max(stash, sum(v for k, v in held.items()
                               if k[0] == 'stash'))
      for k, size in freed_at_end:
        held[k] = size
    if not inside and 0 in mine:
      # The end: stage 0's input gradients (held per micro-batch) gathered
      # from their array, beside the saved inputs.
      peak = max(peak, grads + rings + sum(
          v for k, v in held.items() if k[0] != 'dys') + stages[0].x * num_mb)
    peaks.append(peak)
    stashes.append(stash)
  return peaks, stashes


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
            'step peak (max device)', 'of it stash']
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
