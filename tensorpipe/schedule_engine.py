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
state across tf.while_loop iterations, so `schedule_unrolled.Run` unrolls
the table in Python: each forward cell under its own GradientTape, its
backward cell taking that tape's gradient (2 S T stage calls in the graph).
"""

from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf

from tensorpipe import devices as devices_lib
from tensorpipe import grad_sum
from tensorpipe import pipeline_stage
from tensorpipe import py_utils
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

# loss_of(last stage's flat outputs, t) -> (loss sum, flat metric sums).
LossOf = Callable[[List[tf.Tensor], Any], Tuple[tf.Tensor, List[tf.Tensor]]]


class Ends(NamedTuple):
  """What a run does at the pipeline's two ends, and which cells it keeps.

  Loss inside (1F1B and the other table schedules): `loss_of`,
  `loss_specs` and `normalizer`; the last stage's F adds its micro-batch's
  loss and its B takes d(loss / normalizer). GPipe (the loss outside): a
  forward run with `outputs` (the last stage's outputs, [T, ...]) and
  `save_inputs` (every stage's inputs, [T, ...], for the recompute), and a
  backward run with `dys` (per float output of the last stage, [T, ...])
  reading `saved`, with `input_grads` (stage 0's input gradients). A
  forward run that TF's autodiff will differentiate sets `autodiff`:
  'place' builds each stage call's gradient on its device
  (`GradientOnDevice`); 'recompute_grad' also wraps each call in
  tf.recompute_grad, and then bubble ticks compute on a clamped index with
  their results masked instead of skipped (the gradient of
  tf.recompute_grad inside a tf.cond inside a while loop fails in cond_v2).
  """
  loss_of: Optional[LossOf] = None
  loss_specs: Sequence[tf.TensorSpec] = ()
  normalizer: Any = None
  outputs: bool = False
  save_inputs: bool = False
  dys: Optional[List[tf.Tensor]] = None
  saved: Optional[List[List[tf.Tensor]]] = None
  input_grads: bool = False
  autodiff: str = ''


class Sums(NamedTuple):
  """What a run returns; fields a run does not make are [] or None."""
  loss: List[tf.Tensor]                 # [loss sum, metric value, weight, ..]
  dthetas: List[List[tf.Tensor]]        # per stage, flat weight gradients
  stats: List[List[List[tf.Tensor]]]    # per stage and batch-norm layer
  outputs: List[tf.Tensor] = []         # last stage's flat outputs [T, ...]
  saved: Optional[List[List[tf.Tensor]]] = None  # per stage, inputs [T, ..]
  d_inputs: List[Optional[tf.Tensor]] = []  # per flat input of stage 0


class _State(NamedTuple):
  """One stage's loop state; fields it does not need are []."""
  out: List[Any]                # its outputs to stage s + 1: tensors, or
  #                               TensorArrays when the ring is deeper than 1
  dx: List[Any]                 # its input gradients to stage s - 1, same
  slots: List[tf.TensorArray]   # saved boundary inputs (s > 0)
  stats: List[List[tf.Tensor]]  # batch-norm statistics summed so far
  dtheta: List[tf.Tensor]       # flat weight gradients summed so far
  loss: List[tf.Tensor]         # s = S - 1: [loss sum, metric sums...]
  ends: List[tf.TensorArray]    # last stage: outputs; stage 0: input grads
  stash: List[tf.TensorArray]   # I -> W: per weight op, its x and dz


def Zeros(specs) -> List[tf.Tensor]:
  return [tf.zeros(s.shape, s.dtype) for s in specs]


def _Ring(ring, specs) -> List[Any]:
  """A ring's initial state: zeros, or TensorArrays of zeros."""
  if ring.depth == 1:
    return Zeros(specs)
  return [tf.TensorArray(s.dtype, size=ring.depth, element_shape=s.shape)
          .unstack(tf.zeros([ring.depth] + s.shape.as_list(), s.dtype))
          for s in specs]


def _Write(ring, buffers, index, values) -> List[Any]:
  if ring.depth == 1:
    return list(values)
  return [ta.write(index, v) for ta, v in zip(buffers, values)]


def _TensorArrays(specs, size) -> List[tf.TensorArray]:
  return [tf.TensorArray(s.dtype, size=size, element_shape=s.shape)
          for s in specs]


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


def GradientOnDevice(fn, device: str):
  """`fn` (flat tensors -> flat tensors) whose gradient is built on `device`.

  TF's autodiff of a tf.while_loop builds the gradient loop's body outside
  the forward body's tf.device blocks, so the placer put every gradient op
  of an unrecomputed (or tf.recompute_grad) pipeline on the default device,
  CPU:0 or GPU:0: the backward pass of all K partitions on one device. A
  tf.custom_gradient whose gradient function runs the tape's backprop of the
  call inside tf.device(device) places those ops on the partition's device.
  The tape only records at trace time (no runtime cost); the activations
  its gradient needs are those autodiff would keep anyway.
  """
  @tf.custom_gradient
  def Wrapped(*args):
    floats = [a for a in args if a.dtype.is_floating]
    with tf.GradientTape(watch_accessed_variables=False) as tape:
      tape.watch(floats)
      # tf.identity: custom_gradient needs every output made in this graph
      # (a stage may pass through a tensor captured from outside).
      outs = [tf.identity(o) for o in fn(*args)]

    def Grad(*dys, variables=None):
      ys, out_grads = [], []
      for y, dy in zip(outs, dys):
        if y.dtype.is_floating:
          ys.append(y)
          out_grads.append(tf.zeros_like(y) if dy is None else dy)
      with tf.device(device):
        grads = iter(tape.gradient(
            ys, floats, output_gradients=out_grads,
            unconnected_gradients=tf.UnconnectedGradients.ZERO))
      d_args = [next(grads) if a.dtype.is_floating else None for a in args]
      if variables:
        return d_args, [None] * len(variables)
      return d_args
    return outs, Grad
  return Wrapped


def _AutodiffCall(stage, spec, theta, mb_size, autodiff, ctx):
  """Stage s's call as (flat inputs, t) -> (outputs, stats) for TF's
  autodiff: its gradient on its device, under tf.recompute_grad or not."""
  arg_struct = (list(spec.in_specs), 0, theta)  # inputs, t, weights
  out_struct = (list(spec.out_specs), spec.StatsSpecs())

  def Call(*flat_args):
    flat_in, t, th = tf.nest.pack_sequence_as(arg_struct, list(flat_args))
    t = tf.cast(t, tf.int32)
    # tf.recompute_grad re-runs Call when the gradient is taken: use the
    # forward pass's context (step seed, mode) then too.
    with py_utils.RestoreContext(ctx):
      return tf.nest.flatten(stage.FlatCall(spec.in_struct, th, flat_in, t,
                                            mb_size))
  if autodiff == 'recompute_grad':
    fn = GradientOnDevice(tf.recompute_grad(Call), stage.device)
  else:
    fn = GradientOnDevice(Call, stage.device)

  def Cell(flat_in, t):
    if autodiff == 'recompute_grad':
      # tf.recompute_grad differentiates every argument: t as a float.
      t = tf.cast(t, tf.float32)
    flat = fn(*tf.nest.flatten((flat_in, t, theta)))
    return tf.nest.pack_sequence_as(out_struct, list(flat))
  return Cell


def TraceWeightOps(stage: pipeline_stage.Stage,
                   spec: pipeline_stage.StageSpecs, theta: List[Any],
                   mb_size: int) -> List[Tuple[int, tf.TensorSpec,
                                               tf.TensorSpec, Callable]]:
  """A stage's `py_utils.WeightOp` calls, traced once on specs: per call
  in call order, (index of its weight in the flat theta, spec of x, spec of
  z, fn).

  Raises:
    ValueError: a weight op's w is not one of the stage's weights as they
      come in theta (a layer cast or sliced it before the op).
  """
  flat_theta = tf.nest.flatten(theta)
  n = len(spec.in_specs)
  found = []

  def Fn(*args):
    th = list(args[n:])
    where = {id(v): i for i, v in enumerate(th)}
    with py_utils.CollectWeightOps() as calls:
      stage.FlatCall(spec.in_struct, tf.nest.pack_sequence_as(theta, th),
                     list(args[:n]), tf.constant(0), mb_size)
    for call in calls:
      if id(call.w) not in where:
        raise ValueError(
            f'a py_utils.WeightOp of stage {stage.k} got a weight that is '
            'not one of its weights as they come in theta (cast or sliced '
            'first?); pass theta.<name> and cast inside fn')
      found.append((where[id(call.w)], pipeline_stage.SpecOf(call.x),
                    pipeline_stage.SpecOf(call.z), call.fn))
  specs = list(spec.in_specs) + [pipeline_stage.SpecOf(v) for v in flat_theta]
  with tf.device(stage.device):
    tf.function(Fn, autograph=False).get_concrete_function(*specs)
  return found


def _Period(ticks: Sequence[Any]) -> int:
  """The least p with ticks == ticks[:p] * (len / p)."""
  n = len(ticks)
  return next(p for p in range(1, n + 1)
              if n % p == 0 and tuple(ticks) == tuple(ticks[:p]) * (n // p))


def Run(stages: Sequence[pipeline_stage.Stage], thetas: List[List[Any]],
        specs: Sequence[pipeline_stage.StageSpecs],
        program: schedule_program.Program, flat_stacked: List[tf.Tensor],
        ends: Ends, mb_size: int, acc: Any, devices: Sequence[str],
        first: int = 0, end: Optional[int] = None, unroll_ticks: int = 1,
        parallel_iterations: int = PARALLEL_ITERATIONS) -> Sums:
  """Runs ticks [first, end) of a compiled schedule.

  Args:
    stages: the S stages (stage s on devices[program.stage_device[s]]).
    thetas: per stage, its weights (a list per layer) as tensors.
    specs: per stage, its `pipeline_stage.StageSpecs`.
    program: `schedule_program.Compile` of the schedule.
    flat_stacked: the flat inputs split into micro-batches, [T, N/T, ...].
    ends: see `Ends`.
    mb_size: N / T.
    acc: the `grad_sum.GradSum` that sums the weight gradients.
    devices: the K devices.
    first, end: the ticks to run (default: all).
    unroll_ticks: ticks per iteration of the steady loop (whole periods;
      see schedule_program.Loops).
    parallel_iterations: ticks in flight in the switching loops (GPipe's
      loops keep 1: see pipeline.py).

  Returns:
    `Sums`.
  """
  num_s, num_d = len(stages), program.num_devices
  num_mb = program.table.num_micro_batches
  end = program.num_ticks if end is None else end
  probe = timeline.ActiveProbe()
  dev_of = program.stage_device
  on_device = [[s for s in range(num_s) if dev_of[s] == d]
               for d in range(num_d)]
  acts = [program.table.grid[d][first:end] for d in range(num_d)]
  # Per device, the branches its cells in the run take.
  used = [sorted({b for b in program.branch[d][first:end] if b})
          for d in range(num_d)]
  runs_f = {a.stage for row in acts for a in row if a and a.op == 'F'}
  runs_b = {a.stage for row in acts for a in row if a and a.op in 'BIW'}
  runs_i = {a.stage for row in acts for a in row if a and a.op == 'I'}
  if runs_i and acc is not None and acc.mode != 'sequential':
    raise ValueError(f'grad_sum={acc.mode!r} does not run with schedule '
                     f'{program.table.name!r}, which splits the backward '
                     "pass (I, W); use grad_sum='sequential'")
  # Per stage that runs I cells, its weight ops (py_utils.WeightOp).
  weight_ops = {s: TraceWeightOps(stages[s], specs[s], thetas[s], mb_size)
                for s in runs_i}
  masked = ends.autodiff == 'recompute_grad'
  if masked and any({(a.op, a.stage) for a in row if a} != {('F', s)}
                    for row, s in zip(acts, range(num_d))):
    raise ValueError('autodiff=recompute_grad runs forward cells of one '
                     'stage per device only (stage d on device d)')
  # Masked bubbles write to an extra slot that nothing reads.
  extra = 1 if masked else 0
  loss_inside = ends.loss_of is not None
  keeps_slots = not ends.saved and (loss_inside or ends.save_inputs)
  ctx = py_utils.Current()
  autodiff_calls = {}
  if ends.autodiff:
    for s in runs_f:
      autodiff_calls[s] = _AutodiffCall(stages[s], specs[s], thetas[s],
                                        mb_size, ends.autodiff, ctx)

  def Forward(s, state, x_in, t, slot, w, valid=None):
    """Stage s's forward cell of micro-batch t; (state, stamps)."""
    stage, spec = stages[s], specs[s]
    if valid is not None:
      slot = tf.where(valid, slot, program.num_slots[s])
    x = [tf.gather(v, t) for v in flat_stacked] if s == 0 else list(x_in)
    slots = state.slots
    if s > 0 and keeps_slots:
      slots = [ta.write(slot, v) for ta, v in zip(state.slots, x)]
    start = probe.Stamp(x)
    with tf.control_dependencies(start):
      if s in autodiff_calls:
        y, stats = autodiff_calls[s](x, t)
      else:
        y, stats = stage.FlatCall(spec.in_struct, thetas[s], x, t, mb_size)
      if valid is not None:
        stats = tf.nest.map_structure(
            lambda v: v * tf.cast(valid, v.dtype), stats)
      stats = tf.nest.map_structure(lambda a, b: a + b, state.stats, stats)
      out, loss, end_tas = state.out, state.loss, state.ends
      if s < num_s - 1:
        out = _Write(program.out_rings[s], state.out, w, y)
      elif loss_inside:
        l, m = ends.loss_of(y, t)
        loss = [a + b for a, b in zip(state.loss, [l] + m)]
      elif ends.outputs:
        at = t if valid is None else tf.where(valid, t, num_mb)
        end_tas = [ta.write(at, v) for ta, v in zip(state.ends, y)]
    # A forward row of the timeline is (start, -1, end).
    stamps = start + probe.Missing(1) + probe.Stamp([y, stats, loss])
    if valid is not None:
      stamps = probe.Mask(valid, stamps)
    return state._replace(out=out, slots=slots, stats=stats, loss=loss,
                          ends=end_tas), stamps

  def Backward(s, state, dy_in, t, slot, w, stash_slot=None):
    """Stage s's recompute + vjp of micro-batch t; (state, stamps).

    With `stash_slot` (an I cell) only the gradients of the stage's
    inputs and of its weight ops' outputs z are taken (weights outside
    weight ops get theirs here too); each op's (x, dz) goes to the stash.
    """
    stage, spec = stages[s], specs[s]
    theta_flat = tf.nest.flatten(thetas[s])
    split = stash_slot is not None
    op_idx = [i for i, _, _, _ in weight_ops[s]] if split else []
    # I takes no weight op's weight gradient: those weights are not
    # watched, so autodiff builds no dw kernel (the matmul or
    # convolution's gradient skips unwatched inputs).
    watched = [i for i in range(len(theta_flat)) if i not in op_idx]
    if ends.saved:
      x = [tf.gather(v, t) for v in ends.saved[s]]
    elif s == 0:
      x = [tf.gather(v, t) for v in flat_stacked]
    else:
      x = [ta.read(slot) for ta in state.slots]
    last = s == num_s - 1
    dy = list(dy_in)
    if last and not loss_inside:
      dy = [tf.gather(ends.dys[i], t) for i in spec.float_out]
    start = probe.Stamp(x + dy)
    with tf.GradientTape(watch_accessed_variables=False) as tape, \
        tf.control_dependencies(start):
      # Stage 0's inputs are data: no gradient unless asked for.
      xs = ([x[i] for i in spec.float_in]
            if s > 0 or ends.input_grads else [])
      tape.watch(xs)
      tape.watch([theta_flat[i] for i in watched])
      th = tf.nest.pack_sequence_as(thetas[s], theta_flat)
      with py_utils.CollectWeightOps(tape if split else None) as calls:
        y, _ = stage.FlatCall(spec.in_struct, th, list(x), t, mb_size)
      if last and loss_inside:
        l, _ = ends.loss_of(y, t)
        ys, dy = [l / ends.normalizer], None
      else:
        ys = [y[i] for i in spec.float_out]
    mid = probe.Stamp(ys)
    zs = [call.z for call in calls] if split else []
    if split and len(zs) != len(op_idx):
      raise AssertionError(f'stage {s} made {len(zs)} weight ops, traced '
                           f'{len(op_idx)}')
    with tf.control_dependencies(mid):
      dxs, dzs, dws = tape.gradient(
          ys, (xs, zs, [theta_flat[i] for i in watched]),
          output_gradients=dy,
          unconnected_gradients=tf.UnconnectedGradients.ZERO)
    stash = state.stash
    if split:
      dtheta = list(state.dtheta)
      for i, g in zip(watched, dws):
        dtheta[i] = grad_sum.Accumulate(dtheta[i], g)
      kept = [v for call, dz in zip(calls, dzs) for v in (call.x, dz)]
      stash = [ta.write(stash_slot, v) for ta, v in zip(state.stash, kept)]
    else:
      dtheta = acc.Add(state.dtheta, dws, t)
    dx, end_tas = state.dx, state.ends
    if s > 0:
      dx = _Write(program.dx_rings[s], state.dx, w, dxs)
    elif ends.input_grads:
      end_tas = [ta.write(t, v) for ta, v in zip(state.ends, dxs)]
    stamps = start + mid + probe.Stamp([dxs, dtheta])
    return state._replace(dx=dx, dtheta=dtheta, ends=end_tas,
                          stash=stash), stamps

  def WeightGrad(s, state, stash_slot):
    """Stage s's W cell: each weight op's dw = vjp of fn(x, .) with dz,
    from the (x, dz) its I cell kept; (state, stamps)."""
    theta_flat = tf.nest.flatten(thetas[s])
    kept = [ta.read(stash_slot) for ta in state.stash]
    start = probe.Stamp(kept)
    dtheta = list(state.dtheta)
    with tf.control_dependencies(start):
      for j, (i, _, _, fn) in enumerate(weight_ops[s]):
        x, dz = kept[2 * j], kept[2 * j + 1]
        with tf.GradientTape(watch_accessed_variables=False) as tape:
          tape.watch(theta_flat[i])
          z = fn(x, theta_flat[i])
        dtheta[i] = grad_sum.Accumulate(dtheta[i], tape.gradient(
            z, theta_flat[i], output_gradients=dz))
    # A W row of the timeline is (start, -1, end).
    stamps = start + probe.Missing(1) + probe.Stamp(dtheta)
    return state._replace(dtheta=dtheta), stamps

  # Per device, its tables: branch, micro-batch, slot and ring entry written
  # (F: its output ring's, B: its input-gradient ring's) of each tick; a
  # column that is constant over the run is a Python int (no gather).
  tables, clocks, reads = [], [], []
  for d in range(num_d):
    write = [0] * program.num_ticks
    for c in range(first, end):
      a = program.table.grid[d][c]
      if a is None:
        continue
      ring = (program.out_rings[a.stage] if a.op == 'F' else
              program.dx_rings[a.stage])
      write[c] = ring.write[c] if ring is not None else 0
    columns = []
    with tf.device(devices[d]):
      for col in (program.branch[d], program.micro_batch[d],
                  program.slot[d], write, program.stash[d]):
        if col[first:end] == program.micro_batch[d][first:end]:
          columns.append(columns[1] if len(columns) > 1 else tf.constant(
              col, tf.int32))
        elif len(set(col[first:end])) == 1:
          columns.append(col[first])
        else:
          columns.append(tf.constant(col, tf.int32))
      clocks.append(tf.constant(first))
    tables.append(columns)
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

  def Column(d, i, c):
    col = tables[d][i]
    return tf.gather(col, c) if isinstance(col, tf.Tensor) else col

  def Received(bufs, cs, rings, read_table, s):
    """What stage s sends on its ring this tick: the latched tensors, or
    the entry its consumer reads (read on stage s's device)."""
    if rings[s].depth == 1:
      return bufs[s]
    with tf.device(devices[dev_of[s]]):
      i = tf.gather(read_table[s], cs[dev_of[s]])
      return [ta.read(i) for ta in bufs[s]]

  def Carried(loop):
    """Per device (t0, step, offsets) when a steady loop can carry each
    device's micro-batch instead of its clock: on tick j of iteration n it
    is t0 + step n + offsets[j], and the device's other columns are
    constants or its micro-batch (GPipe). Else None."""
    if any(r is not None and r.depth > 1
           for r in program.out_rings + program.dx_rings):
      return None
    size = len(loop.steady)
    count = (loop.end - loop.first) // size
    plan = []
    for d in range(num_d):
      if any(isinstance(tables[d][i], tf.Tensor) and
             tables[d][i] is not tables[d][1] for i in (2, 3, 4)):
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

  def Tick(cs, states, logs, ops, barrier=False, ts=None):
    """One tick. ops: per device its branch when the loop knows it (steady
    ticks, or a branch that does not change in a switching loop), else None
    (looked up in the table). ts: per device its micro-batch when the loop
    carries it (`Carried`; cs is then not a clock)."""
    outs = [st.out for st in states]
    dxs = [st.dx for st in states]
    new_states, new_logs, new_cs = list(states), [], []
    for d in range(num_d):
      with tf.device(devices[d]):
        c = cs[d]
        if ts is None:
          t, slot, w, stash_slot = (Column(d, i, c) for i in (1, 2, 3, 4))
        else:
          t = ts[d]
          slot, w, stash_slot = (
              t if tables[d][i] is tables[d][1] else tables[d][i]
              for i in (2, 3, 4))
        mine = tuple(states[s] for s in on_device[d])

        def Cell(op, s, mine=mine, t=t, slot=slot, w=w, d=d, valid=None,
                 stash_slot=stash_slot):
          i = on_device[d].index(s)
          if op == 'F':
            x_in = (Received(outs, cs, program.out_rings, reads[0], s - 1)
                    if s > 0 else [])
            new, stamps = Forward(s, mine[i], x_in, t, slot, w, valid)
          elif op == 'W':
            new, stamps = WeightGrad(s, mine[i], stash_slot)
          else:
            dy_in = (Received(dxs, cs, program.dx_rings, reads[1], s + 1)
                     if s < num_s - 1 else [])
            new, stamps = Backward(s, mine[i], dy_in, t, slot, w,
                                   stash_slot if op == 'I' else None)
          return mine[:i] + (new,) + mine[i + 1:], stamps
        # Branches the run does not use are idle (never taken, not traced).
        idle = lambda mine=mine: (mine, probe.Missing(3))
        fns = [idle] + [
            (lambda op=op, s=s, cell=Cell: cell(op, s)) if b in used[d]
            else idle for b, (op, s) in enumerate(program.cells[d], 1)]
        if masked:
          valid = tf.not_equal(Column(d, 0, c), schedule_program.IDLE)
          mine, stamps = Cell(*program.cells[d][used[d][0] - 1],
                              valid=valid)
        elif ops[d] is not None:
          mine, stamps = fns[ops[d]]()
        elif len(used[d]) == 1:
          mine, stamps = probe.Cond(
              tf.equal(Column(d, 0, c), used[d][0]), fns[used[d][0]], idle)
        else:
          mine, stamps = probe.SwitchCase(Column(d, 0, c), fns)
        for s, st in zip(on_device[d], mine):
          new_states[s] = st
        new_logs.append(probe.Log(logs[d], c - first, stamps))
        # Inside an unrolled body the next tick's clock on device d waits
        # for this tick's state there: one tick at a time per device, and
        # Grappler cannot merge this tick's additions to a sum with the
        # next tick's into one AddN (it leaves nodes that drive a control
        # dependency alone), which would add in another order.
        deps = TensorsOn(devices[d], mine) if barrier else []
        with tf.control_dependencies(deps):
          new_cs.append(c + 1)
    return new_cs, new_states, new_logs

  states = []
  for s, (stage, spec) in enumerate(zip(stages, specs)):
    with tf.device(devices[dev_of[s]]):
      end_tas = []
      if s == num_s - 1 and ends.outputs:
        end_tas = _TensorArrays(spec.out_specs, num_mb + extra)
      elif s == 0 and ends.input_grads:
        end_tas = _TensorArrays(spec.DxSpecs(), num_mb)
      states.append(_State(
          out=(_Ring(program.out_rings[s], spec.out_specs)
               if s < num_s - 1 and s in runs_f else []),
          dx=(_Ring(program.dx_rings[s], spec.DxSpecs())
              if s > 0 and s in runs_b else []),
          slots=(_TensorArrays(spec.in_specs, program.num_slots[s] + extra)
                 if s > 0 and keeps_slots else []),
          stats=([Zeros(v) for v in spec.StatsSpecs()] if s in runs_f
                 else []),
          dtheta=acc.Init(tf.nest.flatten(thetas[s])) if s in runs_b else [],
          loss=(Zeros(ends.loss_specs) if s == num_s - 1 and loss_inside
                else []),
          ends=end_tas,
          stash=([ta for _, x, z, _ in weight_ops[s] for ta in
                  _TensorArrays([x, z], program.num_stash[s])]
                 if s in runs_i else [])))
  logs = []
  for d in range(num_d):
    with tf.device(devices[d]):
      logs.append(probe.NewLog(end - first, 3))
  loop_vars = (clocks, states, logs)
  one_loop = probe.recording or bool(ends.autodiff)
  for loop in schedule_program.Loops(program.branch, first, end, one_loop,
                                     unroll_ticks):
    # A switching loop fixes the branch of a device whose branch does not
    # change on its ticks (K = 1; a partition busy all ramp-up long).
    fixed = tuple(
        row[loop.first] if len(set(row[loop.first:loop.end])) == 1 else None
        for row in program.branch)
    per_iteration = loop.steady or (fixed,)
    period = _Period(per_iteration)

    def Body(*args, per_iteration=per_iteration, period=period):
      for i, ops in enumerate(per_iteration):
        barrier = (i + 1) % period == 0 and i < len(per_iteration) - 1
        args = Tick(*args, ops=ops, barrier=barrier)
      return args
    iterations = (loop.end - loop.first) // len(per_iteration)
    parallel = (STEADY_PARALLEL_ITERATIONS if loop.steady
                else parallel_iterations)
    plan = Carried(loop) if loop.steady else None
    if plan is not None:
      # The loop carries each device's micro-batch (t0 + step per
      # iteration, + offset on later ticks): no table gather per tick.
      def CarriedBody(bases, states, logs, per_iteration=per_iteration,
                      period=period, plan=plan):
        for i, ops in enumerate(per_iteration):
          ts = []
          for d in range(num_d):
            # Between periods the next tick's micro-batch on device d
            # waits for this tick's state there (the barrier, see Tick).
            deps = (TensorsOn(devices[d], [states[s] for s in on_device[d]])
                    if i and i % period == 0 else [])
            with tf.device(devices[d]), tf.control_dependencies(deps):
              off = plan[d][2][i]
              ts.append(bases[d] + off if i and (off or deps) else bases[d])
          _, states, logs = Tick(bases, states, logs, ops=ops, ts=ts)
        new_bases = []
        for d in range(num_d):
          with tf.device(devices[d]):
            new_bases.append(bases[d] + plan[d][1])
        return new_bases, states, logs
      bases = []
      for d in range(num_d):
        with tf.device(devices[d]):
          bases.append(tf.constant(plan[d][0]))
      t0, step = plan[0][0], plan[0][1]
      if num_d == 1 and not ends.autodiff and step:
        # One device: ends on its own micro-batch (no iteration counter).
        t_end = t0 + step * iterations
        cond = ((lambda b, *_: b[0] < t_end) if step > 0 else
                (lambda b, *_: b[0] > t_end))
        out = tf.while_loop(cond, CarriedBody, (bases,) + loop_vars[1:],
                            parallel_iterations=parallel)
      else:
        out = tf.while_loop(
            lambda *_: tf.constant(True), CarriedBody,
            (bases,) + loop_vars[1:], maximum_iterations=iterations,
            parallel_iterations=parallel)
      clocks = []
      for d in range(num_d):
        with tf.device(devices[d]):
          clocks.append(tf.constant(loop.end))
      loop_vars = (clocks,) + tuple(out[1:])
      continue
    if num_d == 1 and not ends.autodiff:
      # One device: the loop ends on its own clock, without an iteration
      # counter (two ops less per tick, a tenth of K=1's fixed tick cost;
      # TF's autodiff of a while loop needs the counter).
      loop_vars = tf.while_loop(
          lambda cs, *_, end=loop.end: cs[0] < end, Body, loop_vars,
          parallel_iterations=parallel)
    else:
      loop_vars = tf.while_loop(
          lambda *_: tf.constant(True), Body, loop_vars,
          maximum_iterations=iterations, parallel_iterations=parallel)
  _, states, logs = loop_vars
  for d, log in enumerate(logs):
    probe.Add('table', d, num_d, num_mb, log, table=program.table,
              first=first)
  totals = []
  for s, state in enumerate(states):
    if s in runs_b:
      with tf.device(devices[dev_of[s]]):
        totals.append(acc.Total(state.dtheta))
    else:
      totals.append([])
  outputs, saved, d_inputs = [], None, []
  if ends.outputs:
    with tf.device(devices[dev_of[-1]]):
      outputs = [ta.gather(tf.range(num_mb)) for ta in states[-1].ends]
  if ends.save_inputs:
    saved = [list(flat_stacked)]
    for s in range(1, num_s):
      with tf.device(devices[dev_of[s]]):
        saved.append([ta.gather(tf.range(num_mb))
                      for ta in states[s].slots])
  if ends.input_grads:
    d_inputs = [None] * len(specs[0].in_specs)
    with tf.device(devices[dev_of[0]]):
      for ta, i in zip(states[0].ends, specs[0].float_in):
        d_inputs[i] = ta.gather(tf.range(num_mb))
  return Sums(states[-1].loss, totals, [st.stats for st in states],
              outputs, saved, d_inputs)
