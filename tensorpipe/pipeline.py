"""TensorPipeLayer: GPipe pipeline parallelism for a sequence of layers.

GPipe (Huang et al. 2018, arXiv 1811.06965) cuts a sequence of L layers into K
partitions placed on K devices, splits the mini-batch of N examples into T
micro-batches and pipelines them: at clock tick c partition k works on
micro-batch t = c - k, so the K devices work at the same time on different
micro-batches. The backward pass runs the mirrored schedule. Both passes
are the `gpipe` table (`schedule_builders.Build`: its F ticks, then its B
ticks), run by the one schedule engine that runs every schedule
(`schedule_engine.Run`). Each pass runs as up to three tf.while_loops
(`schedule_program.Loops`): K - 1 ramp-up ticks, the ticks where every
partition is busy (no tf.cond: the cond was most of a tick's fixed cost;
`unroll_ticks` of them per loop iteration) and K - 1 ramp-down ticks; the
graph does not grow with T (with stages in other processes a short pass
runs without loops: `schedule_program.UnrollsAll`). Only the activations
at partition boundaries are kept (stage 0's are the stacked inputs
themselves); each partition's forward pass is recomputed in the backward
pass. Gradients are summed over micro-batches, so one optimizer step per
mini-batch equals the step of the unpipelined model (as a running sum, or
with grad_sum='pairwise' as a binary tree that data-parallel replicas
reproduce bit for bit: grad_sum.py).

Pseudo-code of one training step (`recompute=True`):

  x[t] = micro-batch t of the inputs                    # [T, N/T, ...]
  for c in range(T + K - 1):                             # tf.while_loop
    for k in range(K):                                   # concurrently
      t = c - k                                          # the table
      if 0 <= t < T:
        saved[k][t] = in_k                               # boundary activation
        out_k, stats_k += F_k(theta_k, in_k)             # on device k
  y = concat(out_{K-1})                                  # [N, ...]
  for c in range(T + K - 1):                             # backward tick
    for k in range(K):
      t = T - 1 - (c - (K - 1 - k))                      # the table
      if 0 <= t < T:
        dx_k, dtheta_k += vjp(F_k, saved[k][t], dy_k)    # recompute + backprop
  moving stats of batch norm <- stats summed over all micro-batches

The layer builds; the training wrappers (pipeline_train.py) run. Each call
makes one `pipeline_stage.PipelineCall` (thetas on their devices, stacked
inputs, specs, T) and hands it with its table to GPipe's wrappers (FProp:
the explicit recompute as one tf.custom_gradient, or a forward loop that
TF's autodiff differentiates with `recompute_impl='tf_recompute_grad'` or
without recompute) or to the loss-inside step (FPropLoss,
FPropLossAndGrads: every schedule but GPipe, `schedules.LossInside`).
With one partition and one micro-batch (K=1, T=1) nothing is pipelined:
FProp then calls the partition directly, without loops, and skips the
recompute (it would save no memory there). Inside `timeline.Record()` (at
trace time) every stage call also records tf.timestamp() before and after
(and after the recomputed forward), for tools/benchmark's timeline; all of
it goes through one `timeline.Probe`, which builds nothing when off.

Everything a TensorPipeLayer runs is traced without AutoGraph (FProp, FPropLoss
and FPropLossAndGrads are `tf.autograph.experimental.do_not_convert`), even
inside a tf.function that converts the rest of the step (the trainer's): the
pipeline's own code is plain Python over a schedule table, and AutoGraph spent
most of a step's tracing time converting it (the trainer's first step of
consistency.Consistency16: 34 s with, 7 s without). The layers inside the
pipeline and a loss_fn are therefore traced as written, as the recompute pass
(`tf.custom_gradient`) always traced them: a tensor-dependent branch or loop
there must be tf.cond / tf.while_loop, not Python `if` / `while` on a tensor.

A weight read by several partitions (a tied embedding: `BaseLayer.
TiedWeights`) lives once, in its owner's layer; each call copies it to
every reading partition's device with the other thetas, and the
partitions' gradient totals are added once per step in partition order,
owner first (tied_weights.py), under every schedule.

Batch norm uses each micro-batch's statistics; the moving averages are
updated once per step from the statistics of the whole mini-batch. Dropout
masks are drawn per example (py_utils.StatelessUniform), so they do not depend
on K, T or the schedule, and the recompute pass reproduces them.
"""

from typing import Any, List, Optional, Tuple

from absl import logging
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import devices as devices_lib
from tensorpipe import grad_sum
from tensorpipe import hyperparams
from tensorpipe import microbatch
from tensorpipe import partitioning
from tensorpipe import pipeline_partitions
from tensorpipe import pipeline_stage
from tensorpipe import pipeline_train
from tensorpipe import py_utils
from tensorpipe import schedule_auto
from tensorpipe import schedule_builders
from tensorpipe import schedule_ends
from tensorpipe import schedules
from tensorpipe import tied_weights
from tensorpipe import timeline
from tensorpipe.layers import composite
from tensorpipe.nested_map import NestedMap

# The pipeline's entry points run unconverted (module docstring).
_NoAutoGraph = tf.autograph.experimental.do_not_convert

_RECOMPUTE_IMPLS = ('explicit', 'tf_recompute_grad')


class TensorPipeLayer(base_layer.BaseLayer):
  """GPipe: pipelines partitions of a sequence of layers over K devices.

  Usage:
    p = TensorPipeLayer.Params().Set(
        name='TensorPipe', num_micro_batches=8,
        partitions=[[layer_p, ...], [layer_p, ...]])  # K lists of layer Params
    # or automatic, balanced by FPropMeta costs:
    p = TensorPipeLayer.Params().Set(
        name='TensorPipe', num_micro_batches=8, layers=[layer_p, ...],
        num_partitions=4, input_shapes=[[16, 8, 8, 1]])
    layer = p.Instantiate()
    logits = layer.FPropDefaultTheta(inputs)
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('partitions', None, 'Manual partitioning: a list of K non-empty '
             'lists of layer Params; partition k runs on devices[k].')
    p.Define('layers', None, 'Automatic partitioning: the list of layer Params '
             'to split into num_partitions contiguous partitions of balanced '
             'FPropMeta cost (needs input_shapes).')
    p.Define('num_partitions', 1, 'K, the number of partitions for automatic '
             'partitioning (ignored with `partitions`).')
    p.Define('partition_method', 'min_max', "Automatic partitioning objective: "
             "'min_max' (minimise the most expensive partition, exact) or "
             "'min_variance' (the paper's heuristic: minimise the variance of "
             'partition costs, exact).')
    p.Define('partition_costs', None, 'Automatic partitioning: one cost '
             'per layer (e.g. measured seconds) to balance instead of the '
             "layers' FPropMeta FLOPs; None: FLOPs. schedule='auto' with a "
             'measured plan_profile sets it to the profiled cells (forward, '
             'its recompute, backward), so params.txt holds the cut\'s '
             'costs.')
    p.Define('input_shapes', None, 'Shapes of the mini-batch inputs, e.g. '
             '[[16, 8, 8, 1]] (one per FProp input; a NestedMap of shapes for '
             'a NestedMap input). Needed for automatic partitioning; when set, '
             'shapes are also checked to chain through the layers at '
             'construction.')
    p.Define('num_micro_batches', None, 'T, the number of micro-batches a '
             'mini-batch is split into; None means 1 unless micro_batch_size '
             "is set (set at most one of the two). 'auto': the planner picks "
             'T from a profile measured at several micro-batch sizes '
             '(schedule_auto.py, plan_profile).')
    p.Define('micro_batch_size', None, 'Alternative to num_micro_batches: '
             'examples per micro-batch (T = batch size / micro_batch_size).')
    p.Define('batch_dim', 0, 'Axis of the batch in every input tensor.')
    p.Define('devices', None, 'K device names, one per partition; None picks '
             'K GPUs, else K TPU cores, else K logical CPU devices.')
    p.Define('recompute', True, 'Recompute each partition\'s forward pass in '
             'the backward pass, keeping only partition-boundary activations '
             '(GPipe re-materialisation). False keeps all activations. Ignored '
             "for K=1, T=1, where it would save no memory. 'auto': the "
             'planner picks (schedule_auto.py: off where it predicts a faster '
             'step and the activations fit plan_memory_budget).')
    p.Define('recompute_impl', 'explicit', "How recompute is done: 'explicit' "
             "(a backward tf.while_loop with per-partition vjp; fast) or "
             "'tf_recompute_grad' (tf.recompute_grad in the forward loop).")
    p.Define('schedule', 'gpipe', "Training schedule: 'gpipe' (all forwards, "
             "then all backwards; FProp + any tape), '1f1b' (one forward, "
             'one backward: the loss is computed inside the pipeline and '
             'each partition keeps at most min(K - k, T) micro-batches in '
             "flight) or 'interleaved_1f1b' (1F1B over num_stages_per_device "
             'stages per device, round-robin: the bubble divided by v); any '
             "name registered with schedule_builders.Register runs too. 'auto' "
             'picks one at construction by predicted step time '
             '(schedule_auto.py: plan_profile, plan_memory_budget, '
             'plan_regime; the trainer writes the pick to params.txt). All '
             "but 'gpipe' train through FPropLoss / FPropLossAndGrads (FProp "
             'is then for inference) on the schedule engine '
             '(schedule_engine.py). With recompute=False their table is '
             'unrolled in the graph (2 S T stage calls).')
    p.Define('num_stages_per_device', None, 'v: the layers are cut into K '
             'v stages and each device runs v of them, placed by the '
             "schedule (round-robin for 'interleaved_1f1b', which needs v "
             ">= 2). None: the schedule's own, 2 for 'zb_v' (defined on two "
             'stages per device in a V), else 1. Checkpoints are keyed by '
             'layer, so a run restores under any K, v or schedule.')
    schedule_auto.DefinePlanParams(p)
    p.Define('grad_sum', 'sequential', "How each partition sums its weight "
             "gradients over micro-batches: 'sequential' (one running sum) "
             "or 'pairwise' (a binary tree, T.bit_length() weight-sized "
             'buffers: R = 2 replicas of T / 2 micro-batches then train '
             'bit for bit like one of T; needs the explicit recompute of '
             'recompute=True). See grad_sum.py.')
    p.Define('unroll_ticks', 2, 'Clock ticks per iteration of the loop '
             'over the ticks where every partition is busy (GPipe schedule, '
             'explicit recompute loops and the forward loop of inference). '
             'The while loop\'s own cost per iteration (control ops per loop '
             'variable, the loop condition sent to every partition\'s '
             'device) is then paid once per unroll_ticks ticks (2: a third '
             'to a half less fixed cost per tick, tools/benchmark '
             '--tick_cost); the graph holds unroll_ticks copies of each '
             'partition\'s tick in that loop (more tracing time). Training '
             'gives the bits of unroll_ticks=1 (losses, gradients, weights); '
             'a gradient taken in eval mode through the inference loop '
             '(TF\'s autodiff of it, which adds the ticks of one iteration '
             'first) may differ from unroll_ticks=1 in the last bits. 1 '
             'turns unrolling off.')
    return p

  def __init__(self, params):
    if isinstance(params, hyperparams.Params) and 'schedule' in params:
      params = schedule_auto.ResolveAuto(params)
    super().__init__(params)
    p = self.params
    schedule_auto.CheckRecompute(p)
    microbatch.CheckMicroBatchParams(p.num_micro_batches, p.micro_batch_size)
    stage_params, plan = pipeline_partitions.Resolve(p)
    self._CheckUniqueLayerNames(stage_params)
    self._devices = devices_lib.ResolveDevices(
        p.devices, len(stage_params) // schedule_builders.NumStagesPerDevice(p))
    self._WarnIfDevicesShared()
    if p.recompute_impl not in _RECOMPUTE_IMPLS:
      raise ValueError(f'recompute_impl={p.recompute_impl!r} is not one of '
                       f'{_RECOMPUTE_IMPLS}')
    if not isinstance(p.batch_dim, int) or p.batch_dim < 0:
      raise ValueError(f'batch_dim={p.batch_dim!r} must be an int >= 0')
    if (isinstance(p.unroll_ticks, bool) or not isinstance(p.unroll_ticks, int)
        or p.unroll_ticks < 1):
      raise ValueError(f'TensorPipeLayer {p.name!r}: unroll_ticks='
                       f'{p.unroll_ticks!r} must be an int >= 1 (ticks per '
                       'loop iteration; 1 turns unrolling off)')
    schedule_builders.CheckScheduleParams(p, len(self._devices))
    grad_sum.CheckMode(p.grad_sum, f'TensorPipeLayer {p.name!r}')
    if p.grad_sum == 'pairwise' and not (p.recompute and
                                         p.recompute_impl == 'explicit'):
      raise ValueError(
          f"TensorPipeLayer {p.name!r}: grad_sum='pairwise' sums in the "
          'explicit recompute loops, but recompute='
          f'{p.recompute!r}, recompute_impl={p.recompute_impl!r} (without '
          'recompute TF or the unrolled 1F1B schedule adds the gradients); '
          "set recompute=True, recompute_impl='explicit', or "
          "grad_sum='sequential'")
    placement = schedule_builders.StageDevices(p, len(self._devices))
    stages = []
    for k, layer_ps in enumerate(stage_params):
      device = self._devices[placement[k]]
      with tf.device(device):
        layers = self.CreateChildren(f'partition_{k}', layer_ps)
      stages.append(pipeline_stage.Stage(k, layers, device))
    object.__setattr__(self, '_stages', stages)
    object.__setattr__(self, '_ties', tied_weights.Resolve(
        self, [s.layers for s in stages]))
    object.__setattr__(self, '_placement', placement)
    object.__setattr__(self, '_stage_params', stage_params)
    object.__setattr__(self, '_plan', plan)
    logging.info('TensorPipeLayer %r: %s', p.name, self.PlacementReport())

  # -- construction helpers ------------------------------------------------

  def _WarnIfDevicesShared(self) -> None:
    """Partitions on one device run one after another: no pipelining."""
    shared = devices_lib.SharedDevices(self._devices)
    if not shared:
      return
    where = '; '.join(f'{name} for partitions {", ".join(map(str, ks))}'
                      for name, ks in shared)
    logging.warning(
        'TensorPipeLayer %r: devices=%s names a device more than once (%s): '
        'partitions on one device run one after another, with no pipelining '
        'between them. Give %d distinct devices (on a CPU, '
        'tensorpipe.SetNumLogicalCpuDevices(%d) makes them) or fewer '
        'partitions.', self.params.name, list(self._devices), where,
        len(self._devices), len(self._devices))

  def _CheckUniqueLayerNames(self, stage_params) -> None:
    """Layer names name variables and checkpoint keys: one per pipeline."""
    where = {}
    for k, part in enumerate(stage_params):
      for i, lp in enumerate(part):
        # The name CreateChildren gives the layer.
        name = getattr(lp, 'name', None) or f'partition_{k}_{i}'
        if name in where:
          first = where[name]
          both = (f'twice in partition {k}' if first == k else
                  f'in partition {first} and in partition {k}')
          raise ValueError(
              f'TensorPipeLayer {self.params.name!r}: layer name {name!r} is '
              f'used {both}; layer names name the variables and checkpoint '
              'keys and must be unique across the pipeline: rename one')
        where[name] = k

  # -- properties ----------------------------------------------------------

  @property
  def num_partitions(self) -> int:
    """K, the devices (one partition each, of v stages)."""
    return len(self._devices)

  @property
  def num_stages(self) -> int:
    """S = K v, the stages (`PartitionLayers` has one list each)."""
    return len(self._stages)

  @property
  def stages(self) -> List[pipeline_stage.Stage]:
    """The S stages, each with its layers and device."""
    return list(self._stages)

  @property
  def devices(self) -> List[str]:
    return list(self._devices)

  def PlacementReport(self) -> str:
    """The stages, the devices and which device holds which stage (logged
    at construction; schedule_builders.PlacementReport)."""
    return schedule_builders.PlacementReport(
        self._placement, self._devices, self.params.schedule)

  @property
  def partition_plan(self) -> Optional[partitioning.PartitionPlan]:
    """The automatic partition plan, or None for manual partitions."""
    return self._plan

  def PartitionLayers(self) -> List[List[base_layer.BaseLayer]]:
    return [list(s.layers) for s in self._stages]

  def LayersWithTheta(self, theta: Optional[NestedMap] = None
                      ) -> List[Tuple[base_layer.BaseLayer, NestedMap]]:
    """Every layer of every partition, in order, each with its theta.

    Chaining them (each layer's outputs, composite.AsArgs, are the next
    one's inputs) computes what FProp does, without the pipeline.

    Args:
      theta: this layer's theta (default `self.theta`).
    """
    theta = self.theta if theta is None else theta
    thetas = tied_weights.Inject(self._ties, [
        theta[f'partition_{k}'] for k in range(len(self._stages))])
    return [(layer, layer_theta)
            for layers, stage_theta in zip(self.PartitionLayers(), thetas)
            for layer, layer_theta in zip(layers, stage_theta)]

  @classmethod
  def FPropMeta(cls, p, *input_shapes):
    layer_ps = (p.layers if p.layers is not None else
                [lp for part in p.partitions for lp in part])
    metas, out_shapes = composite.ChainFPropMeta(
        layer_ps, input_shapes, owner=f'TensorPipeLayer {p.name!r}')
    return base_layer.FPropMetaResult(sum(m.flops for m in metas), out_shapes,
                                      sum(m.num_params for m in metas))

  # -- forward -------------------------------------------------------------

  @_NoAutoGraph
  def FProp(self, theta: NestedMap, *inputs):
    """Runs the pipeline on a mini-batch.

    Args:
      theta: this layer's weights (`self.theta` or a transformed copy).
      *inputs: the first layer's inputs; every tensor has the batch on
        `batch_dim` (e.g. [batch, height, width, channels]).

    Returns:
      The last layer's outputs for the whole mini-batch.
    """
    # Dropout and drop-path draw their per-example masks along the batch
    # axis; the recompute pass restores it with the rest of the context.
    with py_utils.BatchAxis(self.params.batch_dim):
      return self._FPropOnBatchAxis(theta, *inputs)

  @_NoAutoGraph
  def FPropLoss(self, theta: NestedMap, inputs: Tuple[Any, ...], targets: Any,
                loss_fn: schedule_ends.LossFn, normalizer: Any) -> NestedMap:
    """Training with the loss inside ('1f1b' and every schedule but
    'gpipe'): the loss, differentiable by a tape.

    Runs the whole step (`pipeline_train.FPropLoss`: forward, loss and
    backward of every micro-batch) and returns the loss under a
    tf.custom_gradient whose gradient is upstream x the weight gradients
    computed there, so a task's loss built on it trains with
    `tape.gradient` unchanged.

    Args:
      theta: this layer's weights.
      inputs: the first layer's inputs, a tuple (FProp's *inputs; a single
        tensor or NestedMap is taken as the one input), batch on batch_dim.
      targets: a structure of tensors with the batch on batch_dim, split
        into micro-batches with the inputs and passed to loss_fn; or None.
      loss_fn: (outputs of micro-batch t, its targets) -> the micro-batch's
        loss SUM (a scalar float tensor), or NestedMap(loss=scalar sum,
        metrics=NestedMap(name=(value sum, weight))). Runs on the last
        partition's device, twice per micro-batch (forward, recompute).
      normalizer: a scalar (e.g. the examples or real tokens of the batch)
        dividing the summed loss; known before the pipeline starts.

    Returns:
      NestedMap(loss=sum of loss sums / normalizer, metrics=name -> (sum of
      value sums, sum of weights)); the metrics get no gradient.
    """
    with py_utils.BatchAxis(self.params.batch_dim):
      call, table = self._LossInsideCall(theta, inputs, loss_fn)
      loss, metrics = pipeline_train.FPropLoss(
          call, table, targets, loss_fn, normalizer, py_utils.IsTraining())
    return NestedMap(loss=loss, metrics=metrics)

  @_NoAutoGraph
  def FPropLossAndGrads(self, theta: NestedMap, inputs: Tuple[Any, ...],
                        targets: Any, loss_fn: schedule_ends.LossFn,
                        normalizer: Any) -> NestedMap:
    """As `FPropLoss`, but also returns the gradients (no tape needed).

    Returns:
      NestedMap(loss, metrics, grads): grads holds d loss / d theta in
      theta's structure (theta.partition_<k>).
    """
    with py_utils.BatchAxis(self.params.batch_dim):
      call, table = self._LossInsideCall(theta, inputs, loss_fn)
      res, grads = pipeline_train.FPropLossAndGrads(
          call, table, targets, loss_fn, normalizer, py_utils.IsTraining())
    # A tied weight's readers' gradients are added to its owner's.
    grads = tied_weights.Fold(self._ties, grads,
                              [s.device for s in self._stages])
    return NestedMap(loss=res.loss, metrics=res.metrics, grads=NestedMap(
        {f'partition_{k}': g for k, g in enumerate(grads)}))

  def _LossInsideCall(self, theta, inputs, loss_fn):
    """(the call, its schedule table) of FPropLoss / FPropLossAndGrads,
    after checking the inputs and loss_fn."""
    inputs, num_mb = self._CheckLossInsideInputs(inputs)
    schedule_ends.CheckLossFn(loss_fn)
    return self._Call(theta, inputs, num_mb), self._LossInsideTable(num_mb)

  def _CheckLossInsideInputs(self, inputs) -> Tuple[Tuple[Any, ...], int]:
    """(inputs as a tuple, T), or ValueError for GPipe or no inputs."""
    p = self.params
    if not schedules.LossInside(p.schedule):
      raise ValueError(f'TensorPipeLayer {p.name!r}: FPropLoss / '
                       'FPropLossAndGrads run a schedule with the loss inside '
                       "the pipeline, but schedule='gpipe'; set "
                       "schedule='1f1b' (or another), or train with FProp and "
                       'a tape')
    if not isinstance(inputs, tuple):
      inputs = (inputs,)
    return inputs, self._NumMicroBatches(inputs, 'FPropLoss')

  def _Call(self, theta: NestedMap, inputs: Tuple[Any, ...],
            num_mb: int) -> pipeline_stage.PipelineCall:
    """The per-call object of one call on `inputs` (T = num_mb)."""
    p = self.params
    return pipeline_stage.PipelineCall.Make(
        self._stages, self._devices,
        [theta[f'partition_{k}'] for k in range(len(self._stages))], inputs,
        num_mb, p.batch_dim, ties=self._ties, recompute=p.recompute,
        grad_sum=p.grad_sum, unroll_ticks=p.unroll_ticks)

  def _LossInsideTable(self, num_mb: int) -> schedules.Schedule:
    p = self.params
    return schedule_builders.FromParam(
        p.schedule, len(self._devices), num_mb,
        schedule_builders.NumStagesPerDevice(p))

  def _GPipeTable(self, num_mb: int) -> schedules.Schedule:
    """GPipe's table, or with v stages per device (inference of an
    interleaved pipeline) a forward-only one."""
    kk = len(self._devices)
    if len(self._stages) == kk:
      return schedule_builders.Build('gpipe', kk, num_mb)
    return schedule_builders.ForwardOnly(self._placement, kk, num_mb)

  def _FPropOnBatchAxis(self, theta: NestedMap, *inputs):
    p = self.params
    if not inputs:
      raise ValueError('TensorPipeLayer.FProp needs at least one input')
    if schedules.LossInside(p.schedule) and py_utils.IsTraining():
      raise ValueError(
          f'TensorPipeLayer {p.name!r} has schedule='
          f'{schedules.Label(p.schedule)!r}, which '
          'trains with the loss inside the pipeline: call FPropLoss / '
          'FPropLossAndGrads (tasks do), run FProp in eval mode '
          "(py_utils.EvalMode()), or use schedule='gpipe'")
    num_mb = self._NumMicroBatches(inputs, 'FProp')
    training = py_utils.IsTraining()
    # The timeline enters here, the one place: every cell stamps through it.
    probe = timeline.ActiveProbe()
    if len(self._stages) == 1 and num_mb == 1:
      return self._SingleCall(theta, inputs, training, probe)
    call = self._Call(theta, inputs, num_mb)
    table = self._GPipeTable(num_mb)
    if training:
      # The explicit recompute, or TF's autodiff of the forward loop.
      result = pipeline_train.GPipeTrain(call, table, p.recompute_impl)
      pipeline_train.ReportCallStats(call, result.stats)
    else:
      result = pipeline_train.GPipeForward(call, table)
    with tf.device(self._stages[-1].device):
      out = microbatch.PackTensors(call.specs[-1].out_struct, result.outputs)
      return microbatch.Merge(out, p.batch_dim)

  def _SingleCall(self, theta, inputs, training, probe):
    """K=1, T=1: one stage call, no micro-batch split and no loop.

    Nothing is pipelined, so the loops would only add per-tick overhead.
    Recompute is skipped as well: with one partition and one micro-batch the
    recomputed forward would run right after the original one and hold the
    same activations at the same time, so it would cost a forward pass and
    save no memory. Results are those of the loops (same ops, same order).
    """
    stage = self._stages[0]
    with tf.device(stage.device):
      (th,) = tied_weights.Inject(self._ties, [list(theta['partition_0'])])
      start = probe.Stamp(tf.nest.flatten(inputs))
      with tf.control_dependencies(start):
        out, collected = stage.Call(th, tuple(inputs), 0)
      probe.Add('forward', 0, 1, 1, probe.OneTickLog(
          start + probe.Stamp(tf.nest.flatten(out))))
    if training:
      with tf.device(stage.device):
        flat_stats = pipeline_stage.FlatStats(collected)
      pipeline_train.ReportStats(
          [stage], [[layer for layer, _ in collected]], [flat_stats])
    return out

  def _NumMicroBatches(self, inputs, entry: str) -> int:
    """T of a call on `inputs`, after checking that their shapes chain."""
    p = self.params
    if not inputs:
      raise ValueError(f'TensorPipeLayer.{entry} needs at least one input')
    num_mb = microbatch.NumMicroBatches(
        microbatch.BatchSize(inputs, p.batch_dim), p.num_micro_batches,
        p.micro_batch_size)
    self._CheckInputShapes(inputs, num_mb)
    return num_mb

  def _CheckInputShapes(self, inputs, num_mb):
    """Checks shapes chain through all layers before any TF op is built."""
    p = self.params
    # Static leaves (None, ints) pass through as they are.
    shapes = tf.nest.map_structure(
        lambda x: x.shape if microbatch.IsTensorLeaf(x) else x, tuple(inputs))

    def MicroShape(s):
      if not isinstance(s, tf.TensorShape) or s.rank is None:
        return s
      dims = s.as_list()
      dims[p.batch_dim] = dims[p.batch_dim] // num_mb
      return tf.TensorShape(dims)
    shapes = tf.nest.map_structure(MicroShape, shapes)
    flat_ps = [lp for part in self._stage_params for lp in part]
    try:
      composite.ChainFPropMeta(flat_ps, shapes,
                               owner=f'TensorPipeLayer {p.name!r}')
    except NotImplementedError:
      pass
