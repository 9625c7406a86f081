"""What a layer's backward pass keeps from its forward pass, from Params.

`Trace(layer_params, input_shapes)` builds the layer under
`base_layer.AbstractVariables()` (no weight is allocated) and traces, on
specs (no tensor is allocated either), its training FProp and the gradient
of its float outputs to its float inputs and weights (`tf.gradients` in
the trace's graph). The forward tensors that a gradient op reads are what
TF keeps alive from the forward to the backward pass:

  own_bytes         those that are neither the layer's inputs nor its
                    outputs (a Transformer block: the projections, the
                    attention probabilities, the feed-forward hidden ...)
  input_kept        whether the backward reads the layer's inputs (a
                    matmul's x)
  output_kept       whether it reads the layer's outputs (a ReLU's y)
  weight_in_bytes,  the inputs x (each buffer once) and outputs z of its
  weight_out_bytes  `py_utils.WeightOp` calls (the zero-bubble stash keeps
                    x and dz); None where FProp on abstract weights does
                    not make them (`BaseLayer.ABSTRACT_WEIGHT_OPS`: a Keras
                    layer)

A gradient op that reads only a tensor's shape (Shape, ZerosLike, ...)
does not keep it; an Identity or Reshape is followed to what it
aliases. Sizes are for the traced batch. A layer that cannot be traced
so gives None, and the memory model (`schedule_plan.TableMemory`) then
counts one output per layer.

Usage:
  saved = saved_activations.Trace(fc_params, [[64, 256]])
  saved.own_bytes, saved.input_kept, saved.output_kept
"""

from typing import Any, Dict, NamedTuple, Optional, Tuple

import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import py_utils

# Ops whose output aliases their first input (no new buffer).
_ALIASES = frozenset({'Identity', 'Reshape', 'Squeeze', 'ExpandDims',
                      'StopGradient', 'Snapshot', 'EnsureShape'})
# Gradient ops that read a tensor's shape, not its values.
_SHAPE_ONLY = frozenset({'Shape', 'ShapeN', 'Size', 'Rank', 'ZerosLike',
                         'OnesLike', 'BroadcastGradientArgs'})

_cache: Dict[Tuple[str, str], Optional['Saved']] = {}


class Saved(NamedTuple):
  """What one layer's backward keeps (module docstring); bytes for the
  traced batch."""
  own_bytes: int
  input_kept: bool
  output_kept: bool
  weight_in_bytes: Optional[int]   # None: its weight ops are not traced
  weight_out_bytes: Optional[int]  # (a Keras layer's: real weights only)


def Scaled(saved: Optional[Saved], factor: float) -> Optional[Saved]:
  """`saved` with its byte counts times `factor` (float32 traced, counted
  in another dtype)."""
  if saved is None or factor == 1:
    return saved
  return saved._replace(**{
      f: int(getattr(saved, f) * factor) for f in (
          'own_bytes', 'weight_in_bytes', 'weight_out_bytes')
      if getattr(saved, f) is not None})


def _Bytes(t: tf.Tensor) -> int:
  n = t.shape.num_elements()
  return 0 if n is None else n * t.dtype.size


def _UniqueBytes(tensors) -> int:
  """Bytes of the distinct buffers behind `tensors` (a Transformer's q,
  k and v projections read one input: the stash keeps it once); each
  buffer at the largest size its readers see (an alias may know a shape
  its source does not)."""
  sizes: Dict[int, int] = {}
  for t in tensors:
    key = id(_Source(t))
    sizes[key] = max(sizes.get(key, 0), _Bytes(t))
  return sum(sizes.values())


def _Source(t: tf.Tensor) -> tf.Tensor:
  """The tensor a chain of aliasing ops (Identity, Reshape, ...) reads."""
  while t.op.type in _ALIASES and t.op.inputs:
    t = t.op.inputs[0]
  return t


def Trace(layer_params: Any, input_shapes: Any) -> Optional[Saved]:
  """`Saved` of one layer on inputs of `input_shapes` (as FPropMeta takes
  them, float32 tensors), or None where it cannot be traced on specs."""
  try:
    # Keyed without the name: a stack of like layers is traced once.
    key = (layer_params.Copy().Set(name='_').ToText(),
           repr(base_layer.InputShapes(input_shapes)))
  except Exception:  # pylint: disable=broad-except
    return None   # (see _Trace)
  if key not in _cache:
    _cache[key] = _Trace(layer_params, input_shapes)
  return _cache[key]


def _Trace(layer_params, input_shapes) -> Optional[Saved]:
  found = []

  def Fn(theta, xs):
    graph = tf.compat.v1.get_default_graph()
    start = len(graph.get_operations())
    # As a pipeline stage runs it: batch norm reports its statistics.
    with py_utils.TrainingMode(), py_utils.CollectBatchStats(), \
        py_utils.CollectWeightOps() as calls:
      ys = layer.FProp(theta, *xs)
    mid = len(graph.get_operations())
    flat_ys = [y for y in tf.nest.flatten(ys)
               if isinstance(y, tf.Tensor) and y.dtype.is_floating]
    flat_xs = [x for x in tf.nest.flatten(xs) if x.dtype.is_floating]
    sources = flat_xs + tf.nest.flatten(theta)
    tf.gradients(flat_ys, sources,
                 grad_ys=[tf.zeros(y.shape, y.dtype) for y in flat_ys])
    ops = graph.get_operations()
    forward = set(ops[start:mid])
    kept = {}
    for op in ops[mid:]:
      if op.type in _SHAPE_ONLY:
        continue
      for t in op.inputs:
        t = _Source(t)
        if t.op in forward or any(t is x for x in flat_xs):
          kept[id(t)] = t
    outputs = {id(_Source(y)) for y in flat_ys}
    inputs = {id(x) for x in flat_xs}
    own = sum(_Bytes(t) for i, t in kept.items()
              if i not in outputs and i not in inputs
              and t.dtype.is_floating and t.op.type != 'Const')
    ops_seen = all(type(l).ABSTRACT_WEIGHT_OPS
                   for l in base_layer.Layers(layer))
    found.append(Saved(
        own, any(i in kept for i in inputs), any(i in kept for i in outputs),
        _UniqueBytes(c.x for c in calls) if ops_seen else None,
        sum(_Bytes(c.z) for c in calls) if ops_seen else None))

  try:
    specs = _Specs(base_layer.InputShapes(input_shapes))
    with base_layer.AbstractVariables():
      layer = layer_params.Instantiate()
    tf.function(Fn, autograph=False).get_concrete_function(
        layer.theta, specs)
  except Exception:  # pylint: disable=broad-except
    # A refinement only: a layer that does not trace on float specs (ids,
    # a Python branch on a value) is counted by its outputs instead.
    return None
  return found[-1] if found else None


def _Specs(shapes: Any) -> Any:
  """Float32 specs of FPropMeta input shapes (per input a TensorShape, or
  a NestedMap of them)."""
  return [tf.nest.map_structure(
      lambda s: tf.TensorSpec(s, tf.float32), s) for s in shapes]
