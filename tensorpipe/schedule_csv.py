"""A CSV `schedule` value read into a checked table (`FromCsvParam`).

A `TensorPipeLayer.schedule` may be a CSV table (the value forms, 'csv:'
text or a '.csv' path, are `schedules.IsCsvParam` / `CsvParam` / `Label`):
torch.distributed.pipelining's compute-only per-rank CSV or one written by
`Schedule.ToCsv`. Such a table is a list of per-device orders, so it is
checked cell by cell first (stage and micro-batch ranges, each action once,
each stage in one row, B versus I and W), each error naming the row and
column, then retimed (`Schedule.Retimed`) and validated. Its sizes are
checked by `schedules.CheckSizes`, as a built table's are.

Pure data: this module imports only `schedules`.
"""

from typing import Dict, Optional, Tuple

from tensorpipe import schedules
from tensorpipe.schedules import Action, Schedule


def FromCsvParam(value: str, num_devices: int,
                 num_micro_batches: Optional[int] = None,
                 num_stages_per_device: int = 1) -> Schedule:
  """The validated table of a CSV `schedule` value (schedules.IsCsvParam).

  A path ending in '.csv' or `schedules.CsvParam`'s 'csv:' text. The
  table's cells are checked (`_CheckCells`), then it is retimed (`Retimed`:
  torch's tables are orders); it must have `num_devices` rows,
  `num_stages_per_device` x K stages and, when given, `num_micro_batches`
  micro-batches (`schedules.CheckSizes`).

  Raises:
    ValueError: naming the value (`schedules.Label`), the cell if one is
      wrong, and the fix.
  """
  label = schedules.Label(value)
  if not value.startswith(schedules.CSV_PREFIX):
    value = schedules.CsvParam(value)
  text = value[len(schedules.CSV_PREFIX):].replace('/', '\n')
  table = Schedule.FromCsv(text, name=label)
  kk, v, tt = num_devices, num_stages_per_device, num_micro_batches
  acts = [a for row in table.grid for a in row if a is not None]

  def Numbered(ids):  # the count of ids numbered 0 .. n - 1, else None
    return len(ids) if ids == set(range(len(ids))) else None

  def Message(what: str, n: int) -> str:
    if what == 'devices':
      return (f'schedule {label!r} has {n} rows (devices) but the pipeline '
              f'has {kk}; give a table with one row per device')
    if what == 'stages':
      return (f'schedule {label!r} has {n} stages, but K={kk} devices x '
              f'num_stages_per_device={v} makes {kk * v}; set '
              f'num_stages_per_device={max(1, n // kk)}')
    return (f'schedule {label!r} has {n} micro-batches but the step has '
            f'{tt}; set num_micro_batches={n} or give a table for T={tt}')
  schedules.CheckSizes(
      (table.num_devices, Numbered({a.stage for a in acts}),
       Numbered({a.micro_batch for a in acts})), kk, v, tt or None, Message)
  _CheckCells(table, label, kk, v, tt)
  return table.Retimed().Validate()


def _CheckCells(table: Schedule, label: str, kk: int, v: int,
                tt: Optional[int]) -> None:
  """Per-cell checks of a table read as orders, before it is retimed.

  Stage in [0, K v), micro-batch in [0, T) (T: the step's, else the number
  the table names), each action once, each stage in one row, a W after an
  I (not a B), not both B and I; then one F and one B (or I and W) per
  stage and micro-batch. Retiming would report any of these as a deadlock.

  Raises:
    ValueError: naming `label`, the row and column of the cell, and the fix.
  """
  ss = kk * v
  seen: Dict[Action, Tuple[int, int]] = {}
  rows: Dict[int, int] = {}
  n_mb = tt or len({a.micro_batch for row in table.grid for a in row if a})

  def Fail(d, c, what, fix):
    raise ValueError(f'schedule {label!r}: row {d} (device {d}), column {c}: '
                     f'{what}; {fix}')

  for d, row in enumerate(table.grid):
    for c, a in enumerate(row):
      if a is None:
        continue
      m, s = a.micro_batch, a.stage
      if not 0 <= s < ss:
        Fail(d, c, f'{a}: stage {s} is not in [0, {ss}) (K={kk} devices x '
             f'num_stages_per_device={v})', f'use stages 0 .. {ss - 1}')
      if not 0 <= m < n_mb:
        named = '' if tt else f' (the table names {n_mb} micro-batches)'
        Fail(d, c, f'{a}: micro-batch {m} is not in [0, {n_mb}){named}',
             f'use micro-batches 0 .. {n_mb - 1}' if tt else
             f'number them 0 .. {n_mb - 1}')
      if a in seen:
        Fail(d, c, f'{a} already appears at row {seen[a][0]}, column '
             f'{seen[a][1]}', 'run each action once')
      if rows.setdefault(s, d) != d:
        Fail(d, c, f'{a}: stage {s} runs in row {rows[s]}',
             'keep each stage in one row (device)')
      seen[a] = (d, c)
  for a, (d, c) in seen.items():
    b, i = Action('B', a.micro_batch, a.stage), Action('I', a.micro_batch,
                                                         a.stage)
    if a.op == 'W' and b in seen:
      Fail(d, c, f'{a} follows the full backward {b} (row {seen[b][0]}, '
           f'column {seen[b][1]})', f'a W needs an I: write {i} for {b}, or '
           f'drop {a}')
    if a.op == 'W' and i not in seen:
      Fail(d, c, f'{a} has no {i} in the table', 'a W needs the I of its '
           f'micro-batch and stage: add {i} before it')
    if a.op == 'I' and b in seen:
      first, second = sorted([(seen[b], b), ((d, c), a)])
      Fail(*second[0], f'{second[1]}: micro-batch {a.micro_batch} of stage '
           f'{a.stage} already has {first[1]} (row {first[0][0]}, column '
           f'{first[0][1]})', 'use either one B or one I and one W per '
           'micro-batch')
  for s in range(ss):
    if s not in rows:
      raise ValueError(f'schedule {label!r}: stage {s} appears in no row; '
                       f'give it a row and its F and B cells')
    d = rows[s]
    for m in range(n_mb):
      f, b, i, w = (Action(op, m, s) for op in 'FBIW')
      missing, why = None, ''
      if f not in seen:
        missing, why = f, 'runs one F per micro-batch'
      elif b not in seen and i not in seen:
        missing, why = b, 'runs one B (or one I and one W) per micro-batch'
      elif i in seen and w not in seen:
        missing, why = w, f'runs {i}, so it needs {w} too'
      if missing:
        after = f' after {i}' if missing == w else ''
        raise ValueError(f'schedule {label!r}: {missing} never appears: '
                         f'stage {s} (row {d}) {why}; add {missing} to row '
                         f'{d}{after}')
