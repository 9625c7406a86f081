"""A cut functional Keras graph's segments: one TensorPipe partition each.

`SegmentParams(graph, costs, plan, k)` makes the Params of segment k of a
`keras_graph.PlanCuts` plan: a `KerasGraphSegment`, which calls its run of
the graph's nodes on the tensors crossing the cut before it and returns
those crossing the cut after it (keras_graph's docstring states the rules).
`InputSpecs` gives the model inputs' per-example specs.
"""

import copy
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import keras_graph
from tensorpipe.keras_graph import CutPlan, FillArgs, Graph, GraphCosts
from tensorpipe.keras_graph import NewObject, TensorInfo, TensorKey
from tensorpipe.layers import keras_layer
from tensorpipe.nested_map import NestedMap


class KerasGraphSegment(base_layer.BaseLayer):
  """A run of consecutive nodes of a functional Keras graph: one partition.

  Its Params are text: the Keras layers it calls (KerasLayer Params, named
  by their Keras names), the keras.ops configs, the node list with tensor
  references, and what it takes and returns. Made by `SegmentParams`.

  FProp(theta, *inputs): the first segment takes the model's inputs
  (positional, in keras.Input order, or one dict keyed by their names),
  every other one the previous segment's NestedMap; the last returns the
  model's outputs (a tensor, a tuple, or a NestedMap keyed by
  `output_keys`), every other one a NestedMap of the tensors a later
  segment needs.
  """

  ADDS_PATH_LEVEL = False

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('sub', [], 'KerasLayer Params of the Keras layers this segment '
             'calls, each named by its Keras name.')
    p.Define('ops', {}, 'keras.ops Operation name -> its serialised config '
             '(stateless calls).')
    p.Define('nodes', [], "The calls, in order: dicts {'layer', 'index', "
             "'args', 'kwargs'} with tensors as {'__tensor__': key}.")
    p.Define('inputs', [], 'Keys of the tensors this segment takes.')
    p.Define('outputs', [], 'Keys of the tensors this segment returns.')
    p.Define('first', True, 'Whether the inputs are the model inputs '
             '(positional args) rather than one NestedMap.')
    p.Define('last', True, 'Whether the outputs are the model outputs.')
    p.Define('single_output', True, 'For the last segment: return one '
             'tensor (else a tuple).')
    p.Define('input_names', [], 'For the first segment: the keras.Input '
             'names, in order; it then also takes one dict keyed by them.')
    p.Define('output_keys', None, 'For the last segment: return a '
             'NestedMap keyed by these (a model with dict outputs), one '
             'per output, in order.')
    p.Define('specs', {}, 'Tensor key -> [per-example shape, dtype name] of '
             'the inputs and outputs (FPropMeta).')
    p.Define('flops_per_example', 0.0, 'Forward FLOPs of one example.')
    p.Define('num_params', 0, 'Weights of the layers called here.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateChildren('sub', p.sub)
    ops = {}
    for name, entry in (p.ops or {}).items():
      ops[name] = NewObject(p.name, name, entry)
    object.__setattr__(self, '_ops', ops)

  def FProp(self, theta, *inputs):
    p = self.params
    if p.first:
      if len(inputs) == 1 and isinstance(inputs[0], dict) and p.input_names:
        inputs = _ByName(p, inputs[0])
      if len(inputs) != len(p.inputs):
        raise ValueError(
            f'KerasGraphSegment {p.name!r}: the model takes {len(p.inputs)} '
            f'input(s) but got {len(inputs)}; pass one tensor per keras.Input, '
            'in order')
      env = dict(zip(p.inputs, inputs))
    else:
      (boundary,) = inputs
      env = {key: boundary[key] for key in p.inputs}
    # A tied reader (tied_to) is named apart but runs its Keras layer's
    # nodes.
    layers = {layer.params.tied_to or layer.layer_name: (layer, layer_theta)
              for layer, layer_theta in zip(self.children.sub, theta.sub)}
    for node in p.nodes:
      args, kwargs = FillArgs(node['args'], env), FillArgs(node['kwargs'], env)
      name = node['layer']
      if name in self._ops:
        with tf.name_scope(name):
          out = self._ops[name](*args, **kwargs)
      else:
        layer, layer_theta = layers[name]
        out = layer.CallKeras(layer_theta, tuple(args), kwargs)
      for j, t in enumerate(tf.nest.flatten(out)):
        env[TensorKey((name, node['index'], j))] = t
    if p.last:
      return _Outputs(p, [env[key] for key in p.outputs])
    return NestedMap({key: env[key] for key in p.outputs})

  @classmethod
  def FPropMeta(cls, p, *input_shapes):
    leaves = tf.nest.flatten([base_layer.ToShape(s) if not isinstance(
        s, (dict, NestedMap)) else s for s in input_shapes])
    batch = None
    for s in leaves:
      s = base_layer.ToShape(s)
      if s.rank:
        batch = s[0]
        break

    def Shape(key):
      shape, _ = p.specs[key]
      return tf.TensorShape([batch] + list(shape))
    if p.last:
      out = _Outputs(p, [Shape(key) for key in p.outputs])
    else:
      out = NestedMap({key: Shape(key) for key in p.outputs})
    return base_layer.FPropMetaResult(p.flops_per_example * (batch or 0), out,
                                      p.num_params)


def _ByName(p, inputs: Dict[str, Any]) -> Tuple[Any, ...]:
  """The first segment's inputs from a dict keyed by keras.Input name."""
  missing = [name for name in p.input_names if name not in inputs]
  if missing:
    raise ValueError(
        f'KerasGraphSegment {p.name!r}: the model\'s inputs are '
        f'{p.input_names} but the dict given has no {missing} (its keys: '
        f'{sorted(inputs)}); key it by the keras.Input names')
  return tuple(inputs[name] for name in p.input_names)


def _Outputs(p, outs: List[Any]) -> Any:
  """The last segment's result: one output, a tuple, or a NestedMap keyed
  by p.output_keys."""
  if p.output_keys:
    return NestedMap(zip(p.output_keys, outs))
  return outs[0] if p.single_output else tuple(outs)


def SegmentParams(graph: Graph, costs: GraphCosts, plan: CutPlan,
                  k: int, output_keys: Optional[Sequence[str]] = None) -> Any:
  """The KerasGraphSegment Params of segment k of `plan`; `output_keys`:
  the last one returns a NestedMap keyed by them."""
  nodes = [graph.nodes[i] for i in plan.Nodes(graph, k)]
  last = k == plan.num_segments - 1
  inputs = graph.inputs if k == 0 else plan.boundaries[k - 1]
  outputs = graph.outputs if last else plan.boundaries[k]
  subs, ops, seen = [], {}, set()
  earlier = {graph.nodes[i].layer for i in range(plan.starts[k])}
  for node in nodes:
    if node.layer in ops or node.layer in seen:
      continue
    seen.add(node.layer)
    if graph.IsOp(node.layer):
      ops[node.layer] = copy.deepcopy(graph.entries[node.layer])
    elif node.layer in earlier:
      # Called in an earlier segment too: read that segment's weights,
      # only those this segment's calls of the layer read.
      calls = [i for i in plan.Nodes(graph, k)
               if graph.nodes[i].layer == node.layer]
      subs.append(keras_layer.KerasLayer.Params().Set(
          name=f'{node.layer}__tied_{k}', tied_to=node.layer,
          tied_weights=costs.WeightsRead(calls),
          keras_config=copy.deepcopy(graph.entries[node.layer])))
    else:
      subs.append(keras_layer.KerasLayer.Params().Set(
          name=node.layer,
          keras_config=copy.deepcopy(graph.entries[node.layer])))
  specs = {key: [list(costs.tensors[key].shape), costs.tensors[key].dtype]
           for key in list(inputs) + list(outputs)}
  num_params = sum(costs.num_params[i] for i in plan.Nodes(graph, k))
  return KerasGraphSegment.Params().Set(
      name=f'segment_{k}', sub=subs, ops=ops,
      nodes=[{'layer': n.layer, 'index': n.index, 'args': n.args,
              'kwargs': n.kwargs} for n in nodes],
      inputs=list(inputs), outputs=list(outputs), first=k == 0, last=last,
      single_output=graph.single_output, specs=specs,
      input_names=list(graph.input_names) if k == 0 else [],
      output_keys=list(output_keys) if last and output_keys else None,
      flops_per_example=float(plan.flops[k]), num_params=int(num_params))


def InputSpecs(graph: Graph, costs: GraphCosts) -> List[TensorInfo]:
  """The model inputs' TensorInfos, in order."""
  return [costs.tensors[key] for key in graph.inputs]
