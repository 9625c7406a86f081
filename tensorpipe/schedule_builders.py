"""The built-in schedule builders and the registry that names them.

Each builder takes (K devices, T micro-batches, v stages per device) and
returns a `schedules.Schedule`; `Build(name, K, T, v)` looks it up (the
built-ins in `BUILDERS`, the user's added with `Register`), checks that the
table is a Schedule of the asked sizes and validates it. `FromParam` turns a
`TensorPipeLayer.schedule` value (a name or a CSV table) into its table. A
combination a builder does not support is refused in one line that names
the value and the fix.

- `gpipe`, `1f1b`: written cell by cell from their closed forms, with the
  boundary slots the engine uses.
- `interleaved_1f1b`: v >= 2 stages per device, stage s on device s mod K
  (Megatron-LM's round-robin placement and order; Narayanan et al. 2021).
- `zb_h1`: 1F1B with B split into I and W, W delayed to fill the bubble at
  1F1B's activation memory (Qi et al. 2023, arXiv 2401.10241, ZB-H1).
- `zb_v`: two stages per device in a V, device k holding stages k and
  2K-1-k, with I and W split (same paper, section 6).

The last three are written as each device's order of actions; `FromOrders`
puts every action on its earliest tick under the tick rule (schedules.py),
with unit-time cells. Their orders are those of torch.distributed.pipelining's
`ScheduleInterleaved1F1B`, `ScheduleInterleavedZeroBubble` (one stage per
rank) and `ScheduleZBVZeroBubble` (tests/testdata/torch_schedules/README.md
names the commit; the tests compare against tables transcribed from it).

Adding a schedule: one builder here (or `Register(name, builder)` from user
code) and one literal grid test in tests/schedule_table_test.py.

The schedule facts a `TensorPipeLayer`'s Params imply are here too:
`CheckScheduleParams` (what its settings cannot run), `NumStagesPerDevice`
(v) and `StageDevices` (each stage's device); `ForwardOnly` is the forward
table of inference over v stages per device.
"""

import numbers
from typing import Any, Callable, Dict, List, Optional, Sequence

from tensorpipe import checks
from tensorpipe import schedule_csv
from tensorpipe import schedules
from tensorpipe.schedules import Action, FromOrders, Schedule

# A builder: (num_devices K, num_micro_batches T, num_stages_per_device v)
# -> Schedule, refusing what it does not support with a one-line ValueError.
Builder = Callable[[int, int, int], Schedule]


def _OneStagePerDevice(name: str, v: int) -> None:
  if v != 1:
    raise ValueError(
        f'schedule {name!r} runs one stage per device, got '
        f'num_stages_per_device={v}; use 1, or schedule="interleaved_1f1b" '
        'or "zb_v" for more stages per device')


def GPipe(num_devices: int, num_micro_batches: int,
          num_stages_per_device: int = 1) -> Schedule:
  """All forwards, then all backwards (Huang et al. 2018, figure 2c).

  Forward: stage k runs micro-batch t on tick t + k, so the pass takes
  span = T + K - 1 ticks, K - 1 of them idle on each device (the bubble,
  (K - 1) / (T + K - 1) of each device's time). Backward: the mirror, on
  ticks span + (T - 1 - t) + (K - 1 - k): the last stage starts on the last
  micro-batch. Each stage keeps all T inputs (slot m).

    K=2, T=3:  tick  0   1   2   3   4   5   6   7
               dev 0 0F0 0F1 0F2 .   .   0B2 0B1 0B0
               dev 1 .   1F0 1F1 1F2 1B2 1B1 1B0 .
  """
  kk, tt = num_devices, num_micro_batches
  _OneStagePerDevice('gpipe', num_stages_per_device)
  span = tt + kk - 1
  grid = [[None] * (2 * span) for _ in range(kk)]
  for k in range(kk):
    for t in range(tt):
      grid[k][t + k] = Action('F', t, k)
      grid[k][span + (tt - 1 - t) + (kk - 1 - k)] = Action('B', t, k)
  slots = {(k, t): t for k in range(kk) for t in range(tt)}
  return Schedule(grid, tt, kk, name='gpipe', slots=slots)


def OneFOneB(num_devices: int, num_micro_batches: int,
             num_stages_per_device: int = 1) -> Schedule:
  """1F1B (PipeDream-flush; Narayanan et al. 2019), loss inside.

  With unit cells, stage k runs micro-batch t's forward on tick f(t, k) and
  its backward on b(t, k):

    f(t, k) = t + k            for t < K - k   (warm-up, as GPipe)
    f(t, k) = 2 t + k          for t >= K - k  (steady state)
    b(t, k) = 2 K - 1 - k + 2 t

  so B(t) on the last stage follows its F at once, and from tick 2K-1-k
  device k alternates B(t), F(t + K - k). The step takes 2 (T + K - 1)
  ticks, GPipe's. Device k keeps min(K - k, T) inputs, micro-batch m in
  slot m mod that (where GPipe keeps T).

    K=2, T=3:  tick  0   1   2   3   4   5   6   7
               dev 0 0F0 0F1 .   0B0 0F2 0B1 .   0B2
               dev 1 .   1F0 1B0 1F1 1B1 1F2 1B2 .
  """
  kk, tt = num_devices, num_micro_batches
  _OneStagePerDevice('1f1b', num_stages_per_device)
  grid = [[None] * (2 * (tt + kk - 1)) for _ in range(kk)]
  for k in range(kk):
    for t in range(tt):
      grid[k][t + k if t < kk - k else 2 * t + k] = Action('F', t, k)
      grid[k][2 * kk - 1 - k + 2 * t] = Action('B', t, k)
  slots = {(k, t): t % min(kk - k, tt) for k in range(kk) for t in range(tt)}
  return Schedule(grid, tt, kk, name='1f1b', slots=slots)


def Interleaved1F1B(num_devices: int, num_micro_batches: int,
                    num_stages_per_device: int = 2) -> Schedule:
  """Interleaved 1F1B: v stages per device, stage j K + k on device k.

  Megatron-LM's order: device k runs w = min(2 (K - k - 1) + (v - 1) K, T v)
  warm-up forwards, then alternates one forward and one backward, then the
  remaining backwards. Its i-th forward is on its local stage
  (i // K) mod v, micro-batch (i // (K v)) K + i mod K; the i-th backward
  walks the local stages in reverse.

    K=2, v=2, T=2:  stages 0, 2 on device 0; 1, 3 on device 1.
  """
  kk, tt, v = num_devices, num_micro_batches, num_stages_per_device
  if v < 2:
    raise ValueError(
        f'interleaved_1f1b needs num_stages_per_device >= 2, got {v}; use 2, '
        'or schedule="1f1b" for one stage per device')
  if tt % kk:
    raise ValueError(
        f'interleaved_1f1b needs num_micro_batches a multiple of '
        f'num_devices={kk}, got {tt}; use T={kk * (tt // kk + 1)}')
  orders = []
  for k in range(kk):
    total = tt * v
    warm = min(2 * (kk - k - 1) + (v - 1) * kk, total)

    def Op(op: str, i: int, k=k) -> Action:
      chunk = (i // kk) % v
      if op == 'B':
        chunk = v - 1 - chunk
      return Action(op, (i // (kk * v)) * kk + i % kk, chunk * kk + k)

    order = [Op('F', i) for i in range(warm)]
    for i in range(total - warm):
      order += [Op('F', warm + i), Op('B', i)]
    order += [Op('B', i) for i in range(total - warm, total)]
    orders.append(order)
  return FromOrders(orders, tt, kk * v, name='interleaved_1f1b')


def ZeroBubbleH1(num_devices: int, num_micro_batches: int,
                 num_stages_per_device: int = 1) -> Schedule:
  """ZB-H1: 1F1B with I and W split; device k delays each W by k steps.

  Device k runs min(K - 1 - k, T) warm-up forwards, then per step one F
  and one I (oldest first), adding the W of its oldest pending I once k
  steps have passed; then the remaining I (with their W once due) and Ws.
  At most K - k micro-batches are in flight, as in 1F1B.
  """
  kk, tt = num_devices, num_micro_batches
  _OneStagePerDevice('zb_h1', num_stages_per_device)
  orders = []
  for k in range(kk):
    warm = min(kk - 1 - k, tt)
    order = [Action('F', m, k) for m in range(warm)]
    done_i = done_w = 0
    for step in range(warm, tt + warm):
      if step < tt:
        order.append(Action('F', step, k))
      order.append(Action('I', done_i, k))
      done_i += 1
      if step - warm >= k:
        order.append(Action('W', done_w, k))
        done_w += 1
    order += [Action('W', m, k) for m in range(done_w, tt)]
    orders.append(order)
  return FromOrders(orders, tt, kk, name='zb_h1')


def ZeroBubbleV(num_devices: int, num_micro_batches: int,
                num_stages_per_device: int = 2) -> Schedule:
  """ZB-V: device k holds stages k and 2K-1-k (a V), I and W split.

  Device k's order: 2 (K - k) - 1 forwards of its first stage; k pairs
  (F of the second stage, F of the first); K - k triples (F, I, W) of the
  second stage; then steady steps (F, I, W of the first stage, then of the
  second) until all forwards ran; then k pairs of Is (first, second stage),
  K - k (I, W) pairs of the first stage, and the remaining Ws.
  """
  kk, tt, v = num_devices, num_micro_batches, num_stages_per_device
  if v != 2:
    raise ValueError(
        f'zb_v holds exactly 2 stages per device, got num_stages_per_device='
        f'{v}; use 2')
  if tt < 2 * kk - 1:
    raise ValueError(
        f'zb_v needs num_micro_batches >= 2K-1 = {2 * kk - 1} at K={kk}, got '
        f'{tt}; use T >= {2 * kk - 1} or schedule="zb_h1"')
  orders = []
  for k in range(kk):
    s0, s1 = k, 2 * kk - 1 - k
    n: Dict[str, int] = {}
    order: List[Action] = []

    def Add(ops: str, stage: int, order=order, n=n) -> None:
      """Appends each op of `ops` on `stage`, at its next micro-batch."""
      for op in ops:
        key = f'{op}{stage}'
        order.append(Action(op, n.get(key, 0), stage))
        n[key] = n.get(key, 0) + 1

    for _ in range(2 * (kk - k) - 1):
      Add('F', s0)
    for _ in range(k):
      Add('F', s1)
      Add('F', s0)
    for _ in range(kk - k):
      Add('FIW', s1)
    while n.get(f'F{s1}', 0) < n.get(f'F{s0}', 0) or n[f'F{s0}'] < tt:
      if n[f'F{s0}'] < tt:
        Add('F', s0)
      Add('IW', s0)
      Add('FIW', s1)
    for _ in range(k):
      Add('I', s0)
      Add('I', s1)
    for _ in range(kk - k):
      Add('IW', s0)
    for stage in (s1, s0):
      while n.get(f'W{stage}', 0) < tt:
        Add('W', stage)
    orders.append(order)
  return FromOrders(orders, tt, 2 * kk, name='zb_v')


BUILDERS: Dict[str, Builder] = {
    'gpipe': GPipe,
    '1f1b': OneFOneB,
    'interleaved_1f1b': Interleaved1F1B,
    'zb_h1': ZeroBubbleH1,
    'zb_v': ZeroBubbleV,
}


# -- Registry ---------------------------------------------------------------

_REGISTRY: Dict[str, Builder] = dict(BUILDERS)
# A schedule's own stages per device (v where num_stages_per_device=None).
_STAGES_PER_DEVICE: Dict[str, int] = {'zb_v': 2}


def Register(name: str, builder: Builder, replace: bool = False,
             stages_per_device: int = 1) -> None:
  """Makes `Build(name, ...)` call `builder(K, T, v)`.

  Args:
    name, builder: the schedule's name and its table builder.
    replace: replace a schedule of that name.
    stages_per_device: the v a TensorPipeLayer with num_stages_per_device
      =None takes for this schedule (2 for a V-shaped schedule like zb_v).

  Raises:
    ValueError: if `name` is taken and not `replace`, or is not a non-empty
      string, or stages_per_device is not a positive int.
  """
  checks.CheckPositiveInts(f'schedule {name!r}',
                           stages_per_device=stages_per_device)
  if not isinstance(name, str) or not name:
    raise ValueError(f'schedule name must be a non-empty string, got '
                     f'{name!r}; pass a name such as "my_schedule"')
  if name in _REGISTRY and not replace:
    raise ValueError(f'schedule {name!r} is already registered; pick another '
                     'name or pass replace=True')
  _REGISTRY[name] = builder
  _STAGES_PER_DEVICE[name] = stages_per_device


def StagesPerDevice(name: Any) -> int:
  """The stages per device schedule `name` takes by default (1 for a CSV
  table or an unknown name)."""
  return _STAGES_PER_DEVICE.get(name, 1) if isinstance(name, str) else 1


def Names() -> List[str]:
  """Registered schedule names, sorted."""
  return sorted(_REGISTRY)


def Build(name: str, num_devices: int, num_micro_batches: int,
          num_stages_per_device: int = 1) -> Schedule:
  """The validated schedule `name` for K devices, T micro-batches, v stages.

    s = schedule_builders.Build('1f1b', num_devices=2, num_micro_batches=3)

  Raises:
    ValueError: for an unknown name (listing the known ones), bad sizes, a
      combination the builder does not support, or a builder whose table is
      not a Schedule of the asked K, K v stages and T.
    TypeError: a size that is not an int.
  """
  if name not in _REGISTRY:
    raise ValueError(f'unknown schedule {name!r}; use one of {Names()} or '
                     'register it with schedule_builders.Register(name, '
                     'builder)')
  kk = _CheckPositiveInt('num_devices', num_devices)
  tt = _CheckPositiveInt('num_micro_batches', num_micro_batches)
  v = _CheckPositiveInt('num_stages_per_device', num_stages_per_device)
  schedule = _REGISTRY[name](kk, tt, v)
  _CheckBuilt(schedule, name, kk, tt, v)
  if not schedule.name:
    schedule.name = name
  return schedule.Validate()


def _CheckPositiveInt(name: str, value: object) -> int:
  """Returns `value` as an int, or raises if it is not a positive integer."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise TypeError(
        f'{name} must be a positive integer, got {value!r} of type '
        f'{type(value).__name__}; pass an int such as {name}=4')
  if value < 1:
    raise ValueError(
        f'{name} must be a positive integer, got {name}={value!r}; '
        f'use {name} >= 1')
  return int(value)


def _CheckBuilt(schedule: object, name: str, kk: int, tt: int, v: int) -> None:
  """Raises unless builder `name` returned a Schedule of the asked sizes."""
  head = f'schedule builder {name!r} returned'
  if not isinstance(schedule, Schedule):
    shown = repr(schedule)
    shown = shown if len(shown) < 60 else shown[:57] + '...'
    raise ValueError(f'{head} {shown} (a {type(schedule).__name__}), not a '
                     'schedules.Schedule; return a Schedule (see '
                     'schedule_builders.py)')

  def Message(what: str, n: int) -> str:
    if what == 'devices':
      return (f'{head} a table with {n} rows (devices) for num_devices={kk}; '
              'make it build one row per device')
    if what == 'stages':
      return (f'{head} a table with {n} stages, but K={kk} devices x '
              f'num_stages_per_device={v} makes {kk * v}; make it build '
              f'K v = {kk * v} stages (or refuse v={v} with a ValueError)')
    return (f'{head} a table with {n} micro-batches for num_micro_batches='
            f'{tt}; make it build T={tt} micro-batches')
  schedules.CheckSizes((schedule.num_devices, schedule.num_stages,
                        schedule.num_micro_batches), kk, v, tt, Message)


def FromParam(value: str, num_devices: int,
              num_micro_batches: Optional[int] = None,
              num_stages_per_device: int = 1) -> Schedule:
  """The validated table a `TensorPipeLayer.schedule` value names.

  A registered name (`Build`, at T = `num_micro_batches`, or 2K when not
  given: the placement and the ops do not depend on T), or a CSV table: a
  path ending in '.csv' or `schedules.CsvParam`'s 'csv:' text
  (`schedule_csv.FromCsvParam`).

  Raises:
    ValueError: naming the value (`schedules.Label`) and the fix.
  """
  if schedules.IsCsvParam(value):
    return schedule_csv.FromCsvParam(value, num_devices, num_micro_batches,
                                     num_stages_per_device)
  return Build(value, num_devices, num_micro_batches or 2 * num_devices,
               num_stages_per_device)


def ForwardOnly(stage_device: Sequence[int], num_devices: int,
                num_micro_batches: int) -> Schedule:
  """Forward cells only, in GPipe's order (micro-batch t of stage s on tick
  t + s), each as early as its device allows: the forward table of a
  pipeline with several stages per device (inference of an interleaved
  pipeline). stage_device: per stage, its device."""
  num_s = len(stage_device)
  orders = [[] for _ in range(num_devices)]
  for t, s in sorted(((t, s) for t in range(num_micro_batches)
                      for s in range(num_s)), key=sum):
    orders[stage_device[s]].append(Action('F', t, s))
  return FromOrders(orders, num_micro_batches, num_s, name='gpipe_forward')


# -- Schedule facts of a TensorPipeLayer's Params ----------------------------

# The stages per device of a schedule defined on more than one, taken when
# num_stages_per_device is None (the default); every other schedule: 1.
def NumStagesPerDevice(p: Any) -> int:
  """v of a TensorPipeLayer's Params: num_stages_per_device, or where it is
  None the schedule's own (StagesPerDevice: 2 for 'zb_v', else 1).

  Raises:
    ValueError: num_stages_per_device is neither None nor an int >= 1.
  """
  v = p.num_stages_per_device
  if v is None:
    return StagesPerDevice(p.schedule)
  if isinstance(v, bool) or not isinstance(v, int) or v < 1:
    raise ValueError(f'TensorPipeLayer {p.name!r}: num_stages_per_device='
                     f'{v!r} must be an int >= 1 (stages per device: 2 or '
                     "more for schedule='interleaved_1f1b'), or None for "
                     "the schedule's own")
  return v


def CheckScheduleParams(p: Any, num_devices: int) -> None:
  """ValueError for a TensorPipeLayer `schedule` its settings cannot run.

  'gpipe' runs with the loss outside the pipeline (`schedules.LossInside`);
  every other registered table ('1f1b', 'interleaved_1f1b', 'zb_h1',
  'zb_v', one registered by the user) and every CSV table runs on the
  engine with the loss inside.
  """
  v = NumStagesPerDevice(p)
  if not schedules.IsCsvParam(p.schedule) and (
      not isinstance(p.schedule, str) or p.schedule not in Names()):
    raise ValueError(f'TensorPipeLayer {p.name!r}: schedule='
                     f'{schedules.Label(p.schedule)!r} is not one of '
                     f'{Names()}; use '
                     "schedule='gpipe' (default), '1f1b' or "
                     "'interleaved_1f1b', a CSV table (a path ending in "
                     "'.csv', or schedules.CsvParam(path)), or register a "
                     'table builder with schedule_builders.Register(name, '
                     'builder)')
  if not schedules.LossInside(p.schedule):
    if v != 1:
      raise ValueError(
          f'TensorPipeLayer {p.name!r}: schedule={p.schedule!r} runs one '
          f'stage per device, got num_stages_per_device={v}; use '
          "schedule='interleaved_1f1b' for several stages per device, or "
          'num_stages_per_device=1')
    return
  # At the step's T when it is set; else (micro_batch_size) the placement
  # and the ops, which do not depend on T, from a table for T = 2K
  # (interleaved 1F1B needs a multiple of K, ZB-V at least 2K - 1) or a
  # CSV table's own T.
  tt = p.num_micro_batches
  tt = tt if isinstance(tt, int) and not isinstance(tt, bool) and tt > 0 else (
      None)
  try:
    table = FromParam(p.schedule, num_devices, tt, v)
  except ValueError as e:
    raise ValueError(f'TensorPipeLayer {p.name!r}: {e}') from None
  split = [a for row in table.grid for a in row if a and a.op in 'IW']
  if split and p.grad_sum != 'sequential':
    raise ValueError(
        f'TensorPipeLayer {p.name!r}: schedule='
        f'{schedules.Label(p.schedule)!r} splits the backward pass into '
        'input- and weight-gradient cells (I, W), which '
        f"add weight gradients as they come; grad_sum={p.grad_sum!r} needs "
        "whole backward cells: use grad_sum='sequential' or "
        "schedule='1f1b'")
  if p.recompute_impl != 'explicit':
    raise ValueError(
        f'TensorPipeLayer {p.name!r}: schedule='
        f'{schedules.Label(p.schedule)!r} recomputes in its own loop, so '
        f'recompute_impl={p.recompute_impl!r} does not '
        "apply; leave recompute_impl='explicit'")


def StageDevices(p: Any, num_devices: int) -> List[int]:
  """Per stage, the index of its device under `p.schedule` (S = K v)."""
  if not schedules.LossInside(p.schedule):
    return list(range(num_devices))
  table = FromParam(p.schedule, num_devices, None, NumStagesPerDevice(p))
  place = table.StageDevice()
  return [place[s] for s in range(table.num_stages)]


def PlacementReport(stage_devices: Sequence[int], devices: Sequence[str],
                    schedule: str) -> str:
  """Which device holds which stage, as text for the build log.

  Args:
    stage_devices: per stage, its device index (`StageDevices`).
    devices: the K device names.
    schedule: the `schedule` value (named with `schedules.Label`).

  Returns:
    'S stages on K devices, v per device (schedule ...):' then one line per
    device with its stages, e.g. '  device 0 (/CPU:0): stages 0, 3'.
  """
  held = [[s for s, d in enumerate(stage_devices) if d == k]
          for k in range(len(devices))]
  per = {len(h) for h in held}
  v = f'{per.pop()} per device' if len(per) == 1 else 'unevenly'
  lines = [f'{len(stage_devices)} stages on {len(devices)} devices, {v} '
           f'(schedule {schedules.Label(schedule)!r}):']
  for k, (name, stages) in enumerate(zip(devices, held)):
    what = 'stage' if len(stages) == 1 else 'stages'
    lines.append(f'  device {k} ({name}): {what} '
                 f'{", ".join(map(str, stages))}')
  return '\n'.join(lines)
