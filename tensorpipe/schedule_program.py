"""A schedule table compiled for the TF engine: what each device does per tick.

`schedules.Schedule` says which action (op, micro-batch, stage) each device
runs on each tick. `Compile` turns a validated table into the constant
tables and loop plan that `schedule_engine.Run` builds its tf.while_loops
from, in pure Python (no TF), so every decision here has a literal test:

- Branches. Device d's distinct (op, stage) pairs, in first-use order, are
  its cells; branch 0 is idle. `branch[d][c]` is device d's cell on tick c.
- Micro-batch labels. The engine runs table label m on mini-batch
  micro-batch `real[m]`, chosen so that stage 0's backward cells take the
  micro-batches T-1, ..., 0 in tick order: every stage that runs its
  backward cells in stage 0's order then sums its weight gradients in the
  order of GPipe's backward pass, so the schedules' gradients are equal bit
  for bit (`Labels` has the reason). 1F1B's backward runs
  labels 0 .. T-1, so label m is micro-batch T-1-m there; GPipe's runs
  T-1 .. 0, so its labels are the micro-batches.
- Boundary slots. Stage s > 0 keeps micro-batch m's input from its F to its
  B in slot `table.Slots()[(s, m)]`; `slot[d][c]` is the slot of device d's
  cell on tick c.
- Rings. Stage s's forward output travels to stage s + 1 (and stage s's
  input gradient to stage s - 1) through a buffer in the producer's loop
  state. A consumer reads on a later tick, so the buffer must hold each
  value until then: with depth R the producer's j-th output goes to entry
  j mod R and must be read before output j + R is written. `Ring` finds the
  least R. In GPipe and 1F1B every consumer reads on the very next
  producer tick (R = 1: one latched tensor); in
  interleaved 1F1B a device may run forwards of its other stages before the
  next device takes the output, so some edges need R = 2 or more.
- Loops. Ticks on which every device works and whose branches repeat with
  a fixed period p run as a loop of p ticks per iteration with each
  device's cell fixed in the graph (`steady`); the ticks before and after
  run one tick per iteration and switch on `branch` (tf.switch_case), whose
  lowered form visits every op of every branch on every tick; under a
  loss-inside table the ramps of at most `RAMP_TICKS` ticks (48 by
  default; 0: none) run once instead, with each tick's cells fixed and no
  loop. With stages in other processes, a run of at most
  `UNROLL_ACROSS_PROCESSES_CELLS` cells (512 by default; 0: off) is one
  such pass over all its ticks, without a loop (`UnrollsAll`).
  Where a device runs one (op, stage) twice in an iteration (interleaved
  1F1B's period: F and B of one stage alternate), `Barriers` makes the
  second wait for the state the first left: its clock or micro-batch, and
  every later sum of the device in the iteration that is added outside a
  cell (`schedule_engine._Gates`: a cell may read neither), so Grappler
  finds no two additions of one sum in a loop body to fuse into an AddN
  (which adds in another order); a B cell's sums in one process are
  inside its function, where nothing else is. A ramp waits so after every
  cell of a device (`LoopBarriers`).
"""

import contextlib
from typing import (Collection, ContextManager, Dict, Iterator, List,
                    NamedTuple, Optional, Sequence, Tuple)

from tensorpipe import schedules

IDLE = 0
# Periods tried for the steady loop, in units of ticks (more gives a bigger
# loop body, traced once).
MAX_PERIOD = 16
# A loss-inside table's switching loops of at most this many ticks (the
# ramps before and after the steady loop) run once with every tick's cells
# fixed in the graph, without a loop (`Loops`, unroll_ramps): a lowered
# switch_case visits every op of every branch on every tick. Measured
# (tools/benchmark --ramp_check, README "The ramps without a switch").
# Exact since the F, B and I cells are functions of their own
# (ISOLATED_CELLS): inlined, fixed ramps moved a Transformer's
# embedding gradient under ZB-H1 by an ulp, and in a one-iteration
# tf.while_loop a batch-norm ResNet's (K=4, T=4; Grappler's constant
# folding), so a ramp runs without a loop. `RampTicks(0)` keeps every
# ramp switching for what is traced inside.
FIXED_RAMP_TICKS = 48
RAMP_TICKS = FIXED_RAMP_TICKS
# Stages in other processes (distribute.ConnectRemoteStages): each
# tf.while_loop iteration there costs a round of messages between the
# processes (the `tiny` model, K=2, T=4: about 2 ms an iteration on
# 127.0.0.1), so the engine runs a run of at most this many cells (all
# devices' non-idle cells together) as one pass with every tick's cells
# fixed and no loop (`Loops`, unroll_all; `UnrollsAll`): K=2, T=8, two
# servers, 1.1-1.7x the one-process step against 1.6-3.4x with loops
# (README "Stages in other processes"). Exact since the F, B and I cells are
# functions of their own (ISOLATED_CELLS: inlined, a Transformer LM's
# attention and embedding gradients moved by an ulp against the looped
# engine's). The graph grows with the cells, so a longer run keeps its
# loops (and the engine logs why). `UnrollAcrossProcesses(0)` keeps the
# loops for what is traced inside.
ONE_PASS_CELLS = 512
UNROLL_ACROSS_PROCESSES_CELLS = ONE_PASS_CELLS
# Each F, B and I cell's stage call (and vjp) is a function of its own
# (tf.function, not inlined; schedule_cells.Cells._Cell): Grappler
# optimizes it alone, so its bits do not depend on what surrounds it: a
# loop body with a switch, a steady loop, a ramp run once without a loop,
# a whole run in one pass. Inlined, the arithmetic optimizer's
# MinimizeBroadcasts reordered a product in one copy of a cell and not in
# another (a Transformer LM's attention: the softmax's gradient times
# 1 / sqrt(d)), and a batch-norm ResNet's forward cells in fixed ramps
# parted from the looped engine's: gradients an ulp off GPipe's. The I/W
# split's W cells (a product per weight op) stay inline: isolated, they
# cost ZB-V a fifth of its step (dense16, K=2, T=8). A cell's outputs
# leave together: its input gradient waits for its weight gradients
# (README "Cells in their own functions": what it costs).
ISOLATED_CELLS = True


def RampTicksOf(table: schedules.Schedule) -> int:
  """The `Loops` unroll_ramps the engine runs `table` with: RAMP_TICKS for
  a loss-inside table, else 0 (GPipe's loops keep their switch)."""
  return RAMP_TICKS if table.loss_inside else 0


def UnrollsAll(branch: Sequence[Sequence[int]], first: int, end: int,
               num_processes: int) -> bool:
  """Whether the engine runs ticks [first, end) of `branch` (a `Program`'s)
  on devices in `num_processes` processes as one pass with every cell
  fixed: across processes, up to UNROLL_ACROSS_PROCESSES_CELLS cells."""
  return num_processes > 1 and NumCells(branch, first, end) <= (
      UNROLL_ACROSS_PROCESSES_CELLS)


def NumCells(branch: Sequence[Sequence[int]], first: int, end: int) -> int:
  """The non-idle cells of all devices on ticks [first, end)."""
  return sum(b != IDLE for row in branch for b in row[first:end])


@contextlib.contextmanager
def _Set(name: str, value: int) -> Iterator[None]:
  """This module's global `name` = value for what is traced inside (the
  engine reads it at trace time), then back."""
  old = globals()[name]
  globals()[name] = value
  try:
    yield
  finally:
    globals()[name] = old


def UnrollAcrossProcesses(cells: int) -> ContextManager[None]:
  """`UNROLL_ACROSS_PROCESSES_CELLS` = cells for what is traced inside
  (0: off, the loops)."""
  return _Set('UNROLL_ACROSS_PROCESSES_CELLS', cells)


def IsolatedCells(on: bool) -> ContextManager[None]:
  """`ISOLATED_CELLS` = on for what is traced inside (cell_flops traces
  with it off, so a cell's ops sit in its switch_case branch)."""
  return _Set('ISOLATED_CELLS', on)


def RampTicks(ticks: int) -> ContextManager[None]:
  """`RAMP_TICKS` = ticks for what is traced inside. 0: every ramp
  switches on the table, each cell a branch function of its own
  (cell_flops finds the cells there; tools/benchmark --ramp_check times
  the two forms)."""
  return _Set('RAMP_TICKS', ticks)


class Ring(NamedTuple):
  """One boundary edge's buffer: depth, producer's write and consumer's read
  entry per tick (0 on ticks without one)."""
  depth: int
  write: List[int]
  read: List[int]


class Loop(NamedTuple):
  """Ticks [first, end); steady: per tick of one iteration (one or more
  periods), per device, its branch, or () for a switching loop (one tick
  per iteration); ramp: a switching loop run once with its cells fixed
  instead (`Loops`, unroll_ramps; with unroll_all every tick)."""
  first: int
  end: int
  steady: Tuple[Tuple[int, ...], ...]
  ramp: bool = False


class Program(NamedTuple):
  """What `schedule_engine.Run` builds from (see the module docstring).

  Attributes:
    table: the validated schedule.
    stage_device: per stage, its device index.
    cells: per device, its (op, stage) cells; branch b > 0 is cells[b - 1].
    branch: per device, per tick, its branch (0 idle).
    micro_batch: per device, per tick, the mini-batch micro-batch its cell
      works on (0 when idle).
    slot: per device, per tick, the boundary slot its cell writes (F) or
      reads (B, I) (0 when it has none).
    num_slots: per stage, the boundary inputs it keeps (0 for stage 0).
    stash: per device, per tick, the I-to-W stash slot its I cell writes or
      its W cell reads (0 otherwise).
    num_stash: per stage, its stash slots (0 for stages that run B).
    out_rings: per stage s < S - 1, the ring of its outputs to stage s + 1.
    dx_rings: per stage s > 0, the ring of its input gradients to s - 1.
    real: per table label m, the micro-batch it runs.
    loops: the loops over all ticks, in order, every ramp switching (as
      the engine runs them unless fixed ramps are on: `RampTicksOf`).
  """
  table: schedules.Schedule
  stage_device: List[int]
  cells: List[List[Tuple[str, int]]]
  branch: List[List[int]]
  micro_batch: List[List[int]]
  slot: List[List[int]]
  num_slots: List[int]
  stash: List[List[int]]
  num_stash: List[int]
  out_rings: List[Optional[Ring]]
  dx_rings: List[Optional[Ring]]
  real: List[int]
  loops: List[Loop]

  @property
  def num_devices(self) -> int:
    return self.table.num_devices

  @property
  def num_stages(self) -> int:
    return self.table.num_stages

  @property
  def num_ticks(self) -> int:
    return self.table.num_ticks


def Labels(table: schedules.Schedule) -> List[int]:
  """Per label m, the micro-batch it runs (module docstring: labels).

  Float sums in GPipe's order give GPipe's bits, so the schedules'
  gradients equal GPipe's exactly rather than to rounding, and training
  runs do not drift apart (1F1B did, by 5e-3 in the loss after 14 steps of
  a batch-norm ResNet in float32, when it summed in the order 0 .. T-1).
  """
  tt = table.num_micro_batches
  dev = table.StageDevice()[0]
  order = [a.micro_batch for a in table.Orders()[dev]
           if a.stage == 0 and a.op in 'BI']
  if not order:  # forward cells only (inference): the labels as they are
    return list(range(tt))
  real = [0] * tt
  for i, m in enumerate(order):
    real[m] = tt - 1 - i
  return real


def MakeRing(produced: Sequence[Tuple[int, int]],
             consumed: Dict[int, int], num_ticks: int) -> Ring:
  """The least-depth ring for one edge.

  Args:
    produced: (tick, micro-batch) of the producer's cells, in tick order.
    consumed: micro-batch -> the tick its consumer cell reads it.
    num_ticks: the table's ticks.
  """
  n = len(produced)
  reads = [consumed[m] for _, m in produced]
  depth = 1
  while any(reads[j] > produced[j + depth][0] for j in range(n - depth)):
    depth += 1
  write, read = [0] * num_ticks, [0] * num_ticks
  for j, ((c, _), r) in enumerate(zip(produced, reads)):
    write[c] = j % depth
    read[r] = j % depth
  return Ring(depth, write, read)


def _Rings(table: schedules.Schedule):
  """(out_rings, dx_rings) per stage (module docstring: rings)."""
  ss = table.num_stages
  ticks = sorted(((c, a) for a, (_, c) in table.Ticks().items()),
                 key=lambda x: x[0])
  f_of = {s: [(c, a.micro_batch) for c, a in ticks
              if a.op == 'F' and a.stage == s] for s in range(ss)}
  b_of = {s: [(c, a.micro_batch) for c, a in ticks
              if a.op in 'BI' and a.stage == s] for s in range(ss)}
  out_rings, dx_rings = [], []
  for s in range(ss):
    out_rings.append(MakeRing(f_of[s], {m: c for c, m in f_of[s + 1]},
                              table.num_ticks) if s < ss - 1 else None)
    dx_rings.append(MakeRing(b_of[s], {m: c for c, m in b_of[s - 1]},
                             table.num_ticks) if s > 0 else None)
  return out_rings, dx_rings


def SteadyRun(branch: Sequence[Sequence[int]], max_period: int = MAX_PERIOD
              ) -> Optional[Tuple[int, int, int]]:
  """(first, end, period) of the longest periodic busy run of ticks, or None.

  On ticks [first, end) (two or more) every device works (no idle cell),
  every device's branch repeats with the period, and (end - first) is a
  multiple of it. A period in which a device runs one (op, stage) twice
  must repeat (two periods or more): a run of distinct ticks traced once
  is not a loop. Ties go to the earlier run, then the smaller period. In
  1F1B this is the ticks 2K - 1 .. 2T - 2 with period 2 (a forward and a
  backward cell each); in interleaved 1F1B with K=2, v=2, T=8 ticks 4 ..
  28 with period 8 (each device's F and B of one stage alternate).
  """
  kk, num_ticks = len(branch), len(branch[0])
  busy = [all(branch[d][c] != IDLE for d in range(kk))
          for c in range(num_ticks)]
  best = None
  for p in range(1, max_period + 1):
    for c in range(num_ticks - p + 1):
      if not all(busy[c:c + p]):
        continue
      end = c + p
      while end + p <= num_ticks and all(busy[end:end + p]) and all(
          branch[d][end + i] == branch[d][end + i - p]
          for d in range(kk) for i in range(p)):
        end += p
      repeats = any(len(set(branch[d][c:c + p])) < p for d in range(kk))
      if (end - c >= (2 * p if repeats else 2) and
          (best is None or end - c > best[1] - best[0])):
        best = (c, end, p)
  return best


def Barriers(steady: Sequence[Sequence[int]],
             every_tick: bool = False,
             after: Sequence[Collection[int]] = ()
             ) -> List[Tuple[bool, ...]]:
  """Per tick i of a steady loop's iteration, per device d: whether d's
  tick i + 1 waits for the state its tick i left (module docstring:
  loops): where d runs on tick i + 1 an (op, stage) it ran since its last
  barrier, or with `every_tick` any cell after one it ran since then, or
  where d's branch on tick i is in `after[d]`. Between the periods of an
  unrolled iteration, and never after the iteration's last tick (the
  loop's own iterations are ordered).
  """
  kk = len(steady[0]) if steady else 0
  seen: List[set] = [set() for _ in range(kk)]
  out = []
  for i, ops in enumerate(steady):
    nxt = steady[i + 1] if i + 1 < len(steady) else None
    row = []
    for d in range(kk):
      seen[d].add(ops[d])
      wait = nxt is not None and nxt[d] != IDLE and (
          nxt[d] in seen[d] or (every_tick and bool(seen[d] - {IDLE})) or
          (bool(after) and ops[d] in after[d]))
      if wait:
        seen[d] = set()
      row.append(wait)
    out.append(tuple(row))
  return out


def LoopBarriers(loop: Loop, cells: Sequence[Sequence[Tuple[str, int]]]
                 ) -> List[Tuple[bool, ...]]:
  """`Barriers` of a loop with fixed cells (`cells`: `Program.cells`).
  A ramp (`RAMP_TICKS`) waits after every cell of a device: the next
  one's micro-batch and sums wait for the state it left, as the
  switching loop it replaces ordered them (a cell that reads neither can
  still start on its data). Waiting only before repeats, a ramp's cells
  ran as their data allowed: ZB-V with recompute, K=2, measured 8-20%
  above the switching ramps' peak, and no faster. A steady loop waits
  before repeats and after a W cell: the device's later cells of the
  iteration start once the W cell's stash entry is gone. Without that
  wait ZB-V's next I cell, of the device's other stage, ran beside the W
  cell and the device held both stages' stashes (dense32mem, K=1, T=4,
  recompute: the allocator's peak 76.6 MiB against 43.8 with it; the step
  time within the runs' noise: benchmarks/results/w_barrier/). On a
  device with two or more stages it also waits after a B cell: in
  interleaved 1F1B's period (F1 B1 F0 B0 at K=1) the two B cells work on
  different micro-batches, nothing else ordered them, and they ran side
  by side in some runs, each with its stage's recompute (conv16, K=1,
  T=8, oneDNN on: 11.3 MiB against 9.0-10.0 with the wait, 6.7 in the
  model; 6.5 with cell_algebra.ORDER_WEIGHT_GRADS too; step time
  within the runs' noise: benchmarks/results/b_wait/)."""
  waits_after = [('W', 'B') if len({s for _, s in row}) > 1 else ('W',)
                 for row in cells]
  after = [{b + 1 for b, (op, _) in enumerate(row) if op in ops}
           for row, ops in zip(cells, waits_after)]
  return Barriers(loop.steady, every_tick=loop.ramp, after=after)


def Loops(branch: Sequence[Sequence[int]], first: int, end: int,
          one_loop: bool = False, unroll_ticks: int = 1,
          unroll_ramps: int = 0, unroll_all: bool = False) -> List[Loop]:
  """The loops over ticks [first, end) (module docstring: loops).

  The steady loop runs max(1, unroll_ticks // p) periods per iteration
  (all of them if it has fewer); the periods its iterations leave over run
  at the end of the switching loop before it. A switching loop of at most
  `unroll_ramps` ticks becomes one iteration with every tick's cells
  fixed (idle cells included): no switch, each of its cells traced. With
  `unroll_all` (and not one_loop) every tick is one such ramp.
  """
  sliced = [row[first:end] for row in branch]
  run = (None if one_loop or unroll_all or end <= first else
         SteadyRun(sliced))
  if run is None:
    loops = [Loop(first, end, ())]
  else:
    a, b, p = run
    per = min(max(1, unroll_ticks // p), (b - a) // p)
    a += ((b - a) // p % per) * p
    steady = tuple(tuple(sliced[d][a + i] for d in range(len(sliced)))
                   for i in range(p)) * per
    loops = [Loop(first, first + a, ()), Loop(first + a, first + b, steady),
             Loop(first + b, end, ())]
  out = []
  for loop in loops:
    if loop.end <= loop.first:
      continue
    if not one_loop and not loop.steady and (
        unroll_all or loop.end - loop.first <= unroll_ramps):
      loop = Loop(loop.first, loop.end, tuple(
          tuple(row[c] for row in branch)
          for c in range(loop.first, loop.end)), ramp=True)
    out.append(loop)
  return out


def Compile(table: schedules.Schedule, one_loop: bool = False) -> Program:
  """The `Program` of a validated table.

  Args:
    table: a schedule that passed `Validate()`.
    one_loop: run every tick in one switching loop (the timeline's
      recorded step: see timeline.Unordered).
  """
  kk, ticks = table.num_devices, table.num_ticks
  real = Labels(table)
  slots = table.Slots()
  stage_device = [table.StageDevice()[s] for s in range(table.num_stages)]
  cells: List[List[Tuple[str, int]]] = [[] for _ in range(kk)]
  branch = [[IDLE] * ticks for _ in range(kk)]
  micro_batch = [[0] * ticks for _ in range(kk)]
  slot = [[0] * ticks for _ in range(kk)]
  stash_of = table.Stash()
  stash = [[0] * ticks for _ in range(kk)]
  for d, row in enumerate(table.grid):
    for c, a in enumerate(row):
      if a is None:
        continue
      key = (a.op, a.stage)
      if key not in cells[d]:
        cells[d].append(key)
      branch[d][c] = 1 + cells[d].index(key)
      micro_batch[d][c] = real[a.micro_batch]
      if a.stage > 0:
        # (Forward cells of a forward-only table keep no input.)
        slot[d][c] = slots.get((a.stage, a.micro_batch), 0)
      if a.op in 'IW':
        stash[d][c] = stash_of[(a.stage, a.micro_batch)]
  num_slots = [0] + [table.NumSlots()[s] for s in range(1, table.num_stages)]
  out_rings, dx_rings = _Rings(table)
  num_stash = [table.StashSlots()[s] for s in range(table.num_stages)]
  return Program(table, stage_device, cells, branch, micro_batch, slot,
                 num_slots, stash, num_stash, out_rings, dx_rings, real,
                 Loops(branch, 0, ticks, one_loop))
