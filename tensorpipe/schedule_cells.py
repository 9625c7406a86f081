"""A run's cells: what one device does for one stage on one tick.

The schedule engine (schedule_engine.py) runs a compiled table tick by
tick; on each tick a device runs at most one cell of one of its stages:

  F  the stage's forward pass of micro-batch t: its input from the stacked
     inputs (stage 0) or the previous stage's ring, kept in a boundary
     slot (s > 0, where the end keeps slots), its output written to the
     ring of the next stage (or handed to the end: the loss inside, or
     GPipe's saved outputs), its batch-norm statistics summed;
  B  the recomputed forward and its vjp: the input gradient written to
     the previous stage's ring (or handed to the end at stage 0), the
     weight gradients summed;
  I  B without the weight ops' weight gradients: each weight op's input x
     and output gradient dz go to the stash;
  W  the weight ops' weight gradients from a stash entry (emptied as it
     is read: `ReadStash`), summed.

`Cells` holds one run's facts (stages, thetas, specs, the program, the
end, the gradient sum) and its cells, each a method from a stage's loop
state (`schedule_ends.StageState`) to (new state, timeline stamps). The
cells use the cell algebra (cell_algebra: `CellCall`,
`TapedCall`, `Vjp`, `WeightGrads`, `AccumulateAt`) and the end's hooks
(schedule_ends); `after` holds the tensors a cell's sums wait for
where they are added outside the cell (`schedule_engine._Gates`).

Each F, B and I cell's stage call (and vjp) is a function of its own,
not inlined (`_Cell`, `schedule_program.ISOLATED_CELLS`): Grappler
optimizes it alone, so it gives the same bits in a loop body, a ramp run
once or one pass (README "Cells in their own functions"). In one
process a B cell adds its weight gradients to the running sums inside
its function (`Cells.sums_in_cell`, sequential sums only; its `after` is
then not needed: nothing outside the function can be merged with them);
an I or W cell's sums, and every sum across processes, are added outside
it, after `after`.
"""

from typing import Any, List, Tuple

from absl import logging
import tensorflow as tf

from tensorpipe import cell_algebra
from tensorpipe import devices as devices_lib
from tensorpipe import grad_sum
from tensorpipe import pipeline_stage
from tensorpipe import py_utils
from tensorpipe import schedule_ends
from tensorpipe import schedule_program
from tensorpipe import timeline


def Ring(ring, specs) -> List[Any]:
  """A ring's initial state: zeros, or TensorArrays of zeros."""
  if ring.depth == 1:
    return cell_algebra.Zeros(specs)
  return [tf.TensorArray(s.dtype, size=ring.depth, element_shape=s.shape)
          .unstack(tf.zeros([ring.depth] + s.shape.as_list(), s.dtype))
          for s in specs]


def Write(ring, buffers, index, values) -> List[Any]:
  if ring.depth == 1:
    return list(values)
  return [ta.write(index, v) for ta, v in zip(buffers, values)]


def StashSpecs(weight_ops) -> List[tf.TensorSpec]:
  """What a stash entry holds, in order: each weight op's x, then its z
  (whose gradient dz is kept)."""
  return [spec for op in weight_ops for spec in (op.x, op.z)]


def StashArrays(weight_ops, num_slots: int) -> List[tf.TensorArray]:
  """A stage's I-to-W stash: per weight op a TensorArray of its inputs x
  and one of its output gradients dz, `num_slots` entries each, of any
  shape (`ReadStash` empties an entry it read)."""
  return [tf.TensorArray(spec.dtype, size=num_slots, infer_shape=False)
          for spec in StashSpecs(weight_ops)]


def ReadStash(weight_ops, stash, slot) -> Tuple[List[Any], List[Any]]:
  """(x, dz of each weight op, in `StashArrays` order; the stash with
  that entry emptied).

  An entry that stays in its TensorArray after its W cell keeps its
  tensors alive until the next I cell writes the slot: an I cell in a
  function of its own makes all its outputs before the write, so the
  device held two micro-batches' stashes where the table has one
  (dense32mem, K=1, T=4, recompute: the allocator's peak 136.8 MiB
  against 73.1 with the entry emptied under ZB-H1, 124.1 against 75.1
  under ZB-V; README, "Memory against TF's allocator"). The entry
  becomes an empty tensor (the arrays take any shape), after the reads.
  """
  specs = StashSpecs(weight_ops)
  kept = []
  for ta, spec in zip(stash, specs):
    value = ta.read(slot)
    value.set_shape(spec.shape)
    kept.append(value)
  with tf.control_dependencies(kept):
    emptied = [ta.write(slot, tf.zeros([0], spec.dtype))
               for ta, spec in zip(stash, specs)]
  return kept, emptied


class Cells:
  """One run's facts and its cells (F, B or I, W), each a method that
  takes a stage's state and returns (new state, timeline stamps)."""

  def __init__(self, call: pipeline_stage.PipelineCall, program, end, acc,
               first, last):
    stages, thetas, specs = call.stages, call.thetas, call.specs
    mb_size = call.mb_size
    self.stages, self.thetas, self.specs = stages, thetas, specs
    self.flat_stacked, self.devices = call.flat_stacked, call.devices
    self.program, self.end, self.acc, self.mb_size = program, end, acc, mb_size
    self.first, self.last = first, last
    self.num_s, self.num_d = len(stages), program.num_devices
    self.num_mb = program.table.num_micro_batches
    self.probe = timeline.ActiveProbe()
    # One switching loop over the run: a recorded step's, and TF's
    # autodiff of GPipe's forward loop. Else, with stages in other
    # processes (schedule_program.UNROLL_ACROSS_PROCESSES_CELLS), the
    # run's ticks in one pass and no loop (inline: schedule_program.
    # Loops(unroll_all) makes it one ramp, which schedule_engine.
    # _WhileLoop runs once), where it has few enough cells.
    self.one_loop = self.probe.recording or bool(end.autodiff)
    processes = devices_lib.NumProcesses(call.devices)
    self.inline = not self.one_loop and schedule_program.UnrollsAll(
        program.branch, first, last, processes)
    if (processes > 1 and not self.inline and
        schedule_program.UNROLL_ACROSS_PROCESSES_CELLS):
      cells = schedule_program.NumCells(program.branch, first, last)
      cap = schedule_program.UNROLL_ACROSS_PROCESSES_CELLS
      why = ('a recorded step' if self.probe.recording else
             "TF's autodiff of the loop (GPipe with recompute=False or "
             "recompute_impl='tf_recompute_grad')" if end.autodiff else
             f'{cells} cells > schedule_program.'
             f'UNROLL_ACROSS_PROCESSES_CELLS={cap}')
      logging.warning(
          'Stages in %d processes run ticks [%d, %d) of %r in '
          'tf.while_loops (%s): each iteration costs a round of messages '
          'between the processes.', processes, first, last,
          program.table.name, why)
    # Where the stages share a process, a B cell adds its weight gradients
    # to the stage's running sums inside its function (`Backward`); across
    # processes the sums stay outside (see there). Same ops, same bits.
    self.sums_in_cell = (processes == 1 and acc is not None and
                         acc.mode == 'sequential')
    dev_of = program.stage_device
    self.on_device = [[s for s in range(self.num_s) if dev_of[s] == d]
                      for d in range(self.num_d)]
    acts = [program.table.grid[d][first:last] for d in range(self.num_d)]
    # Per device, the branches its cells in the run take.
    self.used = [sorted({b for b in program.branch[d][first:last] if b})
                 for d in range(self.num_d)]
    self.runs_f = {a.stage for row in acts for a in row if a and a.op == 'F'}
    self.runs_b = {a.stage for row in acts for a in row
                   if a and a.op in 'BIW'}
    self.runs_i = {a.stage for row in acts for a in row if a and a.op == 'I'}
    if self.runs_i and acc is not None and acc.mode != 'sequential':
      raise ValueError(f'grad_sum={acc.mode!r} does not run with schedule '
                       f'{program.table.name!r}, which splits the backward '
                       "pass (I, W); use grad_sum='sequential'")
    # Per stage that runs I cells, its weight ops (py_utils.WeightOp).
    self.weight_ops = {s: cell_algebra.TraceWeightOps(
        stages[s], specs[s], thetas[s], mb_size) for s in self.runs_i}
    self.masked = end.autodiff == 'recompute_grad'
    if self.masked and any(
        {(a.op, a.stage) for a in row if a} != {('F', s)}
        for row, s in zip(acts, range(self.num_d))):
      raise ValueError('autodiff=recompute_grad runs forward cells of one '
                       'stage per device only (stage d on device d)')
    # Masked bubbles write to an extra slot that nothing reads.
    self.extra = 1 if self.masked else 0
    self.calls = {s: cell_algebra.CellCall(stages[s], specs[s], thetas[s],
                                           mb_size, end.autodiff)
                  for s in self.runs_f}

  def _Cell(self, s: int, cell: Any, inline: bool = False) -> Any:
    """`cell` (..., t) as a function of its own on stage s's device, not
    inlined (`schedule_program.ISOLATED_CELLS`; not for a forward cell
    that TF's autodiff differentiates, `inline`, nor eagerly, where
    nothing is optimized), t passed as a tensor (one trace whatever its
    value) through PlaceholderWithDefault (not a constant even where the
    cell is fixed, a ramp or one pass, so Grappler neither specializes
    the function on it nor folds it).

    Its ops are named as in a fresh graph, the same at every call site
    (no caller's name scope, so no replica prefix): given the caller's
    scope, a Transformer LM's cells in one pass parted from the looped
    engine's again, Grappler's rewrites depending on the node names."""
    if inline or not self.Isolated():
      return cell
    device = self.stages[s].device

    def OnDevice(*args):
      with tf.device(device):  # the function's own ops
        return cell(*args)
    fn = py_utils.IsolatedFunction(OnDevice)
    return lambda *args: fn(*args[:-1], tf.raw_ops.PlaceholderWithDefault(
        input=tf.convert_to_tensor(args[-1], tf.int32), shape=[]))

  @staticmethod
  def Isolated() -> bool:
    """Whether `_Cell` makes a cell a function of its own (traced in a
    graph with `schedule_program.ISOLATED_CELLS` on)."""
    return schedule_program.ISOLATED_CELLS and not tf.executing_eagerly()

  def InitialState(self, s: int) -> schedule_ends.StageState:
    """Stage s's loop state before the run (on its device)."""
    spec, program = self.specs[s], self.program
    end_tas = self.end.EndBuffers(s, self.num_s, spec,
                                  self.num_mb + self.extra)
    return schedule_ends.StageState(
        out=(Ring(program.out_rings[s], spec.out_specs)
             if s < self.num_s - 1 and s in self.runs_f else []),
        dx=(Ring(program.dx_rings[s], spec.DxSpecs())
            if s > 0 and s in self.runs_b else []),
        slots=(schedule_ends.TensorArrays(
            spec.in_specs, program.num_slots[s] + self.extra)
               if s > 0 and self.end.keeps_slots else []),
        stats=([cell_algebra.Zeros(v) for v in spec.StatsSpecs()]
               if s in self.runs_f else []),
        dtheta=(self.acc.Init(tf.nest.flatten(self.thetas[s]))
                if s in self.runs_b else []),
        loss=(cell_algebra.Zeros(self.end.loss_specs)
              if s == self.num_s - 1 else []),
        ends=end_tas,
        stash=(StashArrays(self.weight_ops[s], program.num_stash[s])
               if s in self.runs_i else []))

  def Forward(self, s, state, x_in, t, slot, w, valid=None, after=()):
    """Stage s's forward cell of micro-batch t; (state, stamps). `after`:
    the tensors its sums wait for (`_Gates`)."""
    probe = self.probe
    if valid is not None:
      slot = tf.where(valid, slot, self.program.num_slots[s])
    x = ([tf.gather(v, t) for v in self.flat_stacked] if s == 0
         else list(x_in))
    slots = state.slots
    if s > 0 and self.end.keeps_slots:
      slots = [ta.write(slot, v) for ta, v in zip(state.slots, x)]
    start = probe.Stamp(x)
    with tf.control_dependencies(start):
      y, stats = self._Cell(s, self.calls[s], bool(self.end.autodiff))(x, t)
      if valid is not None:
        stats = tf.nest.map_structure(
            lambda v: v * tf.cast(valid, v.dtype), stats)
      with tf.control_dependencies(after):
        stats = cell_algebra.Add(state.stats, stats)
      state = state._replace(slots=slots, stats=stats)
      if s < self.num_s - 1:
        state = state._replace(
            out=Write(self.program.out_rings[s], state.out, w, y))
      else:
        with tf.control_dependencies(after):
          state = self.end.AfterLastForward(state, y, t, valid, self.num_mb)
    # A forward row of the timeline is (start, -1, end).
    stamps = start + probe.Missing(1) + probe.Stamp([y, stats, state.loss])
    if valid is not None:
      stamps = probe.Mask(valid, stamps)
    return state, stamps

  def Backward(self, s, state, dy_in, t, slot, w, stash_slot=None,
               after=()):
    """Stage s's recompute + vjp of micro-batch t; (state, stamps).

    With `stash_slot` (an I cell) only the gradients of the stage's
    inputs and of its weight ops' outputs z are taken (weights outside
    weight ops get theirs here too); each op's (x, dz) goes to the stash.
    `after`: as in `Forward` (unused where the sums are inside the cell:
    `sums_in_cell`).
    """
    probe, spec, end = self.probe, self.specs[s], self.end
    theta_flat = tf.nest.flatten(self.thetas[s])
    split = stash_slot is not None
    watched = cell_algebra.Watched(
        len(theta_flat), self.weight_ops.get(s, []), split)
    x = end.BackwardInputs(self, s, state, t, slot)
    last = s == self.num_s - 1
    dy = end.LastDys(spec, t) if last else list(dy_in)
    start = probe.Stamp(x + dy)

    # A B cell in a function of its own adds its weight gradients to the
    # running sums inside it (`sums_in_cell`): added after the call, each
    # sum read its gradient back cold, the stage's whole weight size per
    # cell (dense16, K=1, T=8, recompute: 149 against 166 ms a step, of
    # 136 before the cells were isolated). Inside a function Grappler
    # cannot merge them with another tick's additions, so they need no
    # gate (`after`); each gradient is kept apart from the tape's own
    # additions (`grad_sum.ApartIfSum`: a weight read twice in the stage).
    # Across processes they stay outside: passed through the function,
    # the sums cost the client of stages in other processes some 3 ms of
    # CPU per cell (dense16, 1F1B, two servers: 167 ms a step against
    # 127).
    sums_in = not split and self.sums_in_cell and self.Isolated()

    def Cell(x, dy, dtheta, t):
      # Stage 0's inputs are data: no gradient unless asked for.
      cell = cell_algebra.TapedCall(
          self.stages[s], spec, self.thetas[s], x, t, self.mb_size,
          watch_inputs=s > 0 or end.input_grads, watched=watched,
          split=split, head=(end.LastHead(spec, t) if last else
                             cell_algebra.FloatOutputs(spec)),
          dys=dy, deps=start)
      mid = probe.Stamp(cell.ys)
      zs = [call.z for call in cell.calls] if split else []
      if split and len(zs) != len(self.weight_ops[s]):
        raise AssertionError(f'stage {s} made {len(zs)} weight ops, '
                             f'traced {len(self.weight_ops[s])}')
      with tf.control_dependencies(mid):
        dxs, dzs, dws = cell_algebra.Vjp(
            cell.tape, cell.ys,
            (cell.xs, zs, [theta_flat[i] for i in watched]), cell.dys)
      if sums_in:
        dws = self.acc.Add(dtheta, [grad_sum.ApartIfSum(g) for g in dws], t)
      return dxs, dzs, dws, [call.x for call in cell.calls], mid
    dxs, dzs, dws, op_xs, mid = self._Cell(s, Cell)(
        x, dy, list(state.dtheta) if sums_in else [], t)
    if sums_in:
      dtheta = dws
    else:
      with tf.control_dependencies(after):
        dtheta = (cell_algebra.AccumulateAt(state.dtheta, watched, dws)
                  if split else self.acc.Add(state.dtheta, dws, t))
    stash = state.stash
    if split:
      kept = [v for op_x, dz in zip(op_xs, dzs) for v in (op_x, dz)]
      for v, sp in zip(kept, StashSpecs(self.weight_ops[s])):
        # (the stash arrays take any shape)
        if not v.shape.is_compatible_with(sp.shape):
          raise AssertionError(f'stage {s} stashes {v.shape} where its '
                               f'weight op was traced with {sp.shape}')
      stash = [ta.write(stash_slot, v) for ta, v in zip(state.stash, kept)]
    dx, end_tas = state.dx, state.ends
    if s > 0:
      dx = Write(self.program.dx_rings[s], state.dx, w, dxs)
    else:
      end_tas = end.AfterFirstBackward(state, t, dxs)
    stamps = start + mid + probe.Stamp([dxs, dtheta])
    return state._replace(dx=dx, dtheta=dtheta, ends=end_tas,
                          stash=stash), stamps

  def WeightGrad(self, s, state, stash_slot, after=()):
    """Stage s's W cell: each weight op's dw = vjp of fn(x, .) with dz,
    from the (x, dz) its I cell kept; (state, stamps). `after`: as in
    `Forward`."""
    kept, stash = ReadStash(self.weight_ops[s], state.stash, stash_slot)
    start = self.probe.Stamp(kept)
    with tf.control_dependencies(start + list(after)):
      dtheta = cell_algebra.WeightGrads(
          self.weight_ops[s], self.thetas[s], kept[0::2], kept[1::2],
          state.dtheta)
    # A W row of the timeline is (start, -1, end).
    stamps = start + self.probe.Missing(1) + self.probe.Stamp(dtheta)
    return state._replace(dtheta=dtheta, stash=stash), stamps
