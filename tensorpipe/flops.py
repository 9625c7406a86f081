"""Forward FLOPs of a traced TensorFlow graph, counted from op shapes.

Used where a layer's cost cannot be written from its Params (a wrapped Keras
layer, keras_layer.py): trace one call to a concrete function with static
shapes and count its ops with `CountFlops`. The rules follow the hand-written
FPropMeta of our own layers (a multiply-add counts 2):

  MatMul / BatchMatMul     2 m k n
  Conv2D / Conv3D          2 x output size x filter taps x input channels
                           (per group)
  DepthwiseConv2dNative    2 x output size x filter taps
  transposed convolution   2 x input size x filter taps x output channels
  Einsum                   2 x the product of all index sizes
  pooling                  output size x window
  reductions               input size
  other float ops          1 per output element (a few for Softmax, Tanh,
                           Sigmoid, Exp, Log, Erf, Gelu)
  data movement            0 (reshape, transpose, concat, slices, casts,
                           variable reads)

Ops inside nested functions (tf.cond / tf.while_loop bodies) are not
counted: layers that branch need an explicit cost.

Usage:
  graph = tf.function(fn).get_concrete_function(*specs).graph
  flops = flops_lib.CountFlops(graph)
"""

import numpy as np
import tensorflow as tf

# Ops that move or relabel data without arithmetic: 0 FLOPs.
_FREE_OPS = frozenset([
    'Identity', 'IdentityN', 'Reshape', 'Shape', 'ShapeN', 'Size', 'Rank',
    'Const', 'Placeholder', 'ReadVariableOp', 'Cast', 'Transpose',
    'ConcatV2', 'Concat', 'Pack', 'Unpack', 'StridedSlice', 'Slice',
    'Squeeze', 'ExpandDims', 'Fill', 'ZerosLike', 'OnesLike', 'StopGradient',
    'Pad', 'PadV2', 'MirrorPad', 'GatherV2', 'Gather', 'GatherNd', 'Split',
    'SplitV', 'NoOp', 'AssignVariableOp', 'VarHandleOp', 'BroadcastTo',
    'BroadcastArgs', 'Range', 'Tile', 'OneHot', 'PreventGradient',
    'EnsureShape', 'CheckNumerics', 'Bitcast', 'TensorListFromTensor',
])
_REDUCTION_OPS = frozenset(['Sum', 'Mean', 'Max', 'Min', 'Prod', 'ArgMax',
                            'ArgMin'])
_POOL_OPS = frozenset(['MaxPool', 'MaxPoolV2', 'AvgPool', 'MaxPool3D',
                       'AvgPool3D'])
_CONV_OPS = frozenset(['Conv2D', 'Conv3D', 'Conv'])
_TRANSPOSED_CONV_OPS = frozenset(['Conv2DBackpropInput',
                                  'Conv2DBackpropInputV2',
                                  'Conv3DBackpropInputV2'])
# Cost per element of transcendental element-wise ops (as activations.py).
_ELEMENTWISE_COST = {'Softmax': 5, 'LogSoftmax': 5, 'Tanh': 4, 'Sigmoid': 4,
                     'Exp': 4, 'Log': 4, 'Erf': 4, 'Gelu': 8}


def _EinsumFlops(op) -> float:
  """2 x the product of the sizes of all indices (ellipsis dims included)."""
  inputs, output = op.get_attr('equation').decode().split('->')
  sizes = {}
  for labels, t in zip(inputs.split(','), op.inputs):
    dims = t.shape.as_list()
    if '...' in labels:
      head, tail = labels.split('...')
      dims = dims[:len(head)] + dims[len(dims) - len(tail):]
      labels = head + tail
    for label, d in zip(labels, dims):
      sizes[label] = d or 0
  total = float(np.prod(list(sizes.values()) or [1]))
  if '...' in output:
    out_dims = op.outputs[0].shape.as_list()
    head, tail = output.split('...')
    ellipsis = out_dims[len(head):len(out_dims) - len(tail)]
    total *= float(np.prod([d or 0 for d in ellipsis] or [1]))
  return 2.0 * total


def CountFlops(graph: tf.Graph) -> float:
  """Forward FLOPs of the ops in `graph` (a traced function's graph).

  A multiply-add counts 2. MatMul / BatchMatMul: 2 m k n; convolutions:
  2 x output size x filter taps x input channels per group; depthwise: 2 x
  output size x taps; transposed convolutions: 2 x input size x taps x
  output channels; Einsum: 2 x the product of all index sizes; pooling:
  output size x window; reductions: input size; other ops with a float
  output: one per output element (a few for transcendental functions);
  data movement (reshape, transpose, concat, slices, casts, reads): 0.
  Shapes must be static (trace with a fixed batch size).

  Args:
    graph: e.g. `concrete_function.graph`.

  Returns:
    The FLOPs, a float.
  """
  return sum((OpFlops(op) for op in graph.get_operations()), 0.0)


def _Size(shape) -> int:
  dims = shape.as_list() if shape.rank is not None else None
  if dims is None or any(d is None for d in dims):
    return 0
  return int(np.prod(dims, dtype=np.int64)) if dims else 1


def OpFlops(op: tf.Operation) -> float:
  """The FLOPs of one op of a traced graph, by the rules of `CountFlops`."""
  kind = op.type
  if kind in _FREE_OPS or not op.outputs:
    return 0.0
  out = op.outputs[0].shape
  if kind == 'MatMul':
    a = op.inputs[0].shape
    k = a[0] if op.get_attr('transpose_a') else a[-1]
    return 2.0 * _Size(out) * (k or 0)
  if kind.startswith('BatchMatMul'):
    a = op.inputs[0].shape
    k = a[-2] if op.get_attr('adj_x') else a[-1]
    return 2.0 * _Size(out) * (k or 0)
  if kind in _CONV_OPS:
    return 2.0 * _Size(out) * _Size(op.inputs[1].shape[:-1])
  if kind == 'DepthwiseConv2dNative':
    return 2.0 * _Size(out) * _Size(op.inputs[1].shape[:2])
  if kind in _TRANSPOSED_CONV_OPS:
    taps = _Size(op.inputs[1].shape[:-1])
    return 2.0 * _Size(op.inputs[2].shape) * taps
  if kind == 'Einsum':
    return _EinsumFlops(op)
  if kind in _POOL_OPS:
    ksize = op.get_attr('ksize') if 'ksize' in op.node_def.attr else [1]
    return float(_Size(out)) * float(np.prod(ksize))
  if kind in _REDUCTION_OPS:
    return float(_Size(op.inputs[0].shape))
  if op.outputs[0].dtype.is_floating:
    return float(_ELEMENTWISE_COST.get(kind, 1)) * _Size(out)
  return 0.0
