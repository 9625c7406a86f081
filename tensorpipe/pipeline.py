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
graph does not grow with T. Only the activations
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

The recompute is written as an explicit backward `tf.while_loop` (a
`tf.custom_gradient` over the whole pipeline) rather than `tf.recompute_grad`
inside the forward loop: autodiff of a `tf.while_loop` stacks every tensor
the loop body's gradient needs, and with `tf.recompute_grad` in the body that
still included the partition's inputs and made it much slower than the
forward-plus-backward cost (see tools/benchmark). `recompute_impl=
'tf_recompute_grad'` keeps that formulation for comparison (the engine's
forward run with `Ends(autodiff='recompute_grad')`).

With one partition and one micro-batch (K=1, T=1) nothing is pipelined:
FProp then calls the partition directly, without loops, and skips the
recompute (it would save no memory there). The loops run one clock tick at
a time (parallel_iterations=1), which bounds the weight gradients in flight;
the backward loop adds each tick's weight gradients inside its tf.cond so
bubble ticks cost no weight-sized add. A stage's boundary structures are
traced once per call (`pipeline_stage.InferSpecs`). Inside `timeline.Record()` (at
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

Batch norm uses each micro-batch's statistics; the moving averages are
updated once per step from the statistics of the whole mini-batch. Dropout
masks are drawn per example (py_utils.StatelessUniform), so they do not depend
on K or T and the recompute pass reproduces them.
"""

from typing import Any, List, NamedTuple, Optional, Tuple

from absl import logging
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import devices as devices_lib
from tensorpipe import grad_sum
from tensorpipe import hyperparams
from tensorpipe import microbatch
from tensorpipe import partitioning
from tensorpipe import pipeline_1f1b
from tensorpipe import pipeline_stage
from tensorpipe import py_utils
from tensorpipe import schedule_builders
from tensorpipe import schedule_engine
from tensorpipe import schedule_program
from tensorpipe import schedules
from tensorpipe import timeline
from tensorpipe.layers import composite
from tensorpipe.nested_map import NestedMap

# The pipeline's entry points run unconverted (module docstring).
_NoAutoGraph = tf.autograph.experimental.do_not_convert

_RECOMPUTE_IMPLS = ('explicit', 'tf_recompute_grad')
# One clock tick in flight at a time. tf.while_loop's default (10) lets later
# ticks start early; with per-tick weight gradients that kept up to 10
# copies of every partition's dtheta alive (dense16, K=1, T=8: 543 MB peak
# above idle instead of 111 MB) and made the unrecomputed loop's autodiff 3x
# slower. GPipe's schedule is tick-synchronous anyway: within a tick the K
# partitions still run concurrently on their devices.
_PARALLEL_ITERATIONS = 1


class _ForwardResult(NamedTuple):
  """What the forward pass hands on."""
  outputs: List[tf.Tensor]        # last stage's flat outputs, [T, N/T, ...]
  stats: List[List[List[tf.Tensor]]]  # per stage and layer, summed over t
  saved: Optional[List[List[tf.Tensor]]]  # per stage, inputs [T, ...]


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
    p.Define('input_shapes', None, 'Shapes of the mini-batch inputs, e.g. '
             '[[16, 8, 8, 1]] (one per FProp input; a NestedMap of shapes for '
             'a NestedMap input). Needed for automatic partitioning; when set, '
             'shapes are also checked to chain through the layers at '
             'construction.')
    p.Define('num_micro_batches', None, 'T, the number of micro-batches a '
             'mini-batch is split into; None means 1 unless micro_batch_size '
             'is set (set at most one of the two).')
    p.Define('micro_batch_size', None, 'Alternative to num_micro_batches: '
             'examples per micro-batch (T = batch size / micro_batch_size).')
    p.Define('batch_dim', 0, 'Axis of the batch in every input tensor.')
    p.Define('devices', None, 'K device names, one per partition; None picks '
             'K GPUs, else K TPU cores, else K logical CPU devices.')
    p.Define('recompute', True, 'Recompute each partition\'s forward pass in '
             'the backward pass, keeping only partition-boundary activations '
             '(GPipe re-materialisation). False keeps all activations. Ignored '
             'for K=1, T=1, where it would save no memory.')
    p.Define('recompute_impl', 'explicit', "How recompute is done: 'explicit' "
             "(a backward tf.while_loop with per-partition vjp; fast) or "
             "'tf_recompute_grad' (tf.recompute_grad in the forward loop).")
    p.Define('schedule', 'gpipe', "Training schedule: 'gpipe' (all forwards, "
             "then all backwards; FProp + any tape), '1f1b' (one forward, "
             'one backward: the loss is computed inside the pipeline and '
             'each partition keeps at most min(K - k, T) micro-batches in '
             "flight) or 'interleaved_1f1b' (1F1B over num_stages_per_device "
             'stages per device, round-robin: the bubble divided by v); any '
             'name registered with schedule_builders.Register runs too. All '
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
    super().__init__(params)
    p = self.params
    microbatch.CheckMicroBatchParams(p.num_micro_batches, p.micro_batch_size)
    stage_params, plan = self._ResolvePartitions(p)
    self._CheckUniqueLayerNames(stage_params)
    self._devices = devices_lib.ResolveDevices(
        p.devices, len(stage_params) // pipeline_1f1b.NumStagesPerDevice(p))
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
    pipeline_1f1b.CheckScheduleParams(p, len(self._devices))
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
    placement = pipeline_1f1b.StageDevices(p, len(self._devices))
    stages = []
    for k, layer_ps in enumerate(stage_params):
      device = self._devices[placement[k]]
      with tf.device(device):
        layers = self.CreateChildren(f'partition_{k}', layer_ps)
      stages.append(pipeline_stage.Stage(k, layers, device))
    object.__setattr__(self, '_stages', stages)
    object.__setattr__(self, '_placement', placement)
    object.__setattr__(self, '_stage_params', stage_params)
    object.__setattr__(self, '_plan', plan)

  # -- construction helpers ------------------------------------------------

  def _ResolvePartitions(
      self, p) -> Tuple[List[List[Any]], Optional[partitioning.PartitionPlan]]:
    """The K lists of layer Params, and the automatic plan (or None)."""
    if p.partitions is not None and p.layers is not None:
      raise ValueError(f'TensorPipeLayer {p.name!r}: set either `partitions` '
                       '(manual) or `layers` + `num_partitions` (automatic), '
                       'not both')
    if p.partitions is not None:
      parts = list(p.partitions)
      if not parts:
        raise ValueError(f'TensorPipeLayer {p.name!r}: partitions is empty; '
                         'give K >= 1 lists of layer Params')
      for k, part in enumerate(parts):
        if not isinstance(part, (list, tuple)):
          what = (f'layer Params {part.name!r}'
                  if isinstance(part, hyperparams.Params) and 'name' in part
                  else f'{type(part).__name__} {part!r}')
          raise TypeError(f'partitions[{k}] must be a list of layer Params, '
                          f'got {what}; give K lists of layer Params, e.g. '
                          'partitions=[[layer_a, layer_b], [layer_c]]')
        if not part:
          raise ValueError(f'TensorPipeLayer {p.name!r}: partition {k} is '
                           'empty; every partition needs at least one layer')
      v = pipeline_1f1b.NumStagesPerDevice(p)
      if len(parts) % v:
        raise ValueError(
            f'TensorPipeLayer {p.name!r}: {len(parts)} partitions (stages) do '
            f'not fill num_stages_per_device={v} stages on each device; give '
            f'a multiple of {v} partitions')
      if p.input_shapes is not None:
        self._CheckChain([lp for part in parts for lp in part],
                         base_layer.InputShapes(p.input_shapes))
      return [list(part) for part in parts], None
    if p.layers is None:
      raise ValueError(f'TensorPipeLayer {p.name!r}: no layers; set '
                       '`partitions` (K lists of layer Params) or `layers` '
                       'with `num_partitions`')
    layers = list(p.layers)
    if not layers:
      raise ValueError(f'TensorPipeLayer {p.name!r}: layers is empty')
    k = p.num_partitions
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
      raise ValueError(f'num_partitions={k!r} must be a positive int')
    v = pipeline_1f1b.NumStagesPerDevice(p)
    if k * v > len(layers):
      what = (f'num_partitions={k}' if v == 1 else
              f'num_partitions={k} x num_stages_per_device={v} = {k * v} '
              'stages')
      raise ValueError(f'{what} is larger than the number of layers '
                       f'({len(layers)}): each stage needs at least one '
                       f'layer; use num_partitions <= {len(layers) // v}')
    k *= v
    if k == 1:
      return [layers], None
    if p.input_shapes is None:
      raise ValueError(
          f'TensorPipeLayer {p.name!r}: automatic partitioning into {k} '
          'partitions balances FPropMeta costs, which need the input shapes; '
          'set input_shapes (e.g. [[batch, height, width, channels]]) or give '
          '`partitions` explicitly')
    metas = self._CheckChain(layers, base_layer.InputShapes(p.input_shapes))
    costs = [m.flops for m in metas]
    plan = partitioning.Partition(costs, k, method=p.partition_method)
    logging.info('TensorPipeLayer %r partition plan:\n%s', p.name,
                 plan.Report([lp.name for lp in layers]))
    out, start = [], 0
    for size in plan.sizes:
      out.append(layers[start:start + size])
      start += size
    return out, plan

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

  def _CheckChain(self, layer_params, input_shapes):
    try:
      metas, _ = composite.ChainFPropMeta(
          layer_params, input_shapes, owner=f'TensorPipeLayer '
          f'{self.params.name!r}')
    except NotImplementedError:
      return None
    return metas

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
    return [(layer, layer_theta)
            for k, layers in enumerate(self.PartitionLayers())
            for layer, layer_theta in zip(layers, theta[f'partition_{k}'])]

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
                loss_fn: pipeline_1f1b.LossFn, normalizer: Any) -> NestedMap:
    """Training with schedule='1f1b': the loss, differentiable by a tape.

    Runs the whole 1F1B step (forward, loss and backward of every
    micro-batch) and returns the loss under a tf.custom_gradient whose
    gradient is upstream x the weight gradients computed there, so a
    task's loss built on it trains with `tape.gradient` unchanged.

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
    return pipeline_1f1b.FPropLoss(
        self, theta, self._Check1F1BInputs(inputs), targets, loss_fn,
        normalizer)

  @_NoAutoGraph
  def FPropLossAndGrads(self, theta: NestedMap, inputs: Tuple[Any, ...],
                        targets: Any, loss_fn: pipeline_1f1b.LossFn,
                        normalizer: Any) -> NestedMap:
    """As `FPropLoss`, but also returns the gradients (no tape needed).

    Returns:
      NestedMap(loss, metrics, grads): grads holds d loss / d theta in
      theta's structure (theta.partition_<k>).
    """
    return pipeline_1f1b.FPropLossAndGrads(
        self, theta, self._Check1F1BInputs(inputs), targets, loss_fn,
        normalizer)

  def _Check1F1BInputs(self, inputs) -> Tuple[Any, ...]:
    p = self.params
    if p.schedule == 'gpipe':
      raise ValueError(f'TensorPipeLayer {p.name!r}: FPropLoss / '
                       'FPropLossAndGrads run a schedule with the loss inside '
                       "the pipeline, but schedule='gpipe'; set "
                       "schedule='1f1b' (or another), or train with FProp and "
                       'a tape')
    if not isinstance(inputs, tuple):
      inputs = (inputs,)
    if not inputs:
      raise ValueError('TensorPipeLayer.FPropLoss needs at least one input')
    batch = microbatch.BatchSize(inputs, p.batch_dim)
    num_mb = microbatch.NumMicroBatches(batch, p.num_micro_batches,
                                        p.micro_batch_size)
    self._CheckInputShapes(inputs, num_mb)
    return inputs

  def _FPropOnBatchAxis(self, theta: NestedMap, *inputs):
    p = self.params
    if not inputs:
      raise ValueError('TensorPipeLayer.FProp needs at least one input')
    if p.schedule != 'gpipe' and py_utils.IsTraining():
      raise ValueError(
          f'TensorPipeLayer {p.name!r} has schedule='
          f'{schedules.Label(p.schedule)!r}, which '
          'trains with the loss inside the pipeline: call FPropLoss / '
          'FPropLossAndGrads (tasks do), run FProp in eval mode '
          "(py_utils.EvalMode()), or use schedule='gpipe'")
    batch = microbatch.BatchSize(inputs, p.batch_dim)
    num_mb = microbatch.NumMicroBatches(batch, p.num_micro_batches,
                                        p.micro_batch_size)
    mb_size = batch // num_mb
    self._CheckInputShapes(inputs, num_mb)
    training = py_utils.IsTraining()
    # The timeline enters here, the one place: every cell stamps through it.
    probe = timeline.ActiveProbe()
    if len(self._stages) == 1 and num_mb == 1:
      return self._SingleCall(theta, inputs, training, probe)
    thetas = []
    for k, stage in enumerate(self._stages):
      with tf.device(stage.device):
        thetas.append(tf.nest.map_structure(
            tf.identity, list(theta[f'partition_{k}'])))
    stacked = microbatch.Split(inputs, num_mb, p.batch_dim)
    specs = pipeline_stage.InferSpecs(self._stages, thetas, stacked,
                                      mb_size)
    flat_stacked = microbatch.FlattenTensors(stacked)
    if training and p.recompute and p.recompute_impl == 'explicit':
      result = self._RecomputedPipeline(specs, flat_stacked, thetas, num_mb,
                                        mb_size)
    else:
      # TF's autodiff differentiates the loop: in training, each stage's
      # gradient on its device, under tf.recompute_grad with recompute.
      autodiff = ('' if not training else
                  'recompute_grad' if p.recompute else 'place')
      result = self._ForwardLoop(specs, flat_stacked, thetas, num_mb,
                                 mb_size, save_inputs=False,
                                 autodiff=autodiff)
    if training:
      self._ReportStats(specs, result.stats)
    with tf.device(self._stages[-1].device):
      out = microbatch.PackTensors(specs[-1].out_struct, result.outputs)
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
      th = list(theta['partition_0'])
      start = probe.Stamp(tf.nest.flatten(inputs))
      with tf.control_dependencies(start):
        out, collected = stage.Call(th, tuple(inputs), 0)
      probe.Add('forward', 0, 1, 1, probe.OneTickLog(
          start + probe.Stamp(tf.nest.flatten(out))))
    if training:
      with tf.device(stage.device):
        flat_stats = pipeline_stage.FlatStats(collected)
        for (layer, _), flat in zip(collected, flat_stats):
          py_utils.AddBatchStats(layer, py_utils.BatchStats.Pack(flat))
    return out

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

  def _ReportStats(self, specs, stats) -> None:
    """Hands each batch-norm layer its statistics summed over micro-batches."""
    for stage, spec, stage_stats in zip(self._stages, specs, stats):
      for layer, flat in zip(spec.stats_layers, stage_stats):
        with tf.device(stage.device):
          py_utils.AddBatchStats(layer, py_utils.BatchStats.Pack(flat))

  def _Run(self, specs, flat_stacked, thetas, num_mb, mb_size, ends,
           backward: bool, acc=None) -> schedule_engine.Sums:
    """GPipe's forward (or backward) pass: its table's F (B) ticks, run by
    the schedule engine with one tick in flight."""
    kk, num_s = len(self._devices), len(self._stages)
    if num_s == kk:
      # GPipe's table: F ticks [0, span), then B ticks [span, 2 span).
      table = schedule_builders.Build('gpipe', kk, num_mb)
      span = table.num_ticks // 2
    else:
      # v stages per device (inference of an interleaved pipeline): each
      # device runs its stages' forward cells in GPipe's order (micro-batch
      # t of stage s on tick t + s), each as early as it can.
      orders = [[] for _ in range(kk)]
      for t, s in sorted(((t, s) for t in range(num_mb)
                          for s in range(num_s)), key=lambda x: sum(x)):
        orders[self._placement[s]].append(schedules.Action('F', t, s))
      table = schedules.FromOrders(orders, num_mb, num_s,
                                   name='gpipe_forward')
      span = table.num_ticks
    first = span if backward else 0
    return schedule_engine.Run(
        self._stages, thetas, specs, schedule_program.Compile(table),
        flat_stacked, ends, mb_size, acc, self._devices, first=first,
        end=first + span, unroll_ticks=self.params.unroll_ticks,
        parallel_iterations=_PARALLEL_ITERATIONS)

  def _ForwardLoop(self, specs, flat_stacked, thetas, num_mb, mb_size,
                   save_inputs, autodiff='') -> _ForwardResult:
    """The forward pass (the first loop of the pseudo-code).

    Args:
      specs: per stage, its `pipeline_stage.StageSpecs`.
      flat_stacked: the flat inputs split into micro-batches, [T, N/T, ...].
      thetas: per stage, its weights (a list per layer).
      num_mb: T.
      mb_size: N / T.
      save_inputs: whether to return every stage's inputs (for a recompute).
      autodiff: '' or how TF's autodiff will differentiate the loop
        (schedule_engine.Ends: 'place', 'recompute_grad').

    Returns:
      A `_ForwardResult`; its `saved` is None unless `save_inputs`.
    """
    sums = self._Run(specs, flat_stacked, thetas, num_mb, mb_size,
                     schedule_engine.Ends(outputs=True,
                                          save_inputs=save_inputs,
                                          autodiff=autodiff),
                     backward=False)
    return _ForwardResult(sums.outputs, sums.stats, sums.saved)

  def _RecomputedPipeline(self, specs, flat_stacked, thetas, num_mb, mb_size
                          ) -> _ForwardResult:
    """Forward pass + explicit backward pass, as one tf.custom_gradient."""
    arg_struct = (list(flat_stacked), thetas)
    # The stats leave the pipeline without a gradient (FlatStats).
    result_struct = (list(specs[-1].out_specs),
                     [spec.StatsSpecs() for spec in specs])

    @tf.custom_gradient
    def Pipeline(*args):
      f_stacked, f_thetas = tf.nest.pack_sequence_as(arg_struct, list(args))
      fwd = self._ForwardLoop(specs, f_stacked, f_thetas, num_mb, mb_size,
                              save_inputs=True)
      forward_ctx = py_utils.Current()

      def Grad(*dys):
        dys, _ = tf.nest.pack_sequence_as(result_struct, list(dys))
        dys = [tf.zeros_like(o) if d is None else d
               for d, o in zip(dys, fwd.outputs)]
        # The recompute must draw the forward pass's dropout masks even when
        # tape.gradient runs outside the forward's StepSeed block.
        with py_utils.RestoreContext(forward_ctx):
          sums = self._Run(
              specs, f_stacked, f_thetas, num_mb, mb_size,
              schedule_engine.Ends(dys=dys, saved=fwd.saved,
                                   input_grads=True),
              backward=True,
              acc=grad_sum.GradSum(self.params.grad_sum, num_mb))
        return tf.nest.flatten((sums.d_inputs, sums.dthetas))

      return tf.nest.flatten((fwd.outputs, fwd.stats)), Grad

    outputs, stats = tf.nest.pack_sequence_as(
        result_struct, list(Pipeline(*tf.nest.flatten(arg_struct))))
    return _ForwardResult(outputs, stats, None)
