"""The cell algebra: what a pipeline cell computes from a stage call.

Both executors (schedule_engine's loops through schedule_cells, and
schedule_unrolled's unrolled table) and the cell profiler (cell_profile)
build their cells from these, each written once:

  TapedCall     a stage call under a GradientTape (F of the unrolled table,
                the recompute of the engine's B and I cells)
  Vjp           the tape's gradient to inputs, weight-op outputs, weights
                (unconnected: zeros)
  WeightGrads   a W cell: per weight op, dw = vjp of fn(x, .) with dz
  TraceWeightOps  a stage's weight ops, traced once on specs
  CellCall      a forward cell's call, or its autodiff variants
                (`GradientOnDevice`, under tf.recompute_grad or not)
  Zeros, Add, AccumulateAt, `Sums`   the sums the cells keep

A stage and what crosses its boundaries (`Stage`, `StageSpecs`,
`PipelineCall`) live in pipeline_stage.
"""

import contextlib
from typing import (Any, Callable, Iterator, List, NamedTuple, Optional,
                    Sequence)

import tensorflow as tf

from tensorpipe import grad_sum
from tensorpipe import py_utils
from tensorpipe.pipeline_stage import SpecOf
from tensorpipe.pipeline_stage import Stage
from tensorpipe.pipeline_stage import StageSpecs

# A whole backward (a B cell's recompute; without recompute, an F cell's
# tape) hands each weight op's input gradient on only once the op's
# weight gradient is made (py_utils.CollectWeightOps(order_grads=True)),
# so each op's output gradient dz is freed at the op, as the memory model
# (schedule_plan) counts it. Left to the executor, the dx chain ran ahead
# and the dw products waited for the end of the pass, every layer's dz
# held beside the activations: allocator peak, K=1, one intra- and one
# inter-op thread, conv16 1F1B T=4 with recompute 29.0 -> 20.2 MiB (19.3
# in the model), interleaved 1F1B T=8 9.0 -> 6.5 (6.7); dense32mem 1F1B
# T=8 without recompute 28.0 -> 26.0 (26.3). It costs parallelism inside
# a cell: conv16, 1F1B, K=1, T=8 with recompute, 1.10-1.12x the step
# (two inter-op threads, the two forms built in one process and timed in
# turn), at K=2 the same step within noise, dense16 within 5%
# (benchmarks/results/order_grads/). Off (`OrderWeightGrads(False)`, for
# what is traced inside) the executor orders them. The bits are the
# same either way (tests/weight_op_testlib.py).
ORDER_WEIGHT_GRADS = True


@contextlib.contextmanager
def OrderWeightGrads(on: bool) -> Iterator[None]:
  """`ORDER_WEIGHT_GRADS` = on for what is traced inside, then back."""
  global ORDER_WEIGHT_GRADS
  old, ORDER_WEIGHT_GRADS = ORDER_WEIGHT_GRADS, on
  try:
    yield
  finally:
    ORDER_WEIGHT_GRADS = old


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


def TraceWeightOps(stage: Stage, spec: StageSpecs, theta: List[Any],
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


def TapedCall(stage: Stage, spec: StageSpecs, theta: List[Any],
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
    # A whole backward (not split) gets each weight op's dw before its dx
    # goes on (ORDER_WEIGHT_GRADS).
    with py_utils.CollectWeightOps(
        tape if split else None,
        order_grads=ORDER_WEIGHT_GRADS and not split) as calls:
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


def CellCall(stage: Stage, spec: StageSpecs, theta: List[Any],
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
