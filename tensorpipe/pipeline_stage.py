"""One partition of a TensorPipeLayer as its loops call it: a pipeline stage.

A stage holds a partition's layers and device and runs them on one
micro-batch (`Stage.Call`). The executors (schedule_engine's loops,
schedule_unrolled's unrolled table) carry flat lists of tensors, so each
call first traces every stage once to learn what crosses its boundaries
(`InferSpecs`: one frozen `StageSpecs` per stage), and the cells then call
it on flat tensors (`Stage.FlatCall`). One call of a pipeline is one
`PipelineCall` (thetas on their devices, stacked inputs, specs, T), made
once by the layer and passed down to the training wrappers and executors.

Below that, the cell algebra both executors share, each written once:

  TapedCall     a stage call under a GradientTape (F of the unrolled table,
                the recompute of the engine's B and I cells)
  Vjp           the tape's gradient to inputs, weight-op outputs, weights
                (unconnected: zeros)
  WeightGrads   a W cell: per weight op, dw = vjp of fn(x, .) with dz
  TraceWeightOps  a stage's weight ops, traced once on specs
  CellCall      a forward cell's call, or its autodiff variants
                (`GradientOnDevice`, under tf.recompute_grad or not)
  Zeros, Add, AccumulateAt, `Sums`   the sums the cells keep

Usage (inside an executor):

  specs = pipeline_stage.InferSpecs(stages, thetas, stacked, mb_size)
  outputs, stats = stages[k].FlatCall(specs[k].in_struct, theta_k, flat_in,
                                      t, mb_size)
"""

import dataclasses
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import grad_sum
from tensorpipe import microbatch
from tensorpipe import py_utils
from tensorpipe import tied_weights
from tensorpipe.layers import composite

# What a stage's batch-norm layers report: (layer, py_utils.BatchStats) pairs.
Collected = List[Tuple[base_layer.BaseLayer, py_utils.BatchStats]]


def SpecOf(x: Any) -> tf.TensorSpec:
  """The TensorSpec (shape, dtype) of a tensor or TensorSpec."""
  return tf.TensorSpec(x.shape, x.dtype)


def IsFloat(spec: tf.TensorSpec) -> bool:
  """Whether a tensor of this spec gets a gradient."""
  return spec.dtype.is_floating or spec.dtype.is_complex


def FlatStats(collected: Collected) -> List[List[tf.Tensor]]:
  """Per reporting layer, its BatchStats.Flatten(); no gradient flows back.

  The moving averages are updated from these after the step, once, from the
  sum over all micro-batches.
  """
  return [[tf.stop_gradient(s) for s in stats.Flatten()]
          for _, stats in collected]


@dataclasses.dataclass(frozen=True)
class StageSpecs:
  """What crosses one stage's boundaries in one FProp call.

  Attributes:
    in_struct: the stage's input args (a tuple), TensorSpecs as tensor leaves
      (static leaves such as None stay as they are).
    in_specs: its tensor leaves in `microbatch.FlattenTensors` order: the
      flat inputs the loops carry.
    out_struct: the outputs, as the last layer returns them, with specs.
    out_specs: their tensor leaves, flat.
    stats_layers: the batch-norm layers that report statistics, in order.
    stats_specs: per such layer, the specs of its BatchStats.Flatten().
  """
  in_struct: Any
  in_specs: Tuple[tf.TensorSpec, ...]
  out_struct: Any
  out_specs: Tuple[tf.TensorSpec, ...]
  stats_layers: Tuple[base_layer.BaseLayer, ...]
  stats_specs: Tuple[Tuple[tf.TensorSpec, ...], ...]

  @property
  def float_in(self) -> List[int]:
    """Indices in `in_specs` of the inputs that get a gradient."""
    return [i for i, s in enumerate(self.in_specs) if IsFloat(s)]

  @property
  def float_out(self) -> List[int]:
    """Indices in `out_specs` of the outputs that carry a gradient."""
    return [i for i, s in enumerate(self.out_specs) if IsFloat(s)]

  def DxSpecs(self) -> List[tf.TensorSpec]:
    """Specs of the input gradients, one per `float_in` index."""
    return [self.in_specs[i] for i in self.float_in]

  def StatsSpecs(self) -> List[List[tf.TensorSpec]]:
    """`stats_specs` as lists, the structure `FlatStats` returns."""
    return [list(s) for s in self.stats_specs]


class Stage:
  """One partition: its layers and device."""

  def __init__(self, k: int, layers: List[base_layer.BaseLayer], device: str):
    self.k = k
    self.layers = layers
    self.device = device

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

  def FlatCall(self, in_struct: Any, theta: List[Any],
               flat_in: List[tf.Tensor], t: tf.Tensor,
               micro_batch_size: int
              ) -> Tuple[List[tf.Tensor], List[List[tf.Tensor]]]:
    """`Call` on micro-batch t given as flat tensors.

    Args:
      in_struct: `StageSpecs.in_struct`.
      theta: the stage's weights, one entry per layer.
      flat_in: the inputs, one tensor per `StageSpecs.in_specs`.
      t: the micro-batch index, a scalar int32 tensor.
      micro_batch_size: examples per micro-batch.

    Returns:
      (flat outputs, one per `out_specs`; `FlatStats` of the call).
    """
    args = microbatch.PackTensors(in_struct, flat_in)
    out, collected = self.Call(theta, args, t * micro_batch_size)
    return microbatch.FlattenTensors(out), FlatStats(collected)


def InferSpecs(stages: Sequence[Stage], thetas: Sequence[List[Any]],
               stacked: Any, micro_batch_size: int) -> List[StageSpecs]:
  """Traces each stage once to learn the structures crossing its boundaries.

  Args:
    stages: the K stages, in pipeline order.
    thetas: per stage, its weights.
    stacked: the inputs split into micro-batches, [T, N/T, ...] each.
    micro_batch_size: N/T.

  Returns:
    One `StageSpecs` per stage; stage k + 1's inputs are stage k's outputs.
  """
  specs = []
  args = microbatch.Slice(stacked, 0)
  for stage, theta in zip(stages, thetas):
    in_specs = tuple(SpecOf(x) for x in microbatch.FlattenTensors(args))
    in_struct = microbatch.PackTensors(args, list(in_specs))
    traced = []  # (outputs, collected stats) of the one trace

    def Fn(*flat_in, stage=stage, theta=theta, in_struct=in_struct):
      traced.append(stage.Call(  # pylint: disable=cell-var-from-loop
          theta, microbatch.PackTensors(in_struct, list(flat_in)),
          tf.constant(0) * micro_batch_size))

    with tf.device(stage.device):
      tf.function(Fn, autograph=False).get_concrete_function(*in_specs)
    out, collected = traced[-1]
    out_specs = tuple(SpecOf(x) for x in microbatch.FlattenTensors(out))
    specs.append(StageSpecs(
        in_struct=in_struct, in_specs=in_specs,
        out_struct=microbatch.PackTensors(out, list(out_specs)),
        out_specs=out_specs,
        stats_layers=tuple(layer for layer, _ in collected),
        stats_specs=tuple(tuple(SpecOf(s) for s in st.Flatten())
                          for _, st in collected)))
    args = composite.AsArgs(specs[-1].out_struct)
  return specs


@dataclasses.dataclass(frozen=True)
class PipelineCall:
  """One call of a pipeline: made once by the layer (`Make`) and passed
  down to the training wrappers (pipeline_train) and the executors.

  Attributes:
    stages: the S stages.
    thetas: per stage, its weights (a list per layer), on its device.
    devices: the K devices.
    specs: per stage, its `StageSpecs`.
    flat_stacked: the flat inputs split into micro-batches, [T, N/T, ...].
    num_mb: T.
    mb_size: N / T.
    batch_dim: the batch axis of the inputs (and targets).
    recompute: whether a backward cell recomputes its forward (else TF's
      autodiff or the unrolled table keeps the activations).
    grad_sum: how weight gradients sum over micro-batches (grad_sum.MODES).
    unroll_ticks: ticks per iteration of GPipe's steady loops.
  """
  stages: Tuple[Stage, ...]
  thetas: List[List[Any]]
  devices: Tuple[str, ...]
  specs: Tuple[StageSpecs, ...]
  flat_stacked: List[tf.Tensor]
  num_mb: int
  mb_size: int
  batch_dim: int = 0
  recompute: bool = True
  grad_sum: str = 'sequential'
  unroll_ticks: int = 1

  @classmethod
  def Make(cls, stages: Sequence[Stage], devices: Sequence[str],
           stage_thetas: Sequence[List[Any]], inputs: Tuple[Any, ...],
           num_mb: int, batch_dim: int = 0,
           ties: Sequence[tied_weights.Tie] = (),
           **settings) -> 'PipelineCall':
    """Copies each stage's theta to its device (a tied weight to the
    device of every stage that reads it: `tied_weights.Place`), splits
    the inputs into num_mb micro-batches on batch_dim and traces the
    stages' specs; `settings`: the fields after batch_dim."""
    thetas = []
    for stage, theta in zip(stages, stage_thetas):
      with tf.device(stage.device):
        thetas.append(tf.nest.map_structure(tf.identity, list(theta)))
    if ties:
      thetas = tied_weights.Place(ties, stage_thetas, thetas,
                                  [stage.device for stage in stages])
    mb_size = microbatch.BatchSize(inputs, batch_dim) // num_mb
    stacked = microbatch.Split(inputs, num_mb, batch_dim)
    specs = InferSpecs(stages, thetas, stacked, mb_size)
    return cls(tuple(stages), thetas, tuple(devices), tuple(specs),
               microbatch.FlattenTensors(stacked), num_mb, mb_size,
               batch_dim, **settings)

  def With(self, **changes) -> 'PipelineCall':
    """This call with some fields replaced (e.g. thetas inside a
    tf.custom_gradient)."""
    return dataclasses.replace(self, **changes)


# -- the cell algebra both executors share ----------------------------------


class Sums(NamedTuple):
  """What an executor's run returns; fields a run does not make are [] or
  None."""
  loss: List[tf.Tensor]                 # [loss sum, metric value, weight, ..]
  dthetas: List[List[tf.Tensor]]        # per stage, flat weight gradients
  stats: List[List[List[tf.Tensor]]]    # per stage and batch-norm layer
  outputs: List[tf.Tensor] = []         # last stage's flat outputs [T, ...]
  saved: Optional[List[List[tf.Tensor]]] = None  # per stage, inputs [T, ..]
  d_inputs: List[Optional[tf.Tensor]] = []  # per flat input of stage 0


def Zeros(specs: Sequence[tf.TensorSpec]) -> List[tf.Tensor]:
  """One zero tensor per spec: a sum before its first term."""
  return [tf.zeros(s.shape, s.dtype) for s in specs]


def Add(sums: Any, terms: Any) -> Any:
  """`sums` + `terms`, leaf by leaf (same structure)."""
  return tf.nest.map_structure(lambda a, b: a + b, sums, terms)


def AccumulateAt(dtheta: List[tf.Tensor], indices: Sequence[int],
                 grads: Sequence[tf.Tensor]) -> List[tf.Tensor]:
  """dtheta with grads[j] added at indices[j] (`grad_sum.Accumulate`)."""
  dtheta = list(dtheta)
  for i, g in zip(indices, grads):
    dtheta[i] = grad_sum.Accumulate(dtheta[i], g)
  return dtheta


def Vjp(tape: tf.GradientTape, ys: List[tf.Tensor], sources: Any,
        dys: Optional[List[tf.Tensor]]) -> Any:
  """The tape's gradient of ys with output gradients dys (None: ones) to
  `sources` (any structure); a source ys do not reach gets zeros."""
  return tape.gradient(ys, sources, output_gradients=dys,
                       unconnected_gradients=tf.UnconnectedGradients.ZERO)


class WeightOpSpec(NamedTuple):
  """One `py_utils.WeightOp` call of a stage, traced on specs."""
  index: int              # its weight's index in the stage's flat theta
  x: tf.TensorSpec
  z: tf.TensorSpec
  fn: Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


def TraceWeightOps(stage: 'Stage', spec: StageSpecs, theta: List[Any],
                   mb_size: int) -> List[WeightOpSpec]:
  """A stage's `py_utils.WeightOp` calls, traced once on specs, in call
  order.

  Raises:
    ValueError: a weight op's w is not one of the stage's weights as they
      come in theta (a layer cast or sliced it before the op).
  """
  flat_theta = tf.nest.flatten(theta)
  n = len(spec.in_specs)
  found = []

  def Fn(*args):
    th = list(args[n:])
    where = {id(v): i for i, v in enumerate(th)}
    with py_utils.CollectWeightOps() as calls:
      stage.FlatCall(spec.in_struct, tf.nest.pack_sequence_as(theta, th),
                     list(args[:n]), tf.constant(0), mb_size)
    for call in calls:
      if id(call.w) not in where:
        raise ValueError(
            f'a py_utils.WeightOp of stage {stage.k} got a weight that is '
            'not one of its weights as they come in theta (cast or sliced '
            'first?); pass theta.<name> and cast inside fn')
      found.append(WeightOpSpec(where[id(call.w)], SpecOf(call.x),
                                SpecOf(call.z), call.fn))
  specs = list(spec.in_specs) + [SpecOf(v) for v in flat_theta]
  with tf.device(stage.device):
    tf.function(Fn, autograph=False).get_concrete_function(*specs)
  return found


def Watched(num_weights: int, weight_ops: Sequence[WeightOpSpec],
            split: bool) -> List[int]:
  """Indices of the weights a backward cell differentiates: all, or for an
  I cell (`split`) all but its weight ops' (autodiff then builds no dw
  kernel for those: a matmul's gradient skips unwatched inputs)."""
  op_idx = [op.index for op in weight_ops] if split else []
  return [i for i in range(num_weights) if i not in op_idx]


class Taped(NamedTuple):
  """A stage call under a tape, ready for `Vjp`."""
  tape: tf.GradientTape
  xs: List[tf.Tensor]                 # the watched float inputs
  ys: List[tf.Tensor]                 # what the gradient starts from
  dys: Optional[List[tf.Tensor]]      # their output gradients (None: ones)
  calls: List[py_utils.WeightOpCall]  # weight ops seen (split cells only)
  outputs: List[tf.Tensor]            # the stage's flat outputs
  stats: List[List[tf.Tensor]]        # its `FlatStats`


def TapedCall(stage: 'Stage', spec: StageSpecs, theta: List[Any],
              x: List[tf.Tensor], t: tf.Tensor, mb_size: int,
              watch_inputs: bool, watched: Sequence[int], split: bool,
              head: Callable, dys: Optional[List[tf.Tensor]],
              deps: Sequence[tf.Tensor] = ()) -> Taped:
  """Stage call on micro-batch t under a GradientTape watching its float
  inputs (if `watch_inputs`) and the weights at `watched`.

  `head(outputs, dys) -> (ys, dys)` runs inside the tape: the float
  outputs and the incoming gradients, or a loss and None. With `split`
  the tape also records each weight op's output z (`CollectWeightOps`).
  `deps`: control dependencies of the whole call.
  """
  theta_flat = tf.nest.flatten(theta)
  with tf.GradientTape(watch_accessed_variables=False) as tape, \
      tf.control_dependencies(deps):
    xs = [x[i] for i in spec.float_in] if watch_inputs else []
    tape.watch(xs)
    tape.watch([theta_flat[i] for i in watched])
    th = tf.nest.pack_sequence_as(theta, theta_flat)
    with py_utils.CollectWeightOps(tape if split else None) as calls:
      y, stats = stage.FlatCall(spec.in_struct, th, list(x), t, mb_size)
    ys, dys = head(y, dys)
  return Taped(tape, xs, ys, dys, calls, y, stats)


def FloatOutputs(spec: StageSpecs) -> Callable:
  """The `TapedCall` head of an inner stage: its float outputs, dys as
  they come."""
  return lambda y, dys: ([y[i] for i in spec.float_out], dys)


def WeightGrads(weight_ops: Sequence[WeightOpSpec], theta: List[Any],
                xs: Sequence[tf.Tensor], dzs: Sequence[tf.Tensor],
                dtheta: List[tf.Tensor]) -> List[tf.Tensor]:
  """A W cell: dtheta plus, per weight op, dw = vjp of fn(x, .) at its
  weight with dz, from the (x, dz) its I cell kept."""
  theta_flat = tf.nest.flatten(theta)
  dtheta = list(dtheta)
  for op, x, dz in zip(weight_ops, xs, dzs):
    w = theta_flat[op.index]
    with tf.GradientTape(watch_accessed_variables=False) as tape:
      tape.watch(w)
      z = op.fn(x, w)
    dtheta[op.index] = grad_sum.Accumulate(
        dtheta[op.index], tape.gradient(z, w, output_gradients=dz))
  return dtheta


def GradientOnDevice(fn, device: str):
  """`fn` (flat tensors -> flat tensors) whose gradient is built on `device`.

  TF's autodiff of a tf.while_loop builds the gradient loop's body outside
  the forward body's tf.device blocks, so the placer put every gradient op
  of an unrecomputed (or tf.recompute_grad) pipeline on the default device,
  CPU:0 or GPU:0: the backward pass of all K partitions on one device. A
  tf.custom_gradient whose gradient function runs the tape's backprop of the
  call inside tf.device(device) places those ops on the partition's device.
  The tape only records at trace time (no runtime cost); the activations
  its gradient needs are those autodiff would keep anyway.
  """
  @tf.custom_gradient
  def Wrapped(*args):
    floats = [a for a in args if a.dtype.is_floating]
    with tf.GradientTape(watch_accessed_variables=False) as tape:
      tape.watch(floats)
      # tf.identity: custom_gradient needs every output made in this graph
      # (a stage may pass through a tensor captured from outside).
      outs = [tf.identity(o) for o in fn(*args)]

    def Grad(*dys, variables=None):
      ys, out_grads = [], []
      for y, dy in zip(outs, dys):
        if y.dtype.is_floating:
          ys.append(y)
          out_grads.append(tf.zeros_like(y) if dy is None else dy)
      with tf.device(device):
        grads = iter(Vjp(tape, ys, floats, out_grads))
      d_args = [next(grads) if a.dtype.is_floating else None for a in args]
      if variables:
        return d_args, [None] * len(variables)
      return d_args
    return outs, Grad
  return Wrapped


AUTODIFF = ('', 'place', 'recompute_grad')


def CellCall(stage: 'Stage', spec: StageSpecs, theta: List[Any],
             mb_size: int, autodiff: str = '') -> Callable:
  """Stage s's forward call as (flat inputs, t) -> (outputs, stats).

  autodiff: '' (a plain `Stage.FlatCall`, for a loop nothing
  differentiates), or how TF's autodiff will differentiate the loop:
  'place' builds the call's gradient on its device (`GradientOnDevice`),
  'recompute_grad' also wraps the call in tf.recompute_grad.
  """
  if autodiff not in AUTODIFF:
    raise ValueError(f'autodiff={autodiff!r} is not one of {AUTODIFF}')
  if not autodiff:
    return lambda flat_in, t: stage.FlatCall(spec.in_struct, theta, flat_in,
                                             t, mb_size)
  arg_struct = (list(spec.in_specs), 0, theta)  # inputs, t, weights
  out_struct = (list(spec.out_specs), spec.StatsSpecs())
  ctx = py_utils.Current()

  def Call(*flat_args):
    flat_in, t, th = tf.nest.pack_sequence_as(arg_struct, list(flat_args))
    t = tf.cast(t, tf.int32)
    # tf.recompute_grad re-runs Call when the gradient is taken: use the
    # forward pass's context (step seed, mode) then too.
    with py_utils.RestoreContext(ctx):
      return tf.nest.flatten(stage.FlatCall(spec.in_struct, th, flat_in, t,
                                            mb_size))
  if autodiff == 'recompute_grad':
    fn = GradientOnDevice(tf.recompute_grad(Call), stage.device)
  else:
    fn = GradientOnDevice(Call, stage.device)

  def Cell(flat_in, t):
    if autodiff == 'recompute_grad':
      # tf.recompute_grad differentiates every argument: t as a float.
      t = tf.cast(t, tf.float32)
    flat = fn(*tf.nest.flatten((flat_in, t, theta)))
    return tf.nest.pack_sequence_as(out_struct, list(flat))
  return Cell
