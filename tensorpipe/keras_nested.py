"""Functional models whose config is not their graph, as one functional graph.

keras_hub backbones and task models (`GPT2Backbone`, `BertBackbone`,
`GPT2CausalLM`, ...) are functional models built inside a subclass's
`__init__`: their `get_config()` holds the constructor's arguments, not the
graph, their inputs are a dict, and a task model holds its backbone as one
node. `Flatten` rebuilds such a model as a plain `keras.Model(inputs,
outputs)` over the same layer objects:

- every nested functional model is inlined (its layers called in its graph's
  order), so cuts can fall inside it; a layer called at two nesting levels
  (a causal LM's token embedding, called again with `reverse=True`) is one
  layer object with two calls, recognised by identity, not by name;
- dict inputs become a list in Keras' flattening order (sorted keys); the
  input layers keep their names, so a dict keyed by those names still feeds
  the model (`TensorPipeModel` takes dicts keyed by input name);
- dict outputs become a list in the same order, their keys kept
  (`Flattened.output_keys`): `TensorPipeModel` returns a dict keyed by them,
  as the model given does, so compile's losses and metrics keyed by output
  name, fit's dict targets and predict's dict results work as in Keras.

Nothing is copied: the flattened model's layers are the user's objects. Its
config is only read (keras_graph), never fed to `keras.Model.from_config`
for the user: a re-wrapped `GPT2CausalLM` rebuilt that way would hold its
tied embedding table twice. `TensorPipeModel.get_config` stores the model's
own serialised config (the keras_hub class) and flattens again on load.

Inside a flattened model, a nested model is kept whole (one node, as a
plain layer) when it is not functional (a subclassed model's graph is Python
code) or is called with a mask; two different layers that would get one name
are an error. A plain functional model (list inputs, its config its graph)
is not flattened: keras_graph keeps a nested functional model in it as one
node, its variables under its name.

Keras private API used (Keras 3.15.1; keras_nested_test fails if it
changes): `Functional._run_through_graph(inputs, operation_fn)`, the loop
Keras' own `Functional.call` runs, to call each node's layer in order.
"""

from typing import Any, Dict, List, NamedTuple, Optional

import keras

from tensorpipe import errors
from tensorpipe import keras_graph
from tensorpipe import keras_utils


class Flattened(NamedTuple):
  """`Flatten`'s result.

  Attributes:
    model: the plain functional model over the same layer objects.
    source: the model given (its `get_config` is what is stored).
    weight_order: [layer name in `model`, index in that layer's weights]
      per weight of `source`, in `source.weights` order (get_weights).
    output_keys: for dict outputs, their keys in `model`'s output order
      (sorted); None otherwise.
  """
  model: keras.Model
  source: keras.Model
  weight_order: List[List[Any]]
  output_keys: Optional[List[str]] = None


def _HasGraphConfig(model: Any) -> bool:
  try:
    config = model.get_config()
  except (NotImplementedError, TypeError):
    return False
  return (isinstance(config, dict) and 'layers' in config and
          'input_layers' in config)


def NeedsFlattening(model: Any) -> bool:
  """A functional model that keras_graph cannot read as it is: its config is
  not its graph, or its inputs or outputs are a dict. (A plain functional
  model keeps a nested functional model as one node, its variables under
  its name.)"""
  if not keras_graph.IsFunctional(model):
    return False
  return (not _HasGraphConfig(model) or isinstance(model.input, dict) or
          isinstance(model.output, dict))


def _Names(model: keras.Model, seen: Dict[str, int]) -> bool:
  """Records the names of the layers inlining `model` gives; False when two
  different layer objects would share a name."""
  for layer in model.layers:
    if isinstance(layer, keras.layers.InputLayer):
      continue
    if keras_graph.IsFunctional(layer):
      if not _Names(layer, seen):
        return False
      continue
    if seen.setdefault(layer.name, id(layer)) != id(layer):
      return False
  return True


def _Inline(model: keras.Model, inputs: Any) -> Any:
  """`model`'s graph called on `inputs`, nested functional models inlined."""

  def OperationFn(operation):
    if not keras_graph.IsFunctional(operation):
      return operation

    def Call(*args, **kwargs):
      # Keras records mask={name: None, ...} for a dict input: no mask.
      extra = {k: v for k, v in kwargs.items()
               if k != 'training' and any(
                   m is not None for m in keras.tree.flatten(v))}
      if extra or len(args) != 1:
        return operation(*args, **kwargs)  # kept whole
      return _Inline(operation, args[0])
    return Call

  return model._run_through_graph(inputs, operation_fn=OperationFn)  # pylint: disable=protected-access


def Flatten(model: keras.Model) -> Flattened:
  """`model` as a plain functional model over the same layers (see module).

  Raises:
    ValueError: when two different layers of the nested models share a name
      (Keras needs unique names in one model), naming it and the fix.
  """
  if not _Names(model, {}):
    raise ValueError(
        f'keras_nested: model {model.name!r} holds functional models whose '
        'layers share names with other layers; inlining them would give two '
        'layers one name. Give the layers unique names, or wrap the nested '
        'model in a subclassed keras.Model to keep it whole')
  inputs = model.input
  outputs = _Inline(model, inputs)
  if isinstance(inputs, dict):
    inputs = [inputs[k] for k in sorted(inputs)]
  keys = sorted(outputs) if isinstance(outputs, dict) else None
  if keys is not None:
    outputs = [outputs[k] for k in keys]
  flat = keras.Model(inputs, outputs, name=model.name)
  return Flattened(flat, model, keras_utils.WeightOrder(model, flat.layers),
                   keys)


def FromStored(config: Dict[str, Any]) -> Optional[keras.Model]:
  """The model a stored serialised config describes, when it is one that
  must be flattened (`TensorPipeModel.get_config` stores such a model's own
  config: a keras_hub class, or a functional model with dict inputs or
  outputs); None for anything else."""
  inner = config.get('config') if isinstance(config, dict) else None
  if not (isinstance(inner, dict) and 'class_name' in config and (
      'input_layers' not in inner or
      isinstance(inner['input_layers'], dict) or
      isinstance(inner.get('output_layers'), dict))):
    return None
  try:
    model = keras.saving.deserialize_keras_object(config)
  except (TypeError, ValueError) as e:
    raise ValueError(
        f'keras_nested: the stored model {config["class_name"]!r} cannot '
        f'be rebuilt ({errors.FirstLine(e)}); import the package that '
        'defines it (e.g. `import keras_hub`) before loading the '
        'TensorPipeModel') from None
  return model if NeedsFlattening(model) else None


def NestedSource(model: Any) -> Optional[Flattened]:
  """`model` (or the model a stored config describes) flattened, when
  keras_graph cannot read it as it is (see above); else None."""
  if isinstance(model, dict):
    model = FromStored(model)
  if model is None or not NeedsFlattening(model):
    return None
  return Flatten(model)


def MaxSequenceLength(model: Any) -> Optional[int]:
  """A keras_hub backbone's (or its task model's backbone's) length."""
  for obj in (model, getattr(model, 'backbone', None)):
    length = getattr(obj, 'max_sequence_length', None)
    if isinstance(length, int) and not isinstance(length, bool):
      return length
  return None
