"""The schedule engine: runs any compiled schedule table as tf.while_loops.

One engine for every schedule whose loss is inside the pipeline (1F1B,
interleaved 1F1B, a table read from CSV): `schedule_program.Compile` turns
the table into constant per-device tables and a loop plan, and `Run` builds
the loops from them. Each device keeps its own copy of the clock and reads
its cell of tick c (branch, micro-batch, boundary slot, ring entry) from
tables on its own device; no clock or index crosses devices on a tick.
Pseudo-code (recompute on):

  x[t] = micro-batch t of the inputs                       # [T, N/T, ...]
  for c in range(ticks):                                    # tf.while_loop
    for d in range(K):                                      # concurrently
      op, s, t = cell of device d on tick c                 # the table
      if op == F:
        in = x[t] if s == 0 else ring_out[s - 1][read]      # stage s - 1's
        slot[s][slot(c)] = in                               # s > 0
        ring_out[s][write], stats_s += F_s(theta_s, in)
        if s == S - 1: loss, metrics += loss_fn(out, targets[t])
      elif op == B:                                         # recompute + vjp
        in = x[t] if s == 0 else slot[s][slot(c)]
        dy = d(loss_fn / normalizer) if s == S - 1 else ring_dx[s + 1][read]
        ring_dx[s][write], dtheta_s += vjp(F_s, in, dy)
  moving stats of batch norm <- stats summed over all micro-batches

Rings of depth 1 are one latched tensor per boundary (GPipe's and 1F1B's
case); deeper rings (interleaved 1F1B) are TensorArrays in the producer's
loop state, read on the producer's device and sent to the consumer. Ticks
on which every device works in a repeating pattern run as a loop whose
cells are fixed in the graph (no tf.switch_case); the others switch on the
table (`schedule_program`). Two ticks may be in flight in a switching loop
(`PARALLEL_ITERATIONS`: cells of different cost on neighbouring devices
overlap as their data allow, rather than each tick waiting for its slowest
cell); the steady loop runs a whole period per iteration, one in flight.

Without recompute nothing public in TensorFlow carries a stage's autodiff
state across tf.while_loop iterations, so `RunUnrolled` unrolls the table
in Python: each forward cell under its own GradientTape, its backward cell
taking that tape's gradient (2 S T stage calls in the graph).
"""

from typing import Any, Callable, List, NamedTuple, Sequence, Tuple

from absl import logging
import tensorflow as tf

from tensorpipe import pipeline_stage
from tensorpipe import schedule_program
from tensorpipe import timeline

# Ticks in flight in a switching loop. 1 makes the loop tick-synchronous: a
# tick lasts as long as its slowest cell, and in 1F1B's steady state every
# tick has a backward cell on some device, so F-ticks would cost as much as
# B-ticks. With 2, a device may start its next tick's cell while a
# neighbour finishes the current one, while the loop still bounds how far a
# device runs ahead (and the boundary activations in flight). One run, 8
# dense 512x512 tanh layers, batch 256, K=4, T=8, one thread per device (2
# shared cores): step time / GPipe's with recompute = 1.50 (1 tick in
# flight), 0.86 (2), 1.07 (3), 1.37 (8).
PARALLEL_ITERATIONS = 2
# The steady loop runs a period (1F1B: two ticks) per iteration: one
# iteration in flight keeps the same ticks in flight. 1F1B conv16 / dense16,
# K=2, T=32 and K=4, T=8: 1 and 2 iterations within noise of each other.
STEADY_PARALLEL_ITERATIONS = 1
# Without recompute the table is unrolled: 2 S T stage calls in the graph.
# Past this many, tracing takes long enough to warn.
UNROLLED_CELLS_WARNING = 256

# loss_of(last stage's flat outputs, t) -> (loss sum, flat metric sums).
LossOf = Callable[[List[tf.Tensor], Any], Tuple[tf.Tensor, List[tf.Tensor]]]


class Sums(NamedTuple):
  """What a run returns: summed over micro-batches, per stage."""
  loss: List[tf.Tensor]                 # [loss sum, metric value, weight, ..]
  dthetas: List[List[tf.Tensor]]        # per stage, flat weight gradients
  stats: List[List[List[tf.Tensor]]]    # per stage and batch-norm layer


class _State(NamedTuple):
  """One stage's loop state; fields it does not need are []."""
  out: List[Any]                # its outputs to stage s + 1: tensors, or
  #                               TensorArrays when the ring is deeper than 1
  dx: List[Any]                 # its input gradients to stage s - 1, same
  slots: List[tf.TensorArray]   # saved boundary inputs (s > 0)
  stats: List[List[tf.Tensor]]  # batch-norm statistics summed so far
  dtheta: List[tf.Tensor]       # flat weight gradients summed so far
  loss: List[tf.Tensor]         # s = S - 1: [loss sum, metric sums...]


def _Zeros(specs) -> List[tf.Tensor]:
  return [tf.zeros(s.shape, s.dtype) for s in specs]


def _Ring(ring, specs) -> List[Any]:
  """A ring's initial state: zeros, or TensorArrays of zeros."""
  if ring.depth == 1:
    return _Zeros(specs)
  return [tf.TensorArray(s.dtype, size=ring.depth, element_shape=s.shape)
          .unstack(tf.zeros([ring.depth] + s.shape.as_list(), s.dtype))
          for s in specs]


def _Write(ring, buffers, index, values) -> List[Any]:
  if ring.depth == 1:
    return list(values)
  return [ta.write(index, v) for ta, v in zip(buffers, values)]


def Run(stages: Sequence[pipeline_stage.Stage], thetas: List[List[Any]],
        specs: Sequence[pipeline_stage.StageSpecs],
        program: schedule_program.Program, flat_stacked: List[tf.Tensor],
        loss_of: LossOf, loss_specs: List[tf.TensorSpec],
        normalizer: tf.Tensor, mb_size: int, acc: Any,
        devices: Sequence[str]) -> Sums:
  """One step of a compiled schedule: loss sums and weight gradients.

  Args:
    stages: the S stages (stage s on devices[program.stage_device[s]]).
    thetas: per stage, its weights (a list per layer) as tensors.
    specs: per stage, its `pipeline_stage.StageSpecs`.
    program: `schedule_program.Compile` of the schedule.
    flat_stacked: the flat inputs split into micro-batches, [T, N/T, ...].
    loss_of: see `LossOf`; runs on the last stage's device.
    loss_specs: specs of [loss sum, metric value, weight, ...].
    normalizer: divides the loss whose gradient the backward cells take.
    mb_size: N / T.
    acc: the `grad_sum.GradSum` that sums the weight gradients.
    devices: the K devices.

  Returns:
    `Sums`.
  """
  num_s, num_d = len(stages), program.num_devices
  probe = timeline.ActiveProbe()
  dev_of = program.stage_device
  on_device = [[s for s in range(num_s) if dev_of[s] == d]
               for d in range(num_d)]

  def Forward(s, state, x_in, t, slot, w):
    """Stage s's forward cell of micro-batch t; (state, stamps)."""
    stage, spec = stages[s], specs[s]
    if s == 0:
      x = [tf.gather(v, t) for v in flat_stacked]
      slots = []
    else:
      x = list(x_in)
      slots = [ta.write(slot, v) for ta, v in zip(state.slots, x)]
    start = probe.Stamp(x)
    with tf.control_dependencies(start):
      y, stats = stage.FlatCall(spec.in_struct, thetas[s], x, t, mb_size)
      stats = tf.nest.map_structure(lambda a, b: a + b, state.stats, stats)
      out, loss = state.out, state.loss
      if s == num_s - 1:
        l, m = loss_of(y, t)
        loss = [a + b for a, b in zip(state.loss, [l] + m)]
      else:
        out = _Write(program.out_rings[s], state.out, w, y)
    # A forward row of the timeline is (start, -1, end).
    stamps = start + probe.Missing(1) + probe.Stamp([y, stats, loss])
    return state._replace(out=out, slots=slots, stats=stats,
                          loss=loss), stamps

  def Backward(s, state, dy_in, t, slot, w):
    """Stage s's recompute + vjp of micro-batch t; (state, stamps)."""
    stage, spec = stages[s], specs[s]
    theta_flat = tf.nest.flatten(thetas[s])
    if s == 0:
      x = [tf.gather(v, t) for v in flat_stacked]
    else:
      x = [ta.read(slot) for ta in state.slots]
    start = probe.Stamp(x + list(dy_in))
    with tf.GradientTape(watch_accessed_variables=False) as tape, \
        tf.control_dependencies(start):
      # Stage 0's inputs are data: no gradient is computed for them.
      xs = [x[i] for i in spec.float_in] if s > 0 else []
      tape.watch(xs)
      tape.watch(theta_flat)
      th = tf.nest.pack_sequence_as(thetas[s], theta_flat)
      y, _ = stage.FlatCall(spec.in_struct, th, list(x), t, mb_size)
      if s == num_s - 1:
        l, _ = loss_of(y, t)
        ys, dy = [l / normalizer], None
      else:
        ys, dy = [y[i] for i in spec.float_out], list(dy_in)
    mid = probe.Stamp(ys)
    with tf.control_dependencies(mid):
      dxs, dws = tape.gradient(
          ys, (xs, theta_flat), output_gradients=dy,
          unconnected_gradients=tf.UnconnectedGradients.ZERO)
    dtheta = acc.Add(state.dtheta, dws, t)
    dx = state.dx
    if s > 0:
      dx = _Write(program.dx_rings[s], state.dx, w, dxs)
    stamps = start + mid + probe.Stamp([dxs, dtheta])
    return state._replace(dx=dx, dtheta=dtheta), stamps

  # Per device, its tables: branch, micro-batch, slot and ring entry written
  # (F: its output ring's, B: its input-gradient ring's) of each tick.
  tables, clocks, reads = [], [], []
  for d in range(num_d):
    write = [0] * program.num_ticks
    for c in range(program.num_ticks):
      a = program.table.grid[d][c]
      if a is None:
        continue
      ring = (program.out_rings[a.stage] if a.op == 'F' else
              program.dx_rings[a.stage])
      write[c] = ring.write[c] if ring is not None else 0
    with tf.device(devices[d]):
      tables.append([tf.constant(v, tf.int32) for v in (
          program.branch[d], program.micro_batch[d], program.slot[d], write)])
      clocks.append(tf.constant(0))
  # Per ring deeper than 1, the entry its consumer reads on each tick, on
  # the producer's device.
  for rings in (program.out_rings, program.dx_rings):
    per_stage = []
    for s, ring in enumerate(rings):
      if ring is None or ring.depth == 1:
        per_stage.append(None)
        continue
      with tf.device(devices[dev_of[s]]):
        per_stage.append(tf.constant(ring.read, tf.int32))
    reads.append(per_stage)

  def Received(states, cs, rings, read_table, s):
    """What stage s sends on its ring this tick: the latched tensors, or
    the entry its consumer reads (read on stage s's device)."""
    if rings[s].depth == 1:
      return states[s]
    with tf.device(devices[dev_of[s]]):
      i = tf.gather(read_table[s], cs[dev_of[s]])
      return [ta.read(i) for ta in states[s]]

  def Tick(cs, states, logs, ops=None):
    """One tick. ops: per device its branch when the loop knows it (steady
    ticks: no switch), else None (looked up in the table)."""
    outs = [st.out for st in states]
    dxs = [st.dx for st in states]
    new_states, new_logs, new_cs = list(states), [], []
    for d in range(num_d):
      with tf.device(devices[d]):
        c = cs[d]
        t, slot, w = (tf.gather(tables[d][i], c) for i in (1, 2, 3))
        new_cs.append(c + 1)
        mine = tuple(states[s] for s in on_device[d])

        def Cell(op, s, mine=mine, t=t, slot=slot, w=w, d=d):
          i = on_device[d].index(s)
          if op == 'F':
            x_in = (Received(outs, cs, program.out_rings, reads[0], s - 1)
                    if s > 0 else [])
            new, stamps = Forward(s, mine[i], x_in, t, slot, w)
          else:
            dy_in = (Received(dxs, cs, program.dx_rings, reads[1], s + 1)
                     if s < num_s - 1 else [])
            new, stamps = Backward(s, mine[i], dy_in, t, slot, w)
          return mine[:i] + (new,) + mine[i + 1:], stamps
        fns = [lambda mine=mine: (mine, probe.Missing(3))] + [
            lambda op=op, s=s, cell=Cell: cell(op, s)
            for op, s in program.cells[d]]
        if ops is None:
          mine, stamps = probe.SwitchCase(tf.gather(tables[d][0], c), fns)
        else:
          mine, stamps = fns[ops[d]]()
        for s, st in zip(on_device[d], mine):
          new_states[s] = st
        new_logs.append(probe.Log(logs[d], c, stamps))
    return new_cs, new_states, new_logs

  states = []
  for s, (stage, spec) in enumerate(zip(stages, specs)):
    with tf.device(devices[dev_of[s]]):
      states.append(_State(
          out=(_Ring(program.out_rings[s], spec.out_specs)
               if s < num_s - 1 else []),
          dx=_Ring(program.dx_rings[s], spec.DxSpecs()) if s > 0 else [],
          slots=[tf.TensorArray(v.dtype, size=program.num_slots[s],
                                element_shape=v.shape)
                 for v in spec.in_specs] if s > 0 else [],
          stats=[_Zeros(v) for v in spec.StatsSpecs()],
          dtheta=acc.Init(tf.nest.flatten(thetas[s])),
          loss=_Zeros(loss_specs) if s == num_s - 1 else []))
  logs = []
  for d in range(num_d):
    with tf.device(devices[d]):
      logs.append(probe.NewLog(program.num_ticks, 3))
  loop_vars = (clocks, states, logs)
  for loop in program.loops:
    per_iteration = loop.steady or (None,)

    def Body(*args, per_iteration=per_iteration):
      for ops in per_iteration:
        args = Tick(*args, ops=ops)
      return args
    loop_vars = tf.while_loop(
        lambda *_: tf.constant(True), Body, loop_vars,
        maximum_iterations=(loop.end - loop.first) // len(per_iteration),
        parallel_iterations=(STEADY_PARALLEL_ITERATIONS if loop.steady
                             else PARALLEL_ITERATIONS))
  _, states, logs = loop_vars
  for d, log in enumerate(logs):
    probe.Add('table', d, num_d, program.table.num_micro_batches, log,
              table=program.table)
  totals = []
  for s, state in enumerate(states):
    with tf.device(devices[dev_of[s]]):
      totals.append(acc.Total(state.dtheta))
  return Sums(states[-1].loss, totals, [st.stats for st in states])


def RunUnrolled(stages, thetas, specs, program, flat_stacked, loss_of,
                loss_specs, normalizer, mb_size, devices) -> Sums:
  """A compiled schedule without recompute: the table unrolled in Python.

  Each forward cell runs under its own GradientTape, built when the step is
  traced; its backward cell, traced later in table order, takes that
  tape's gradient, so the forward cell's intermediate tensors stay alive
  exactly from the forward to the backward cell (1F1B: at most
  min(K - k, T) micro-batches of activations on device k). A control
  dependency on the previous cell of the same device makes each device run
  its cells in the table's order (the dataflow alone would let every
  forward run first, as in GPipe). The graph holds 2 S T stage calls, so it
  grows with T (the loop's does not).
  """
  num_s, num_d = len(stages), program.num_devices
  num_mb = program.table.num_micro_batches
  probe = timeline.ActiveProbe()
  if 2 * num_s * num_mb > UNROLLED_CELLS_WARNING:
    logging.warning(
        'Schedule %r without recompute unrolls its table: S=%d stages x '
        'T=%d gives %d stage calls in the graph (more than %d), which makes '
        'tracing slow; use recompute=True (a loop whose graph does not grow '
        'with T) or fewer micro-batches', program.table.name, num_s, num_mb,
        2 * num_s * num_mb, UNROLLED_CELLS_WARNING)
  outs, dxs_of, pending = {}, {}, {}
  dthetas = [[tf.zeros_like(w) for w in tf.nest.flatten(th)]
             for th in thetas]
  stats = [[_Zeros(ss) for ss in spec.StatsSpecs()] for spec in specs]
  sums = _Zeros(loss_specs)
  previous = [[] for _ in range(num_d)]  # per device: its last cell's results
  rows = [[] for _ in range(num_d)]      # per device: timeline rows
  for c in range(program.num_ticks):
    for d in range(num_d):
      a = program.table.grid[d][c]
      if a is None:
        rows[d].append(probe.Missing(3))
        continue
      s, t = a.stage, program.real[a.micro_batch]
      stage, spec = stages[s], specs[s]
      theta_flat = tf.nest.flatten(thetas[s])
      with tf.device(devices[d]), tf.control_dependencies(previous[d]):
        if a.op == 'F':
          x = ([tf.gather(v, t) for v in flat_stacked] if s == 0 else
               outs.pop((t, s - 1)))
          start = probe.Stamp(x)
          with tf.GradientTape(watch_accessed_variables=False) as tape, \
              tf.control_dependencies(start):
            # Stage 0's inputs are data: no gradient for them.
            xs = [x[i] for i in spec.float_in] if s > 0 else []
            tape.watch(xs)
            tape.watch(theta_flat)
            th = tf.nest.pack_sequence_as(thetas[s], theta_flat)
            y, cell_stats = stage.FlatCall(spec.in_struct, th, list(x), t,
                                           mb_size)
            if s == num_s - 1:
              l, m = loss_of(y, t)
              ys = [l / normalizer]
              sums = [u + v for u, v in zip(sums, [l] + m)]
            else:
              ys = [y[i] for i in spec.float_out]
              outs[(t, s)] = y
          stats[s] = tf.nest.map_structure(lambda u, v: u + v, stats[s],
                                           cell_stats)
          pending[(t, s)] = (tape, xs, theta_flat, ys)
          end = probe.Stamp([y, cell_stats])
          rows[d].append(start + probe.Missing(1) + end)
          # (With the timeline on, the next cell's start follows this end.)
          previous[d] = y + tf.nest.flatten(cell_stats) + end
        else:
          tape, xs, theta_flat, ys = pending.pop((t, s))
          dy = None if s == num_s - 1 else dxs_of.pop((t, s + 1))
          start = probe.Stamp(ys + (dy or []))
          with tf.control_dependencies(start):
            dxs, dws = tape.gradient(
                ys, (xs, theta_flat), output_gradients=dy,
                unconnected_gradients=tf.UnconnectedGradients.ZERO)
          dthetas[s] = [u + g for u, g in zip(dthetas[s], dws)]
          if s > 0:
            dxs_of[(t, s)] = list(dxs)
          # A backward row without a recompute is (start, -1, end).
          end = probe.Stamp([dxs, dthetas[s]])
          rows[d].append(start + probe.Missing(1) + end)
          previous[d] = list(dxs) + dthetas[s] + end
  assert not (outs or dxs_of or pending), (outs, dxs_of, pending)
  if probe.recording:
    for d in range(num_d):
      with tf.device(devices[d]):
        probe.Add('table', d, num_d, num_mb, tf.stack([
            tf.stack(row) for row in rows[d]]), table=program.table)
  return Sums(sums, dthetas, stats)
