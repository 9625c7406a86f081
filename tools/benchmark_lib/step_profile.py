"""Where a step's time goes on the CPU threads (tools/benchmark --step_profile).

A step's wall time on this machine is its kernels (the ops' compute) plus
what the runtime does around them: the executor visiting ops (dead ones
included: the branches of a tick's tf.switch_case it does not take), loop
control, TensorArray and copy bookkeeping, function calls. The cost model
(tensorpipe/cost_model.py) charges the second part as a per-tick cost;
this module measures it from TensorFlow's own profiler.

`Run(step, steps, logdir)` runs `step()` `steps` times under
`tf.profiler.experimental` (host tracer: an event named 'op:OpType' for
each kernel it traces, on the thread that ran it) and `FromXSpace` reads
the trace back. TF 2.21 traces no such event for its cheapest ops
(Switch, Merge, Enter, Exit, NextIteration, Identity, Const) nor for
asynchronous kernels (_Recv): their time counts as no kernel. _Send, the
loop counter's ops and TensorList writes are traced: they count as
kernels. Per step (the window of its 'step' trace event; a kernel that
spans two windows counts in both):

  wall         the step's window
  kernel       the union over threads of the kernel events: some kernel ran
  no_kernel    wall - kernel: no kernel ran on any thread
  busy         per thread, the union of its kernel events
  kernels      kernel events in the window

The profiler adds its own cost per op (about a microsecond), so the
profiled wall is above the unprofiled step; the benchmark reports both.

Usage:
  profiles = step_profile.Run(lambda: step_fn(x)[0].numpy(), 5, '/tmp/p')
  s = step_profile.Median(profiles)
  s.no_kernel_s, s.busy_s
"""

import dataclasses
import glob
import os
import shutil
import statistics
from typing import Callable, Dict, List, Sequence, Tuple

from tools.benchmark_lib import settings

STEP_EVENT = 'step'

Interval = Tuple[int, int]  # [start, end) in picoseconds


def UnionLength(intervals: Sequence[Interval]) -> int:
  """The length of the union of [start, end) intervals."""
  total, end = 0, None
  for a, b in sorted(intervals):
    if end is None or a > end:
      total += b - a
      end = b
    elif b > end:
      total += b - end
      end = b
  return total


def IsKernelEvent(name: str) -> bool:
  """Whether a host-trace event is an op kernel's compute ('name:Type').

  The runtime's own events have '::' in their names
  ('ExecutorState::Process', 'ThreadpoolListener::Record'), a space
  ('EagerLocalExecute: __inference_Step_45', the whole function call on
  the Python thread) or no ':'.
  """
  return name.count(':') == 1 and not any(c.isspace() for c in name)


@dataclasses.dataclass(frozen=True)
class StepProfile:
  """One step's (or the median step's) time on the threads, in seconds."""
  wall_s: float
  kernel_s: float
  no_kernel_s: float
  busy_s: Tuple[float, ...]  # per thread that ran a kernel, largest first
  kernels: int

  def ToJson(self) -> Dict[str, object]:
    d = dataclasses.asdict(self)
    d['busy_s'] = list(self.busy_s)
    return d

  @classmethod
  def FromJson(cls, d: Dict[str, object]) -> 'StepProfile':
    return cls(**dict(d, busy_s=tuple(d['busy_s'])))


def Summarize(window: Interval, threads: Sequence[Sequence[Interval]]
              ) -> StepProfile:
  """The StepProfile of one step's window from each thread's kernel
  intervals (clipped to the window)."""
  lo, hi = window
  per_thread = []
  for events in threads:
    clipped = [(max(a, lo), min(b, hi)) for a, b in events
               if b > lo and a < hi]
    if clipped:
      per_thread.append(clipped)
  every = [iv for events in per_thread for iv in events]
  kernel = UnionLength(every)
  ps = 1e-12
  return StepProfile(
      wall_s=(hi - lo) * ps, kernel_s=kernel * ps,
      no_kernel_s=(hi - lo - kernel) * ps,
      busy_s=tuple(sorted((UnionLength(e) * ps for e in per_thread),
                          reverse=True)),
      kernels=len(every))


def FromXSpace(xspace) -> List[StepProfile]:
  """The StepProfile of each 'step' event of a profiler XSpace, in order."""
  windows: List[Interval] = []
  threads: List[List[Interval]] = []
  for plane in xspace.planes:
    names = {k: m.name for k, m in plane.event_metadata.items()}
    for line in plane.lines:
      base = line.timestamp_ns * 1000
      kernels = []
      for e in line.events:
        name = names.get(e.metadata_id, '')
        start = base + e.offset_ps
        if name == STEP_EVENT:
          windows.append((start, start + e.duration_ps))
        elif IsKernelEvent(name):
          kernels.append((start, start + e.duration_ps))
      if kernels:
        threads.append(kernels)
  return [Summarize(w, threads) for w in sorted(windows)]


def Median(profiles: Sequence[StepProfile]) -> StepProfile:
  """Field by field medians (busy_s: per thread rank), so kernel_s +
  no_kernel_s need not equal wall_s."""
  if not profiles:
    raise ValueError('Median of no step profiles')
  n = max(len(p.busy_s) for p in profiles)
  busy = tuple(statistics.median(p.busy_s[i] if i < len(p.busy_s) else 0.0
                                 for p in profiles) for i in range(n))
  return StepProfile(
      wall_s=statistics.median(p.wall_s for p in profiles),
      kernel_s=statistics.median(p.kernel_s for p in profiles),
      no_kernel_s=statistics.median(p.no_kernel_s for p in profiles),
      busy_s=busy,
      kernels=round(statistics.median(p.kernels for p in profiles)))


def Run(step: Callable[[], object], steps: int, logdir: str
        ) -> List[StepProfile]:
  """Runs `step()` `steps` times under TF's profiler (host events only)
  and returns each step's profile. `step` must wait for its results
  (e.g. call .numpy()); `logdir` is replaced."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  if steps < 1:
    raise ValueError(f'steps={steps} must be at least 1')
  shutil.rmtree(logdir, ignore_errors=True)
  options = tf.profiler.experimental.ProfilerOptions(
      host_tracer_level=2, python_tracer_level=0, device_tracer_level=0)
  tf.profiler.experimental.start(logdir, options=options)
  try:
    for i in range(steps):
      with tf.profiler.experimental.Trace(STEP_EVENT, step_num=i, _r=1):
        step()
  finally:
    tf.profiler.experimental.stop()
  files = glob.glob(os.path.join(logdir, 'plugins', 'profile', '*',
                                 '*.xplane.pb'))
  if len(files) != 1:
    raise RuntimeError(f'the profiler wrote {len(files)} traces under '
                       f'{logdir}, expected 1')
  xspace = xplane_pb2.XSpace()
  with open(files[0], 'rb') as f:
    xspace.ParseFromString(f.read())
  return FromXSpace(xspace)


def Ticks(setting) -> int:
  """Clock ticks of a benchmark setting's table per step (0: no pipeline).
  GPipe's table counts its forward and its backward ticks."""
  if setting.kind != 'pipe':
    return 0
  return settings.ScheduleTable(setting).num_ticks


def Table(rows: Sequence[Dict[str, object]]) -> str:
  """Markdown table of --step_profile rows (model, setting, ticks,
  step_time_s, profile: a StepProfile), with each setting's no-kernel time
  over its model's first setting's, per extra tick."""
  out = ['| model | setting | ticks | step ms | profiled ms | kernels ms | '
         'no kernel ms | no kernel per tick µs | extra no kernel per extra '
         'tick µs (vs first) | busy ms per thread | kernels |',
         '|---|---|---|---|---|---|---|---|---|---|---|']
  first: Dict[str, Dict[str, object]] = {}
  for r in rows:
    p = r['profile']
    base = first.setdefault(r['model'], r)
    extra_ticks = r['ticks'] - base['ticks']
    extra = ''
    if r is not base and extra_ticks > 0:
      more = p.no_kernel_s - base['profile'].no_kernel_s
      extra = f'{more / extra_ticks * 1e6:.0f}'
    per_tick = (f'{p.no_kernel_s / r["ticks"] * 1e6:.0f}' if r['ticks']
                else '')
    busy = ', '.join(f'{b * 1e3:.1f}' for b in p.busy_s)
    out.append(f'| {r["model"]} | {r["setting"]} | {r["ticks"]} | '
               f'{r["step_time_s"] * 1e3:.1f} | {p.wall_s * 1e3:.1f} | '
               f'{p.kernel_s * 1e3:.1f} | {p.no_kernel_s * 1e3:.2f} | '
               f'{per_tick} | {extra} | {busy} | {p.kernels} |')
  return '\n'.join(out)
