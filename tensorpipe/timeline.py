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
  events = rec.Events(raw)                 # [Event(phase, k, t, start, end)]
  trace = timeline.ChromeTrace(events, devices)

Recording is decided when the step is traced: without an active `Record()`
context no timestamp op, no extra loop state and no control dependency is
built, so instrumentation costs nothing when off. Timestamps are wall-clock
seconds (float64); cells whose tick was a bubble carry -1 and are dropped.

Nothing here runs TensorFlow ops at import.
"""

import contextlib
import dataclasses
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import tensorflow as tf

from tensorpipe import py_utils

PHASES = ('forward', 'recompute', 'backward')


@dataclasses.dataclass(frozen=True)
class Event:
  """One stage call: partition k ran `phase` of micro-batch t."""
  phase: str       # 'forward', 'recompute' or 'backward'
  k: int           # partition (= device index)
  t: int           # micro-batch
  start: float     # seconds
  end: float       # seconds


@dataclasses.dataclass
class _Entry:
  direction: str   # 'forward' (start, end) or 'backward' (start, mid, end)
  k: int
  num_partitions: int
  num_micro_batches: int
  tensor: Any


class Recorder:
  """Collects the timestamp tensors built while a step function is traced."""

  def __init__(self):
    self._entries: List[_Entry] = []
    self._marks: Dict[str, Any] = {}

  def Add(self, direction: str, k: int, num_partitions: int,
          num_micro_batches: int, tensor: tf.Tensor) -> None:
    """Registers a [ticks, 2] (forward) or [ticks, 3] (backward) tensor."""
    assert direction in ('forward', 'backward'), direction
    self._entries.append(_Entry(direction, k, num_partitions,
                                num_micro_batches, tensor))

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
      kk, tt = e.num_partitions, e.num_micro_batches
      for c, row in enumerate(rows):
        if row[0] < 0:
          continue
        if e.direction == 'forward':
          t = c - e.k
          events.append(Event('forward', e.k, t, float(row[0]),
                              float(row[1])))
        else:
          t = tt - 1 - (c - (kk - 1 - e.k))
          if len(row) == 3:
            events.append(Event('recompute', e.k, t, float(row[0]),
                                float(row[1])))
            events.append(Event('backward', e.k, t, float(row[1]),
                                float(row[2])))
          else:
            events.append(Event('backward', e.k, t, float(row[0]),
                                float(row[1])))
    events.sort(key=lambda ev: (ev.start, ev.k))
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
  """Calls `fn` (which builds a tf.cond) and keeps its conds unordered.

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
      if op.type in ('If', 'StatelessIf'):
        acd.run_independently(op)
  return out


def ChromeTrace(events: Sequence[Event], devices: Sequence[str],
                marks: Optional[Dict[str, float]] = None) -> Dict[str, Any]:
  """Chrome trace JSON (chrome://tracing, Perfetto): one row per device.

  Times are microseconds from the earliest event (or the 'step_start' mark).
  """
  origin = min([ev.start for ev in events] +
               ([marks['step_start']] if marks and 'step_start' in marks
                else []))
  trace = []
  for k, name in enumerate(devices):
    trace.append({'name': 'thread_name', 'ph': 'M', 'pid': 0, 'tid': k,
                  'args': {'name': f'partition {k} on {name}'}})
  for ev in events:
    trace.append({
        'name': f'{ev.phase[0].upper()} t={ev.t}', 'cat': ev.phase, 'ph': 'X',
        'pid': 0, 'tid': ev.k, 'ts': (ev.start - origin) * 1e6,
        'dur': max(0.0, ev.end - ev.start) * 1e6,
        'args': {'phase': ev.phase, 'partition': ev.k, 'micro_batch': ev.t}})
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
