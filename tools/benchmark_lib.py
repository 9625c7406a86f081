"""Library of tools/benchmark: settings, one-setting runs, tables and plots.

Each setting (K, T, recompute, or a baseline) runs in a fresh Python process
(`RunSettingSubprocess`), so thread-pool sizes and logical devices can be set
before TensorFlow starts and the memory figures belong to that setting
alone. The child (`RunSetting`) builds the model, traces the training step
(forward + backward + SGD update in one tf.function) and measures memory
over the warm-up steps; then it builds the setting's baselines
(`PairedBaselines`) and, for pipelined settings, a copy of the step with the
timeline on, and times all of them in turn, one step each per round. Ratios
between a setting and its baselines come from that rotation. The recorded
steps' cells are the in-pipeline stage costs the simulator
(tensorpipe/simulator.py) predicts from; each partition is also timed alone
on one micro-batch (the costs a user has before running the pipeline).

Settings are named:
  plain          the layers as one SequentialLayer, no TensorPipeLayer;
  plain-T8       the same, run on 8 micro-batches one after another
                 (Python-unrolled in the step, gradients summed by autodiff,
                 all activations kept): what micro-batching itself costs
                 with these kernels, without any pipeline machinery;
  naive-K        K partitions, T=1, no recompute (model parallelism, no
                 pipelining), with the issue's "one core per device" threads
                 (one intra-op thread, K inter-op threads). TF's logical CPU
                 devices share one thread pool, so the idle devices' cores
                 still run the busy device's independent ops (e.g. the input
                 and weight gradients of a conv at the same time);
  naive-K-serial the same with a single inter-op thread: at most one op at a
                 time, as on K single-core devices of which model
                 parallelism keeps one busy at a time (the paper's naive
                 baseline). Compared across processes.
  K2-T8-rc       TensorPipeLayer with K=2, T=8 and recompute;
  K2-T8-norc     the same without recompute;
  K2-T8-rcg      recompute with recompute_impl='tf_recompute_grad'.

Nothing here defines flags or runs TensorFlow ops at import; TensorFlow is
imported inside the child functions.
"""

import dataclasses
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (description, batch size)
BUILTIN_MODELS = {
    'dense16': ('16 layers relu(x @ W + b), W 1024x1024, batch 64, float32',
                64),
    'conv16': ('16 layers relu(conv3x3), 16 -> 16 channels, no bias, input '
               '[64, 32, 32, 16] NHWC, float32', 64),
    'dense32': ('32 layers relu(x @ W + b), W 1024x1024, batch 64, float32',
                64),
    'dense32mem': ('32 layers relu(x @ W + b), W 256x256, batch 4096, '
                   'float32: activation-dominated, for the memory target',
                   4096),
    'tiny': ('4 layers relu(x @ W + b), W 8x8, batch 8 (smoke tests)', 8),
}


@dataclasses.dataclass(frozen=True)
class Setting:
  """One benchmark configuration."""
  name: str
  kind: str                  # 'plain' or 'pipe'
  num_partitions: int = 1
  num_micro_batches: int = 1
  recompute: bool = False
  recompute_impl: str = 'explicit'
  serial: bool = False       # naive-K-serial: one inter-op thread

  @property
  def threads(self) -> Tuple[int, int]:
    """(intra-op, inter-op) threads: one core per device (or one in all)."""
    return 1, 1 if self.serial else max(1, self.num_partitions)


_SETTING_RE = re.compile(r'^K(\d+)-T(\d+)-(rc|norc|rcg)$')


def ParseSetting(name: str) -> Setting:
  """Parses a setting name such as 'plain', 'naive-2' or 'K4-T8-rc'.

  Raises:
    ValueError: for an unknown name, listing the accepted forms.
  """
  if name == 'plain':
    return Setting(name, 'plain')
  m = re.match(r'^plain-T(\d+)$', name)
  if m and int(m.group(1)) >= 1:
    return Setting(name, 'plain', 1, int(m.group(1)), False)
  m = re.match(r'^naive-(\d+)(-serial)?$', name)
  if m and int(m.group(1)) >= 1:
    return Setting(name, 'pipe', int(m.group(1)), 1, False,
                   serial=bool(m.group(2)))
  m = _SETTING_RE.match(name)
  if m and int(m.group(1)) >= 1 and int(m.group(2)) >= 1:
    mode = m.group(3)
    return Setting(name, 'pipe', int(m.group(1)), int(m.group(2)),
                   mode != 'norc',
                   'tf_recompute_grad' if mode == 'rcg' else 'explicit')
  raise ValueError(f'unknown benchmark setting {name!r}; use plain, '
                   'plain-T<t> (e.g. plain-T8), naive-K (e.g. naive-2), '
                   'naive-K-serial or '
                   'K<k>-T<t>-<rc|norc|rcg> (e.g. K4-T8-rc)')


def GridSettings(ks: Sequence[int] = (1, 2, 4),
                 ts: Sequence[int] = (1, 4, 8)) -> List[str]:
  """plain, plain-T, naive-K(-serial) for K > 1, every (K, T) x recompute."""
  names = ['plain'] + [f'plain-T{t}' for t in ts if t > 1]
  names += [f'naive-{k}{suffix}' for k in ks if k > 1
            for suffix in ('', '-serial')]
  for k in ks:
    for t in ts:
      names += [f'K{k}-T{t}-rc', f'K{k}-T{t}-norc']
  return names


# -- models ------------------------------------------------------------------


def BuiltinModel(name: str) -> Tuple[List[Any], List[int]]:
  """(list of layer Params, input shape) of a built-in micro-benchmark."""
  from tensorpipe.layers import conv  # pylint: disable=g-import-not-at-top
  from tensorpipe.layers import linear  # pylint: disable=g-import-not-at-top
  if name not in BUILTIN_MODELS:
    raise ValueError(f'unknown model {name!r}; built-in models are '
                     f'{sorted(BUILTIN_MODELS)} (or a registered experiment '
                     'key)')
  batch = BUILTIN_MODELS[name][1]
  if name == 'conv16':
    return [conv.Conv2DLayer.Params().Set(
        name=f'conv{i}', filter_shape=(3, 3, 16, 16), filter_stride=(1, 1),
        bias=False, activation='RELU') for i in range(16)], [batch, 32, 32, 16]
  num, dim = {'dense16': (16, 1024), 'dense32': (32, 1024),
              'dense32mem': (32, 256), 'tiny': (4, 8)}[name]
  return [linear.FCLayer.Params().Set(
      name=f'fc{i}', input_dim=dim, output_dim=dim, activation='RELU')
          for i in range(num)], [batch, dim]


def RegistryModel(key: str) -> Tuple[List[Any], List[int]]:
  """Layers and input shape of a registered experiment's TensorPipeLayer.

  The experiment's `Task().model` must be TensorPipeLayer Params with
  `layers` (or `partitions`) and `input_shapes`; the benchmark re-partitions
  those layers for each setting and trains them on random inputs with a
  mean-of-output loss (the model's cost, not its task's).

  Raises:
    ValueError: unknown key (with the known keys) or no layer list.
  """
  from tensorpipe import model_registry  # pylint: disable=g-import-not-at-top
  try:
    task_p = model_registry.GetExperiment(key).Task()
  except ValueError as e:
    raise ValueError(f'--models: {key!r} is neither a built-in model '
                     f'({sorted(BUILTIN_MODELS)}) nor usable: {e}') from None
  model = getattr(task_p, 'model', None)
  layers = getattr(model, 'layers', None) or [
      lp for part in (getattr(model, 'partitions', None) or []) for lp in part]
  shapes = getattr(model, 'input_shapes', None)
  if not layers or not shapes:
    raise ValueError(f'experiment {key!r}: Task().model has no `layers` / '
                     '`partitions` with `input_shapes`; the benchmark needs a '
                     'TensorPipeLayer model')
  return list(layers), list(shapes[0])


def ModelLayers(name: str) -> Tuple[List[Any], List[int]]:
  if name in BUILTIN_MODELS:
    return BuiltinModel(name)
  return RegistryModel(name)


def _BuildLayer(setting: Setting, layer_ps, input_shape):
  """The layer under test for a setting."""
  from tensorpipe import pipeline  # pylint: disable=g-import-not-at-top
  from tensorpipe.layers import composite  # pylint: disable=g-import-not-at-top
  if setting.kind == 'plain':
    seq = composite.SequentialLayer.Params().Set(
        name='Sequential', sub=layer_ps).Instantiate()
    if setting.num_micro_batches == 1:
      return seq
    return _UnrolledMicroBatches(seq, setting.num_micro_batches)
  return pipeline.TensorPipeLayer.Params().Set(
      name='TensorPipe', layers=layer_ps,
      num_partitions=setting.num_partitions,
      num_micro_batches=setting.num_micro_batches,
      input_shapes=[input_shape], recompute=setting.recompute,
      recompute_impl=setting.recompute_impl).Instantiate()


class _UnrolledMicroBatches:
  """plain-T<t>: a layer run on T micro-batches in turn, outputs concatenated.

  Autodiff sums each weight's gradient over the T uses, as gradient
  accumulation does; nothing is recomputed or pipelined.
  """

  def __init__(self, layer, num_micro_batches: int):
    self._layer = layer
    self._t = num_micro_batches
    self.trainable_variables = layer.trainable_variables

  def FPropDefaultTheta(self, x):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    if x.shape[0] % self._t:
      raise ValueError(f'batch {x.shape[0]} is not divisible by T={self._t}')
    outs = [self._layer.FPropDefaultTheta(mb)
            for mb in tf.split(x, self._t, axis=0)]
    return tf.concat(outs, axis=0)


# -- the child: one setting in this process ----------------------------------


def _ResetPeakRss() -> bool:
  """Resets the kernel's peak-RSS counter (VmHWM) of this process."""
  try:
    with open('/proc/self/clear_refs', 'w') as f:
      f.write('5')
    return True
  except OSError:
    return False


def _Rss() -> Tuple[int, int]:
  """(current RSS, peak RSS) in bytes."""
  cur = peak = 0
  try:
    with open('/proc/self/status') as f:
      for line in f:
        if line.startswith('VmRSS:'):
          cur = int(line.split()[1]) * 1024
        elif line.startswith('VmHWM:'):
          peak = int(line.split()[1]) * 1024
  except OSError:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  return cur, peak


def _TfMemoryInfo(tf, reset: bool = False) -> Optional[Dict[str, int]]:
  """TF's CPU allocator figures (all logical CPUs share it), or None."""
  try:
    if reset:
      tf.config.experimental.reset_memory_stats('CPU:0')
    info = tf.config.experimental.get_memory_info('CPU:0')
    return {k: int(v) for k, v in info.items()}
  except (ValueError, RuntimeError, tf.errors.OpError):
    return None


def _Median(fn, reps: int) -> float:
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _PartitionCosts(tf, layer, x, num_mb: int, reps: int) -> Dict[str, Any]:
  """Median time of each partition's forward / forward+vjp on a micro-batch."""
  from tensorpipe import microbatch  # pylint: disable=g-import-not-at-top
  from tensorpipe.layers import composite  # pylint: disable=g-import-not-at-top
  mb = microbatch.Slice(microbatch.Split((x,), num_mb), 0)
  fwd, bwd = [], []
  args = tuple(mb)
  for k, (layers, device) in enumerate(zip(layer.PartitionLayers(),
                                           layer.devices)):
    thetas = [lay.theta for lay in layers]

    def Forward(*a, layers=layers, thetas=thetas):
      for lay, th in zip(layers, thetas):
        a = composite.AsArgs(lay.FProp(th, *a))
      return composite.FromArgs(a)

    def ForwardBackward(*a, layers=layers, thetas=thetas):
      variables = [v for lay in layers for v in lay.trainable_variables]
      with tf.GradientTape() as tape:
        tape.watch([t for t in a if t.dtype.is_floating])
        y = Forward(*a, layers=layers, thetas=thetas)
      return tape.gradient(y, [t for t in a if t.dtype.is_floating] +
                           variables)

    def Null(*a):
      return [tf.identity(t) for t in a]

    with tf.device(device):
      f_fn = tf.function(Forward)
      fb_fn = tf.function(ForwardBackward)
      null_fn = tf.function(Null)
      out = f_fn(*args)
      fb_fn(*args)
      null_fn(*args)
      # The cost of calling a tf.function (dispatch, fetching results) is not
      # part of a stage call inside the pipeline's loop: subtract it.
      null = _Median(lambda null_fn=null_fn: [
          t.numpy() for t in null_fn(*args)], reps)
      f = _Median(lambda f_fn=f_fn: tf.nest.map_structure(
          lambda t: t.numpy(), f_fn(*args)), reps)
      fb = _Median(lambda fb_fn=fb_fn: [g.numpy() for g in fb_fn(*args)],
                   reps)
    fwd.append(max(0.0, f - null))
    bwd.append(max(0.0, fb - f))
    args = composite.AsArgs(out)
  return {'forward': fwd, 'backward': bwd}


def PairedBaselines(setting_name: str) -> List[str]:
  """Settings timed in the same process as `setting_name`, interleaved.

  Separate processes of the same setting differ by up to ~25% on this
  machine (memory layout, oneDNN caches), so every ratio the targets use is
  taken between functions timed step by step in turn in one process: plain
  for every setting (plain-T<t> too for K=1, T > 1), naive-K for K > 1 and
  T > 1, and the no-recompute twin for K=1 recompute settings. Baselines run
  with the setting's threads (e.g. plain with K inter-op threads next to a
  K-partition setting).
  """
  s = ParseSetting(setting_name)
  if s.kind == 'plain':
    return [] if s.name == 'plain' else ['plain']
  out = ['plain']
  k, t = s.num_partitions, s.num_micro_batches
  if k == 1 and t > 1:
    out.append(f'plain-T{t}')
  if k > 1 and t > 1:
    out.append(f'naive-{k}')
  if k == 1 and s.recompute:
    out.append(f'K1-T{t}-norc')
  return out


def _StepFn(tf, layer, x, learning_rate):
  """The training step (forward, backward, SGD update) as a tf.function."""
  from tensorpipe import timeline  # pylint: disable=g-import-not-at-top
  variables = layer.trainable_variables

  def Step(x):
    rec = timeline.Active()
    start = rec.Mark('step_start', [x]) if rec else None
    with tf.control_dependencies([start] if rec else []):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.nest.flatten(layer.FPropDefaultTheta(x))[0])
    grads = tape.gradient(loss, variables)
    updates = [v.assign_sub(learning_rate * g)
               for v, g in zip(variables, grads)]
    if rec:
      rec.Mark('step_end', updates)
      return loss, rec.Tensors()
    return loss, {}
  return tf.function(Step).get_concrete_function(x)


def RunSetting(model: str, setting_name: str, steps: int = 10,
               warmup: int = 2, partition_costs: bool = True,
               timeline_dir: Optional[str] = None,
               learning_rate: float = 1e-3,
               pair_with: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  """Runs one setting in this process (TensorFlow must not be started yet).

  Memory is measured on the setting alone, over its warm-up steps, before
  the `pair_with` baselines are built; then the setting and its baselines
  are timed in turn, one step each per round, for `steps` rounds.

  Returns:
    A JSON-able dict: step times, examples/s, memory (peak RSS above idle
    and TF's allocator: `activation_peak_bytes` is the allocator's peak
    during a step minus what was allocated before it, i.e. weights and
    inputs), partition costs, the paired baselines' step times and, with
    `timeline_dir`, the timeline's breakdown and file paths.
  """
  setting = ParseSetting(setting_name)
  pairs = [ParseSetting(n) for n in (pair_with or [])]
  intra, inter = setting.threads
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.threading.set_intra_op_parallelism_threads(intra)
  tf.config.threading.set_inter_op_parallelism_threads(inter)
  from tensorpipe import devices  # pylint: disable=g-import-not-at-top
  from tensorpipe import timeline  # pylint: disable=g-import-not-at-top
  devices.SetNumLogicalCpuDevices(
      max([1, setting.num_partitions] + [p.num_partitions for p in pairs]))

  layer_ps, input_shape = ModelLayers(model)
  batch = input_shape[0]
  x = tf.random.stateless_uniform(input_shape, seed=[1, 2])
  layer = _BuildLayer(setting, layer_ps, input_shape)

  t0 = time.perf_counter()
  if timeline_dir:
    with timeline.Record() as recorder:
      step_fn = _StepFn(tf, layer, x, learning_rate)
  else:
    recorder = None
    step_fn = _StepFn(tf, layer, x, learning_rate)
  trace_s = time.perf_counter() - t0

  def Run(fn):
    loss, raw = fn(x)
    loss.numpy()
    return raw

  # Memory of the setting alone: its warm-up steps (at least one).
  idle_rss, _ = _Rss()
  reset_ok = _ResetPeakRss()
  alloc_before = _TfMemoryInfo(tf, reset=True)
  t0 = time.perf_counter()
  for _ in range(max(1, warmup)):
    raw = Run(step_fn)
  warmup_s = time.perf_counter() - t0
  _, peak_rss = _Rss()
  alloc = _TfMemoryInfo(tf)
  if alloc and alloc_before:
    alloc['current_before_step'] = alloc_before['current']
    alloc['activation_peak_bytes'] = max(
        0, alloc['peak'] - alloc_before['current'])

  fns = {setting.name: step_fn}
  for p in pairs:
    fns[p.name] = _StepFn(tf, _BuildLayer(p, layer_ps, input_shape), x,
                          learning_rate)
    for _ in range(max(1, warmup)):
      Run(fns[p.name])
  # Stage costs for the simulator: the same layer's step with the timeline
  # on, timed in the same rotation, so each recorded step's cells and its
  # wall time come from the same moment (this machine drifts by 20-30%
  # within minutes).
  recorded, rec_events = None, []
  # Without recompute the backward pass is autodiff of the forward loop and
  # records no cells: the recorded step is then the recompute twin's (same
  # layers, K and T), whose backward cells (without their recompute part)
  # stand for the autodiff backward.
  want_cells = (partition_costs and setting.kind == 'pipe' and
                setting.recompute_impl == 'explicit' and
                (setting.num_partitions > 1 or setting.num_micro_batches > 1)
                and not timeline_dir)
  if want_cells:
    rec_layer = layer if setting.recompute else _BuildLayer(
        dataclasses.replace(setting, recompute=True), layer_ps, input_shape)
    with timeline.Record() as recorded:
      fns['timeline'] = _StepFn(tf, rec_layer, x, learning_rate)
    for _ in range(max(1, warmup)):
      Run(fns['timeline'])
  times = {name: [] for name in fns}
  names = list(fns)
  for i in range(steps):
    # Rotate the order each round so no function always follows another.
    for name in names[i % len(names):] + names[:i % len(names)]:
      start = time.perf_counter()
      raw_i = Run(fns[name])
      times[name].append(time.perf_counter() - start)
      if name == setting.name:
        raw = raw_i
      elif name == 'timeline':
        rec_events.append(recorded.Events(raw_i))
  med = statistics.median(times[setting.name])
  result = {
      'model': model, 'setting': setting.name, 'kind': setting.kind,
      'K': setting.num_partitions, 'T': setting.num_micro_batches,
      'recompute': setting.recompute, 'recompute_impl': setting.recompute_impl,
      'batch': batch, 'threads': {'intra_op': intra, 'inter_op': inter},
      'steps': steps, 'warmup': warmup,
      'step_times_s': times[setting.name],
      'step_time_s': med, 'examples_per_s': batch / med,
      'trace_s': trace_s, 'warmup_s': warmup_s,
      'paired': {p.name: {'step_time_s': statistics.median(times[p.name]),
                          'step_times_s': times[p.name]} for p in pairs},
      'memory': {
          'idle_rss_bytes': idle_rss, 'peak_rss_bytes': peak_rss,
          'peak_above_idle_bytes': max(0, peak_rss - idle_rss),
          'peak_reset': reset_ok, 'tf_allocator': alloc},
  }
  if timeline_dir and recorder is not None:
    result['timeline'] = _WriteTimeline(
        recorder, raw, setting, model, timeline_dir,
        layer.devices if setting.kind == 'pipe' else ['/CPU:0'])
  if partition_costs and setting.kind == 'pipe':
    result['partition_costs_s'] = _PartitionCosts(
        tf, layer, x, setting.num_micro_batches, reps=max(3, steps // 2))
  if want_cells:
    result['stage_costs_s'] = StageCostsFromEvents(
        [e for events in rec_events for e in events], setting.num_partitions)
    if setting.recompute:
      result['recorded_step_time_s'] = statistics.median(times['timeline'])
  return result


def StageCostsFromEvents(events, num_partitions: int) -> Dict[str, Any]:
  """Per partition and phase, statistics of its recorded cells' durations.

  These are the stage costs inside the running pipeline (warm caches, no
  per-call dispatch), as opposed to `_PartitionCosts`' isolated calls.
  Returns {phase: [median per partition]} and, under 'alone', the lower
  quartiles: with more devices than cores a cell's wall time includes
  waiting for a core, and the quickest cells are those that had one to
  themselves, i.e. the cell's work.
  """
  out = {'alone': {}}
  for phase in ('forward', 'recompute', 'backward'):
    per_k = [sorted(e.end - e.start for e in events
                    if e.phase == phase and e.k == k) or [0.0]
             for k in range(num_partitions)]
    out[phase] = [statistics.median(d) for d in per_k]
    out['alone'][phase] = [d[(len(d) - 1) // 4] for d in per_k]
  return out


def _WriteTimeline(recorder, raw, setting, model, out_dir,
                   device_names) -> Dict[str, Any]:
  from tensorpipe import timeline  # pylint: disable=g-import-not-at-top
  events = recorder.Events(raw)
  marks = recorder.Marks(raw)
  os.makedirs(out_dir, exist_ok=True)
  stem = os.path.join(out_dir, f'timeline_{model}_{setting.name}')
  with open(stem + '.json', 'w') as f:
    json.dump(timeline.ChromeTrace(events, device_names, marks), f)
  breakdown = timeline.Breakdown(events, setting.num_partitions,
                                 marks['step_start'], marks['step_end'])
  png = stem + '.png'
  PlotGantt(events, setting.num_partitions, marks, png,
            title=f'{model} {setting.name}: one training step')
  return {'chrome_trace': stem + '.json', 'png': png,
          'breakdown_s': breakdown, 'num_events': len(events),
          'events': [dataclasses.asdict(e) for e in events],
          'marks': marks}


def PlotGantt(events, num_partitions: int, marks: Dict[str, float],
              path: str, title: str = '') -> None:
  """PNG Gantt chart: one row per device, colour by phase, label t."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  colors = {'forward': '#4c72b0', 'recompute': '#dd8452',
            'backward': '#55a868'}
  origin = marks.get('step_start', min(e.start for e in events))
  fig, ax = plt.subplots(figsize=(12, 1.0 + 0.6 * num_partitions))
  for e in events:
    left, width = (e.start - origin) * 1e3, (e.end - e.start) * 1e3
    ax.barh(e.k, width, left=left, color=colors[e.phase], edgecolor='black',
            linewidth=0.3, height=0.8)
    if width > 0:
      ax.text(left + width / 2, e.k, str(e.t), ha='center', va='center',
              fontsize=6, color='white')
  for name in ('step_start', 'step_end'):
    if name in marks:
      ax.axvline((marks[name] - origin) * 1e3, color='gray', ls='--', lw=0.8)
  ax.set_yticks(range(num_partitions))
  ax.set_yticklabels([f'device {k}' for k in range(num_partitions)])
  ax.invert_yaxis()
  ax.set_xlabel('time in the step (ms); number = micro-batch t')
  handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
  ax.legend(handles, list(colors), loc='upper right', fontsize=7, ncol=3)
  ax.set_title(title)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def ChildMain() -> None:
  """Entry point of the per-setting subprocess: argv[1] is a JSON request."""
  request = json.loads(sys.argv[1])
  result = RunSetting(**request)
  sys.stdout.write('BENCHMARK_RESULT ' + json.dumps(result) + '\n')


def RunSettingSubprocess(model: str, setting_name: str, timeout_s: float = 600,
                         **kwargs) -> Dict[str, Any]:
  """Runs `RunSetting` in a fresh Python process and returns its result.

  Raises:
    RuntimeError: the child failed, with its stderr tail.
  """
  ParseSetting(setting_name)
  request = dict(model=model, setting_name=setting_name, **kwargs)
  env = dict(os.environ)
  env['PYTHONPATH'] = _REPO_ROOT + (
      os.pathsep + env['PYTHONPATH'] if env.get('PYTHONPATH') else '')
  env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  proc = subprocess.run(
      [sys.executable, '-c',
       'from tools import benchmark_lib; benchmark_lib.ChildMain()',
       json.dumps(request)],
      capture_output=True, text=True, timeout=timeout_s, env=env,
      cwd=_REPO_ROOT, check=False)
  for line in proc.stdout.splitlines():
    if line.startswith('BENCHMARK_RESULT '):
      return json.loads(line[len('BENCHMARK_RESULT '):])
  raise RuntimeError(f'benchmark setting {setting_name!r} of {model!r} '
                     f'failed (exit {proc.returncode}):\n'
                     f'{proc.stderr[-3000:]}')


# -- analysis of a set of results (parent process) ---------------------------


def PairedTime(r: Dict[str, Any], baseline: str) -> Optional[float]:
  """The baseline's step time measured in r's own process, if it was."""
  p = (r.get('paired') or {}).get(baseline)
  return p['step_time_s'] if p else None


def AddSpeedups(results: List[Dict[str, Any]], baseline: str) -> None:
  """Sets 'speedup' (baseline step time / step time) per result, in place.

  The baseline's time from the same process (see PairedBaselines) is used
  when there is one ('speedup_paired' True), else the baseline's own run.
  """
  base = {r['model']: r['step_time_s'] for r in results
          if r['setting'] == baseline}
  for r in results:
    paired = PairedTime(r, baseline)
    b = paired or base.get(r['model'])
    r['speedup_vs'] = baseline if b else None
    r['speedup'] = (b / r['step_time_s']) if b else None
    r['speedup_paired'] = paired is not None


def _Costs(r, source: str = 'pipeline', alone: bool = False):
  """(forward, backward) per-partition costs of a result, or None.

  source 'pipeline': the cells recorded inside the running pipeline
  (`stage_costs_s`; with recompute the backward cost is recompute + backward
  - forward, so that the simulator's recompute (= forward) plus it is the
  measured cell; without, the recompute twin's backward cells);
  'isolated': each partition timed alone (`partition_costs_s`).
  """
  if source == 'pipeline':
    c = r.get('stage_costs_s')
    if not c:
      return None
    if alone and 'alone' in c:
      c = c['alone']
    if not r['recompute']:
      return c['forward'], c['backward']
    return c['forward'], [max(0.0, rc + b - f) for f, rc, b in zip(
        c['forward'], c['recompute'], c['backward'])]
  c = r.get('partition_costs_s')
  return (c['forward'], c['backward']) if c else None


def _MeasuredStep(r, source: str) -> float:
  """The step time a prediction from `source` costs is compared with.

  Pipeline-cell costs come from the recorded steps, which were timed in the
  same rotation: their own wall time is the fair comparison.
  """
  if source == 'pipeline' and r.get('recorded_step_time_s'):
    return r['recorded_step_time_s']
  return r['step_time_s']


def AddPredictions(results: List[Dict[str, Any]],
                   num_cores: Optional[int] = None) -> Dict[str, Any]:
  """Adds the simulator's predicted step time to every pipelined result.

  Two predictions per result, from two sources of stage costs:
    'pipeline' (`predicted_step_s`, settings with loops): the setting's own
      cells recorded by the timeline inside the pipeline (median per
      partition and phase), compared with the wall time of those same
      recorded steps; for no-recompute settings the cells of the recompute
      twin timed in the same rotation, compared with the setting's time. This checks the schedule model (dependencies,
      clock ticks, bubble, overheads) given the costs, as the issue's
      simulator target asks. With K <= cores each device has a core; with
      more devices than cores the cells' work (lower quartile of their
      durations) is simulated on the shared cores.
    'isolated' (`predicted_isolated_step_s`, every setting): each partition
      timed alone on one micro-batch, i.e. what a user has before running
      the pipeline; devices share `num_cores` cores (processor sharing).
  Calibration per model, recompute mode and source: the per-tick overhead
  o and the fixed per-step overhead F are fitted by least squares to the
  K=1 runs with loops (T > 1) (simulator.CalibrateFromK1); K=1, T=1 (the
  loop-free fast path: f + b + F) and every K > 1 run are out-of-sample.

  Returns:
    The calibrations, keyed 'model/rc/source'.
  """
  from tensorpipe import simulator  # pylint: disable=g-import-not-at-top
  cores = num_cores or os.cpu_count() or 1
  calib = {}
  for source in ('pipeline', 'isolated'):
    for model in sorted({r['model'] for r in results}):
      for rc in (True, False):
        runs = []
        for r in results:
          costs = _Costs(r, source) if r['kind'] == 'pipe' else None
          if (costs and r['model'] == model and r['K'] == 1 and r['T'] > 1
              and r['recompute'] == rc and r['recompute_impl'] == 'explicit'):
            runs.append((r['T'], costs[0][0], costs[1][0],
                         _MeasuredStep(r, source)))
        if runs:
          c = simulator.CalibrateFromK1(runs, rc)
          calib[f'{model}/{"rc" if rc else "norc"}/{source}'] = (
              dataclasses.asdict(c))
  for r in results:
    if r['kind'] != 'pipe' or r['recompute_impl'] != 'explicit':
      continue
    fast = r['K'] == 1 and r['T'] == 1
    for source, key in (('pipeline', 'predicted_step_s'),
                        ('isolated', 'predicted_isolated_step_s')):
      costs = _Costs(r, source)
      c = calib.get(f'{r["model"]}/{"rc" if r["recompute"] else "norc"}/'
                    f'{source}')
      if not costs:
        continue
      if c is None:
        # No K=1 run with loops to fit the overheads: predict without them.
        c = {'tick_overhead': 0.0, 'fixed_overhead': 0.0}
        r['prediction_uncalibrated'] = True
      kwargs = dict(num_micro_batches=r['T'],
                    recompute=r['recompute'] and not fast,
                    tick_overhead=0.0 if fast else c['tick_overhead'],
                    fixed_overhead=c['fixed_overhead'])
      shared = r['K'] > cores
      if source == 'pipeline' and shared:
        # More devices than cores: the cells' work (their quickest
        # quartile) on `cores` cores, shared by the running cells.
        costs = _Costs(r, source, alone=True)
      pred = simulator.Simulate(
          costs[0], costs[1],
          num_cores=(min(r['K'], cores) if source == 'isolated' or shared
                     else None), **kwargs)
      r[key] = pred.step_time
      if source == 'isolated':
        ideal = simulator.Simulate(costs[0], costs[1], **kwargs)
        r['predicted_ideal_step_s'] = ideal.step_time
        r['predicted_bubble_fraction'] = ideal.bubble_fraction
        r['predicted_busy_s'] = ideal.busy
    r['calibration_run'] = r['K'] == 1 and r['T'] > 1
    if 'predicted_step_s' in r:
      r['prediction_source'] = 'pipeline'
    elif 'predicted_isolated_step_s' in r:
      r['predicted_step_s'] = r['predicted_isolated_step_s']
      r['prediction_source'] = 'isolated'
    if 'predicted_step_s' in r:
      r['prediction_error'] = (r['predicted_step_s'] / _MeasuredStep(
          r, r['prediction_source']) - 1.0)
    if 'predicted_isolated_step_s' in r:
      r['prediction_error_isolated'] = (
          r['predicted_isolated_step_s'] / r['step_time_s'] - 1.0)
  return calib


def _Mb(x: Optional[float]) -> str:
  return '-' if x is None else f'{x / 2**20:.0f}'


def MarkdownTable(results: List[Dict[str, Any]]) -> str:
  """A markdown table of results (one row per setting)."""
  head = ('| model | setting | K | T | recompute | step ms | examples/s | '
          'speed-up | vs | peak RSS MiB above idle | activation peak MiB '
          '(TF allocator) | predicted ms | error (recompute settings: vs '
          'their recorded steps\' time) | error from isolated '
          'stage costs |')
  lines = [head, '|' + '---|' * (head.count('|') - 1)]
  any_paired = False
  for r in results:
    pipe = r['kind'] == 'pipe'
    sp = r.get('speedup')
    pred = r.get('predicted_step_s')
    err = r.get('prediction_error')
    err_s = '-' if err is None else f'{err * 100:+.0f}%'
    if err is not None and r.get('prediction_source') == 'isolated':
      err_s += ' (isolated costs)'
    if r.get('calibration_run') and err is not None:
      err_s += ' (fit)'
    if r.get('prediction_uncalibrated') and err is not None:
      err_s += ' (no K=1 fit: overheads 0)'
    err_i = r.get('prediction_error_isolated')
    sp_s = '-' if sp is None else f'{sp:.2f}x'
    if sp is not None and r.get('speedup_paired'):
      sp_s += '*'
      any_paired = True
    alloc = r['memory'].get('tf_allocator') or {}
    cells = [r['model'], r['setting'], r['K'] if pipe else '-',
             r['T'] if pipe or r['T'] > 1 else '-',
             'yes' if r['recompute'] else 'no',
             f"{r['step_time_s'] * 1e3:.1f}", f"{r['examples_per_s']:.0f}",
             sp_s, r.get('speedup_vs') or '-',
             _Mb(r['memory']['peak_above_idle_bytes']),
             _Mb(alloc.get('activation_peak_bytes')),
             '-' if pred is None else f'{pred * 1e3:.1f}', err_s,
             '-' if err_i is None else f'{err_i * 100:+.0f}%']
    lines.append('| ' + ' | '.join(str(c) for c in cells) + ' |')
  if any_paired:
    lines.append('\n\\* baseline timed in the same process, interleaved '
                 'step by step with the setting and with its threads (plain '
                 'next to a K-partition setting runs with K inter-op '
                 'threads).')
  return '\n'.join(lines)


def BreakdownTable(breakdown: Dict[str, float]) -> str:
  """Markdown table of a timeline breakdown (seconds -> ms and % of step)."""
  step = breakdown['step']
  lines = ['| part | ms | % of step |', '|---|---|---|']
  for key in ('forward', 'backward', 'recompute', 'bubble', 'load_imbalance',
              'setup', 'weight_update', 'backward_and_weight_update', 'step'):
    if key in breakdown:
      v = breakdown[key]
      lines.append(f'| {key} | {v * 1e3:.1f} | {100 * v / step:.0f}% |')
  return '\n'.join(lines)


def _Find(results, model, setting):
  for r in results:
    if r['model'] == model and r['setting'] == setting:
      return r
  return None


def EvaluateTargets(results: List[Dict[str, Any]],
                    num_cores: Optional[int] = None) -> List[Dict[str, Any]]:
  """The issue's targets 1-6 as (name, measured ratio, limit, passed) rows.

  Rows are given for the built-in models that were run (dense16, conv16,
  dense32mem); missing settings give rows with ratio None (not evaluated).
  """
  rows = []
  run_models = {r['model'] for r in results}

  def Ratio(model, a, b, inverse=False):
    """Step time of a / step time of b, from a's process when b was paired."""
    ra = _Find(results, model, a)
    if not ra:
      return None
    tb = PairedTime(ra, b)
    if tb is None:
      rb = _Find(results, model, b)
      if not rb:
        return None
      tb = rb['step_time_s']
    x = ra['step_time_s'] / tb
    return 1.0 / x if inverse else x

  def Add(name, value, limit, op):
    if op is None:     # an explanatory ratio, not a target
      rows.append({'target': name, 'measured': value, 'limit': '-',
                   'passed': None, 'info': True})
      return
    ok = None if value is None else (value <= limit if op == '<='
                                     else value >= limit)
    rows.append({'target': name, 'measured': value, 'limit': f'{op} {limit}',
                 'passed': ok})

  for model in ('dense16', 'conv16'):
    if model not in run_models:
      continue
    Add(f'1. {model}: K1-T1-norc time / plain time',
        Ratio(model, 'K1-T1-norc', 'plain'), 1.05, '<=')
    Add(f'2. {model}: throughput K1-T1-rc / K1-T1-norc',
        Ratio(model, 'K1-T1-rc', 'K1-T1-norc', inverse=True), 0.85, '>=')
    Add(f'2b. {model}: throughput K1-T8-rc / K1-T8-norc (recompute really '
        'done)', Ratio(model, 'K1-T8-rc', 'K1-T8-norc', inverse=True), 0.85,
        '>=')
    Add(f'3. {model}: K1-T8-rc time / plain time',
        Ratio(model, 'K1-T8-rc', 'plain'), 1.3, '<=')
    Add(f'3a. {model}: plain-T8 time / plain time (micro-batching alone, '
        'no pipeline code)', Ratio(model, 'plain-T8', 'plain'), None, None)
    Add(f'3b. {model}: K1-T8-rc time / plain-T8 time (the engine with '
        'recompute vs micro-batching alone)',
        Ratio(model, 'K1-T8-rc', 'plain-T8'), None, None)
    Add(f'4. {model}: throughput K2-T8-rc / naive-2',
        Ratio(model, 'K2-T8-rc', 'naive-2', inverse=True), 1.6, '>=')
    Add(f'4a. {model}: throughput K2-T8-rc / naive-2-serial (naive-2 with '
        'one op at a time, as on 2 single-core devices; separate processes)',
        Ratio(model, 'K2-T8-rc', 'naive-2-serial', inverse=True), None, None)
    Add(f'4b. {model}: throughput K2-T8-rc / K1-T8-rc (what the second '
        'device adds to the same micro-batched work; separate processes)',
        Ratio(model, 'K2-T8-rc', 'K1-T8-rc', inverse=True), None, None)
  if 'dense32mem' in run_models:
    mem_rc = _Find(results, 'dense32mem', 'K1-T8-rc')
    mem_plain = _Find(results, 'dense32mem', 'plain')

    def Activations(r):
      return ((r['memory'].get('tf_allocator') or {}).get(
          'activation_peak_bytes'))
    act = ((Activations(mem_rc), Activations(mem_plain))
           if mem_rc and mem_plain else (None, None))
    Add('5. dense32mem: peak activation memory K1-T8-rc / plain (TF '
        'allocator peak during a step minus weights and inputs)',
        act[0] / act[1] if None not in act and act[1] else None,
        round(1 / 3, 3), '<=')
    Add('5b. dense32mem: peak RSS above idle K1-T8-rc / plain (whole '
        'process, for reference)',
        (mem_rc['memory']['peak_above_idle_bytes'] /
         mem_plain['memory']['peak_above_idle_bytes'])
        if mem_rc and mem_plain else None, round(1 / 3, 3), '<=')
  # The simulator target is about the micro-benchmarks; for other models the
  # same rows describe the models that were run.
  sim_models = ({'dense16', 'conv16'} & run_models) or (
      run_models - {'dense32mem'})
  if not sim_models:
    return rows
  names = ', '.join(sorted(sim_models))
  errs = [abs(r['prediction_error']) for r in results
          if r.get('prediction_error') is not None and r['K'] in (1, 2, 4)
          and not r.get('calibration_run')
          and r['T'] in (1, 4, 8) and r['model'] in sim_models]
  Add(f'6. simulator ({names}): largest |predicted / measured - 1| (K in '
      '1,2,4; T in 1,4,8; K=1 runs with loops are the calibration fit)',
      max(errs) if errs else None, 0.15, '<=')
  cores = num_cores or os.cpu_count() or 1
  for letter, label, keep in (
      ('a', f'K <= {cores} (one core per device)',
       lambda r: 1 < r['K'] <= cores or (r['K'] == 1 and r['T'] > 1)),
      ('b', f'K > {cores} (devices share cores)', lambda r: r['K'] > cores),
      ('c', 'K=1, T=1 (loop-free fast path, isolated costs)',
       lambda r: r['K'] == 1 and r['T'] == 1)):
    sub = [abs(r['prediction_error']) for r in results
           if r.get('prediction_error') is not None
           and not r.get('calibration_run') and keep(r)
           and r['model'] in sim_models]
    Add(f'6{letter}. simulator, {label}: largest error',
        max(sub) if sub else None, None, None)
  return rows


def ReportText(report: Dict[str, Any]) -> str:
  """The whole printed report (also written to tables.md) of a results dict.

  Paths are shown relative to the repository when they are inside it.
  """
  def Rel(path):
    rel = os.path.relpath(path, _REPO_ROOT)
    return path if rel.startswith('..') else rel
  out = [MarkdownTable(report['results']), '',
         TargetsTable(report['targets'])]
  for t in report.get('timelines', []):
    tl = t['timeline']
    out.append(f"\nTimeline {t['model']} {t['setting']} (step "
               f"{tl['breakdown_s']['step'] * 1e3:.1f} ms): {Rel(tl['png'])}, "
               f"{Rel(tl['chrome_trace'])}")
    out.append(BreakdownTable(tl['breakdown_s']))
  out.append(f"\nMachine: {report['cpu_count']} cores; load average at start "
             f"{report['load_average_at_start']:.2f}; wall time "
             f"{report['wall_time_s']:.0f} s.")
  return '\n'.join(out) + '\n'


def TargetsTable(rows: List[Dict[str, Any]]) -> str:
  lines = ['| target | measured | limit | result |', '|---|---|---|---|']
  for r in rows:
    m = '-' if r['measured'] is None else f"{r['measured']:.3f}"
    res = {True: 'pass', False: 'FAIL', None: 'not run'}[r['passed']]
    if r.get('info'):
      res = 'explains' if r['measured'] is not None else 'not run'
    lines.append(f"| {r['target']} | {m} | {r['limit']} | {res} |")
  return '\n'.join(lines)


def PlotSpeedup(results: List[Dict[str, Any]], model: str, path: str) -> None:
  """Speed-up vs K, one line per (T, recompute)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  rs = [r for r in results if r['model'] == model and r['kind'] == 'pipe'
        and r.get('speedup') and r['setting'][0] == 'K'
        and r['recompute_impl'] == 'explicit']
  fig, ax = plt.subplots(figsize=(6, 4))
  for t in sorted({r['T'] for r in rs}):
    for rc in (True, False):
      pts = sorted((r['K'], r['speedup']) for r in rs
                   if r['T'] == t and r['recompute'] == rc)
      if pts:
        ax.plot(*zip(*pts), marker='o', ls='-' if rc else ':',
                label=f'T={t}{" recompute" if rc else ""}')
  for suffix, style in (('', '-'), ('-serial', ':')):
    naive = sorted((r['K'], r['speedup']) for r in results
                   if r['model'] == model and r.get('speedup')
                   and re.match(rf'^naive-\d+{suffix}$', r['setting']))
    if naive:
      ax.plot(*zip(*naive), marker='x', color='black', ls=style,
              label=f'naive-K{suffix}')
  ax.axhline(1.0, color='gray', lw=0.8)
  ax.set_xlabel('K (partitions = logical CPU devices)')
  ax.set_ylabel(f'speed-up vs {rs[0]["speedup_vs"] if rs else "baseline"} '
                '(same process and threads)')
  ax.set_title(f'{model}: throughput speed-up ({os.cpu_count()} cores)')
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def PlotMemory(results: List[Dict[str, Any]], model: str, path: str) -> None:
  """Peak RSS above idle per setting (bar chart)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  rs = [r for r in results if r['model'] == model]
  fig, ax = plt.subplots(figsize=(max(5, 0.45 * len(rs)), 4))
  ax.bar(range(len(rs)),
         [r['memory']['peak_above_idle_bytes'] / 2**20 for r in rs],
         color=['#dd8452' if r['recompute'] else '#4c72b0' for r in rs])
  ax.set_xticks(range(len(rs)))
  ax.set_xticklabels([r['setting'] for r in rs], rotation=60, fontsize=7,
                     ha='right')
  ax.set_ylabel('peak RSS above idle (MiB)')
  ax.set_title(f'{model}: peak memory per setting (orange = recompute)')
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
