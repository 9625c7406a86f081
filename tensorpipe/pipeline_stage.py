"""One partition of a TensorPipeLayer as its loops call it: a pipeline stage.

A stage holds a partition's layers and device and runs them on one
micro-batch (`Stage.Call`). The executors (schedule_engine's loops,
schedule_unrolled's unrolled table) carry flat lists of tensors, so each
call first traces every stage once to learn what crosses its boundaries
(`InferSpecs`: one frozen `StageSpecs` per stage), and the cells then call
it on flat tensors (`Stage.FlatCall`). One call of a pipeline is one
`PipelineCall` (thetas on their devices, stacked inputs, specs, T), made
once by the layer and passed down to the training wrappers and executors.

What a cell computes from a stage call (the tape, the vjp, the
weight-op split, the sums) is the cell algebra, cell_algebra.py.

Usage (inside an executor):

  specs = pipeline_stage.InferSpecs(stages, thetas, stacked, mb_size)
  outputs, stats = stages[k].FlatCall(specs[k].in_struct, theta_k, flat_in,
                                      t, mb_size)
"""

import dataclasses
from typing import Any, List, Sequence, Tuple

import tensorflow as tf

from tensorpipe import base_layer
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
