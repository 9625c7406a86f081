"""Schedule timeline: when each partition ran each micro-batch, per device.

GPipe's step time (Huang et al. 2018, figure 4) splits into useful compute,
the pipeline bubble, recompute, load imbalance, setup and the weight update.
To see that split for a real run, `TensorPipeLayer` can record, for every
clock tick and partition, `tf.timestamp()` before and after the stage call
(and, in the recomputing backward pass, after the recomputed forward). The
timestamps travel as extra loop state, one [ticks, 2 or 3] float64 tensor per
partition, and come out of the step function through a `Recorder`:

  with timeline.Record() as rec:          # while the step is traced
    step_fn = tf.function(Step).get_concrete_function(x)
  # Step returns rec.Tensors() next to its loss
  loss, raw = step_fn(x)
  events = rec.Events(raw)                 # [Event(phase, k, t, start, ...)]
  trace = timeline.ChromeTrace(events, devices)

Recording is decided when the step is traced: without an active `Record()`
context no timestamp op, no extra loop state and no control dependency is
built, so instrumentation costs nothing when off. The pipeline builds all of
it through one object, a `Probe`, whose methods build nothing when recording
is off. Timestamps are wall-clock seconds (float64); cells whose tick was a
bubble carry -1 and are dropped.

Every log is decoded by the schedule's table (one decoder, `TableEvents`):
the engine hands each device's [ticks, 3] log of the table it ran to
`Probe.Add('table', ...)`, and row c is that device's action on tick c: a
forward row is (start, -, end); a B or I row is (start, mid, end), recompute
then backward, or (start, -1, end) when the cell recomputed nothing; a
[ticks, 2] log (start, end) is read the same way without a recompute split.
The one-call pipeline (K = T = 1) logs its single forward cell as
'forward', read as the `gpipe` table's forward ticks. `Breakdown` sees when
the passes interleave (1F1B and the other loss-inside schedules) and splits
the step accordingly.

Nothing here runs TensorFlow ops at import.
"""

import contextlib
import dataclasses
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import tensorflow as tf

from tensorpipe import py_utils
from tensorpipe import schedule_builders
from tensorpipe import schedules

PHASES = ('forward', 'recompute', 'backward')


@dataclasses.dataclass(frozen=True)
class Event:
  """One stage call: partition k ran `phase` of micro-batch t."""
  phase: str       # 'forward', 'recompute' or 'backward'
  k: int           # partition (= device index)
  t: int           # micro-batch
  start: float     # seconds
  end: float       # seconds
  tick: int = -1   # clock tick of its pass's loop (-1: not recorded)
  stage: int = -1  # the (virtual) stage it ran: k, or with v stages per
                   # device (interleaved, zb_v) one of k's (-1: unknown)


# What a Recorder entry's log holds: the forward ticks of the gpipe table (the
# one-call pipeline's single cell), or the ticks of any schedule table the
# engine ran (schedule_engine: 'table', with the table it ran).
DIRECTIONS = ('forward', 'table')


@dataclasses.dataclass
class _Entry:
  direction: str   # one of DIRECTIONS
  k: int
  num_partitions: int
  num_micro_batches: int
  tensor: Any
  table: Any = None   # the schedules.Schedule of a 'table' log
  first: int = 0      # the table tick of the log's first row


class Recorder:
  """Collects the timestamp tensors built while a step function is traced."""

  def __init__(self):
    self._entries: List[_Entry] = []
    self._marks: Dict[str, Any] = {}

  def Add(self, direction: str, k: int, num_partitions: int,
          num_micro_batches: int, tensor: tf.Tensor, table: Any = None,
          first: int = 0) -> None:
    """Registers a [ticks, 2] or [ticks, 3] log.

    Raises:
      ValueError: `direction` is not one of DIRECTIONS, or a 'table' log
        comes without its table.
    """
    if direction not in DIRECTIONS:
      raise ValueError(f'timeline log direction {direction!r} is not one of '
                       f"{DIRECTIONS}; use 'table' (with table=) for a "
                       "schedule table, 'forward' for the gpipe table's "
                       'forward ticks')
    if direction == 'table' and table is None:
      raise ValueError("a 'table' timeline log needs table=the "
                       'schedules.Schedule it ran')
    self._entries.append(_Entry(direction, k, num_partitions,
                                num_micro_batches, tensor, table, first))

  def Mark(self, name: str, deps: Sequence[Any] = ()) -> tf.Tensor:
    """A timestamp taken after `deps` (e.g. 'step_start', 'step_end')."""
    stamp = Stamp(deps)
    self._marks[name] = stamp
    return stamp

  def Tensors(self) -> Dict[str, Any]:
    """The tensors a step function returns so that `Events` can decode them."""
    out = {f'cells_{i}': e.tensor for i, e in enumerate(self._entries)}
    out.update({f'mark_{n}': v for n, v in self._marks.items()})
    return out

  def Marks(self, values: Dict[str, Any]) -> Dict[str, float]:
    return {n[len('mark_'):]: float(v) for n, v in values.items()
            if n.startswith('mark_')}

  def Events(self, values: Dict[str, Any]) -> List[Event]:
    """Decodes the returned values into events, in (start, k) order.

    Args:
      values: the evaluated `Tensors()` dict (numpy arrays or eager tensors).
    """
    events = []
    for i, e in enumerate(self._entries):
      rows = values[f'cells_{i}']
      rows = rows.numpy() if hasattr(rows, 'numpy') else rows
      if e.direction == 'table':
        events.extend(TableEvents(rows, e.table, e.k, first=e.first,
                                  ticks=len(rows)))
        continue
      # The gpipe table's forward ticks: the first half of its ticks.
      table = schedule_builders.Build('gpipe', e.num_partitions,
                                      e.num_micro_batches)
      events.extend(TableEvents(rows, table, e.k, first=0,
                                ticks=table.num_ticks // 2))
    events.sort(key=lambda ev: (ev.start, ev.k))
    return events


def TableEvents(rows: Any, table: schedules.Schedule, k: int,
                first: int = 0, ticks: Optional[int] = None) -> List[Event]:
  """Decodes device k's log of table ticks [first, first + ticks).

  The one event decoder: row c ran `table.grid[k][first + c]`. A forward
  (F) row is (start, -, end); a B or I row is (start, mid, end), recompute
  then backward, or (start, -1, end) / a 2-column row without a recompute
  split; a W row is one 'backward' span. Rows whose first stamp is < 0 did
  not run (idle ticks). Events carry the row's index as `tick`.

  Raises:
    ValueError: a row ran on a tick where the table idles, or the log has
      another number of rows than the ticks it covers (a log of another
      schedule or of another K, T).
  """
  ticks = table.num_ticks - first if ticks is None else ticks
  kk, tt = table.num_devices, table.num_micro_batches
  if len(rows) != ticks or first + ticks > table.num_ticks:
    have = min(ticks, table.num_ticks - first)
    since = f' from tick {first}' if first else ''
    raise ValueError(
        f'{table.name} log of partition {k} has {len(rows)} rows, but K={kk}, '
        f'T={tt} has {have} ticks{since}; record one row per tick of its '
        'loop')
  events = []
  for c, row in enumerate(rows):
    if row[0] < 0:
      continue
    action = table.grid[k][first + c]
    if action is None:
      raise ValueError(f'{table.name} log of partition {k} has a cell on '
                       f'tick {c}, where the schedule idles; record -1 there '
                       '(Probe.Missing)')
    start, end = float(row[0]), float(row[-1])
    mid = float(row[1]) if len(row) == 3 and action.op in 'BI' else -1.0
    if action.op == 'F':
      spans = [('forward', start, end)]
    elif mid >= 0:
      spans = [('recompute', start, mid), ('backward', mid, end)]
    else:
      spans = [('backward', start, end)]
    events.extend(Event(phase, k, action.micro_batch, s, e, c, action.stage)
                  for phase, s, e in spans)
  return events


@contextlib.contextmanager
def Record() -> Iterator[Recorder]:
  """Makes TensorPipeLayers traced inside the block record their timeline.

  The recorder is part of py_utils' FProp context: the recompute pass records
  into the forward's recorder, and `py_utils.WithContext` carries it into
  replica threads.
  """
  rec = Recorder()
  with py_utils.TimelineRecorder(rec):
    yield rec


def Active() -> Optional[Recorder]:
  """The recorder of the innermost `Record()` block, or None (recording off)."""
  return py_utils.Current().timeline_recorder


def Stamp(deps: Sequence[Any] = ()) -> tf.Tensor:
  """tf.timestamp() that runs only after every tensor in `deps` exists."""
  deps = [d for d in tf.nest.flatten(deps) if d is not None]
  with tf.control_dependencies(deps):
    return tf.timestamp()


def Unordered(fn: Callable[[], Any]) -> Any:
  """Calls `fn` (which builds a tf.cond or tf.switch_case) unordered.

  tf.timestamp is stateful, so a tf.cond whose branch records one becomes a
  stateful `If`, and tf.function's automatic control dependencies then run
  the K partitions' conds of a clock tick one after another instead of
  concurrently on their devices: the timeline would show (and cause) a
  serial schedule. A timestamp has no side effect that needs ordering, and
  stage calls are functional (layers take theta as tensors and return
  batch-norm statistics as outputs), so the conds built by `fn` are
  registered to run independently, as the unrecorded, stateless conds do.
  tests/timeline_test.py checks that no recorded cond is ordered after
  another (it would catch a TensorFlow that drops this hook).
  """
  graph = tf.compat.v1.get_default_graph()
  before = len(graph.get_operations())
  out = fn()
  acd = getattr(graph, 'experimental_acd_manager', None)
  if acd is not None:
    for op in graph.get_operations()[before:]:
      if op.type in ('If', 'StatelessIf', 'Case', 'StatelessCase'):
        acd.run_independently(op)
  return out


class Probe:
  """The pipeline's one entry to the timeline, for one traced loop or call.

  Stamps are lists, [] with recording off, so that they concatenate and
  serve as control dependencies; logs (the [ticks, n] rows of one partition,
  carried as loop state) are () with recording off. So the pipeline calls
  every method unconditionally, and with recording off nothing is built.

  Usage (inside a loop body, for partition k on tick `clock`):

    probe = timeline.ActiveProbe()          # once, when the loop is traced
    log = probe.NewLog(num_ticks, 2)        # loop state
    start = probe.Stamp(inputs)
    with tf.control_dependencies(start):
      out = Stage(inputs)
    log = probe.Log(log, clock, start + probe.Stamp(out))
    ...                                     # after the loop:
    probe.Add('table', k, num_partitions, num_micro_batches, log,
              table=table)
  """

  def __init__(self, recorder: Optional[Recorder]):
    self._rec = recorder

  @property
  def recording(self) -> bool:
    """Whether this probe stamps (inside a `Record()` block)."""
    return self._rec is not None

  def Stamp(self, deps: Sequence[Any] = ()) -> List[tf.Tensor]:
    """[a `Stamp(deps)`], or [] when recording is off."""
    return [Stamp(deps)] if self._rec else []

  def Missing(self, n: int) -> List[tf.Tensor]:
    """The n stamps of a cell that did not run (a bubble tick): -1 each."""
    return [tf.constant(-1.0, tf.float64)] * n if self._rec else []

  def Mask(self, ran: tf.Tensor, stamps: List[tf.Tensor]) -> List[tf.Tensor]:
    """`stamps` where the scalar bool `ran` holds, else those of `Missing`."""
    return [tf.where(ran, v, -1.0) for v in stamps]

  def Cond(self, pred: tf.Tensor, true_fn: Callable[[], Any],
           false_fn: Callable[[], Any]) -> Any:
    """tf.cond; when recording, one left unordered (see `Unordered`)."""
    if not self._rec:
      return tf.cond(pred, true_fn, false_fn)
    return Unordered(lambda: tf.cond(pred, true_fn, false_fn))

  def SwitchCase(self, branch_index: tf.Tensor,
                 branch_fns: Sequence[Callable[[], Any]]) -> Any:
    """tf.switch_case; when recording, one left unordered (the engine's
    choice of a device's cell on a tick)."""
    if not self._rec:
      return tf.switch_case(branch_index, branch_fns)
    return Unordered(lambda: tf.switch_case(branch_index, branch_fns))

  def NewLog(self, num_ticks: int, width: int) -> Any:
    """A [num_ticks, width] float64 log of -1 (no cell ran), or ()."""
    return -tf.ones([num_ticks, width], tf.float64) if self._rec else ()

  def Log(self, log: Any, clock: tf.Tensor, stamps: List[tf.Tensor]) -> Any:
    """`log` with row `clock` set to `stamps` (one per column)."""
    if not self._rec:
      return log
    return tf.tensor_scatter_nd_update(log, tf.reshape(clock, [1, 1]),
                                       tf.stack(stamps)[tf.newaxis])

  def OneTickLog(self, stamps: List[tf.Tensor]) -> Any:
    """The [1, len(stamps)] log of a call made once, outside any loop."""
    if not self._rec:
      return ()
    return tf.reshape(tf.stack(stamps), [1, len(stamps)])

  def Add(self, direction: str, k: int, num_partitions: int,
          num_micro_batches: int, log: Any, table: Any = None,
          first: int = 0) -> None:
    """Hands partition k's finished log to the recorder (`Recorder.Add`)."""
    if self._rec:
      self._rec.Add(direction, k, num_partitions, num_micro_batches, log,
                    table, first)


def ActiveProbe() -> Probe:
  """The `Probe` of the innermost `Record()` block (a no-op one if none)."""
  return Probe(Active())


def ChromeTrace(events: Sequence[Event], devices: Sequence[str],
                marks: Optional[Dict[str, float]] = None) -> Dict[str, Any]:
  """Chrome trace JSON (chrome://tracing, Perfetto): one row per device.

  Times are microseconds from the earliest event (or the 'step_start' mark).
  A cell is named by its phase, micro-batch and (virtual) stage, e.g.
  'F t=2 s=5': with v stages per device a row holds several stages.
  """
  origin = min([ev.start for ev in events] +
               ([marks['step_start']] if marks and 'step_start' in marks
                else []))
  trace = []
  for k, name in enumerate(devices):
    trace.append({'name': 'thread_name', 'ph': 'M', 'pid': 0, 'tid': k,
                  'args': {'name': f'partition {k} on {name}'}})
  for ev in events:
    stage = f' s={ev.stage}' if ev.stage >= 0 else ''
    trace.append({
        'name': f'{ev.phase[0].upper()} t={ev.t}{stage}', 'cat': ev.phase,
        'ph': 'X', 'pid': 0, 'tid': ev.k, 'ts': (ev.start - origin) * 1e6,
        'dur': max(0.0, ev.end - ev.start) * 1e6,
        'args': {'phase': ev.phase, 'partition': ev.k, 'stage': ev.stage,
                 'micro_batch': ev.t, 'tick': ev.tick}})
  for name, value in (marks or {}).items():
    trace.append({'name': name, 'ph': 'i', 's': 'g', 'pid': 0, 'tid': 0,
                  'ts': (value - origin) * 1e6})
  return {'traceEvents': trace, 'displayTimeUnit': 'ms'}


def Breakdown(events: Sequence[Event], num_partitions: int,
              step_start: float, step_end: float) -> Dict[str, float]:
  """The paper's figure-4 split of one step, in seconds (sums to the step).

  Per device k, busy_k = time in its stage calls. Categories, averaged over
  devices:
    forward, backward: useful work (backward excludes the recompute);
    recompute: the recomputed forward inside the backward pass;
    load_imbalance: mean over k of (max_j busy_j - busy_k), the wait a
      perfectly pipelined device would still have because partitions differ;
    bubble: the rest of the idle time inside the forward and backward loops
      (pipeline fill/drain plus per-tick loop overhead);
    setup: from the step start to the first stage call, plus the gap between
      the forward and backward loops (loss, output merge, input split);
    weight_update: from the last stage call to the step end (gradient
      summation outside the loop and the optimizer update); named
      backward_and_weight_update when no backward cells were recorded.

  For 1F1B, whose forward and backward cells interleave on one clock (a
  backward cell starts before the last forward cell ends), the loop span is
  first cell start to last cell end and setup is only the time before the
  first cell.
  """
  kk = num_partitions
  busy = {ph: [0.0] * kk for ph in PHASES}
  for ev in events:
    busy[ev.phase][ev.k] += ev.end - ev.start
  fwd = [ev for ev in events if ev.phase == 'forward']
  bwd = [ev for ev in events if ev.phase != 'forward']
  first = min(ev.start for ev in events)
  last = max(ev.end for ev in events)
  fwd_span = max(ev.end for ev in fwd) - min(ev.start for ev in fwd)
  bwd_span = (max(ev.end for ev in bwd) - min(ev.start for ev in bwd)
              if bwd else 0.0)
  gap = (min(ev.start for ev in bwd) - max(ev.end for ev in fwd)
         if bwd else 0.0)
  if gap < 0:
    # Interleaved passes (1F1B): one loop from the first cell to the last.
    fwd_span, bwd_span, gap = last - first, 0.0, 0.0
  total_busy = [sum(busy[ph][k] for ph in PHASES) for k in range(kk)]
  mean = lambda xs: sum(xs) / len(xs)
  imbalance = mean([max(total_busy) - b for b in total_busy])
  idle = fwd_span + bwd_span - mean(total_busy)
  out = {
      'forward': mean(busy['forward']),
      'backward': mean(busy['backward']),
      'recompute': mean(busy['recompute']),
      'load_imbalance': imbalance,
      'bubble': idle - imbalance,
      'setup': (first - step_start) + max(0.0, gap),
      'weight_update': step_end - last,
  }
  if not bwd:
    # Without recompute the backward pass is TensorFlow's autodiff of the
    # forward loop, which records no cells: it is part of this last gap.
    out['backward_and_weight_update'] = out.pop('weight_update')
  out['step'] = step_end - step_start
  return out
