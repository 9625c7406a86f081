"""A compiled schedule without recompute: its table unrolled in Python.

Nothing public in TensorFlow carries a stage's autodiff state from one
tf.while_loop iteration to a later one, so without recompute the table is
not a loop (schedule_engine.Run) but one stage call per cell in the graph:
each forward cell under its own GradientTape, its backward (or I) cell
taking that tape's gradient. The graph holds 2 S T stage calls (3 with I
and W), so it grows with T; `UNROLLED_CELLS_WARNING` says where tracing
gets slow. The cells are the cell algebra (cell_algebra:
`TapedCall`, `Vjp`, `WeightGrads`), as in the engine's loops.
"""

from absl import logging
import tensorflow as tf

from tensorpipe import cell_algebra
from tensorpipe import pipeline_stage
from tensorpipe import timeline

# Past this many stage calls, tracing takes long enough to warn.
UNROLLED_CELLS_WARNING = 256


class _Cells:
  """The unrolled table's cells and what each leaves for a later one.

  Each cell method runs one cell on device d's tick and returns (its
  timeline row, the tensors the device's next cell waits for).
  """

  def __init__(self, call, program, end):
    stages, thetas, specs = call.stages, call.thetas, call.specs
    mb_size = call.mb_size
    self.stages, self.thetas, self.specs = stages, thetas, specs
    self.flat_stacked, self.end, self.mb_size = call.flat_stacked, end, mb_size
    self.probe = timeline.ActiveProbe()
    self.outs, self.dxs_of, self.pending, self.stashed = {}, {}, {}, {}
    self.dthetas = [[tf.zeros_like(w) for w in tf.nest.flatten(th)]
                    for th in thetas]
    self.split = {(a.micro_batch, a.stage) for row in program.table.grid
                  for a in row if a and a.op == 'I'}
    self.weight_ops = {s: cell_algebra.TraceWeightOps(
        stages[s], specs[s], thetas[s], mb_size)
                       for s in {st for _, st in self.split}}
    self.stats = [[cell_algebra.Zeros(ss) for ss in spec.StatsSpecs()]
                  for spec in specs]
    self.sums = cell_algebra.Zeros(end.loss_specs)

  def Forward(self, s, t, m):
    """F: the stage call of micro-batch t under a tape kept for its B."""
    probe, spec = self.probe, self.specs[s]
    last = s == len(self.stages) - 1
    x = ([tf.gather(v, t) for v in self.flat_stacked] if s == 0 else
         self.outs.pop((t, s - 1)))
    start = probe.Stamp(x)
    # A split backward (I, W) watches no weight op's weight (I builds no
    # dw kernel; W takes each op's dw itself).
    split = (m, s) in self.split
    watched = cell_algebra.Watched(
        len(tf.nest.flatten(self.thetas[s])), self.weight_ops.get(s, []),
        split)
    losses = []

    def LossHead(y, unused_dys):
      l, metrics = self.end.loss_of(y, t)
      losses.append([l] + metrics)
      return [l / self.end.normalizer], None
    # Stage 0's inputs are data: no gradient for them.
    cell = cell_algebra.TapedCall(
        self.stages[s], spec, self.thetas[s], x, t, self.mb_size,
        watch_inputs=s > 0, watched=watched, split=split,
        head=LossHead if last else cell_algebra.FloatOutputs(spec),
        dys=None, deps=start)
    if last:
      self.sums = [u + v for u, v in zip(self.sums, losses[-1])]
    else:
      self.outs[(t, s)] = cell.outputs
    self.stats[s] = cell_algebra.Add(self.stats[s], cell.stats)
    self.pending[(t, s)] = (cell, watched)
    end = probe.Stamp([cell.outputs, cell.stats])
    # (With the timeline on, the next cell's start follows this end.) The
    # last stage's next cell also waits for the loss: nothing else reads it
    # before the step's end, and an executor free to run it late kept every
    # micro-batch's outputs alive until then (dense32mem, 1F1B, K=1, T=8,
    # one inter-op thread: 43.8 MiB against 39.6 with the wait).
    loss = list(self.sums) if last else []
    return (start + probe.Missing(1) + end,
            cell.outputs + tf.nest.flatten(cell.stats) + loss + end)

  def WeightGrad(self, s, t):
    """W: each weight op's dw from the (x, dz) its I cell kept."""
    xs, dzs = self.stashed.pop((t, s))
    start = self.probe.Stamp(dzs)
    with tf.control_dependencies(start):
      self.dthetas[s] = cell_algebra.WeightGrads(
          self.weight_ops[s], self.thetas[s], xs, dzs, self.dthetas[s])
    end = self.probe.Stamp(self.dthetas[s])
    return start + self.probe.Missing(1) + end, self.dthetas[s] + end

  def Backward(self, s, t, op):
    """B (or I: no weight op's dw; each op's (x, dz) kept for W): the
    gradient of the tape its F cell kept."""
    cell, watched = self.pending.pop((t, s))
    theta_flat = tf.nest.flatten(self.thetas[s])
    zs = [call.z for call in cell.calls] if op == 'I' else []
    dy = (None if s == len(self.stages) - 1 else
          self.dxs_of.pop((t, s + 1)))
    start = self.probe.Stamp(cell.ys + (dy or []))
    with tf.control_dependencies(start):
      dxs, dzs, dws = cell_algebra.Vjp(
          cell.tape, cell.ys, (cell.xs, zs, [theta_flat[i] for i in watched]),
          dy)
    self.dthetas[s] = cell_algebra.AccumulateAt(self.dthetas[s], watched,
                                                dws)
    if op == 'I':
      self.stashed[(t, s)] = ([call.x for call in cell.calls], list(dzs))
    if s > 0:
      self.dxs_of[(t, s)] = list(dxs)
    # A backward row without a recompute is (start, -1, end).
    end = self.probe.Stamp([dxs, self.dthetas[s]])
    return (start + self.probe.Missing(1) + end,
            list(dxs) + self.dthetas[s] + end)


def Run(call: pipeline_stage.PipelineCall, program,
        end) -> cell_algebra.Sums:
  """A compiled schedule without recompute: the table unrolled in Python.

  Each forward cell runs under its own GradientTape, built when the step is
  traced; its backward cell, traced later in table order, takes that
  tape's gradient, so the forward cell's intermediate tensors stay alive
  exactly from the forward to the backward cell (1F1B: at most
  min(K - k, T) micro-batches of activations on device k). A control
  dependency on the previous cell of the same device makes each device run
  its cells in the table's order (the dataflow alone would let every
  forward run first, as in GPipe). The graph holds 2 S T stage calls, so it
  grows with T (the loop's does not, in one process). end: the
  `schedule_ends.LossInside` of the call.
  """
  num_s, num_d = len(call.stages), program.num_devices
  devices = call.devices
  num_mb = program.table.num_micro_batches
  if 2 * num_s * num_mb > UNROLLED_CELLS_WARNING:
    logging.warning(
        'Schedule %r without recompute unrolls its table: S=%d stages x '
        'T=%d gives %d stage calls in the graph (more than %d), which makes '
        'tracing slow; use recompute=True (a loop whose graph does not grow '
        'with T) or fewer micro-batches', program.table.name, num_s, num_mb,
        2 * num_s * num_mb, UNROLLED_CELLS_WARNING)
  cells = _Cells(call, program, end)
  probe = cells.probe
  previous = [[] for _ in range(num_d)]  # per device: its last cell's results
  rows = [[] for _ in range(num_d)]      # per device: timeline rows
  for c in range(program.num_ticks):
    for d in range(num_d):
      a = program.table.grid[d][c]
      if a is None:
        rows[d].append(probe.Missing(3))
        continue
      s, t = a.stage, program.real[a.micro_batch]
      with tf.device(devices[d]), tf.control_dependencies(previous[d]):
        if a.op == 'F':
          row, previous[d] = cells.Forward(s, t, a.micro_batch)
        elif a.op == 'W':
          row, previous[d] = cells.WeightGrad(s, t)
        else:
          row, previous[d] = cells.Backward(s, t, a.op)
      rows[d].append(row)
  assert not (cells.outs or cells.dxs_of or cells.pending or cells.stashed), (
      cells.outs, cells.dxs_of, cells.pending)
  if probe.recording:
    for d in range(num_d):
      with tf.device(devices[d]):
        probe.Add('table', d, num_d, num_mb, tf.stack([
            tf.stack(row) for row in rows[d]]), table=program.table)
  return cell_algebra.Sums(cells.sums, cells.dthetas, cells.stats)
