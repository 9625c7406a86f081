"""TensorPipeLayer: GPipe pipeline parallelism for a sequence of layers.

GPipe (Huang et al. 2018, arXiv 1811.06965) cuts a sequence of L layers into K
partitions placed on K devices, splits the mini-batch of N examples into T
micro-batches and pipelines them: at clock tick c partition k works on
micro-batch t = c - k, so the K devices work at the same time on different
micro-batches. The backward pass runs the mirrored schedule. Only the
activations at partition boundaries are kept; each partition's forward pass is
recomputed in the backward pass. Gradients are summed over micro-batches, so
one optimizer step per mini-batch equals the step of the unpipelined model.

Pseudo-code of one training step (`recompute=True`):

  x[t] = micro-batch t of the inputs                    # [T, N/T, ...]
  for c in range(T + K - 1):                             # tf.while_loop
    for k in range(K):                                   # concurrently
      t = c - k
      if 0 <= t < T:
        saved[k][t] = in_k                               # boundary activation
        out_k, stats_k += F_k(theta_k, in_k)             # on device k
  y = concat(out_{K-1})                                  # [N, ...]
  for c in range(T + K - 1):                             # backward tick
    for k in range(K):
      t = T - 1 - (c - (K - 1 - k))
      if 0 <= t < T:
        dx_k, dtheta_k += vjp(F_k, saved[k][t], dy_k)    # recompute + backprop
  moving stats of batch norm <- stats summed over all micro-batches

The recompute is written as an explicit backward `tf.while_loop` (a
`tf.custom_gradient` over the whole pipeline) rather than `tf.recompute_grad`
inside the forward loop: autodiff of a `tf.while_loop` stacks every tensor
the loop body's gradient needs, and with `tf.recompute_grad` in the body that
still included the partition's inputs and made it much slower than the
forward-plus-backward cost (see tools/benchmark). `recompute_impl=
'tf_recompute_grad'` keeps that formulation for comparison.

With one partition and one micro-batch (K=1, T=1) nothing is pipelined:
FProp then calls the partition directly, without loops, and skips the
recompute (it would save no memory there). The loops run one clock tick at
a time (parallel_iterations=1), which bounds the weight gradients in flight;
the backward loop adds each tick's weight gradients inside its tf.cond so
bubble ticks cost no weight-sized add. Inside `timeline.Record()` (at trace
time) every stage call also records tf.timestamp() before and after (and
after the recomputed forward), for tools/benchmark's timeline.

Batch norm uses each micro-batch's statistics; the moving averages are
updated once per step from the statistics of the whole mini-batch. Dropout
masks are drawn per example (py_utils.StatelessUniform), so they do not depend
on K or T and the recompute pass reproduces them.
"""

from typing import Any, List, Optional, Sequence, Tuple

from absl import logging
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import devices as devices_lib
from tensorpipe import hyperparams
from tensorpipe import microbatch
from tensorpipe import partitioning
from tensorpipe import py_utils
from tensorpipe import timeline
from tensorpipe.layers import composite
from tensorpipe.nested_map import NestedMap

_RECOMPUTE_IMPLS = ('explicit', 'tf_recompute_grad')
# One clock tick in flight at a time. tf.while_loop's default (10) lets later
# ticks start early; with per-tick weight gradients that kept up to 10
# copies of every partition's dtheta alive (dense16, K=1, T=8: 543 MB peak
# above idle instead of 111 MB) and made the unrecomputed loop's autodiff 3x
# slower. GPipe's schedule is tick-synchronous anyway: within a tick the K
# partitions still run concurrently on their devices.
_PARALLEL_ITERATIONS = 1


def _Zeros(specs: Sequence[tf.TensorSpec]) -> List[tf.Tensor]:
  return [tf.zeros(s.shape, s.dtype) for s in specs]


def _IsFloat(spec: tf.TensorSpec) -> bool:
  return spec.dtype.is_floating or spec.dtype.is_complex


def _SpecOf(x: tf.Tensor) -> tf.TensorSpec:
  return tf.TensorSpec(x.shape, x.dtype)


def _NoStamps(rec, n: int = 2) -> List[tf.Tensor]:
  """Timestamps of a bubble tick (-1 = did not run), when recording."""
  return [tf.constant(-1.0, tf.float64)] * n if rec else []


def _RecordTick(events: tf.Tensor, c: tf.Tensor, stamps) -> tf.Tensor:
  """Writes one tick's stamps into row c of a [ticks, n] events tensor."""
  return tf.tensor_scatter_nd_update(events, tf.reshape(c, [1, 1]),
                                     tf.stack(stamps)[tf.newaxis])


def _Cond(rec, pred, true_fn, false_fn):
  """tf.cond; when recording a timeline, one that keeps ticks concurrent."""
  if not rec:
    return tf.cond(pred, true_fn, false_fn)
  return timeline.Unordered(lambda: tf.cond(pred, true_fn, false_fn))


def _Stamped(call):
  """Wraps a stage call to also return its start and end timestamps."""
  def Call(flat_in, t):
    start = timeline.Stamp(flat_in)
    with tf.control_dependencies([start]):
      res = list(call(list(flat_in), t))
    return res + [start, timeline.Stamp(res)]
  return Call


class _Stage:
  """One partition: its layers, device and the structures crossing it."""

  def __init__(self, k: int, layers: List[base_layer.BaseLayer], device: str):
    self.k = k
    self.layers = layers
    self.device = device
    self.in_struct = None      # structure of the input args (a tuple)
    self.in_specs = None       # flat TensorSpecs of the inputs
    self.out_struct = None
    self.out_specs = None
    self.stats_layers = None   # batch-norm layers reporting stats, in order
    self.stats_specs = None

  def Call(self, theta: List[Any], args: Tuple[Any, ...],
           example_offset) -> Tuple[Any, List[Tuple[Any, Any]]]:
    """Runs the stage's layers on one micro-batch; returns (outputs, stats).

    `example_offset` (t * micro-batch size) is relative: it adds to the
    enclosing context's offset (e.g. a replica's start in the global batch).
    """
    with py_utils.ExampleOffset(example_offset), \
        py_utils.CollectBatchStats() as collected:
      for layer, layer_theta in zip(self.layers, theta):
        with tf.name_scope(layer.layer_name):
          args = composite.AsArgs(layer.FProp(layer_theta, *args))
    return composite.FromArgs(args), collected

  def FlatCall(self, theta, flat_in, t, micro_batch_size):
    """Flat-tensor version of Call: returns (flat outputs, flat stats)."""
    args = microbatch.PackTensors(self.in_struct, flat_in)
    out, collected = self.Call(theta, args, t * micro_batch_size)
    flat_stats = []
    for _, stats in collected:
      flat_stats.extend(tf.stop_gradient(s) for s in stats.Flatten())
    return microbatch.FlattenTensors(out), flat_stats, out, collected


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
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    microbatch.CheckMicroBatchParams(p.num_micro_batches, p.micro_batch_size)
    stage_params = self._ResolvePartitions(p)
    self._CheckUniqueLayerNames(stage_params)
    self._devices = devices_lib.ResolveDevices(p.devices, len(stage_params))
    if p.recompute_impl not in _RECOMPUTE_IMPLS:
      raise ValueError(f'recompute_impl={p.recompute_impl!r} is not one of '
                       f'{_RECOMPUTE_IMPLS}')
    if not isinstance(p.batch_dim, int) or p.batch_dim < 0:
      raise ValueError(f'batch_dim={p.batch_dim!r} must be an int >= 0')
    stages = []
    for k, layer_ps in enumerate(stage_params):
      with tf.device(self._devices[k]):
        layers = self.CreateChildren(f'partition_{k}', layer_ps)
      stages.append(_Stage(k, layers, self._devices[k]))
    object.__setattr__(self, '_stages', stages)
    object.__setattr__(self, '_stage_params', stage_params)

  # -- construction helpers ------------------------------------------------

  def _ResolvePartitions(self, p) -> List[List[Any]]:
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
      if p.input_shapes is not None:
        self._CheckChain([lp for part in parts for lp in part],
                         base_layer.InputShapes(p.input_shapes))
      return [list(part) for part in parts]
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
    if k > len(layers):
      raise ValueError(f'num_partitions={k} is larger than the number of '
                       f'layers ({len(layers)}): each partition needs at least '
                       f'one layer; use num_partitions <= {len(layers)}')
    if k == 1:
      return [layers]
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
    object.__setattr__(self, '_plan', plan)
    out, start = [], 0
    for size in plan.sizes:
      out.append(layers[start:start + size])
      start += size
    return out

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
    return len(self._stages)

  @property
  def devices(self) -> List[str]:
    return list(self._devices)

  @property
  def partition_plan(self) -> Optional[partitioning.PartitionPlan]:
    """The automatic partition plan, or None for manual partitions."""
    return getattr(self, '_plan', None)

  def PartitionLayers(self) -> List[List[base_layer.BaseLayer]]:
    return [list(s.layers) for s in self._stages]

  @classmethod
  def FPropMeta(cls, p, *input_shapes):
    layer_ps = (p.layers if p.layers is not None else
                [lp for part in p.partitions for lp in part])
    metas, out_shapes = composite.ChainFPropMeta(
        layer_ps, input_shapes, owner=f'TensorPipeLayer {p.name!r}')
    return base_layer.FPropMetaResult(sum(m.flops for m in metas), out_shapes,
                                      sum(m.num_params for m in metas))

  # -- forward -------------------------------------------------------------

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

  def _FPropOnBatchAxis(self, theta: NestedMap, *inputs):
    p = self.params
    if not inputs:
      raise ValueError('TensorPipeLayer.FProp needs at least one input')
    batch = microbatch.BatchSize(inputs, p.batch_dim)
    num_mb = microbatch.NumMicroBatches(batch, p.num_micro_batches,
                                        p.micro_batch_size)
    mb_size = batch // num_mb
    self._CheckInputShapes(inputs, num_mb)
    training = py_utils.IsTraining()
    if len(self._stages) == 1 and num_mb == 1:
      return self._SingleCall(theta, inputs, training)
    thetas = []
    for k, stage in enumerate(self._stages):
      with tf.device(stage.device):
        thetas.append(tf.nest.map_structure(
            tf.identity, list(theta[f'partition_{k}'])))
    stacked = microbatch.Split(inputs, num_mb, p.batch_dim)
    self._InferSpecs(thetas, stacked, mb_size)
    flat_stacked = microbatch.FlattenTensors(stacked)
    if training and p.recompute and p.recompute_impl == 'explicit':
      flat_out, flat_stats = self._RecomputedPipeline(
          flat_stacked, thetas, num_mb, mb_size)
    else:
      wrap = training and p.recompute
      flat_out, flat_stats = self._ForwardLoop(
          flat_stacked, thetas, num_mb, mb_size, save_inputs=False,
          wrap_recompute_grad=wrap)[:2]
    if training:
      self._ReportStats(flat_stats)
    last = self._stages[-1]
    with tf.device(last.device):
      out = microbatch.PackTensors(last.out_struct, flat_out)
      return microbatch.Merge(out, p.batch_dim)

  def _SingleCall(self, theta, inputs, training):
    """K=1, T=1: one stage call, no micro-batch split and no loop.

    Nothing is pipelined, so the loops would only add per-tick overhead.
    Recompute is skipped as well: with one partition and one micro-batch the
    recomputed forward would run right after the original one and hold the
    same activations at the same time, so it would cost a forward pass and
    save no memory. Results are those of the loops (same ops, same order).
    """
    stage = self._stages[0]
    rec = timeline.Active()
    with tf.device(stage.device):
      th = list(theta['partition_0'])
      start = rec and timeline.Stamp(tf.nest.flatten(inputs))
      with tf.control_dependencies([start] if rec else []):
        out, collected = stage.Call(th, tuple(inputs), 0)
      if rec:
        end = timeline.Stamp(tf.nest.flatten(out))
        rec.Add('forward', 0, 1, 1, tf.reshape(tf.stack([start, end]),
                                               [1, 2]))
    if training:
      for layer, stats in collected:
        with tf.device(stage.device):
          py_utils.AddBatchStats(layer, py_utils.BatchStats.Pack(
              [tf.stop_gradient(s) for s in stats.Flatten()]))
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

  def _InferSpecs(self, thetas, stacked, mb_size):
    """Traces each stage once to learn the structures crossing boundaries."""
    args = microbatch.Slice(stacked, 0)
    for stage, theta in zip(self._stages, thetas):
      stage.in_struct = args
      flat = microbatch.FlattenTensors(args)
      stage.in_specs = [_SpecOf(x) for x in flat]

      def Fn(*flat_in, stage=stage, theta=theta):
        f_out, f_stats, out, collected = stage.FlatCall(
            theta, list(flat_in), tf.constant(0), mb_size)
        Fn.out = out
        Fn.collected = collected
        return f_out + f_stats

      with tf.device(stage.device):
        concrete = tf.function(Fn, autograph=False).get_concrete_function(
            *stage.in_specs)
      del concrete
      stage.out_specs = [_SpecOf(x) for x in
                         microbatch.FlattenTensors(Fn.out)]
      stage.out_struct = microbatch.PackTensors(Fn.out, stage.out_specs)
      stage.stats_layers = [layer for layer, _ in Fn.collected]
      stage.stats_specs = [_SpecOf(s) for _, st in Fn.collected
                           for s in st.Flatten()]
      args = composite.AsArgs(stage.out_struct)

  def _ReportStats(self, flat_stats):
    i = 0
    for stage in self._stages:
      for layer in stage.stats_layers:
        stats = py_utils.BatchStats.Pack(flat_stats[i:i + 3])
        i += 3
        with tf.device(stage.device):
          py_utils.AddBatchStats(layer, stats)

  def _ForwardLoop(self, flat_stacked, thetas, num_mb, mb_size, save_inputs,
                   wrap_recompute_grad=False):
    """The forward clock-cycle loop.

    Returns:
      (flat outputs [N/T*T ...] stacked per micro-batch merged later,
       flat summed stats, saved stage inputs (list per stage of stacked
       tensors [T, ...]) or None).
    """
    stages = self._stages
    num_k = len(stages)
    ticks = num_mb + num_k - 1
    last = stages[-1]

    forward_ctx = py_utils.Current()

    def MakeCall(stage, theta):
      def Call(*flat_args):
        n_in = len(stage.in_specs)
        flat_in = list(flat_args[:n_in])
        t = tf.cast(flat_args[n_in], tf.int32)
        th = tf.nest.pack_sequence_as(theta, list(flat_args[n_in + 1:]))
        # tf.recompute_grad re-runs Call when the gradient is taken: use the
        # forward pass's context (step seed, mode) then too.
        with py_utils.RestoreContext(forward_ctx):
          f_out, f_stats = stage.FlatCall(th, flat_in, t, mb_size)[:2]
        return f_out + f_stats
      if wrap_recompute_grad:
        rc = tf.recompute_grad(Call)
        # tf.recompute_grad differentiates every argument: pass t as a float.
        return lambda flat_in, t: rc(*flat_in, tf.cast(t, tf.float32),
                                     *tf.nest.flatten(theta))
      return lambda flat_in, t: Call(*flat_in, t, *tf.nest.flatten(theta))
    calls = [MakeCall(s, th) for s, th in zip(stages, thetas)]
    rec = timeline.Active()
    if rec:
      calls = [_Stamped(call) for call in calls]

    def Body(c, buffers, stats_acc, out_tas, saved_tas, events):
      new_buffers, new_stats, new_saved, new_events = [], [], [], []
      for k, stage in enumerate(stages):
        t = c - k
        valid = tf.logical_and(t >= 0, t < num_mb)
        tc = tf.clip_by_value(t, 0, num_mb - 1)
        slot = tf.where(valid, t, num_mb)  # slot num_mb collects bubble writes
        with tf.device(stage.device):
          if k == 0:
            x = [tf.gather(s, tc) for s in flat_stacked]
          else:
            x = buffers[k - 1]
          if save_inputs:
            new_saved.append([ta.write(slot, v)
                              for ta, v in zip(saved_tas[k], x)])
          n_out = len(stage.out_specs)
          n_stamps = 2 if rec else 0
          if wrap_recompute_grad:
            # The gradient of tf.recompute_grad inside a tf.cond inside a
            # while loop fails in cond_v2, so bubble ticks compute on a
            # clamped index; their outputs go nowhere and stats are masked.
            res = list(calls[k](x, tc))
            if rec:
              res[-2:] = [tf.where(valid, v, -1.0) for v in res[-2:]]
            y, st = res[:n_out], res[n_out:len(res) - n_stamps]
            st = [s * tf.cast(valid, s.dtype) for s in st]
          else:
            res = _Cond(
                rec, valid, lambda k=k, x=x, tc=tc: calls[k](x, tc),
                lambda k=k: _Zeros(stages[k].out_specs +
                                   stages[k].stats_specs) + _NoStamps(rec))
            res = list(res) if isinstance(res, (list, tuple)) else [res]
            y, st = res[:n_out], res[n_out:len(res) - n_stamps]
          if rec:
            new_events.append(_RecordTick(events[k], c, res[-2:]))
          new_stats.append([a + b for a, b in zip(stats_acc[k], st)])
          if k < num_k - 1:
            new_buffers.append(y)
          else:
            out_tas = [ta.write(slot, v) for ta, v in zip(out_tas, y)]
      return (c + 1, new_buffers, new_stats, out_tas,
              new_saved if save_inputs else saved_tas, new_events)

    buffers, stats_acc, saved_tas, events = [], [], [], []
    for k, stage in enumerate(stages):
      with tf.device(stage.device):
        if rec:
          events.append(-tf.ones([ticks, 2], tf.float64))
        if k < num_k - 1:
          buffers.append(_Zeros(stage.out_specs))
        stats_acc.append(_Zeros(stage.stats_specs))
        if save_inputs:
          saved_tas.append([
              tf.TensorArray(s.dtype, size=num_mb + 1, element_shape=s.shape)
              for s in stage.in_specs])
    with tf.device(last.device):
      out_tas = [tf.TensorArray(s.dtype, size=num_mb + 1,
                                element_shape=s.shape)
                 for s in last.out_specs]
    _, _, stats_acc, out_tas, saved_tas, events = tf.while_loop(
        lambda c, *_: c < ticks, Body,
        (tf.constant(0), buffers, stats_acc, out_tas, saved_tas, events),
        maximum_iterations=ticks,
        parallel_iterations=_PARALLEL_ITERATIONS)
    for k, ev in enumerate(events):
      rec.Add('forward', k, num_k, num_mb, ev)
    with tf.device(last.device):
      flat_out = [ta.gather(tf.range(num_mb)) for ta in out_tas]
    flat_stats = [s for per_stage in stats_acc for s in per_stage]
    saved = None
    if save_inputs:
      saved = []
      for stage, tas in zip(stages, saved_tas):
        with tf.device(stage.device):
          saved.append([ta.gather(tf.range(num_mb)) for ta in tas])
    return flat_out, flat_stats, saved

  def _RecomputedPipeline(self, flat_stacked, thetas, num_mb, mb_size):
    """Forward loop + explicit backward loop, as one tf.custom_gradient."""
    stages = self._stages
    num_k = len(stages)
    n_in = len(flat_stacked)
    theta_structs = thetas
    flat_thetas = [tf.nest.flatten(th) for th in thetas]
    theta_sizes = [len(f) for f in flat_thetas]
    n_out = len(stages[-1].out_specs)

    @tf.custom_gradient
    def Pipeline(*args):
      f_stacked = list(args[:n_in])
      f_theta, i = [], n_in
      for size, struct in zip(theta_sizes, theta_structs):
        f_theta.append(tf.nest.pack_sequence_as(struct,
                                                list(args[i:i + size])))
        i += size
      flat_out, flat_stats, saved = self._ForwardLoop(
          f_stacked, f_theta, num_mb, mb_size, save_inputs=True)

      forward_ctx = py_utils.Current()

      def Grad(*dys):
        dys = [tf.zeros_like(o) if d is None else d
               for d, o in zip(dys[:n_out], flat_out)]
        # The recompute must draw the forward pass's dropout masks even when
        # tape.gradient runs outside the forward's StepSeed block.
        with py_utils.RestoreContext(forward_ctx):
          d_inputs, d_thetas = self._BackwardLoop(saved, f_theta, dys, num_mb,
                                                  mb_size)
        grads = list(d_inputs)
        for d in d_thetas:
          grads.extend(d)
        return grads

      return flat_out + flat_stats, Grad

    args = list(flat_stacked)
    for f in flat_thetas:
      args.extend(f)
    res = Pipeline(*args)
    return list(res[:n_out]), list(res[n_out:])

  def _BackwardLoop(self, saved, thetas, dys_stacked, num_mb, mb_size):
    """Backward clock-cycle loop: recompute + vjp per partition.

    Args:
      saved: per stage, the flat stacked inputs [T, ...] saved by the forward.
      thetas: per stage, the weights (structures of tensors).
      dys_stacked: gradients of the flat stacked outputs [T, ...].

    Returns:
      (gradients of the flat stacked inputs of stage 0 (None for non-float),
       per stage the flat gradients of its theta).
    """
    stages = self._stages
    num_k = len(stages)
    ticks = num_mb + num_k - 1
    float_in = [[i for i, s in enumerate(st.in_specs) if _IsFloat(s)]
                for st in stages]
    float_out = [[i for i, s in enumerate(st.out_specs) if _IsFloat(s)]
                 for st in stages]

    rec = timeline.Active()

    def Vjp(k, x, dy, tc):
      """Recompute + backprop of one cell; with a recorder also 3 stamps."""
      stage = stages[k]
      theta_flat = tf.nest.flatten(thetas[k])
      start = rec and timeline.Stamp(x + dy)
      with tf.GradientTape(watch_accessed_variables=False) as tape, \
          tf.control_dependencies([start] if rec else []):
        xs = [x[i] for i in float_in[k]]
        tape.watch(xs)
        tape.watch(theta_flat)
        th = tf.nest.pack_sequence_as(thetas[k], theta_flat)
        x_all = list(x)
        y = stage.FlatCall(th, x_all, tc, mb_size)[0]
      ys = [y[i] for i in float_out[k]]
      mid = rec and timeline.Stamp(ys)
      with tf.control_dependencies([mid] if rec else []):
        grads = tape.gradient(
            ys, xs + theta_flat, output_gradients=dy,
            unconnected_gradients=tf.UnconnectedGradients.ZERO)
      stamps = [start, mid, timeline.Stamp(grads)] if rec else []
      return grads[:len(xs)], grads[len(xs):] + stamps

    def Body(c, gbufs, dtheta_acc, din_tas, events):
      new_gbufs = [[] for _ in range(num_k)]
      new_acc, new_events = [], []
      for k in range(num_k):
        stage = stages[k]
        t = num_mb - 1 - (c - (num_k - 1 - k))
        valid = tf.logical_and(t >= 0, t < num_mb)
        tc = tf.clip_by_value(t, 0, num_mb - 1)
        with tf.device(stage.device):
          x = [tf.gather(s, tc) for s in saved[k]]
          if k == num_k - 1:
            dy = [tf.gather(dys_stacked[i], tc) for i in float_out[k]]
          else:
            dy = gbufs[k + 1]
          theta_specs = [_SpecOf(w) for w in tf.nest.flatten(thetas[k])]
          dx_specs = [stage.in_specs[i] for i in float_in[k]]
          # The weight-gradient sum is updated inside the cond: a bubble tick
          # passes it through instead of adding a zero tensor the size of
          # the partition's weights (that add and the zeros were most of a
          # bubble tick's cost for large weights).
          def Valid(k=k, x=x, dy=dy, tc=tc, acc=dtheta_acc[k]):
            dx, rest = Vjp(k, x, dy, tc)
            n = len(acc)
            return (dx + [a + g for a, g in zip(acc, rest[:n])] + rest[n:])

          def Bubble(dx_specs=dx_specs, acc=dtheta_acc[k]):
            return _Zeros(dx_specs) + list(acc) + _NoStamps(rec, 3)

          res = _Cond(rec, valid, Valid, Bubble)
          res = list(res) if isinstance(res, (list, tuple)) else [res]
          dx = res[:len(dx_specs)]
          if rec:
            new_events.append(_RecordTick(events[k], c, res[-3:]))
          new_acc.append(res[len(dx_specs):len(dx_specs) + len(theta_specs)])
          if k == 0:
            slot = tf.where(valid, t, num_mb)
            din_tas = [ta.write(slot, v) for ta, v in zip(din_tas, dx)]
          else:
            new_gbufs[k] = dx
      return c + 1, new_gbufs, new_acc, din_tas, new_events

    gbufs, acc, events = [None] * num_k, [], []
    for k, stage in enumerate(stages):
      with tf.device(stage.device):
        if rec:
          events.append(-tf.ones([ticks, 3], tf.float64))
        if k > 0:
          gbufs[k] = _Zeros([stage.in_specs[i] for i in float_in[k]])
        acc.append([tf.zeros_like(w) for w in tf.nest.flatten(thetas[k])])
    with tf.device(stages[0].device):
      din_tas = [tf.TensorArray(stages[0].in_specs[i].dtype, size=num_mb + 1,
                                element_shape=stages[0].in_specs[i].shape)
                 for i in float_in[0]]
    # While-loop state cannot hold None: stage 0 has no incoming gradient.
    gbufs[0] = []
    _, _, acc, din_tas, events = tf.while_loop(
        lambda c, *_: c < ticks, Body,
        (tf.constant(0), gbufs, acc, din_tas, events),
        maximum_iterations=ticks,
        parallel_iterations=_PARALLEL_ITERATIONS)
    for k, ev in enumerate(events):
      rec.Add('backward', k, num_k, num_mb, ev)
    d_inputs = [None] * len(stages[0].in_specs)
    with tf.device(stages[0].device):
      for j, i in enumerate(float_in[0]):
        d_inputs[i] = din_tas[j].gather(tf.range(num_mb))
    return d_inputs, acc
