"""A functional Keras 3 graph cut into pipeline stages.

GPipe cuts a sequence of layers; a functional Keras model (all of
keras.applications) is a graph: skip connections, several inputs and
outputs, layers called more than once. Here the graph is read from the
model's config (text, as every TensorPipe Params), its node calls are put in
one topological order, and the order is cut into K consecutive segments.
Each segment becomes one `KerasGraphSegment` layer (keras_graph_segment.py),
which a TensorPipeLayer takes as a manual partition; `Stage.Call`, the
schedules and recompute are unchanged.

  graph = ReadGraph(model.get_config())     # nodes in topological order
  costs = keras_graph_costs.Analyse(graph)  # shapes, FLOPs, weights
  plan = PlanCuts(graph, costs, K)          # cuts between nodes
  partitions = [[keras_graph_segment.SegmentParams(graph, costs, plan, k)]
                for k in range(K)]

What crosses cut k travels in the segment's output NestedMap: every tensor
made before the cut (model inputs included) that a node after it reads or
that is a model output; nothing else. The first segment takes the model's
inputs as positional args, the last returns its outputs (one tensor, or a
tuple in the model's output order).

Choices, each refused in one line where it does not hold:
  * Every Keras layer is a `KerasLayer` child of its segment, named by its
    Keras name; segments add no level to paths or checkpoint keys, so a
    checkpoint restores under any K.
  * A layer called at several nodes (shared weights) may have its calls in
    several segments (a causal LM's token embedding, called again on the
    last hidden state): the first segment calling it holds its variables,
    each later one a `KerasLayer` with `tied_to` that reads them
    (tied_weights.py: a copy per step on its device, its gradient added to
    the owner's once per step). Such a layer must have trainable weights
    only (batch-norm statistics are refused by the reader).
  * A nested model (functional or Sequential) is one node: kept whole, as
    one KerasLayer, not flattened.
  * `keras.ops` nodes (Operations without weights) run as stateless calls.
  * Each node's recorded call arguments are applied, but for `training`:
    as in Keras 3.15's own functional call, the mode of the call (fit:
    True, predict: False) replaces a recorded `training=False`. A frozen
    backbone is one with `trainable=False`, whose batch norms Keras (and
    the pipeline) then run on their moving averages.
  * Keras masks do not cross a cut (they are attributes of tensors), so
    graphs with a Masking layer or an Embedding(mask_zero=True) are refused.
  * Every tensor crossing a cut has the batch on axis 0.
  * Each node runs on one micro-batch at a time: a keras.ops node that
    reduces over the batch axis is computed per micro-batch, unlike in
    plain Keras; it is not refused but warned of (keras_graph_mixing).

The costs the cuts are planned on (GraphCosts) are computed by
keras_graph_costs.Analyse.

Keras private APIs this module relies on: none. The config layout it reads
(`layers[i].inbound_nodes[j].args/kwargs`, `__keras_tensor__` with
`keras_history`, `input_layers` / `output_layers`) is what
`keras.Model.get_config` writes in Keras 3.15 (keras_utils lists the
private APIs of the other Keras modules).
"""

import copy
import dataclasses
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import errors
from tensorpipe import partitioning
from tensorpipe.layers import keras_layer
from tensorpipe.layers import keras_rebuild
from tensorpipe.nested_map import NestedMap

_KERAS_TENSOR = '__keras_tensor__'
_REF = '__tensor__'  # {'__tensor__': key}: a tensor in a node's arguments


def TensorKey(history: Sequence[Any]) -> str:
  """The NestedMap key of output `i` of node `n` of layer `name`."""
  name, node, index = history
  base = re.sub(r'\W', '_', str(name))
  return f't_{base}__{int(node)}_{int(index)}'


@dataclasses.dataclass(frozen=True)
class Node:
  """One call of a Keras layer or op in the graph.

  Attributes:
    layer: the Keras layer's (or op's) name.
    index: which call of the layer it is (its node index in the config).
    args, kwargs: the recorded call arguments, tensors as {'__tensor__': key}.
  """
  layer: str
  index: int
  args: Any
  kwargs: Any

  def Reads(self) -> List[str]:
    """Keys of the tensors the call reads, in argument order."""
    out = []

    def Walk(x):
      if isinstance(x, dict) and set(x) == {_REF}:
        out.append(x[_REF])
      elif isinstance(x, dict):
        for v in x.values():
          Walk(v)
      elif isinstance(x, (list, tuple)):
        for v in x:
          Walk(v)
    Walk([self.args, self.kwargs])
    return out

  def OutputKey(self, j: int) -> str:
    """The key of the call's j-th flat output."""
    return TensorKey((self.layer, self.index, j))


@dataclasses.dataclass(frozen=True)
class Graph:
  """A functional model's config as nodes in one topological order.

  Attributes:
    name: the model's name.
    entries: Keras layer (or op) name -> its serialised config (module,
      class_name, config, build_config; without inbound_nodes).
    nodes: every call, in a topological order (config order breaks ties).
    inputs: the keys of the model inputs, in order.
    outputs: the keys of the model outputs, in order.
    single_output: whether the model returns one tensor (not a list).
    producers: tensor key -> index in `nodes` of the node making it (model
      inputs: -1).
    input_names, output_names: the Keras layers that make the model's
      inputs (its keras.Input names) and outputs, in order.
  """
  name: str
  entries: Dict[str, Dict[str, Any]]
  nodes: Tuple[Node, ...]
  inputs: Tuple[str, ...]
  outputs: Tuple[str, ...]
  single_output: bool
  producers: Dict[str, int]
  input_names: Tuple[str, ...]
  output_names: Tuple[str, ...]

  def IsOp(self, name: str) -> bool:
    """Whether `name` is a keras.ops Operation (no weights), not a Layer."""
    module = self.entries[name].get('module') or ''
    return module.startswith('keras.src.ops') or module.startswith('keras.ops')

  def NodesOf(self, name: str) -> List[int]:
    """Indices in `nodes` of the calls of layer `name`."""
    return [i for i, n in enumerate(self.nodes) if n.layer == name]


def _Triples(spec: Any, what: str) -> Tuple[List[Tuple[str, int, int]], bool]:
  """input_layers / output_layers as (name, node, index) triples."""
  if isinstance(spec, dict):
    raise ValueError(
        f'keras_graph: the model\'s {what} are a dict ({sorted(spec)}); '
        'build the model with a list of inputs and outputs, '
        'keras.Model([in_a, in_b], [out_a, out_b])')
  if (isinstance(spec, (list, tuple)) and len(spec) == 3 and
      isinstance(spec[0], str)):
    return [tuple(spec)], True
  return [tuple(t) for t in spec], False


def _Convert(x: Any, producers: Dict[str, Tuple[str, int]]) -> Any:
  """A config's call argument with KerasTensors as {'__tensor__': key}."""
  if isinstance(x, dict) and x.get('class_name') == _KERAS_TENSOR:
    history = x['config']['keras_history']
    key = TensorKey(history)
    producers[key] = (str(history[0]), int(history[1]))
    return {_REF: key}
  if isinstance(x, dict):
    return {k: _Convert(v, producers) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_Convert(v, producers) for v in x]
  return x


def IsFunctional(model: Any) -> bool:
  """Whether `model` is a functional Keras 3 model (a graph of layers)."""
  return isinstance(model, keras.Model) and any(
      c.__name__ == 'Functional' for c in type(model).__mro__)


def ReadGraph(config: Dict[str, Any]) -> Graph:
  """The Graph of a functional model's `get_config()` (not modified).

  Raises:
    ValueError: for dict inputs or outputs, masking layers, or a config that
      is not a functional model's.
  """
  config = copy.deepcopy(config)
  if not isinstance(config, dict) or 'layers' not in config or (
      'input_layers' not in config):
    raise ValueError('keras_graph: the config is not a functional Keras '
                     "model's (no 'layers' / 'input_layers'); give "
                     'model.get_config() of a keras.Model(inputs, outputs)')
  input_triples, _ = _Triples(config['input_layers'], 'inputs')
  output_triples, single = _Triples(config['output_layers'], 'outputs')
  entries, pending = {}, []
  where: Dict[str, Tuple[str, int]] = {}
  for entry in config['layers']:
    name = entry.get('name') or entry['config']['name']
    if entry.get('class_name') == 'Masking' or (
        entry.get('class_name') == 'Embedding' and
        entry['config'].get('mask_zero')):
      raise ValueError(
          f'keras_graph: layer {name!r} ({entry["class_name"]}) makes a Keras '
          'mask, which cannot cross a pipeline cut (masks are attributes of '
          'tensors, not tensors); pass the mask as an explicit input or '
          'drop it (mask_zero=False)')
    entries[name] = {k: v for k, v in entry.items()
                     if k not in ('inbound_nodes', 'name')}
    for n, inbound in enumerate(entry.get('inbound_nodes') or []):
      args = _Convert(inbound.get('args', []), where)
      kwargs = _Convert(inbound.get('kwargs', {}), where)
      pending.append(Node(name, n, args, kwargs))
  inputs = tuple(TensorKey(t) for t in input_triples)
  for key in inputs:
    where[key] = ('', -1)
  # Kahn's algorithm; ties go to config order, then node index.
  done = {('', -1)}
  nodes: List[Node] = []
  while pending:
    for i, node in enumerate(pending):
      if all(where.get(key, ('?', -2)) in done for key in node.Reads()):
        nodes.append(node)
        done.add((node.layer, node.index))
        del pending[i]
        break
    else:
      missing = sorted({k for node in pending for k in node.Reads()
                        if where.get(k, ('?', -2)) not in done})
      raise ValueError(f'keras_graph: tensors {missing[:5]} are read but '
                       'never made; is this a complete functional model?')
  index = {(n.layer, n.index): i for i, n in enumerate(nodes)}
  index[('', -1)] = -1
  producers = {key: index[w] for key, w in where.items() if w in index}
  outputs = []
  for t in output_triples:
    key = TensorKey(t)
    if (str(t[0]), int(t[1])) not in index:
      raise ValueError(f'keras_graph: output {list(t)} is not made by any '
                       'node of the model')
    producers[key] = index[(str(t[0]), int(t[1]))]
    outputs.append(key)
  return Graph(config.get('name', 'model'), entries, tuple(nodes), inputs,
               tuple(outputs), single, producers,
               tuple(str(t[0]) for t in input_triples),
               tuple(str(t[0]) for t in output_triples))


# -- node objects and costs ---------------------------------------------------


# Call arguments Keras serialises as {'class_name': ..., 'config': ...}:
# an index's slices (x[:, 0]), constants as tensors or arrays. Keras's
# functional loader deserialises a node's arguments the same way.
_SERIALISED_ARGS = ('__slice__', '__ellipsis__', '__tensor__', '__numpy__',
                    '__bytes__')


def FillArgs(x: Any, env: Dict[str, Any]) -> Any:
  """Call arguments with each {'__tensor__': key} replaced by env[key] and
  Keras's serialised constants (slices, tensors, arrays) rebuilt."""
  if isinstance(x, dict) and set(x) == {_REF}:
    return env[x[_REF]]
  if isinstance(x, dict) and x.get('class_name') in _SERIALISED_ARGS:
    return keras.saving.deserialize_keras_object(copy.deepcopy(x))
  if isinstance(x, dict):
    return {k: FillArgs(v, env) for k, v in x.items()}
  if isinstance(x, list):
    return [FillArgs(v, env) for v in x]
  return x


def NewObject(graph_name: str, name: str, entry: Dict[str, Any]):
  """The Keras object of a layer's config `entry` (Normalization rebound)."""
  try:
    obj = keras.saving.deserialize_keras_object(copy.deepcopy(entry))
  except (TypeError, ValueError) as e:
    first = errors.FirstLine(e)
    raise ValueError(f'keras_graph: layer {name!r} of model {graph_name!r} '
                     f'cannot be rebuilt from its config: {first}') from None
  keras_rebuild.DeriveStateInCalls(obj)
  return obj


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  """One tensor of the graph: per-example shape, dtype, batch axis 0."""
  shape: Tuple[Optional[int], ...]
  dtype: str
  batched: bool = True

  def Bytes(self, batch: int, unknown: int = 1) -> int:
    """Bytes of the tensor for `batch` examples (unknown dims, such as a
    sequence axis of None, count `unknown`)."""
    n = int(np.prod([d or unknown for d in self.shape])) if self.shape else 1
    return n * batch * tf.as_dtype(self.dtype).size


@dataclasses.dataclass(frozen=True)
class GraphCosts:
  """What the cost model knows of each node and tensor.

  Attributes:
    flops: per node, forward FLOPs of one example (`flops.CountFlops` of a
      traced inference call).
    num_params: per node, the weights its layer holds if this is the
      layer's first call, else 0.
    tensors: tensor key -> TensorInfo.
    sequence_length: the length FLOPs and bytes count for the model's
      unknown non-batch dims (a sequence axis of None); None: they were
      unknown, and FLOPs of ops over them are not counted.
    weights_read: per node, the indices (in its layer's `weights` order) of
      the weights its call reads; a stage that calls a layer owned by an
      earlier stage (tied weights) is given only these. None: unknown
      (every weight is read).
    weight_sizes: per Keras layer name, the values (scalars) of each of
      its weights, in `weights` order.
  """
  flops: Tuple[float, ...]
  num_params: Tuple[int, ...]
  tensors: Dict[str, TensorInfo]
  sequence_length: Optional[int] = None
  weights_read: Optional[Tuple[Tuple[int, ...], ...]] = None
  weight_sizes: Optional[Dict[str, Tuple[int, ...]]] = None

  def WeightsRead(self, nodes: Sequence[int]) -> Optional[List[int]]:
    """The weights (indices) that any of `nodes` (calls of one layer)
    reads, sorted; None: unknown (every weight)."""
    if self.weights_read is None:
      return None
    return sorted(set().union(*(self.weights_read[i] for i in nodes)))

  def Bytes(self, key: str, batch: int) -> int:
    return self.tensors[key].Bytes(batch, self.sequence_length or 1)


# -- cuts ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CutPlan:
  """Where the node order is cut, and what crosses each cut.

  Attributes:
    starts: per segment, the index of its first node (starts[0] == 0).
    boundaries: per cut (K-1), the keys of the tensors crossing it, in the
      order they are made.
    flops: per segment, forward FLOPs of one example.
  """
  starts: Tuple[int, ...]
  boundaries: Tuple[Tuple[str, ...], ...]
  flops: Tuple[float, ...]

  @property
  def num_segments(self) -> int:
    return len(self.starts)

  def Nodes(self, graph: Graph, k: int) -> range:
    """Indices in `graph.nodes` of segment k's nodes."""
    end = self.starts[k + 1] if k + 1 < len(self.starts) else len(graph.nodes)
    return range(self.starts[k], end)

  def Report(self, graph: Graph, costs: GraphCosts, batch: int) -> str:
    """A table: per segment its layers and FLOPs; per cut the tensors and
    their bytes for a mini-batch of `batch` examples."""
    total = sum(self.flops) or 1.0
    length = (f', unknown dims counted as {costs.sequence_length}'
              if costs.sequence_length else '')
    lines = [f'{graph.name}: {len(graph.nodes)} nodes in '
             f'{self.num_segments} segments (batch {batch}{length})']
    for k in range(self.num_segments):
      nodes = self.Nodes(graph, k)
      first, last = graph.nodes[nodes[0]].layer, graph.nodes[nodes[-1]].layer
      lines.append(f'  segment {k}: nodes {nodes[0]}..{nodes[-1]} ({first} .. '
                   f'{last}), {self.flops[k] * batch:.3g} FLOPs '
                   f'({100 * self.flops[k] / total:.1f}%)')
      if k < len(self.boundaries):
        keys = self.boundaries[k]
        size = sum(costs.Bytes(key, batch) for key in keys)
        lines.append(f'    cut {k}: {len(keys)} tensor(s), {size} bytes')
        for key in keys:
          info = costs.tensors[key]
          lines.append(f'      {key} {[None] + list(info.shape)} '
                       f'{info.dtype} ({costs.Bytes(key, batch)} bytes)')
    for name, ks in TiedLayers(graph, self).items():
      weights = sum(costs.num_params[i] for i in graph.NodesOf(name))
      read = ''
      later = [i for i in graph.NodesOf(name)
               if i not in self.Nodes(graph, ks[0])]
      indices = costs.WeightsRead(later)
      if indices is not None and costs.weight_sizes is not None:
        sizes = costs.weight_sizes[name]
        read = (f'; the later segments read {sum(sizes[i] for i in indices)}'
                f' of its weights, copied to their devices per step')
      lines.append(
          f'  tied: {name} ({weights} weights) is held on the devices of '
          f'segments {", ".join(map(str, ks))} (segment {ks[0]} owns it); '
          f'its gradient crosses once per step from each of segments '
          f'{", ".join(map(str, ks[1:]))} to segment {ks[0]}{read}')
    return '\n'.join(lines)


def _Cuttable(graph: Graph) -> List[bool]:
  """cuttable[c]: whether a cut may fall before node c (c in 1..n-1); a
  shared layer's calls may fall in several segments (tied weights)."""
  n = len(graph.nodes)
  ok = [True] * (n + 1)
  ok[0] = ok[n] = False
  return ok


def TiedLayers(graph: Graph, plan: 'CutPlan') -> Dict[str, List[int]]:
  """Keras layer name -> the segments calling it, for each layer (not op)
  called in more than one segment (its weights tied across them)."""
  segments: Dict[str, List[int]] = {}
  for k in range(plan.num_segments):
    for i in plan.Nodes(graph, k):
      name = graph.nodes[i].layer
      if not graph.IsOp(name) and k not in segments.setdefault(name, []):
        segments[name].append(k)
  return {name: ks for name, ks in segments.items() if len(ks) > 1}


def _Boundary(graph: Graph, cut: int) -> Tuple[str, ...]:
  """Keys made before node `cut` that a later node reads or that are outputs."""
  needed = set(graph.outputs)
  for node in graph.nodes[cut:]:
    needed.update(node.Reads())
  keys = [key for key in needed if graph.producers.get(key, -1) < cut]
  return tuple(sorted(keys, key=lambda k: (graph.producers.get(k, -1), k)))


def PlanCuts(graph: Graph, costs: GraphCosts, num_segments: int,
             cut_after: Optional[Sequence[str]] = None,
             method: str = 'min_max', stages_per_device: int = 1) -> CutPlan:
  """Cuts the node order into `num_segments` segments.

  Args:
    graph: the graph.
    costs: its GraphCosts (FLOPs per node).
    num_segments: K v stages (K devices, v stages per device).
    cut_after: optional K-1 Keras layer names, in order: cut after each
      layer's last call. None balances the FLOPs (partitioning.Partition
      over the runs of nodes between allowed cuts).
    method: partitioning objective ('min_max' or 'min_variance').
    stages_per_device: v, for the messages only (they name what the user
      set: num_partitions = K devices, not K v stages).

  Raises:
    ValueError: K larger than the number of places to cut, a cut that
      splits a shared layer's calls, unknown or unordered layer names, or a
      crossing tensor without a batch axis.
  """
  n = len(graph.nodes)
  ok = _Cuttable(graph)
  v = stages_per_device
  asked = (f'num_partitions={num_segments // v} x {v} stages per device = '
           f'{num_segments} stages' if v > 1 else
           f'num_partitions={num_segments}')
  if isinstance(num_segments, bool) or not isinstance(num_segments, int) or (
      num_segments < 1):
    raise ValueError(f'keras_graph: num_partitions={num_segments!r} must be a '
                     'positive int')
  if cut_after is not None:
    names = list(cut_after)
    if len(names) != num_segments - 1:
      raise ValueError(
          f'keras_graph: cut_after={names} names {len(names)} layers; '
          f'{asked} need{"s" if v == 1 else ""} {num_segments - 1}')
    cuts = []
    for name in names:
      calls = graph.NodesOf(name) if name in graph.entries else []
      if not calls:
        raise ValueError(f'keras_graph: cut_after names {name!r}, which is '
                         f'no layer called in model {graph.name!r}')
      c = max(calls) + 1
      if not ok[c]:
        raise ValueError(f'keras_graph: cut_after {name!r} would cut at the '
                         'end of the model; choose another layer')
      cuts.append(c)
    if cuts != sorted(set(cuts)):
      raise ValueError(f'keras_graph: cut_after={names} must name layers in '
                       'model order, each once')
    starts = [0] + cuts
  else:
    atoms, start = [], 0
    for c in range(1, n + 1):
      if c == n or ok[c]:
        atoms.append((start, c))
        start = c
    if num_segments > len(atoms):
      raise ValueError(
          f'keras_graph: {asked} but model {graph.name!r} can be cut in '
          f'only {len(atoms)} pieces (its {n} layer calls); use '
          + (f'num_partitions <= {len(atoms)}' if v == 1 else
             f'num_partitions x stages per device <= {len(atoms)}'))
    if num_segments == 1:
      starts = [0]
    else:
      atom_costs = [sum(costs.flops[a:b]) for a, b in atoms]
      plan = partitioning.Partition(atom_costs, num_segments, method=method)
      starts, i = [], 0
      for size in plan.sizes:
        starts.append(atoms[i][0])
        i += size
  boundaries = []
  for c in starts[1:]:
    keys = _Boundary(graph, c)
    for key in keys:
      info = costs.tensors.get(key)
      if info is None or not info.batched:
        raise ValueError(
            f'keras_graph: tensor {key} crosses the cut before node {c} but '
            'has no batch axis 0 (a pipeline splits every boundary tensor '
            'into micro-batches); choose cut_after so that it stays in one '
            'partition')
    boundaries.append(keys)
  ends = list(starts[1:]) + [n]
  flops = tuple(float(sum(costs.flops[a:b])) for a, b in zip(starts, ends))
  return CutPlan(tuple(starts), tuple(boundaries), flops)
