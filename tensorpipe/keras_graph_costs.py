"""What a functional Keras graph costs: shapes, FLOPs and weights per node.

`Analyse(graph)` calls each node of a `keras_graph.Graph` on Keras
symbolic tensors (shapes and dtypes of every tensor), counts the FLOPs of
one traced inference call per node (`flops.CountFlops`) and the weights
that call reads, and the weights each layer holds at its first call;
`keras_graph.PlanCuts` cuts on these costs. It runs on Keras objects built
without allocating weights (keras_utils.NoAllocation), so a large model is
costed from its config.

  graph = keras_graph.ReadGraph(model.get_config())
  costs = keras_graph_costs.Analyse(graph)   # keras_graph.GraphCosts
  plan = keras_graph.PlanCuts(graph, costs, K)
"""

import json
from typing import Any, Dict, Optional, Tuple

import keras
import numpy as np
import tensorflow as tf

from tensorpipe import checks
from tensorpipe import errors
from tensorpipe import flops as flops_lib
from tensorpipe import keras_graph
from tensorpipe import keras_utils
from tensorpipe.layers import keras_rebuild

# (FLOPs, weights read) per _FlopsKey.
_FLOPS_CACHE: Dict[str, Tuple[float, Tuple[int, ...]]] = {}


def _FlopsKey(entry: Dict[str, Any], args: Any, kwargs: Any,
              sequence_length: Optional[int]) -> str:
  config = dict(entry.get('config') or {})
  config.pop('name', None)
  def Spec(t):
    if isinstance(t, keras.KerasTensor):
      return [list(t.shape[1:]), str(t.dtype)]
    return t
  leaves = tf.nest.map_structure(Spec, [args, kwargs])
  return json.dumps([entry.get('module'), entry.get('class_name'), config,
                     leaves, sequence_length], sort_keys=True, default=repr)


def _NodeFlops(obj, args: Any, kwargs: Any,
               sequence_length: Optional[int]) -> Tuple[float, Tuple[int, ...]]:
  """CountFlops of one inference call of `obj` on one example, its unknown
  non-batch dims taken as `sequence_length` (if given), and the indices
  (in `obj.weights` order) of the weights the call reads: those whose
  placeholder an op of the traced call consumes. A layer called again
  with other arguments may read other weights (an untied
  `ReversibleEmbedding`: its forward call reads `embeddings`, its
  `reverse=True` call only `reverse_embeddings`)."""
  flat = tf.nest.flatten([args, kwargs])
  positions = [i for i, t in enumerate(flat)
               if isinstance(t, keras.KerasTensor)]
  specs = [tf.TensorSpec([1] + [sequence_length if d is None else d
                                for d in flat[i].shape[1:]], flat[i].dtype)
           for i in positions]
  variables = list(getattr(obj, 'weights', []))
  var_specs = [tf.TensorSpec(v.shape, v.dtype) for v in variables]
  takes_training = isinstance(obj, keras.Layer) and 'training' in (
      keras_rebuild.CallArgs(obj))

  # A plain tf.Graph with placeholders, not a traced tf.function: tracing
  # initialises TensorFlow's devices, and experiments build their Params
  # (this cost model included) before the trainer sets the devices up.
  graph = tf.Graph()
  with graph.as_default():
    tensors = [tf.raw_ops.Placeholder(dtype=s.dtype, shape=s.shape)
               for s in list(specs) + var_specs]
    xs, ws = tensors[:len(specs)], tensors[len(specs):]
    # Constant arguments (keras_graph.FillArgs rebuilds them as eager
    # tensors) become this graph's constants: a graph cannot capture them.
    leaves = [tf.constant(t.numpy()) if isinstance(t, tf.Tensor) and hasattr(
        t, 'numpy') else t for t in flat]
    for i, x in zip(positions, xs):
      leaves[i] = x
    a, kw = tf.nest.pack_sequence_as([args, kwargs], leaves)
    kw = dict(kw)
    if takes_training:
      kw['training'] = False
    with keras.StatelessScope(state_mapping=list(zip(variables, ws))):
      obj(*a, **kw)
  reads = tuple(i for i, w in enumerate(ws) if w.consumers())
  return flops_lib.CountFlops(graph), reads


def Analyse(graph: keras_graph.Graph,
            sequence_length: Optional[int] = None) -> keras_graph.GraphCosts:
  """Shapes by Keras' symbolic calls, FLOPs by one traced call per node.

  Runs on objects built without allocating weights (keras_utils.
  NoAllocation); FLOPs are cached by layer class, config without the name,
  and input shapes (keras.applications repeat their blocks). A sequence
  model's inputs are often (None, None): `sequence_length` is the length
  its unknown non-batch dims are counted at (else ops over them count 0
  FLOPs and the cut cannot balance the blocks).
  """
  if sequence_length is not None:
    checks.CheckPositiveInts('keras_graph', sequence_length=sequence_length)
  flops, params, reads, weight_sizes, tensors = [], [], [], {}, {}
  with keras_utils.NoAllocation():
    objects = {name: keras_graph.NewObject(graph.name, name, entry)
               for name, entry in graph.entries.items()
               if entry.get('class_name') != 'InputLayer'}
    env = {}
    for key, name in zip(graph.inputs, graph.input_names):
      cfg = graph.entries[name]['config']
      shape = cfg.get('batch_shape') or cfg.get('batch_input_shape')
      env[key] = keras.KerasTensor(shape, dtype=cfg.get('dtype', 'float32'))
    for node in graph.nodes:
      obj = objects[node.layer]
      args = keras_graph.FillArgs(node.args, env)
      kwargs = keras_graph.FillArgs(node.kwargs, env)
      try:
        out = obj(*args, **kwargs)
      except (TypeError, ValueError) as e:
        first = errors.FirstLine(e)
        raise ValueError(f'keras_graph: node {node.index} of layer '
                         f'{node.layer!r} fails on its recorded inputs: '
                         f'{first}') from None
      for j, t in enumerate(tf.nest.flatten(out)):
        env[node.OutputKey(j)] = t
      key = _FlopsKey(graph.entries[node.layer], args, kwargs,
                      sequence_length)
      if key not in _FLOPS_CACHE:
        if len(_FLOPS_CACHE) > 4096:
          _FLOPS_CACHE.clear()
        _FLOPS_CACHE[key] = _NodeFlops(obj, args, kwargs, sequence_length)
      node_flops, node_reads = _FLOPS_CACHE[key]
      flops.append(node_flops)
      reads.append(node_reads)
      first_call = node.layer not in weight_sizes
      if first_call:
        weight_sizes[node.layer] = tuple(int(np.prod(w.shape)) for w in
                                         getattr(obj, 'weights', []))
      params.append(sum(weight_sizes[node.layer]) if first_call else 0)
    for key, t in env.items():
      if isinstance(t, keras.KerasTensor):
        batched = bool(t.shape) and t.shape[0] is None
        tensors[key] = keras_graph.TensorInfo(tuple(t.shape[1:]), str(t.dtype),
                                             batched)
  return keras_graph.GraphCosts(tuple(flops), tuple(params), tensors,
                                sequence_length, tuple(reads),
                                weight_sizes)
