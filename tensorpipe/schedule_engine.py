"""The schedule engine: runs any compiled schedule table as tf.while_loops
(stages in other processes: one pass without a loop, `UnrollsAll`).

One engine for every schedule (GPipe, 1F1B, interleaved 1F1B, the
zero-bubble tables, a table read from CSV): `schedule_program.Compile`
turns the table into constant per-device tables and a loop plan, and `Run`
builds the loops from them. Each device keeps its own copy of the clock and
reads its cell of tick c (branch, micro-batch, boundary slot, ring entry)
from tables on its own device; no clock or index crosses devices on a
tick. Pseudo-code (recompute on):

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

Split by job: what the pipeline's two ends do is a `schedule_ends.End`
whose hooks the cells call (`LossInside`, GPipe's `GPipeForward` and
`GPipeBackward`); the cells (schedule_cells: `Cells.Forward`, `Backward`,
`WeightGrad`) use the cell algebra (cell_algebra: `TapedCall`,
`Vjp`, `WeightGrads`, `CellCall`); this module is the tick machinery
around them:
per-device tables (`_DeviceTables`), one tick (`_Tick`) and the loop
drivers (`_SwitchingLoop`, `_CarriedLoop`).

Rings of depth 1 are one latched tensor per boundary (GPipe's and 1F1B's
case); deeper rings (interleaved 1F1B) are TensorArrays in the producer's
loop state, read on the producer's device and sent to the consumer. Ticks
on which every device works in a repeating pattern run as a loop whose
cells are fixed in the graph (no tf.switch_case); the others switch on the
table (`schedule_program`), but for a loss-inside table's short ones
(`schedule_program.RAMP_TICKS`: fixed ramps), which run once without a
loop, each tick's cells fixed, waiting after each cell of a device
(`LoopBarriers`). Each F, B and I cell is a function of its own
(`schedule_program.ISOLATED_CELLS`), so Grappler gives it the same
bits wherever it runs: in a switching loop, a steady loop, a ramp or one
pass. Two
ticks may be in flight in a switching loop (`PARALLEL_ITERATIONS`:
cells of different cost on neighbouring devices overlap as their data
allow, rather than each tick waiting for its slowest
cell); the steady loop runs a whole period per iteration, one in flight.
With stages in other processes, a run of at most `schedule_program.
UNROLL_ACROSS_PROCESSES_CELLS` cells is one pass over all its ticks with
every cell fixed and no loop (`schedule_program.UnrollsAll`; each loop
iteration there costs a round of messages between the processes), but for
a recorded step and TF's autodiff of GPipe's loop.

Without recompute nothing public in TensorFlow carries a stage's autodiff
state across tf.while_loop iterations, so `schedule_unrolled.Run` unrolls
the table in Python: each forward cell under its own GradientTape, its
backward cell taking that tape's gradient (2 S T stage calls in the graph).
"""

from typing import Any, List, NamedTuple, Optional, Tuple

import tensorflow as tf

from tensorpipe import devices as devices_lib
from tensorpipe import pipeline_stage
from tensorpipe import schedule_cells
from tensorpipe import schedule_ends
from tensorpipe import schedule_program
from tensorpipe.cell_algebra import Sums

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
# LOOP_DEVICE: a loop's own control (its iteration counter and condition)
# is built on the first device of the pipeline, not on the caller's default
# device. Each iteration sends the condition to every device of the loop;
# with stages in other processes (distribute.ConnectRemoteStages) the
# default device is the client's, so that would be a round trip through
# the client per iteration: 20.0 -> 16.4 ms per step for the `tiny` model,
# K=2, T=4, 1F1B, two TF servers on 127.0.0.1 (tools/benchmark
# --remote_check). In one process it changes no transfer and no bit.

# -- the tick machinery ------------------------------------------------------


def TensorsOn(device: str, structure: Any) -> List[tf.Tensor]:
  """The tensors of `structure` on `device` (of a TensorArray: its flow).

  '/device:CPU:1' matches a tensor on '/job:localhost/replica:0/task:0/
  device:CPU:1' (graph tensors carry the full name) and the reverse
  (`devices_lib.Matches`).
  """
  spec = tf.DeviceSpec.from_string(device)
  out = []
  for x in tf.nest.flatten(structure):
    if isinstance(x, tf.TensorArray):
      x = x.flow
    if isinstance(x, tf.Tensor) and x.device:
      if devices_lib.Matches(spec, tf.DeviceSpec.from_string(x.device)):
        out.append(x)
  return out


class _Tables(NamedTuple):
  """Per device, its columns (branch, micro-batch, slot, ring entry
  written, stash slot: an int tensor per tick, or a Python int where the
  column is constant over the run; the micro-batch column object itself
  where a column equals it) and its clock; per ring deeper than 1 (out
  rings, dx rings), the entry its consumer reads on each tick."""
  columns: List[List[Any]]
  clocks: List[tf.Tensor]
  reads: List[List[Optional[tf.Tensor]]]

  def Column(self, d: int, i: int, c) -> Any:
    col = self.columns[d][i]
    return tf.gather(col, c) if isinstance(col, tf.Tensor) else col


def _DeviceTables(program, devices, first, last) -> _Tables:
  """Each device's tables on its own device (F writes its output ring's
  entry, B its input-gradient ring's)."""
  columns, clocks, reads = [], [], []
  for d in range(program.num_devices):
    write = [0] * program.num_ticks
    for c in range(first, last):
      a = program.table.grid[d][c]
      if a is None:
        continue
      ring = (program.out_rings[a.stage] if a.op == 'F' else
              program.dx_rings[a.stage])
      write[c] = ring.write[c] if ring is not None else 0
    cols = []
    with tf.device(devices[d]):
      for col in (program.branch[d], program.micro_batch[d],
                  program.slot[d], write, program.stash[d]):
        if col[first:last] == program.micro_batch[d][first:last]:
          cols.append(cols[1] if len(cols) > 1 else tf.constant(
              col, tf.int32))
        elif len(set(col[first:last])) == 1:
          cols.append(col[first])
        else:
          cols.append(tf.constant(col, tf.int32))
      clocks.append(tf.constant(first))
    columns.append(cols)
  for rings in (program.out_rings, program.dx_rings):
    per_stage = []
    for s, ring in enumerate(rings):
      if ring is None or ring.depth == 1:
        per_stage.append(None)
        continue
      with tf.device(devices[program.stage_device[s]]):
        per_stage.append(tf.constant(ring.read, tf.int32))
    reads.append(per_stage)
  return _Tables(columns, clocks, reads)


def _Received(engine, bufs, cs, rings, read_table, s) -> List[tf.Tensor]:
  """What stage s sends on its ring this tick: the latched tensors, or the
  entry its consumer reads (read on stage s's device)."""
  if rings[s].depth == 1:
    return bufs[s]
  d = engine.program.stage_device[s]
  with tf.device(engine.devices[d]):
    i = tf.gather(read_table[s], cs[d])
    return [ta.read(i) for ta in bufs[s]]


def _Carried(engine, tables, loop) -> Optional[List[Tuple[int, int,
                                                          List[int]]]]:
  """Per device (t0, step, offsets) when a fixed loop can carry each
  device's micro-batch instead of its clock: on tick j of iteration n it is
  t0 + step n + offsets[j], and the device's other columns are constants
  or its micro-batch (GPipe). Else None."""
  program = engine.program
  if any(r is not None and r.depth > 1
         for r in program.out_rings + program.dx_rings):
    return None
  size = len(loop.steady)
  count = (loop.end - loop.first) // size
  plan = []
  for d in range(engine.num_d):
    cols = tables.columns[d]
    if any(isinstance(cols[i], tf.Tensor) and cols[i] is not cols[1]
           for i in (2, 3, 4)):
      return None
    mb = program.micro_batch[d]
    t0 = mb[loop.first]
    step = mb[loop.first + size] - t0 if count > 1 else 0
    offsets = [mb[loop.first + j] - t0 for j in range(size)]
    if any(mb[loop.first + size * n + j] != t0 + step * n + offsets[j]
           for n in range(count) for j in range(size)):
      return None
    plan.append((t0, step, offsets))
  return plan


def _DeviceTick(engine, tables, d, c, states, outs, dxs, cs, op, ts,
                after):
  """Device d's cells of one tick: (its stages' new states, stamps)."""
  probe, program, on_device = engine.probe, engine.program, engine.on_device
  if ts is None:
    t, slot, w, stash_slot = (tables.Column(d, i, c) for i in (1, 2, 3, 4))
  else:
    cols = tables.columns[d]
    t = ts[d]
    slot, w, stash_slot = (t if cols[i] is cols[1] else cols[i]
                           for i in (2, 3, 4))
  mine = tuple(states[s] for s in on_device[d])

  def Cell(op, s, valid=None):
    i = on_device[d].index(s)
    if op == 'F':
      x_in = (_Received(engine, outs, cs, program.out_rings,
                        tables.reads[0], s - 1) if s > 0 else [])
      new, stamps = engine.Forward(s, mine[i], x_in, t, slot, w, valid,
                                   after)
    elif op == 'W':
      new, stamps = engine.WeightGrad(s, mine[i], stash_slot, after)
    else:
      dy_in = (_Received(engine, dxs, cs, program.dx_rings, tables.reads[1],
                         s + 1) if s < engine.num_s - 1 else [])
      new, stamps = engine.Backward(s, mine[i], dy_in, t, slot, w,
                                    stash_slot if op == 'I' else None, after)
    return mine[:i] + (new,) + mine[i + 1:], stamps
  # Branches the run does not use are idle (never taken, not traced).
  idle = lambda: (mine, probe.Missing(3))
  used = engine.used[d]
  fns = [idle] + [(lambda op=op, s=s: Cell(op, s)) if b in used else idle
                  for b, (op, s) in enumerate(program.cells[d], 1)]
  if engine.masked:
    valid = tf.not_equal(tables.Column(d, 0, c), schedule_program.IDLE)
    return Cell(*program.cells[d][used[0] - 1], valid=valid)
  if op is not None:
    return fns[op]()
  if len(used) == 1:
    return probe.Cond(tf.equal(tables.Column(d, 0, c), used[0]),
                      fns[used[0]], idle)
  return probe.SwitchCase(tables.Column(d, 0, c), fns)


def _Tick(engine, tables, cs, states, logs, ops, barrier=None, ts=None,
          after=None):
  """One tick. ops: per device its branch when the loop knows it (steady
  ticks, or a branch that does not change in a switching loop), else None
  (looked up in the table). barrier: per device, whether its next tick
  waits for this one's state (`schedule_program.Barriers`). ts: per device
  its micro-batch when the loop carries it (`_Carried`; cs is then not a
  clock)."""
  outs = [st.out for st in states]
  dxs = [st.dx for st in states]
  new_states, new_logs, new_cs = list(states), [], []
  for d in range(engine.num_d):
    with tf.device(engine.devices[d]):
      c = cs[d]
      mine, stamps = _DeviceTick(engine, tables, d, c, states, outs, dxs, cs,
                                 ops[d], ts, after[d] if after else [])
      for s, st in zip(engine.on_device[d], mine):
        new_states[s] = st
      new_logs.append(engine.probe.Log(logs[d], c - engine.first, stamps))
      # At a barrier of a fixed body (schedule_program.LoopBarriers) the
      # next tick's clock on device d waits for this tick's state there,
      # so Grappler cannot merge this tick's additions to a sum with a
      # later tick's into one AddN (it leaves nodes that drive a control
      # dependency alone), which would add in another order.
      deps = (TensorsOn(engine.devices[d], mine) if barrier and barrier[d]
              else [])
      with tf.control_dependencies(deps):
        new_cs.append(c + 1)
  return new_cs, new_states, new_logs


def _Gates(engine, barriers, i, states, gates):
  """Per device, what the sums of tick i of a loop body added outside a
  cell (all but a B cell's in one process: schedule_cells) wait for: the
  state the device left at its last barrier before tick i (`states`: the
  state after tick i - 1), so Grappler cannot merge a sum's additions
  across the barrier even where no cell reads the clock or micro-batch
  the barrier delays (a last stage without targets)."""
  if not i:
    return gates
  return [TensorsOn(engine.devices[d], [states[s] for s in engine.on_device[d]])
          if barriers[i - 1][d] else gates[d] for d in range(engine.num_d)]


def _SwitchingLoop(engine, tables, loop, loop_vars, parallel_iterations):
  """A loop over ticks [loop.first, loop.end): its ticks with each
  device's cell fixed (a steady loop or a ramp), or one tick per iteration
  switching on the table."""
  # A switching loop fixes the branch of a device whose branch does not
  # change on its ticks (K = 1; a partition busy all ramp-up long).
  fixed = tuple(
      row[loop.first] if len(set(row[loop.first:loop.end])) == 1 else None
      for row in engine.program.branch)
  per_iteration = loop.steady or (fixed,)
  barriers = (schedule_program.LoopBarriers(loop, engine.program.cells)
              if loop.steady
              else schedule_program.Barriers(per_iteration))

  def Body(*args):
    gates = [[] for _ in range(engine.num_d)]
    for i, (ops, barrier) in enumerate(zip(per_iteration, barriers)):
      gates = _Gates(engine, barriers, i, args[1], gates)
      args = _Tick(engine, tables, *args, ops=ops, barrier=barrier,
                   after=gates)
    return args
  parallel = (STEADY_PARALLEL_ITERATIONS if loop.steady
              else parallel_iterations)
  return _WhileLoop(engine, Body, loop_vars,
                    (loop.end - loop.first) // len(per_iteration), parallel,
                    lambda cs, *_: cs[0] < loop.end, loop.ramp)


def _WhileLoop(engine, body, loop_vars, iterations, parallel, own_cond,
               ramp=False):
  """tf.while_loop of `iterations` iterations of `body`. With one device
  (and no autodiff) it ends on `own_cond`, a condition on the device's own
  clock or micro-batch, without an iteration counter (two ops less per
  tick, a tenth of K=1's fixed tick cost; TF's autodiff of a while loop
  needs the counter); else its control is on the first device
  (LOOP_DEVICE).

  A ramp (`schedule_program.Loop.ramp`: one iteration with its cells
  fixed; where the engine runs the whole table unrolled, stages in other
  processes, every loop is one: `schedule_program.UnrollsAll`) is no loop:
  the body once. A one-iteration tf.while_loop of a ramp's fixed cells
  changed bits: GPipe's gradients of a batch-norm ResNet (SmallResNetLayers,
  K=4, T=4, 1F1B) moved by an ulp with Grappler's constant folding on
  (pipeline_train_test.testBatchNormResNetAtFourStagesGivesGPipesBits).
  """
  if ramp:
    if iterations != 1:
      raise AssertionError(f'a loop of {iterations} iterations run once')
    return body(*loop_vars)
  if engine.num_d == 1 and not engine.end.autodiff and own_cond:
    return tf.while_loop(own_cond, body, loop_vars,
                         parallel_iterations=parallel)
  with tf.device(engine.devices[0]):
    return tf.while_loop(
        lambda *_: tf.constant(True), body, loop_vars,
        maximum_iterations=iterations, parallel_iterations=parallel)


def _CarriedLoop(engine, tables, loop, plan, loop_vars):
  """A steady loop that carries each device's micro-batch (t0 + step per
  iteration, + offset on later ticks): no table gather per tick."""
  per_iteration = loop.steady
  barriers = schedule_program.LoopBarriers(loop, engine.program.cells)
  num_d, devices = engine.num_d, engine.devices

  def Body(bases, states, logs):
    gates = [[] for _ in range(num_d)]
    for i, ops in enumerate(per_iteration):
      gates = _Gates(engine, barriers, i, states, gates)
      ts = []
      for d in range(num_d):
        # After a barrier every later tick's micro-batch on device d waits
        # for the state d left there (schedule_program.Barriers), as a
        # switching loop's clock does (_Tick: each tick's clock follows
        # the one before): waiting on the next tick only, a cell after it
        # that needed no data from it started early (ZB-V's I cell of one
        # stage beside the W cell of the other: LoopBarriers).
        deps = (gates[d] if i and any(barriers[j][d] for j in range(i))
                else [])
        with tf.device(devices[d]), tf.control_dependencies(deps):
          off = plan[d][2][i]
          ts.append(bases[d] + off if i and (off or deps) else bases[d])
      _, states, logs = _Tick(engine, tables, bases, states, logs, ops=ops,
                              ts=ts, after=gates)
    new_bases = []
    for d in range(num_d):
      with tf.device(devices[d]):
        new_bases.append(bases[d] + plan[d][1])
    return new_bases, states, logs
  bases = []
  for d in range(num_d):
    with tf.device(devices[d]):
      bases.append(tf.constant(plan[d][0]))
  iterations = (loop.end - loop.first) // len(per_iteration)
  t0, step = plan[0][0], plan[0][1]
  t_end = t0 + step * iterations  # one device: ends on its micro-batch
  cond = ((lambda b, *_: b[0] < t_end) if step > 0 else
          (lambda b, *_: b[0] > t_end) if step < 0 else None)
  out = _WhileLoop(engine, Body, (bases,) + tuple(loop_vars[1:]), iterations,
                   STEADY_PARALLEL_ITERATIONS, cond, loop.ramp)
  clocks = []
  for d in range(num_d):
    with tf.device(devices[d]):
      clocks.append(tf.constant(loop.end))
  return (clocks,) + tuple(out[1:])


def Run(call: pipeline_stage.PipelineCall, program: schedule_program.Program,
        end: schedule_ends.End, acc: Any, first: int = 0,
        last: Optional[int] = None, unroll_ticks: int = 1,
        parallel_iterations: int = PARALLEL_ITERATIONS) -> Sums:
  """Runs ticks [first, last) of a compiled schedule.

  Args:
    call: the stages (stage s on call.devices[program.stage_device[s]]),
      their thetas and specs, and the stacked inputs.
    program: `schedule_program.Compile` of the schedule.
    end: the pipeline's ends (`schedule_ends.LossInside`, `GPipeForward`,
      `GPipeBackward`).
    acc: the `grad_sum.GradSum` that sums the weight gradients.
    first, last: the ticks to run (default: all).
    unroll_ticks: ticks per iteration of the steady loop (whole periods;
      see schedule_program.Loops).
    parallel_iterations: ticks in flight in the switching loops (GPipe's
      loops keep 1: see pipeline_train.py).

  Returns:
    `Sums`.
  """
  last = program.num_ticks if last is None else last
  engine = schedule_cells.Cells(call, program, end, acc, first, last)
  devices = call.devices
  tables = _DeviceTables(program, devices, first, last)
  dev_of, probe, num_d = program.stage_device, engine.probe, engine.num_d
  states = []
  for s in range(engine.num_s):
    with tf.device(devices[dev_of[s]]):
      states.append(engine.InitialState(s))
  logs = []
  for d in range(num_d):
    with tf.device(devices[d]):
      logs.append(probe.NewLog(last - first, 3))
  loop_vars = (tables.clocks, states, logs)
  ramps = schedule_program.RampTicksOf(program.table)
  for loop in schedule_program.Loops(program.branch, first, last,
                                     engine.one_loop,
                                     unroll_ticks, ramps, engine.inline):
    plan = _Carried(engine, tables, loop) if loop.steady else None
    if plan is not None:
      loop_vars = _CarriedLoop(engine, tables, loop, plan, loop_vars)
    else:
      loop_vars = _SwitchingLoop(engine, tables, loop, loop_vars,
                                 parallel_iterations)
  _, states, logs = loop_vars
  for d, log in enumerate(logs):
    probe.Add('table', d, num_d, engine.num_mb, log, table=program.table,
              first=first)
  totals = []
  for s, state in enumerate(states):
    if s in engine.runs_b:
      with tf.device(devices[dev_of[s]]):
        totals.append(acc.Total(state.dtheta))
    else:
      totals.append([])
  return end.Finish(engine, states, Sums(
      states[-1].loss, totals, [st.stats for st in states]))
