"""Schedules with the loss inside the pipeline: 1F1B, interleaved 1F1B, ...

PipeDream-flush / 1F1B (Narayanan et al. 2021, arXiv 2006.09503; Megatron-LM,
DeepSpeed) has GPipe's bubble and GPipe's synchronous, exact gradients, but
starts a micro-batch's backward pass as soon as the last partition has
computed its loss, so partition k holds at most min(K - k, T) micro-batches
between their forward and backward passes where GPipe holds T. Interleaved
1F1B (Narayanan et al. 2021, arXiv 2104.04473) gives each device v stages
(round-robin), cutting the bubble by v for v times the boundary transfers.
These need the loss inside the pipeline: the last stage applies a
per-micro-batch loss function to its outputs, and one step returns (loss,
metrics, gradients) rather than outputs (`TensorPipeLayer.FPropLossAndGrads`).

This module is their front end: it splits the mini-batch, traces the loss
function once, builds the schedule's table (`schedule_builders.FromParam`),
and runs it on the one engine (`schedule_program.Compile`,
`schedule_engine.Run`; the pseudo-code is there). Every schedule relabels
micro-batches so that its backward cells run GPipe's order
(`schedule_program.Labels`), which makes the weight gradients equal
GPipe's bit for bit.

The loop (recompute) is traced once for all ticks and, like GPipe's loops,
is never differentiated: the step computes the gradients itself.
`TensorPipeLayer.FPropLoss` wraps it in a tf.custom_gradient whose gradient
is upstream x the stored gradients, so a task's loss built on it works with
the trainer's GradientTape unchanged. Without recompute the engine unrolls
the table (`schedule_unrolled.Run`): each stage keeps its forward
cells' activations until their backward cells and skips the recompute, at
a graph that grows with T. Layer-level recompute (stash each layer's input,
recompute inside layers) was not chosen: it recomputes every layer's
forward once as well, so it costs what stage recompute costs.

Batch norm and dropout behave as in GPipe: each micro-batch normalises with
its own statistics, the moving averages are updated once per step from the
sum over micro-batches, and dropout masks are per example (micro-batch t's
example offset, the step's context), so they do not depend on K, T or the
schedule, and the recompute redraws them exactly.
"""

from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf

from tensorpipe import grad_sum
from tensorpipe import microbatch
from tensorpipe import pipeline_stage
from tensorpipe import py_utils
from tensorpipe import schedule_builders
from tensorpipe import schedule_engine
from tensorpipe import schedule_program
from tensorpipe import schedule_unrolled
from tensorpipe import schedules
from tensorpipe.nested_map import NestedMap

# A loss function: (outputs of one micro-batch, its targets or None) -> the
# micro-batch's loss SUM (scalar), or NestedMap(loss=scalar sum,
# metrics=NestedMap(name=(value sum, weight))).
LossFn = Callable[[Any, Any], Any]


class LossAndGrads(NamedTuple):
  """What one 1F1B step returns.

  Attributes:
    loss: sum over micro-batches of loss_fn's loss, divided by `normalizer`.
    metrics: NestedMap name -> (value sum, weight sum) over micro-batches
      (empty if loss_fn returns a bare loss).
    grads: per partition, the flat gradients of `loss` with respect to its
      weights.
    stats: per partition and batch-norm layer, BatchStats.Flatten() summed
      over micro-batches (not yet reported).
    stats_layers: per partition, its batch-norm layers in `stats` order.
  """
  loss: tf.Tensor
  metrics: NestedMap
  grads: List[List[tf.Tensor]]
  stats: List[List[List[tf.Tensor]]]
  stats_layers: List[Tuple[Any, ...]]


class _LossSpec(NamedTuple):
  """What loss_fn returns, learned by tracing it once."""
  loss: tf.TensorSpec
  metric_names: Tuple[str, ...]
  metric_specs: Tuple[Tuple[tf.TensorSpec, tf.TensorSpec], ...]


def _CheckLossResult(result: Any) -> Tuple[tf.Tensor, NestedMap]:
  """loss_fn's result as (scalar loss sum, NestedMap of (value, weight))."""
  fix = ('loss_fn(outputs, targets) must return the micro-batch\'s loss sum '
         '(a scalar float tensor) or NestedMap(loss=scalar, metrics='
         'NestedMap(name=(value sum, weight)))')
  if isinstance(result, dict):
    extra = sorted(set(result) - {'loss', 'metrics'})
    if 'loss' not in result or extra:
      raise ValueError(f'loss_fn returned a dict with keys {sorted(result)}; '
                       f'{fix}')
    loss, metrics = result['loss'], result.get('metrics') or NestedMap()
  else:
    loss, metrics = result, NestedMap()
  if not isinstance(loss, tf.Tensor) or not (
      loss.dtype.is_floating and loss.shape.rank == 0):
    what = (f'a {loss.dtype.name} tensor of shape {loss.shape}'
            if isinstance(loss, tf.Tensor) else f'{type(loss).__name__} '
            f'{loss!r}')
    raise ValueError(f'loss_fn returned {what} as the loss; {fix}')
  if not isinstance(metrics, dict):
    raise ValueError(f'loss_fn returned metrics={metrics!r}; {fix}')
  for name, pair in metrics.items():
    ok = (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(
        isinstance(v, tf.Tensor) and v.shape.rank == 0 for v in pair))
    if not ok:
      raise ValueError(f'loss_fn returned metrics[{name!r}]={pair!r}, not a '
                       f'(value sum, weight) pair of scalar tensors; {fix}')
  return loss, NestedMap(metrics)


def _TraceLoss(loss_fn: LossFn, out_struct: Any, target_specs: Any,
               device: str) -> _LossSpec:
  """Traces loss_fn once on one micro-batch's specs and checks its result."""
  traced = []

  def Fn(out_flat, target_flat):
    outs = microbatch.PackTensors(out_struct, list(out_flat))
    targets = (None if target_specs is None else
               microbatch.PackTensors(target_specs, list(target_flat)))
    traced.append(_CheckLossResult(loss_fn(outs, targets)))

  out_specs = microbatch.FlattenTensors(out_struct)
  tgt_specs = ([] if target_specs is None else
               microbatch.FlattenTensors(target_specs))
  with tf.device(device):
    tf.function(Fn, autograph=False).get_concrete_function(
        list(out_specs), list(tgt_specs))
  loss, metrics = traced[-1]
  names = tuple(sorted(metrics))
  return _LossSpec(
      pipeline_stage.SpecOf(loss), names,
      tuple((pipeline_stage.SpecOf(metrics[n][0]),
             pipeline_stage.SpecOf(metrics[n][1])) for n in names))


def Run(stages: Sequence[pipeline_stage.Stage], thetas: List[List[Any]],
        inputs: Tuple[Any, ...], targets: Any, loss_fn: LossFn,
        normalizer: tf.Tensor, num_mb: int, batch_dim: int,
        recompute: bool = True, grad_sum_mode: str = 'sequential',
        schedule: str = '1f1b', devices: Optional[Sequence[str]] = None,
        num_stages_per_device: int = 1) -> LossAndGrads:
  """One step of a loss-inside schedule: loss, metrics and weight gradients.

  Args:
    stages: the S = K v stages.
    thetas: per stage, its weights (a list per layer) as tensors.
    inputs: the first layer's inputs (a tuple), batch on `batch_dim`.
    targets: a structure of tensors with the batch on `batch_dim` (split like
      the inputs and handed to loss_fn), or None.
    loss_fn: see `LossFn`.
    normalizer: scalar tensor dividing the summed loss (and its gradients).
    num_mb: T.
    batch_dim: the batch axis of inputs and targets.
    recompute: True: the engine's tf.while_loops, recomputing each forward
      cell in its backward cell; False: the table unrolled in Python
      (`schedule_unrolled.Run`), keeping each cell's activations until
      its backward.
    grad_sum_mode: grad_sum.MODES ('pairwise' needs recompute).
    schedule: a registered schedule name (`schedule_builders.Build`), a CSV
      path or `schedules.CsvParam` text (`schedule_builders.FromParam`).
    devices: the K devices (default: one per stage, the stages' own).
    num_stages_per_device: v.

  Returns:
    A `LossAndGrads`.
  """
  devices = list(devices or [stage.device for stage in stages])
  table = schedule_builders.FromParam(schedule, len(devices), num_mb,
                             num_stages_per_device)
  for s, stage in enumerate(stages):
    want = devices[table.StageDevice()[s]]
    if stage.device != want:
      raise AssertionError(f'stage {s} is on {stage.device}, but schedule '
                           f'{schedules.Label(schedule)!r} places it on {want}')
  batch = microbatch.BatchSize(inputs, batch_dim)
  mb_size = batch // num_mb
  stacked = microbatch.Split(inputs, num_mb, batch_dim)
  specs = pipeline_stage.InferSpecs(stages, thetas, stacked, mb_size)
  flat_stacked = microbatch.FlattenTensors(stacked)
  flat_targets, target_specs = [], None
  if targets is not None:
    stacked_targets = microbatch.Split(targets, num_mb, batch_dim)
    flat_targets = microbatch.FlattenTensors(stacked_targets)
    target_specs = microbatch.PackTensors(
        stacked_targets, [tf.TensorSpec(x.shape[1:], x.dtype)
                          for x in flat_targets])
  last = stages[-1]
  loss_spec = _TraceLoss(loss_fn, specs[-1].out_struct, target_specs,
                         last.device)
  normalizer = tf.cast(normalizer, loss_spec.loss.dtype)
  loss_specs = [loss_spec.loss] + [s for pair in loss_spec.metric_specs
                                   for s in pair]

  def LossOf(k_out, t):
    """(loss sum, flat metric sums) of micro-batch t from the last outputs."""
    outs = microbatch.PackTensors(specs[-1].out_struct, list(k_out))
    tgt = None
    if targets is not None:
      tgt = microbatch.PackTensors(
          target_specs, [tf.gather(s, t) for s in flat_targets])
    loss, metrics = _CheckLossResult(loss_fn(outs, tgt))
    flat = []
    for name in loss_spec.metric_names:
      flat.extend(metrics[name])
    return loss, flat

  program = schedule_program.Compile(table)
  # One stage, one micro-batch: the recompute would run right after the
  # forward and save no memory (as for GPipe, recompute is ignored there).
  if not recompute or (len(stages) == 1 and num_mb == 1):
    if grad_sum_mode != 'sequential' and num_mb > 1:
      raise ValueError(f'grad_sum={grad_sum_mode!r} needs recompute=True '
                       f'(the unrolled {schedule} schedule sums in Python)')
    sums = schedule_unrolled.Run(
        stages, thetas, specs, program, flat_stacked, LossOf, loss_specs,
        normalizer, mb_size, devices)
  else:
    sums = schedule_engine.Run(
        stages, thetas, specs, program, flat_stacked,
        schedule_engine.Ends(loss_of=LossOf, loss_specs=loss_specs,
                             normalizer=normalizer),
        mb_size, grad_sum.GradSum(grad_sum_mode, num_mb), devices)
  with tf.device(last.device):
    loss = sums.loss[0] / normalizer
    metrics = NestedMap()
    for i, name in enumerate(loss_spec.metric_names):
      metrics[name] = (sums.loss[1 + 2 * i], sums.loss[2 + 2 * i])
  return LossAndGrads(loss, metrics, sums.dthetas, sums.stats,
                      [spec.stats_layers for spec in specs])


def _ReportStats(stats_layers, stages, stats) -> None:
  """Hands each batch-norm layer its statistics summed over micro-batches."""
  for stage, layers, stage_stats in zip(stages, stats_layers, stats):
    for layer, flat in zip(layers, stage_stats):
      with tf.device(stage.device):
        py_utils.AddBatchStats(layer, py_utils.BatchStats.Pack(flat))


def _Setup(layer, theta: NestedMap, inputs: Tuple[Any, ...]):
  """(stages, per-stage thetas on their devices, T) of a TensorPipeLayer."""
  p = layer.params
  stages = layer.stages
  thetas = []
  for k, stage in enumerate(stages):
    with tf.device(stage.device):
      thetas.append(tf.nest.map_structure(
          tf.identity, list(theta[f'partition_{k}'])))
  batch = microbatch.BatchSize(inputs, p.batch_dim)
  num_mb = microbatch.NumMicroBatches(batch, p.num_micro_batches,
                                      p.micro_batch_size)
  return stages, thetas, num_mb


def _RunLayer(layer, stages, thetas, inputs, targets, loss_fn, normalizer,
              num_mb) -> LossAndGrads:
  p = layer.params
  return Run(stages, thetas, inputs, targets, loss_fn, normalizer, num_mb,
             p.batch_dim, p.recompute, p.grad_sum, p.schedule, layer.devices,
             NumStagesPerDevice(p))


def _CheckLossFn(loss_fn: Any) -> None:
  if not callable(loss_fn):
    raise TypeError(f'loss_fn={loss_fn!r} is not callable; pass a function '
                    '(outputs, targets) -> loss sum of one micro-batch')


def FPropLossAndGrads(layer, theta: NestedMap, inputs: Tuple[Any, ...],
                      targets: Any, loss_fn: LossFn,
                      normalizer: Any) -> NestedMap:
  """`TensorPipeLayer.FPropLossAndGrads` (see there): no tape needed."""
  _CheckLossFn(loss_fn)
  stages, thetas, num_mb = _Setup(layer, theta, inputs)
  with py_utils.BatchAxis(layer.params.batch_dim):
    res = _RunLayer(layer, stages, thetas, inputs, targets, loss_fn,
                    normalizer, num_mb)
  if py_utils.IsTraining():
    _ReportStats(res.stats_layers, stages, res.stats)
  grads = NestedMap({f'partition_{k}': tf.nest.pack_sequence_as(
      thetas[k], res.grads[k]) for k in range(len(stages))})
  return NestedMap(loss=res.loss, metrics=res.metrics, grads=grads)


def FPropLoss(layer, theta: NestedMap, inputs: Tuple[Any, ...], targets: Any,
              loss_fn: LossFn, normalizer: Any) -> NestedMap:
  """`TensorPipeLayer.FPropLoss` (see there): a loss a tape differentiates.

  The schedule's step runs in the forward pass of a tf.custom_gradient over
  the flat weights; its gradient function returns upstream x the gradients
  the step computed. So `tape.gradient(f(loss), variables)` equals the GPipe
  pipeline's for any scalar f that is linear in the loss (the trainer's
  loss * weight / total_weight + regulariser is), without a second pass.
  Metrics get no gradient.
  """
  _CheckLossFn(loss_fn)
  stages, thetas, num_mb = _Setup(layer, theta, inputs)
  flat_theta = tf.nest.flatten(thetas)
  stats_layers = []

  @tf.custom_gradient
  def Step(*flat):
    th = tf.nest.pack_sequence_as(thetas, list(flat))
    with py_utils.BatchAxis(layer.params.batch_dim):
      res = _RunLayer(layer, stages, th, inputs, targets, loss_fn,
                      normalizer, num_mb)
    stats_layers.append((res.stats_layers, res.metrics, res.stats))
    grads = tf.nest.flatten(res.grads)

    def Grad(dloss, *unused_dys):
      return [tf.cast(dloss, g.dtype) * g for g in grads]
    return [res.loss] + tf.nest.flatten((res.metrics, res.stats)), Grad

  flat_out = Step(*flat_theta)
  layers, metrics_struct, stats_struct = stats_layers[-1]
  metrics, stats = tf.nest.pack_sequence_as((metrics_struct, stats_struct),
                                            list(flat_out[1:]))
  if py_utils.IsTraining():
    _ReportStats(layers, stages, stats)
  return NestedMap(loss=flat_out[0], metrics=metrics)


# The stages per device of a schedule defined on more than one, taken when
# num_stages_per_device is None (the default); every other schedule: 1.
_OWN_STAGES_PER_DEVICE = {'zb_v': 2}


def NumStagesPerDevice(p) -> int:
  """v of a TensorPipeLayer's Params: num_stages_per_device, or where it is
  None the schedule's own (2 for 'zb_v', else 1).

  Raises:
    ValueError: num_stages_per_device is neither None nor an int >= 1.
  """
  v = p.num_stages_per_device
  if v is None:
    return (_OWN_STAGES_PER_DEVICE.get(p.schedule, 1)
            if isinstance(p.schedule, str) else 1)
  if isinstance(v, bool) or not isinstance(v, int) or v < 1:
    raise ValueError(f'TensorPipeLayer {p.name!r}: num_stages_per_device='
                     f'{v!r} must be an int >= 1 (stages per device: 2 or '
                     "more for schedule='interleaved_1f1b'), or None for "
                     "the schedule's own")
  return v


def CheckScheduleParams(p, num_devices: int) -> None:
  """ValueError for a TensorPipeLayer `schedule` its settings cannot run.

  'gpipe' runs with the loss outside the pipeline (pipeline.py); every
  other registered table ('1f1b', 'interleaved_1f1b', 'zb_h1', 'zb_v', one
  registered by the user) and every CSV table runs on the engine with the
  loss inside.
  """
  v = NumStagesPerDevice(p)
  if not schedules.IsCsvParam(p.schedule) and (
      not isinstance(p.schedule, str) or
      p.schedule not in schedule_builders.Names()):
    raise ValueError(f'TensorPipeLayer {p.name!r}: schedule='
                     f'{schedules.Label(p.schedule)!r} is not one of '
                     f'{schedule_builders.Names()}; use '
                     "schedule='gpipe' (default), '1f1b' or "
                     "'interleaved_1f1b', a CSV table (a path ending in "
                     "'.csv', or schedules.CsvParam(path)), or register a "
                     'table builder with schedule_builders.Register(name, '
                     'builder)')
  if p.schedule == 'gpipe':
    if v != 1:
      raise ValueError(
          f"TensorPipeLayer {p.name!r}: schedule='gpipe' runs one stage "
          f'per device, got num_stages_per_device={v}; use '
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
    table = schedule_builders.FromParam(p.schedule, num_devices, tt, v)
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


def StageDevices(p, num_devices: int) -> List[int]:
  """Per stage, the index of its device under `p.schedule` (S = K v)."""
  if p.schedule == 'gpipe':
    return list(range(num_devices))
  table = schedule_builders.FromParam(p.schedule, num_devices, None,
                                     NumStagesPerDevice(p))
  place = table.StageDevice()
  return [place[s] for s in range(table.num_stages)]
