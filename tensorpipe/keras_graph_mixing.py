"""The keras.ops nodes of a functional Keras graph that mix examples.

A pipeline runs every node of a `keras_graph.Graph` on one micro-batch
(N/T examples) at a time, so a keras.ops node that reduces, scans or sorts
over the batch axis (`keras.ops.mean(h, axis=0)`, an axis of None) is
computed per micro-batch, unlike in plain Keras. Such nodes are not
refused (T=1 is exact) but found here and warned of once when the graph is
planned (keras_graph_params.WarnBatchMixing); the same op inside a layer's
`call` is not seen.

  mixing = BatchMixingOps(graph, keras_graph_costs.Analyse(graph))
"""

import dataclasses
from typing import Any, List

from tensorpipe import keras_graph

# keras.ops Operations with an `axis` (or `axes`) that can span examples:
# reductions, scans and sorts (axis None: all axes, the batch included).
_AXIS_OPS = frozenset([
    'Mean', 'Sum', 'Max', 'Min', 'Prod', 'Std', 'Var', 'Argmax', 'Argmin',
    'Logsumexp', 'Median', 'Quantile', 'All', 'Any', 'Amax', 'Amin',
    'Average', 'CountNonzero', 'Cumsum', 'Cumprod', 'Sort', 'Argsort',
    'Norm', 'Nansum', 'Nanmean', 'Ptp', 'Moments',
])


@dataclasses.dataclass(frozen=True)
class BatchMixingOp:
  """A keras.ops node whose result mixes the examples of its input.

  Attributes:
    layer: the op's name in the model.
    op: its class, e.g. 'Mean'.
    axis: the recorded axis (None: all axes).
  """
  layer: str
  op: str
  axis: Any


def BatchMixingOps(graph: keras_graph.Graph,
                   costs: keras_graph.GraphCosts) -> List[BatchMixingOp]:
  """The keras.ops nodes that reduce, scan or sort over the batch axis.

  A pipeline runs every node on one micro-batch (N/T examples) at a time,
  so such an op (`keras.ops.mean(h, axis=0)`, `keras.ops.sum(h)`) sees a
  micro-batch, not the batch: its result differs from plain Keras'. Ops
  hidden inside a layer's `call` are not seen here.
  """
  found = []
  for node in graph.nodes:
    entry = graph.entries[node.layer]
    if not graph.IsOp(node.layer) or entry.get('class_name') not in _AXIS_OPS:
      continue
    config = entry.get('config') or {}
    key = 'axes' if 'axes' in config else 'axis'
    reads = node.Reads()
    info = costs.tensors.get(reads[0]) if reads else None
    if key not in config or info is None or not info.batched:
      continue
    axis = config[key]
    rank = len(info.shape) + 1
    axes = (range(rank) if axis is None else
            axis if isinstance(axis, (list, tuple)) else [axis])
    if any(int(a) % rank == 0 for a in axes):
      found.append(BatchMixingOp(node.layer, entry['class_name'], axis))
  return found
