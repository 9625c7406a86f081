"""Pipeline schedules as data: one table per schedule.

A schedule says, for each device and clock tick, which action the device
runs: (op, micro-batch, stage), op F (forward), B (full backward), I (input
gradient only) or W (weight gradient only), stage a virtual stage (a device
may hold several: round-robin for interleaved 1F1B (Narayanan et al. 2021,
arXiv 2104.04473), a V for ZB-V (Qi et al. 2023, arXiv 2401.10241)). The
table is the one definition a schedule has: a builder writes it
(`schedule_builders.py`, which also holds the registry: `Build`,
`Register`, `Names`), `Validate` checks it, the engine compiles it
(`schedule_program.py`), the simulator and the timeline read it, and
`ToCsv` / `FromCsv` exchange it with torch.distributed.pipelining's
compute-only per-rank CSV, so a table made there, or by the zero-bubble
authors' ILP, reads here (`schedule_csv.FromCsvParam`).

Pure data: this module imports no other TensorPipe module.
"""

import csv as _csv
import io as _io
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple


# -- Schedules as data ------------------------------------------------------
#
# Tick rule (what `Validate` checks): an action may use only what actions on
# strictly earlier ticks produced, on any device. F(m, s) needs F(m, s - 1);
# B(m, s) and I(m, s) need F(m, s) and the input gradient of (m, s + 1) (its
# B or I; the last stage's loss is inside the pipeline); W(m, s) needs
# I(m, s). Every F(m, s) runs once, and every (m, s) has one B or one I and
# one W. A stage runs on one device.
#
# Example: 1F1B, K=2 devices, T=3 micro-batches (`Grid()`):
#
#   tick    0   1   2   3   4   5   6   7
#   dev 0   0F0 0F1 .   0B0 0F2 0B1 .   0B2
#   dev 1   .   1F0 1B0 1F1 1B1 1F2 1B2 .

OPS = ('F', 'B', 'I', 'W')
# torch.distributed.pipelining's communication and overlap actions, which
# a compute-only table does not hold (the engine places its own transfers).
_COMM_OPS = ('SEND_F', 'RECV_F', 'SEND_B', 'RECV_B', 'UNSHARD', 'RESHARD',
             'REDUCE_GRAD', 'OVERLAP_F_B')


class Action(NamedTuple):
  """One cell of a schedule: op 'F', 'B', 'I' or 'W' on (micro_batch, stage).

  str() is torch's action text, stage first: Action('I', 3, 1) is '1I3'.
  """
  op: str
  micro_batch: int
  stage: int

  def __str__(self) -> str:
    return f'{self.stage}{self.op}{self.micro_batch}'

  @staticmethod
  def FromStr(text: str, where: str = '') -> Optional['Action']:
    """Parses torch's '<stage><op><micro-batch>' text; '' is idle (None).

    Raises:
      ValueError: on a communication action or text that is no action.
    """
    text = text.strip()
    if not text:
      return None
    where = f'{where}: ' if where else ''
    if any(c in text for c in _COMM_OPS) or text.startswith('('):
      raise ValueError(
          f'{where}{text!r} is a communication or overlap action; TensorPipe '
          'reads only compute actions (F, B, I, W): write the table with '
          "torch's _dump_csv(format='compute_only')")
    digits = len(text) - len(text.lstrip('0123456789'))
    op, mb = text[digits:digits + 1], text[digits + 1:]
    if not digits or op not in OPS or not mb.isdigit():
      raise ValueError(
          f'{where}{text!r} is not an action; write <stage><op><micro-batch> '
          'with op one of F, B, I, W, e.g. 0F0 or 1I3')
    return Action(op, int(mb), int(text[:digits]))


def _Fail(schedule: 'Schedule', device: int, tick: int, what: str,
          fix: str) -> None:
  """Raises a ValueError naming device and tick, with the grid below it."""
  name = f'schedule {schedule.name!r}: ' if schedule.name else ''
  raise ValueError(f'{name}device {device}, tick {tick}: {what}; {fix}\n'
                   + schedule.Grid(mark=(device, tick)))


class Schedule:
  """A pipeline schedule as a table: grid[device][tick] is an Action or None.

    s = schedule_builders.Build('1f1b', num_devices=2, num_micro_batches=3)
    s.grid[1][2]          # Action('B', 0, 1), shown as 1B0
    s.Validate()          # raises ValueError naming device and tick
    s.ToCsv()             # torch.distributed.pipelining's compute-only CSV

  Attributes:
    grid: tuple (one per device) of tuples (one per tick, all rows as long
      as the longest) of Action or None.
    num_devices: K, the rows of the grid.
    num_ticks: the columns of the grid.
    num_stages: S, the virtual stages; stage s runs on one device.
    num_micro_batches: T.
    name: the builder's name or the CSV's, for messages.
    slots: None, or an explicit boundary-slot assignment
      {(stage, micro_batch): slot} that `Validate` checks (builders whose
      engine indexes slots by a rule pass it); None derives one (`Slots`).
  """

  def __init__(self, grid: Sequence[Sequence[Optional[Action]]],
               num_micro_batches: Optional[int] = None,
               num_stages: Optional[int] = None, name: str = '',
               slots: Optional[Dict[Tuple[int, int], int]] = None):
    rows = [list(r) for r in grid]
    if not rows:
      raise ValueError('got an empty grid; pass one list per device')
    width = max(len(r) for r in rows)
    self.grid = tuple(tuple(r + [None] * (width - len(r))) for r in rows)
    self.name = name
    self.num_devices = len(rows)
    self.num_ticks = width
    acts = [a for r in self.grid for a in r if a is not None]
    bad = [a for a in acts if not isinstance(a, Action)]
    if bad:
      raise TypeError(f'{bad[0]!r} is not an Action or None; write '
                      "Action('F', micro_batch, stage)")
    self.num_micro_batches = num_micro_batches or 1 + max(
        (a.micro_batch for a in acts), default=0)
    self.num_stages = num_stages or 1 + max((a.stage for a in acts),
                                            default=0)
    self.slots = slots

  def __eq__(self, other) -> bool:
    return (isinstance(other, Schedule) and self.grid == other.grid and
            self.num_stages == other.num_stages and
            self.num_micro_batches == other.num_micro_batches)

  def __repr__(self) -> str:
    return (f'Schedule({self.name!r}, K={self.num_devices}, '
            f'S={self.num_stages}, T={self.num_micro_batches})')

  def Ticks(self) -> Dict[Action, Tuple[int, int]]:
    """Maps each action to its (device, tick) (the last one if repeated)."""
    return {a: (d, c) for d, row in enumerate(self.grid)
            for c, a in enumerate(row) if a is not None}

  @property
  def loss_inside(self) -> bool:
    """`LossInside` of the table's name."""
    return LossInside(self.name)

  def StageDevice(self) -> Dict[int, int]:
    """Maps each stage that appears in the table to its device."""
    return {a.stage: d for d, row in enumerate(self.grid)
            for a in row if a is not None}

  def Orders(self) -> List[List[Action]]:
    """Per device, its actions in tick order (idle ticks dropped)."""
    return [[a for a in row if a is not None] for row in self.grid]

  def BubbleFraction(self) -> float:
    """The idle share of the devices' ticks with unit-time cells.

    For GPipe and 1F1B, (K - 1) / (T + K - 1): each device is busy 2 T of
    the 2 (T + K - 1) ticks, which is why the GPipe paper recommends
    T >= 4 K.
    """
    busy = sum(a is not None for row in self.grid for a in row)
    cells = self.num_devices * self.num_ticks
    return (cells - busy) / cells

  def Grid(self, mark: Optional[Tuple[int, int]] = None) -> str:
    """The device-by-tick grid as text; `mark` (device, tick) is pointed at."""
    cells = [[str(a) if a else '' for a in row] for row in self.grid]
    w = max([len(str(self.num_ticks))] + [len(x) for r in cells for x in r])
    lines = ['tick    ' + ' '.join(f'{c:<{w}}'
                                   for c in range(self.num_ticks)).rstrip()]
    for d, row in enumerate(cells):
      line = f'dev {d:<3} ' + ' '.join(f'{x or ".":<{w}}' for x in row)
      lines.append(line + (f'   <-- device {d}, tick {mark[1]}'
                           if mark and mark[0] == d else ''))
    if mark:
      lines.append(' ' * (8 + mark[1] * (w + 1)) + '^' * w)
    return '\n'.join(lines)

  def Validate(self) -> 'Schedule':
    """Checks the table (module comment: tick rule); returns self.

    Raises:
      ValueError: naming the device and tick of the first error, then the
        device-by-tick grid with that cell marked.
    """
    kk, ss, tt = self.num_devices, self.num_stages, self.num_micro_batches
    done: Dict[Action, int] = {}
    stage_dev: Dict[int, int] = {}
    fix_dep = 'move it to a later tick than the action it needs'
    for c in range(self.num_ticks):
      for d in range(kk):
        a = self.grid[d][c]
        if a is None:
          continue
        if a.op not in OPS:
          _Fail(self, d, c, f'op {a.op!r} of {a} is not one of F, B, I, W',
                'use F, B, I or W')
        if not 0 <= a.micro_batch < tt:
          _Fail(self, d, c, f'{a}: micro-batch {a.micro_batch} is not in '
                f'[0, {tt})', f'use micro-batches 0 .. {tt - 1}')
        if not 0 <= a.stage < ss:
          _Fail(self, d, c, f'{a}: stage {a.stage} is not in [0, {ss})',
                f'use stages 0 .. {ss - 1}')
        if stage_dev.setdefault(a.stage, d) != d:
          _Fail(self, d, c, f'{a}: stage {a.stage} already runs on device '
                f'{stage_dev[a.stage]}', 'keep each stage on one device')
        if a in done:
          _Fail(self, d, c, f'{a} already ran on tick {done[a]}',
                'run each action once')
        m, s = a.micro_batch, a.stage
        other = Action('I' if a.op == 'B' else 'B', m, s)
        if a.op in 'BI' and other in done:
          _Fail(self, d, c, f'{a}: micro-batch {m} of stage {s} already ran '
                f'{other} on tick {done[other]}',
                'use either one B or one I and one W per micro-batch')
        for need in Needs(a, ss):
          got = [done.get(n) for n in need]
          if all(g is None for g in got):
            names = ' or '.join(str(n) for n in need)
            _Fail(self, d, c, f'{a} runs before {names}', fix_dep)
      for d in range(kk):
        a = self.grid[d][c]
        if a is not None:
          done[a] = c
    last = self.num_ticks - 1
    for s in range(ss):
      if s not in stage_dev:
        _Fail(self, 0, last, f'stage {s} never runs',
              f'give stage {s} a device and its F and B cells')
    for s in range(ss):
      d = stage_dev[s]
      for m in range(tt):
        missing = None
        if Action('F', m, s) not in done:
          missing = Action('F', m, s)
        elif Action('B', m, s) not in done and Action('I', m, s) not in done:
          missing = Action('B', m, s)
        elif Action('I', m, s) in done and Action('W', m, s) not in done:
          missing = Action('W', m, s)
        if missing:
          _Fail(self, d, last, f'{missing} never runs (by the last tick)',
                f'add {missing} on device {d}')
    if self.slots is not None:
      self._CheckSlots(done)
    return self

  def _Lives(self, first: str, last: str, done=None):
    """{(stage, m): (device, first tick, last tick)} of a buffer's lives."""
    done = done if done is not None else {a: c for a, (d, c)
                                          in self.Ticks().items()}
    dev = self.StageDevice()
    lives = {}
    for a, c in done.items():
      if a.op == first:
        ends = [done.get(Action(op, a.micro_batch, a.stage)) for op in last]
        ends = [e for e in ends if e is not None]
        if ends:
          lives[(a.stage, a.micro_batch)] = (dev[a.stage], c, max(ends))
    return lives

  def _CheckSlots(self, done) -> None:
    """Raises if an explicit slot is written while another input holds it."""
    holders: Dict[Tuple[int, int], Tuple[int, int]] = {}
    lives = sorted(self._Lives('F', 'BI', done).items(),
                   key=lambda kv: kv[1][1])
    for (s, m), (d, start, end) in lives:
      slot = self.slots.get((s, m))
      if slot is None:
        _Fail(self, d, start, f'{Action("F", m, s)} has no boundary slot',
              f'give (stage {s}, micro-batch {m}) a slot')
      held = holders.get((s, slot))
      if held is not None and held[1] >= start:
        _Fail(self, d, start, f'{Action("F", m, s)} writes boundary slot '
              f'{slot} of stage {s} while micro-batch {held[0]} holds it '
              f'until tick {held[1]}', 'give it another slot')
      holders[(s, slot)] = (m, end)

  def Slots(self) -> Dict[Tuple[int, int], int]:
    """{(stage, micro_batch): slot}: the boundary input each F keeps.

    A stage keeps micro-batch m's input from its F tick through its B (or
    I) tick; the slot is freed after that tick. Explicit `slots` if given,
    else the lowest free slot at each F, in tick order.
    """
    if self.slots is not None:
      return dict(self.slots)
    return _Colour(self._Lives('F', 'BI'))

  def NumSlots(self) -> Dict[int, int]:
    """{stage: number of boundary slots it needs}."""
    out = {s: 0 for s in range(self.num_stages)}
    for (s, _), slot in self.Slots().items():
      out[s] = max(out[s], slot + 1)
    return out

  def SlotsPerDevice(self) -> List[int]:
    """Per device, the boundary inputs it keeps (all its stages' slots)."""
    dev = self.StageDevice()
    out = [0] * self.num_devices
    for s, n in self.NumSlots().items():
      if s in dev:
        out[dev[s]] += n
    return out

  def Stash(self) -> Dict[Tuple[int, int], int]:
    """{(stage, micro_batch): slot} of the I-to-W stash: what an I cell
    keeps for its W cell, from the I tick through the W tick (the lowest
    free slot at each I, in tick order)."""
    return _Colour(self._Lives('I', 'W'))

  def StashSlots(self) -> Dict[int, int]:
    """{stage: slots of the I-to-W stash} (0 for stages that run B)."""
    out = {s: 0 for s in range(self.num_stages)}
    for (s, _), slot in self.Stash().items():
      out[s] = max(out[s], slot + 1)
    return out

  def ToCsv(self) -> str:
    """torch.distributed.pipelining's compute-only CSV: a row per rank.

    What its `_dump_csv(filename, format='compute_only')` writes: Python's
    csv.writer (CRLF line ends), each row the rank's list, trailing idle
    ticks dropped.
    """
    buf = _io.StringIO(newline='')
    writer = _csv.writer(buf)
    for row in self.grid:
      cells = [str(a) if a else '' for a in row]
      while cells and not cells[-1]:
        cells.pop()
      writer.writerow(cells)
    return buf.getvalue()

  @staticmethod
  def FromCsv(text: str, name: str = 'csv',
              num_micro_batches: Optional[int] = None,
              num_stages: Optional[int] = None) -> 'Schedule':
    """Reads `ToCsv` / torch's compute-only CSV (not validated: `Validate`).

    Raises:
      ValueError: on a communication action or text that is not an action,
        naming row (device) and column (tick).
    """
    rows = list(_csv.reader(_io.StringIO(text, newline='')))
    grid = [[Action.FromStr(x, f'CSV {name!r} row {d} (device {d}), column '
                            f'{c} (tick {c})') for c, x in enumerate(row)]
            for d, row in enumerate(rows)]
    return Schedule(grid, num_micro_batches, num_stages, name=name)

  def Retimed(self) -> 'Schedule':
    """Each device's actions in the same order, each on its earliest tick.

    torch's tables are orders; ticks there are only roughly aligned. This
    gives each action the first tick after its device's previous action and
    after what it needs (the tick rule), so the result validates if the
    orders are consistent.
    """
    return FromOrders(self.Orders(), self.num_micro_batches, self.num_stages,
                      name=self.name, slots=self.slots)


def Needs(a: Action, num_stages: int) -> List[Tuple[Action, ...]]:
  """What `a` needs on earlier ticks (the tick rule; the simulator's edges).

  A list of alternatives: each entry is satisfied by any one of its actions
  (the input gradient of (m, s + 1) comes from its B or its I).
  """
  m, s = a.micro_batch, a.stage
  if a.op == 'F':
    return [(Action('F', m, s - 1),)] if s > 0 else []
  if a.op == 'W':
    return [(Action('I', m, s),)]
  needs = [(Action('F', m, s),)]
  if s < num_stages - 1:
    needs.append((Action('B', m, s + 1), Action('I', m, s + 1)))
  return needs


def _Colour(lives) -> Dict[Tuple[int, int], int]:
  """Lowest free slot per stage for {(stage, m): (device, start, end)}."""
  slots, ends = {}, {}
  for key, (_, start, end) in sorted(lives.items(),
                                     key=lambda kv: (kv[1][1], kv[0])):
    busy = ends.setdefault(key[0], [])
    free = [i for i, e in enumerate(busy) if e < start]
    slot = free[0] if free else len(busy)
    if slot == len(busy):
      busy.append(end)
    busy[slot] = end
    slots[key] = slot
  return slots


def FromOrders(orders: Sequence[Sequence[Action]],
               num_micro_batches: Optional[int] = None,
               num_stages: Optional[int] = None, name: str = '',
               slots=None) -> Schedule:
  """A schedule from per-device action orders, each action as early as it can.

  Pseudo-code (list scheduling on the tick rule):

    while some device has actions left:
      on each device whose next action's needs ran on earlier ticks: run it
      tick += 1

  Raises:
    ValueError: if no device can make progress (the orders deadlock),
      naming each device's next action.
  """
  orders = [list(o) for o in orders]
  acts = [a for o in orders for a in o]
  ss = num_stages if num_stages is not None else 1 + max(
      (a.stage for a in acts), default=0)
  pos = [0] * len(orders)
  done: Dict[Action, int] = {}
  grid: List[List[Optional[Action]]] = [[] for _ in orders]
  tick = 0
  while any(p < len(o) for p, o in zip(pos, orders)):
    ran = []
    for d, o in enumerate(orders):
      a = o[pos[d]] if pos[d] < len(o) else None
      if a is not None and all(any(done.get(n, tick) < tick for n in need)
                               for need in Needs(a, ss)):
        ran.append(a)
        grid[d].append(a)
        pos[d] += 1
      else:
        grid[d].append(None)
    if not ran:
      nxt = ', '.join(f'device {d}: {o[pos[d]]}' for d, o in enumerate(orders)
                      if pos[d] < len(o))
      raise ValueError(f'schedule {name!r}: the orders deadlock at tick {tick} '
                       f'({nxt} wait on each other); reorder them')
    for a in ran:
      done[a] = tick
    tick += 1
  return Schedule(grid, num_micro_batches, num_stages, name=name, slots=slots)


# The schedules whose loss is outside the pipeline (FProp, then a tape).
LOSS_OUTSIDE = ('gpipe',)


def LossInside(value: object) -> bool:
  """Whether a `TensorPipeLayer.schedule` value (a name or a CSV table)
  trains with the loss inside the pipeline (FPropLoss): all but GPipe."""
  return not (isinstance(value, str) and value in LOSS_OUTSIDE)


# -- CSV tables as `TensorPipeLayer.schedule` values -------------------------

CSV_PREFIX = 'csv:'


def IsCsvParam(value: object) -> bool:
  """Whether a `schedule` value is a CSV table: 'csv:' text or a '.csv' path."""
  return isinstance(value, str) and (value.startswith(CSV_PREFIX) or
                                     value.endswith('.csv'))


def CsvParam(path: str) -> str:
  """A `TensorPipeLayer.schedule` value holding the CSV table of `path`.

  'csv:' then the table's rows joined by '/' (actions hold no '/'), one
  line: params.txt then records the table itself, so a resumed run whose
  file changed differs in its hyper-parameters, and the run does not
  depend on the file afterwards.

  Raises:
    ValueError: the file cannot be read, naming it.
  """
  try:
    with open(path) as f:
      text = f.read()
  except OSError as e:
    raise ValueError(f'schedule CSV {path!r} cannot be read ({e}); give '
                     'the path of a table written by Schedule.ToCsv or '
                     "torch.distributed.pipelining's _dump_csv") from None
  rows = [r for r in text.replace('\r\n', '\n').split('\n')]
  while rows and not rows[-1].strip():
    rows.pop()
  return CSV_PREFIX + '/'.join(rows)


def Label(value: str) -> str:
  """A short name of a `schedule` value for messages: the name or path as
  given, 'csv table (N rows)' for `CsvParam` text (never the table)."""
  if isinstance(value, str) and value.startswith(CSV_PREFIX):
    return f'csv table ({value.count("/") + 1} rows)'
  return value


# -- A table's sizes against its pipeline's ----------------------------------

SIZES = ('devices', 'stages', 'micro-batches')


def CheckSizes(sizes: Tuple[int, Optional[int], Optional[int]],
               num_devices: int, num_stages_per_device: int,
               num_micro_batches: Optional[int],
               message: Callable[[str, int], str]) -> None:
  """The one size check of a table (built or CSV) against its pipeline.

  Compares, in this order, the table's rows with K (`num_devices`), its
  stages with K v, its micro-batches with T, and raises for the first that
  differs. A size of None, or T None, is not compared (a CSV table whose
  stages or micro-batches are not numbered 0 .. n - 1 is left to its
  per-cell checks, which name the cell).

  Args:
    sizes: the table's (rows, stages, micro-batches).
    num_devices, num_stages_per_device, num_micro_batches: K, v, T.
    message: (what, the table's size) -> the error's text, `what` one of
      SIZES; each caller words its own fix.

  Raises:
    ValueError: message(what, size) of the first size that differs.
  """
  kk, v, tt = num_devices, num_stages_per_device, num_micro_batches
  for what, found, wanted in zip(SIZES, sizes, (kk, kk * v, tt)):
    if found is not None and wanted is not None and found != wanted:
      raise ValueError(message(what, found))
