"""The child process of tools/benchmark: one setting of one model, measured.

`RunSetting` runs in a fresh Python process started by launch.py, so the
thread-pool sizes and logical devices it sets belong to that setting alone
and its memory figures too. TensorFlow is imported at the top of this module
(an import starts no runtime); `RunSetting` configures the threads before
any op runs. It builds the model, traces the training step (forward +
backward + SGD update in one tf.function) and measures memory over the
warm-up steps; then it builds the setting's baselines
(settings.PairedBaselines) and, for pipelined settings, a copy of the step
with the timeline on, and times all of them in turn, one step each per
round. Ratios between a setting and its baselines come from that rotation.
The recorded steps' cells are the in-pipeline stage costs the simulator
(tensorpipe/simulator.py) predicts from; each partition is also timed alone
on one micro-batch (the costs a user has before running the pipeline).

Usage (what launch.RunSettingSubprocess runs):
  python -c 'from tools.benchmark_lib import runner; runner.ChildMain()' \
      '{"model": "tiny", "setting_name": "K2-T2-rc", "steps": 2}'
"""

import contextlib
import dataclasses
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import devices
from tensorpipe import hyperparams
from tensorpipe import microbatch
from tensorpipe import model_registry
from tensorpipe import pipeline
from tensorpipe import schedule_program
from tensorpipe import schedules
from tensorpipe import timeline
from tensorpipe.layers import composite
from tensorpipe.layers import conv
from tensorpipe.layers import linear
from tensorpipe.layers import transformer
from tensorpipe.nested_map import NestedMap
from tools.benchmark_lib import plots
from tools.benchmark_lib import ramp_check
from tools.benchmark_lib import results as results_lib
from tools.benchmark_lib import settings
from tools.benchmark_lib import step_profile

# -- models ------------------------------------------------------------------


class SequenceIn(base_layer.BaseLayer):
  """xfmr models' first layer: float vectors [N, S, D] -> the NestedMap an
  encoder layer reads (src_vecs, src_paddings of zeros: no padding)."""

  def FProp(self, theta, x: tf.Tensor) -> NestedMap:
    del theta  # no weights
    return NestedMap(src_vecs=x,
                     src_paddings=tf.zeros(tf.shape(x)[:2], x.dtype))

  @classmethod
  def FPropMeta(cls, p, x_shape):
    shape = base_layer.ToShape(x_shape)
    return base_layer.FPropMetaResult(
        0, NestedMap(src_vecs=shape, src_paddings=shape[:2]), 0)


class SequenceOut(base_layer.BaseLayer):
  """xfmr models' last layer: the encoder's NestedMap -> src_vecs."""

  def FProp(self, theta, nm: NestedMap) -> tf.Tensor:
    del theta  # no weights
    return nm.src_vecs

  @classmethod
  def FPropMeta(cls, p, nm_shapes):
    return base_layer.FPropMetaResult(
        0, base_layer.ToShape(nm_shapes.src_vecs), 0)


def BuiltinLayers(name: str) -> Tuple[List[Any], List[int]]:
  """(list of layer Params, input shape) of a built-in micro-benchmark.

  Raises:
    ValueError: `name` is not in settings.BUILTIN_MODELS.
  """
  spec = settings.BUILTIN_MODELS.get(name)
  if spec is None:
    raise ValueError(f'unknown model {name!r}; built-in models are '
                     f'{sorted(settings.BUILTIN_MODELS)} (or a registered '
                     'experiment key)')
  w = spec.widths
  if spec.layer == 'conv3x3':
    layers = [conv.Conv2DLayer.Params().Set(
        name=f'conv{i}', filter_shape=(3, 3, w[i], w[i + 1]),
        filter_stride=(1, 1), bias=False, activation='RELU')
              for i in range(spec.num_layers)]
  elif spec.layer == 'xfmr':
    layers = ([SequenceIn.Params().Set(name='seq_in')] +
              [transformer.TransformerEncoderLayer.Params().Set(
                  name=f'enc{i}', model_dim=spec.dim, hidden_dim=4 * spec.dim,
                  num_heads=spec.dim // 32, head_dim=32)
               for i in range(spec.num_layers)] +
              [SequenceOut.Params().Set(name='seq_out')])
  else:
    layers = [linear.FCLayer.Params().Set(
        name=f'fc{i}', input_dim=w[i], output_dim=w[i + 1],
        activation='RELU') for i in range(spec.num_layers)]
  return layers, spec.input_shape


def RegistryLayers(key: str) -> Tuple[List[Any], List[int]]:
  """Layers and input shape of a registered experiment's TensorPipeLayer.

  The experiment's `Task().model` must be TensorPipeLayer Params with
  `layers` (or `partitions`) and `input_shapes`; the benchmark re-partitions
  those layers for each setting and trains them on random inputs with a
  mean-of-output loss (the model's cost, not its task's).

  Raises:
    ValueError: unknown key (with the known keys) or no layer list.
  """
  try:
    task_p = model_registry.GetExperiment(key).Task()
  except ValueError as e:
    raise ValueError(f'--models: {key!r} is neither a built-in model '
                     f'({sorted(settings.BUILTIN_MODELS)}) nor usable: {e}'
                     ) from None
  model = task_p.model if 'model' in task_p else None
  layers = shapes = None
  if (isinstance(model, hyperparams.InstantiableParams) and
      issubclass(model.cls, pipeline.TensorPipeLayer)):
    layers = model.layers or [lp for part in (model.partitions or [])
                              for lp in part]
    shapes = model.input_shapes
  if not layers or not shapes:
    raise ValueError(f'experiment {key!r}: Task().model has no `layers` / '
                     '`partitions` with `input_shapes`; the benchmark needs a '
                     'TensorPipeLayer model')
  return list(layers), list(shapes[0])


def ModelLayers(name: str) -> Tuple[List[Any], List[int]]:
  """Layers and input shape of a built-in model or a registered experiment."""
  if name in settings.BUILTIN_MODELS:
    return BuiltinLayers(name)
  return RegistryLayers(name)


class UnrolledMicroBatches:
  """plain-T<t>: a layer run on T micro-batches in turn, outputs concatenated.

  Autodiff sums each weight's gradient over the T uses, as gradient
  accumulation does; nothing is recomputed or pipelined.
  """

  def __init__(self, layer: composite.SequentialLayer,
               num_micro_batches: int):
    self._layer = layer
    self._t = num_micro_batches
    self.trainable_variables = layer.trainable_variables

  def FPropDefaultTheta(self, x: tf.Tensor) -> tf.Tensor:
    """x: [batch, ...] with batch divisible by T; returns [batch, ...]."""
    if x.shape[0] % self._t:
      raise ValueError(f'batch {x.shape[0]} is not divisible by T={self._t}')
    outs = [self._layer.FPropDefaultTheta(mb)
            for mb in tf.split(x, self._t, axis=0)]
    return tf.concat(outs, axis=0)


def BuildLayer(setting: settings.Setting, layer_ps: Sequence[Any],
               input_shape: Sequence[int],
               stage_devices: Optional[Sequence[str]] = None) -> Any:
  """The layer under test for a setting (plain, plain-T<t> or a pipeline;
  its partitions on `stage_devices` if given)."""
  if setting.kind == 'plain':
    seq = composite.SequentialLayer.Params().Set(
        name='Sequential', sub=list(layer_ps)).Instantiate()
    if setting.num_micro_batches == 1:
      return seq
    return UnrolledMicroBatches(seq, setting.num_micro_batches)
  p = PipelineParams(setting, layer_ps, input_shape)
  if stage_devices:
    p.devices = list(stage_devices)
  return p.Instantiate()


def PipelineParams(setting: settings.Setting, layer_ps: Sequence[Any],
                   input_shape: Sequence[int]) -> hyperparams.Params:
  """The TensorPipeLayer Params of a pipelined setting (its layers cut by
  the layer's own partitioning)."""
  p = pipeline.TensorPipeLayer.Params().Set(
      name='TensorPipe', layers=list(layer_ps),
      num_partitions=setting.num_partitions,
      num_micro_batches=setting.num_micro_batches,
      input_shapes=[list(input_shape)], recompute=setting.recompute,
      recompute_impl=setting.recompute_impl,
      schedule=setting.schedule,
      num_stages_per_device=setting.num_stages_per_device)
  if setting.unroll_ticks is not None:
    p.unroll_ticks = setting.unroll_ticks
  return p


# -- measurements --------------------------------------------------------------


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


def _TfMemoryInfo(reset: bool = False) -> Optional[Dict[str, int]]:
  """TF's CPU allocator figures (all logical CPUs share it), or None."""
  try:
    if reset:
      tf.config.experimental.reset_memory_stats('CPU:0')
    info = tf.config.experimental.get_memory_info('CPU:0')
    return {k: int(v) for k, v in info.items()}
  except (ValueError, RuntimeError, tf.errors.OpError):
    return None


def _Median(fn: Callable[[], Any], reps: int) -> float:
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def PartitionCosts(layer: pipeline.TensorPipeLayer, x: tf.Tensor,
                   num_micro_batches: int,
                   reps: int) -> results_lib.PhaseCosts:
  """Median time of each partition's forward / forward+vjp on a micro-batch,
  each partition timed alone on its device."""
  mb = microbatch.Slice(microbatch.Split((x,), num_micro_batches), 0)
  fwd, bwd = [], []
  args = tuple(mb)
  for layers, device in zip(layer.PartitionLayers(), layer.devices):
    thetas = [lay.theta for lay in layers]

    def Forward(*a, layers=layers, thetas=thetas):
      for lay, th in zip(layers, thetas):
        a = composite.AsArgs(lay.FProp(th, *a))
      return composite.FromArgs(a)

    def ForwardBackward(*a, layers=layers, thetas=thetas):
      variables = [v for lay in layers for v in lay.trainable_variables]
      floats = [t for t in a if t.dtype.is_floating]
      with tf.GradientTape() as tape:
        tape.watch(floats)
        y = Forward(*a, layers=layers, thetas=thetas)
      return tape.gradient(y, floats + variables)

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
  return results_lib.PhaseCosts(fwd, bwd)


def _MeanLoss(layer: Any, x: tf.Tensor) -> tf.Tensor:
  """The benchmark's loss: the mean of the first output.

  A 1F1B pipeline computes it inside its loop (FPropLoss): per micro-batch
  the output sum over elements per example, divided by the batch size.
  """
  if not (isinstance(layer, pipeline.TensorPipeLayer) and
          schedules.LossInside(layer.params.schedule)):
    return tf.reduce_mean(tf.nest.flatten(layer.FPropDefaultTheta(x))[0])

  def LossFn(outputs, unused_targets):
    y = tf.nest.flatten(outputs)[0]
    return tf.reduce_sum(y) / float(y.shape[1:].num_elements())
  return layer.FPropLoss(layer.theta, (x,), None, LossFn,
                         tf.cast(tf.shape(x)[0], tf.float32)).loss


def StepFn(layer: Any, x: tf.Tensor, learning_rate: float):
  """The training step (forward, backward, SGD update) as a concrete
  function of x returning (loss, the timeline's raw tensors or {})."""
  variables = layer.trainable_variables

  def Step(x):
    rec = timeline.Active()
    start = rec.Mark('step_start', [x]) if rec else None
    with tf.control_dependencies([start] if rec else []):
      with tf.GradientTape() as tape:
        loss = _MeanLoss(layer, x)
    grads = tape.gradient(loss, variables)
    updates = []
    for v, g in zip(variables, grads):
      # On the variable's device, as tensorpipe/optimizers.py updates:
      # placed by default, the product would run on the client's CPU:0,
      # and with stages in other processes every gradient would cross to
      # it and back each step (dense16: 64 MB each way).
      with tf.device(v.device):
        updates.append(v.assign_sub(learning_rate * g))
    if rec:
      rec.Mark('step_end', updates)
      return loss, rec.Tensors()
    return loss, {}
  return tf.function(Step).get_concrete_function(x)


def _WriteTimeline(recorder: timeline.Recorder, raw: Any,
                   setting: settings.Setting, model: str, out_dir: str,
                   device_names: Sequence[str]) -> results_lib.TimelineRecord:
  """Chrome trace JSON + Gantt PNG of one recorded step, and its breakdown."""
  events = recorder.Events(raw)
  marks = recorder.Marks(raw)
  os.makedirs(out_dir, exist_ok=True)
  stem = os.path.join(out_dir, f'timeline_{model}_{setting.name}')
  with open(stem + '.json', 'w') as f:
    json.dump(timeline.ChromeTrace(events, device_names, marks), f)
  breakdown = timeline.Breakdown(events, setting.num_partitions,
                                 marks['step_start'], marks['step_end'])
  png = stem + '.png'
  plots.PlotGantt(events, setting.num_partitions, marks, png,
                  title=f'{model} {setting.name}: one training step')
  return results_lib.TimelineRecord(
      chrome_trace=stem + '.json', png=png, breakdown_s=breakdown,
      num_events=len(events),
      events=[dataclasses.asdict(e) for e in events], marks=marks)


def _SetUpProcess(setting: settings.Setting,
                  pairs: Sequence[settings.Setting],
                  remote_workers: Optional[Sequence[str]]
                  ) -> Optional[List[str]]:
  """Threads and devices for a setting, before TensorFlow starts; with
  `remote_workers`, this process becomes their client: the stage devices
  on the servers (else None: logical CPU devices of this process)."""
  intra, inter = setting.threads
  # With remote_workers, connect_to_cluster hands this config to the
  # servers: each gets K inter-op threads. One each was slower (conv16
  # K2-T8-1f1b-rc: 168 against 115-123 ms; README, "Stages in other
  # processes").
  tf.config.threading.set_intra_op_parallelism_threads(intra)
  tf.config.threading.set_inter_op_parallelism_threads(inter)
  if not remote_workers:
    devices.SetNumLogicalCpuDevices(
        max([1, setting.num_partitions] + [p.num_partitions for p in pairs]))
    return None
  if setting.kind != 'pipe' or pairs:
    raise ValueError('remote_workers runs one pipelined setting, without '
                     f'baselines; got {setting.name!r} paired with '
                     f'{[p.name for p in pairs]}')
  from tensorpipe import distribute  # pylint: disable=g-import-not-at-top
  return distribute.ConnectRemoteStages(list(remote_workers))


def _WarmUpMeasuringMemory(run: Callable[[], Any], warmup: int
                           ) -> Tuple[results_lib.Memory, float, Any]:
  """Runs the warm-up steps (at least one) of the setting alone: (its
  memory over them, their seconds, the last step's raw timeline tensors)."""
  idle_rss, _ = _Rss()
  reset_ok = _ResetPeakRss()
  alloc_before = _TfMemoryInfo(reset=True)
  t0 = time.perf_counter()
  for _ in range(max(1, warmup)):
    raw = run()
  warmup_s = time.perf_counter() - t0
  _, peak_rss = _Rss()
  alloc = _TfMemoryInfo()
  if alloc and alloc_before:
    alloc['current_before_step'] = alloc_before['current']
    alloc['activation_peak_bytes'] = max(
        0, alloc['peak'] - alloc_before['current'])
  memory = results_lib.Memory(
      idle_rss_bytes=idle_rss, peak_rss_bytes=peak_rss,
      peak_above_idle_bytes=max(0, peak_rss - idle_rss),
      peak_reset=reset_ok, tf_allocator=alloc)
  return memory, warmup_s, raw


def _WantsCells(setting: settings.Setting, partition_costs: bool,
                timeline_dir: Optional[str]) -> bool:
  """Whether the setting's stage costs come from a recorded twin step
  (per-partition cells assume one stage per device: not for v > 1)."""
  return (partition_costs and setting.kind == 'pipe' and
          setting.recompute_impl == 'explicit' and
          setting.num_stages_per_device == 1 and
          (setting.num_partitions > 1 or setting.num_micro_batches > 1)
          and not timeline_dir)


def _OwnCpuS() -> float:
  """This process's user + system CPU seconds so far."""
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def ProcessCpuS(pid: int) -> float:
  """User + system CPU seconds of process `pid` (on this machine) so far,
  from /proc/<pid>/stat.

  Raises:
    ValueError: no such process (it ended, or is on another machine).
  """
  try:
    with open(f'/proc/{pid}/stat', 'rb') as f:
      fields = f.read().rsplit(b')', 1)[1].split()
  except OSError as e:
    raise ValueError(f'cannot read the CPU time of process {pid} ({e}); '
                     'cpu_pids must be running processes on this '
                     'machine') from None
  # utime and stime: fields 14 and 15 of stat(5), 12 and 13 after the name.
  return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def _SwitchingRampsTwin(layer: Any, twin: Any,
                        runner: Callable[[Any], Callable[[], Any]],
                        isolated: bool = True):
  """(a step of `twin`, a copy of `layer`'s pipeline given `layer`'s
  weights, traced with every ramp switching on the table, and with
  `isolated` False its F, B and I cells inline
  (`schedule_program.IsolatedCells`); its trace seconds): --ramp_check's
  baselines."""
  for a, b in zip(layer.variables, twin.variables, strict=True):
    b.assign(a)
  t0 = time.perf_counter()
  with schedule_program.RampTicks(0), \
      schedule_program.IsolatedCells(isolated):
    run = runner(twin)
  return run, time.perf_counter() - t0


def _WarmUp(run: Callable[[], Any], warmup: int) -> None:
  """`warmup` steps of `run` (at least one: the first traces nothing new
  but runs the function's first-call setup)."""
  for _ in range(max(1, warmup)):
    run()


def _TimeMeasuringCpu(fns: Dict[str, Callable[[], Any]], steps: int,
                      cpu_pids: Sequence[int]):
  """`_TimeInRotation(fns, steps)`, and where one function is timed alone
  the CPU seconds per step of this process and of each of `cpu_pids`
  over those rounds: (times, raws, cpu_s or None, pid_cpu_s)."""
  alone = len(fns) == 1 and steps > 0
  before = ((_OwnCpuS(), [ProcessCpuS(p) for p in cpu_pids]) if alone
            else None)
  times, raws = _TimeInRotation(fns, steps)
  if not alone:
    return times, raws, None, []
  return (times, raws, (_OwnCpuS() - before[0]) / steps,
          [(ProcessCpuS(p) - c) / steps for p, c in zip(cpu_pids, before[1])])


def _TimeInRotation(fns: Dict[str, Callable[[], Any]], steps: int
                    ) -> Tuple[Dict[str, List[float]], Dict[str, List[Any]]]:
  """`steps` rounds of one step of each function, the order rotated each
  round so no function always follows another: per name, its step times
  and its steps' raw timeline tensors."""
  times = {name: [] for name in fns}
  raws = {name: [] for name in fns}
  names = list(fns)
  for i in range(steps):
    for name in names[i % len(names):] + names[:i % len(names)]:
      start = time.perf_counter()
      raws[name].append(fns[name]())
      times[name].append(time.perf_counter() - start)
  return times, raws


def RunSetting(model: str, setting_name: str, steps: int = 10,
               warmup: int = 2, partition_costs: bool = True,
               timeline_dir: Optional[str] = None,
               learning_rate: float = 1e-3,
               pair_with: Optional[Sequence[str]] = None,
               step_profile_steps: int = 0,
               remote_workers: Optional[Sequence[str]] = None,
               switching_ramps: bool = False,
               cpu_pids: Sequence[int] = (),
               one_pass_cells: Optional[int] = None
               ) -> results_lib.Result:
  """Runs one setting in this process (TensorFlow must not have run yet).

  Memory is measured on the setting alone, over its warm-up steps, before
  the `pair_with` baselines are built; then the setting and its baselines
  are timed in turn, one step each per round, for `steps` rounds.

  With `remote_workers` ('host:port' of running TF servers, one per
  partition: `remote.StartServers`) the pipeline's partitions run on the
  servers (`distribute.ConnectRemoteStages`), this process being the
  client.

  With `step_profile_steps`, that many more steps run under TF's profiler
  after the timed rounds (`step_profile`: the median step's time with no
  kernel running and each thread's busy time).

  With `switching_ramps`, the setting is traced with its ramps fixed
  (`schedule_program.FIXED_RAMP_TICKS`, the default) and the same
  pipeline traced with its ramps switching on the table (`schedule_program.
  RAMP_TICKS` = 0), with its F, B and I cells isolated and inline, is timed
  in the rotation too, as the baselines `ramp_check.TWINS` (their trace
  seconds in `result.paired_trace_s`): tools/benchmark --ramp_check.

  With `one_pass_cells`, the setting is traced with
  `schedule_program.UnrollAcrossProcesses(one_pass_cells)`: stages in
  other processes run a run of at most that many cells in one pass,
  without a loop (0: the loops; None: the library's default).

  Where the setting is timed alone (nothing paired, no recorded twin),
  its CPU seconds per step are measured over the timed rounds: this
  process's (`result.cpu_s`) and each of `cpu_pids`' (processes on this
  machine, e.g. the TF servers of `remote_workers`: `result.pid_cpu_s`).

  Returns:
    The result: step times, memory (peak RSS above idle and TF's allocator),
    partition costs, the paired baselines' step times and, with
    `timeline_dir`, the recorded step's files and breakdown.
  """
  setting = settings.ParseSetting(setting_name)
  pairs = [settings.ParseSetting(n) for n in (pair_with or [])]
  stage_devices = _SetUpProcess(setting, pairs, remote_workers)
  layer_ps, input_shape = ModelLayers(model)
  x = tf.random.stateless_uniform(input_shape, seed=[1, 2])
  layer = BuildLayer(setting, layer_ps, input_shape, stage_devices)

  def Runner(step_fn):
    """A step of step_fn on x, waited for; returns its raw tensors."""
    def Run():
      loss, raw = step_fn(x)
      loss.numpy()
      return raw
    return Run

  t0 = time.perf_counter()
  recorder = None
  if timeline_dir:
    with timeline.Record() as recorder:
      step_fn = StepFn(layer, x, learning_rate)
  else:
    # --ramp_check: the setting with its ramps fixed; --remote_check: with
    # or without its one pass across processes; else the library's forms.
    with contextlib.ExitStack() as forms:
      if switching_ramps:
        forms.enter_context(schedule_program.RampTicks(
            schedule_program.FIXED_RAMP_TICKS))
      if one_pass_cells is not None:
        forms.enter_context(
            schedule_program.UnrollAcrossProcesses(one_pass_cells))
      step_fn = StepFn(layer, x, learning_rate)
  trace_s = time.perf_counter() - t0
  memory, warmup_s, raw = _WarmUpMeasuringMemory(Runner(step_fn), warmup)

  fns = {setting.name: Runner(step_fn)}
  paired_trace_s = {}
  for name, isolated in (ramp_check.TWINS.items() if switching_ramps
                         else ()):
    twin = BuildLayer(setting, layer_ps, input_shape, stage_devices)
    fns[name], paired_trace_s[name] = _SwitchingRampsTwin(
        layer, twin, lambda l: Runner(StepFn(l, x, learning_rate)),
        isolated)
    _WarmUp(fns[name], warmup)
  for p in pairs:
    fns[p.name] = Runner(StepFn(BuildLayer(p, layer_ps, input_shape), x,
                                learning_rate))
    _WarmUp(fns[p.name], warmup)
  # Stage costs for the simulator: the same layer's step with the timeline
  # on, timed in the same rotation, so each recorded step's cells and its
  # wall time come from the same moment (this machine drifts by 20-30%
  # within minutes). Without recompute the backward pass is autodiff of the
  # forward loop and records no cells: the recorded step is then the
  # recompute twin's (same layers, K and T), whose backward cells (without
  # their recompute part) stand for the autodiff backward. A 1F1B setting
  # records its own loop's cells (forward, recompute, backward on one
  # clock; timeline.TableEvents), with or without recompute.
  want_cells = _WantsCells(setting, partition_costs, timeline_dir)
  if want_cells:
    own = setting.recompute or schedules.LossInside(setting.schedule)
    rec_layer = layer if own else BuildLayer(
        dataclasses.replace(setting, recompute=True), layer_ps, input_shape)
    with timeline.Record() as recorded:
      fns['timeline'] = Runner(StepFn(rec_layer, x, learning_rate))
    _WarmUp(fns['timeline'], warmup)
  times, raws, cpu_s, pid_cpu_s = _TimeMeasuringCpu(fns, steps, cpu_pids)
  if steps:
    raw = raws[setting.name][-1]

  result = results_lib.Result(
      model=model, setting=setting, batch=input_shape[0],
      step_time_s=statistics.median(times[setting.name]), memory=memory,
      step_times_s=times[setting.name], steps=steps, warmup=warmup,
      trace_s=trace_s, warmup_s=warmup_s,
      paired={name: results_lib.StepTimes(
          statistics.median(times[name]), times[name])
              for name in fns if name not in (setting.name, 'timeline')},
      paired_trace_s=paired_trace_s, cpu_s=cpu_s, pid_cpu_s=pid_cpu_s)
  if timeline_dir and recorder is not None:
    result.timeline = _WriteTimeline(
        recorder, raw, setting, model, timeline_dir,
        layer.devices if setting.kind == 'pipe' else ['/CPU:0'])
  if step_profile_steps:
    with tempfile.TemporaryDirectory() as logdir:
      result.step_profile = step_profile.Median(step_profile.Run(
          fns[setting.name], step_profile_steps, logdir))
  if partition_costs and setting.kind == 'pipe':
    result.partition_costs_s = PartitionCosts(
        layer, x, setting.num_micro_batches, reps=max(3, steps // 2))
  rec_events = [recorded.Events(r) for r in raws.get('timeline', [])]
  if want_cells and any(rec_events):
    result.stage_costs_s = results_lib.StageCosts.FromEvents(
        [e for events in rec_events for e in events], setting.num_partitions)
    if own:
      result.recorded_step_time_s = statistics.median(times['timeline'])
  return result


def ChildMain() -> None:
  """Entry point of the per-setting subprocess: argv[1] is a JSON request
  (RunSetting's arguments); prints the result as one JSON line."""
  request = json.loads(sys.argv[1])
  result = RunSetting(**request)
  sys.stdout.write(results_lib.RESULT_LINE_PREFIX +
                   json.dumps(result.ToJson()) + '\n')
