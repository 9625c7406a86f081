"""Keras 3 interop helpers shared by KerasLayer and the Keras front door.

Everything here is about Keras objects as TensorPipe sees them: telling Keras
2 (tf_keras) objects apart and saying why they are refused, checking that a
value can live in text Params, importing a factory by its dotted name,
building Keras objects reproducibly (SeededPythonRandom) or without
allocating weights (NoAllocation), and walking a Keras object's sublayers.

Keras private APIs TensorPipe relies on, all used through this module
(tested with Keras 3.15.1, the version TF 2.21 installs and requirements.txt
pins; re-check each on a Keras upgrade, keras_layer_test,
keras_graph_test, keras_build_test, keras_weight_ops_test,
keras_schedules_test and keras_multi_output_test fail if one changes):

  | private API                                   | used by                |
  |-----------------------------------------------|------------------------|
  | `Variable._value` (rebinding a Keras variable | RebindVariable:        |
  |   to a TensorPipe tf.Variable)                |   KerasLayer weights   |
  | `Layer._flatten_layers`                       | FlattenLayers          |
  | `Dropout._get_noise_shape` (SpatialDropout)   | NoiseShape             |
  | `Layer._seed_generators`                      | SeedGenerators         |
  | `keras.src.backend.common.global_state`       | NoAllocation           |
  |   ('uninitialized_variables')                 |                        |
  | `keras.src.backend.common.symbolic_scope`     | InSymbolicScope:       |
  |                                               |   TensorPipeModel.call |
  | `Layer.finalize_state` and the `mean` /       | FinalizeState,         |
  |   `variance` tensors Normalization's `call`   |   DerivedState:        |
  |   reads (derived from `adapt_mean` /          |   KerasLayer's         |
  |   `adapt_variance`, or from `input_mean`)     |   Normalization call,  |
  |                                               |   to_keras             |
  | `keras.src.backend.common.stateless_scope`    | SubstitutedValue:      |
  |   (`get_stateless_scope().get_current_value`) |   keras_weight_ops     |
  | `keras.src.backend.get_autocast_scope`,       | AutocastOf:            |
  |   `AutocastScope.maybe_cast`,                 |   keras_weight_ops     |
  |   `Variable._autocast`                        |                        |
  | `Dense` / `EinsumDense` / `BaseConv._kernel`, | RawKernel,             |
  |   `Embedding._embeddings`,                    |   RawEmbeddings,       |
  |   `Conv1D._compute_causal_padding`            |   keras_weight_ops     |
  | `keras.src.backend.set_keras_mask`            | SetKerasMask:          |
  |                                               |   keras_weight_ops     |
  | `Trainer._compile_loss` / `_compile_metrics`, | keras_loss_inside      |
  |   `CompileLoss.build` / `_flat_losses` /      |   (the compiled losses |
  |   `_y_true_build_structure` /                 |   and weighted-mean    |
  |   `_y_pred_build_structure`,                  |   metrics inside the   |
  |   `CompileMetrics.build` / `_flat_metrics` /  |   pipeline, one or     |
  |   `_flat_weighted_metrics` / `_flatten_y`,    |   several outputs;     |
  |   `MeanMetricWrapper._fn` / `_fn_kwargs`,     |   keras_multi_output_  |
  |   `Mean.total` / `count`, `keras.src.metrics. |   test too)            |
  |   reduction_metrics.                          |                        |
  |   reduce_to_samplewise_values`,               |                        |
  |   `keras.src.losses.loss.                     |                        |
  |   reduce_weighted_values` /                   |                        |
  |   `unscale_loss_for_distribution`             |                        |
  | `TensorFlowTrainer._maybe_symbolic_build`     | TensorPipeModel:       |
  |   (overridden), `Trainer._symbolic_build`     |   built before tracing |

keras_graph reads the functional config layout that `keras.Model.get_config`
writes (`inbound_nodes` args/kwargs, `__keras_tensor__` with
`keras_history`), public in the sense that saved models depend on it, and
follows Keras' functional rule that the call's `training` replaces a
recorded one (keras/src/models/functional.py, `operation_fn`).

Keras 2 is refused, not wrapped: it has no supported way to run a layer on
substituted weights (Keras 3 has keras.StatelessScope and stateless_call),
and a TensorPipe layer's FProp(theta) and the pipeline's recompute pass
must run the layer on the weights they are handed.
"""

import contextlib
import importlib
import random
from typing import Any, List, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

# Types a text-serialisable Params value may hold (ToText / FromText).
_TEXT_LEAVES = (type(None), bool, int, float, str)


def IsKeras2(obj: Any) -> bool:
  """Whether `obj` is a Keras 2 (tf-keras) object (layer, model, class)."""
  module = (obj.__module__ if isinstance(obj, type) else
            type(obj).__module__) or ''
  return module.split('.')[0] == 'tf_keras' or module.startswith(
      'keras.engine') or module.startswith('keras.src.engine')


def Keras2Error(owner: str, what: str, obj: Any) -> TypeError:
  """The TypeError for a Keras 2 object where a Keras 3 one is needed."""
  return TypeError(
      f'{owner}: {what} is a Keras 2 (tf_keras) {type(obj).__name__}; '
      'KerasLayer wraps Keras 3 objects (`import keras`, or tf.keras in TF '
      '2.21) because only Keras 3 can run a layer on substituted weights '
      '(keras.StatelessScope / stateless_call), which FProp(theta) and the '
      'recompute pass need. Rebuild it with Keras 3: the same code with '
      '`import keras` instead of tf_keras, or keras.layers.deserialize('
      "{'class_name': ..., 'config': layer.get_config()})")


def CheckTextValue(owner: str, key: str, value: Any) -> None:
  """Raises TypeError unless `value` is plain text data (ToText-able).

  Args:
    owner: what the value belongs to, for the message.
    key: the Params key (and path below it) holding the value.
    value: None, bool, int, float, str, or lists / tuples / str-keyed dicts
      of them.

  Raises:
    TypeError: naming the key path, the type found and the fix.
  """
  if isinstance(value, _TEXT_LEAVES):
    if isinstance(value, float) and not np.isfinite(value):
      raise TypeError(f'{owner}: {key}={value!r} is not a finite number')
    return
  if isinstance(value, (list, tuple)):
    for i, v in enumerate(value):
      CheckTextValue(owner, f'{key}[{i}]', v)
    return
  if isinstance(value, dict):
    for k, v in value.items():
      if not isinstance(k, str):
        raise TypeError(f'{owner}: {key} has the non-string key {k!r}; '
                        'Keras configs and keyword arguments use string keys')
      CheckTextValue(owner, f'{key}[{k!r}]', v)
    return
  if IsKeras2(value):
    raise Keras2Error(owner, key, value)
  if isinstance(value, (keras.Layer, keras.Operation)) or hasattr(
      value, 'get_config'):
    raise TypeError(
        f'{owner}: {key} holds the Keras object {type(value).__name__} '
        f'{getattr(value, "name", "")!r}, which Params cannot write as text '
        '(ToText / FromText, params.txt); give its config instead: '
        'keras.saving.serialize_keras_object(obj), or a factory name')
  raise TypeError(
      f'{owner}: {key} holds a {type(value).__module__}.'
      f'{type(value).__qualname__} ({value!r:.60}), which Params cannot '
      'write as text (ToText / FromText, params.txt); use numbers, strings, '
      'lists and dicts (a Keras config: keras.saving.serialize_keras_object), '
      'or build the object inside a factory named by keras_factory')


def ResolveFactory(owner: str, name: str):
  """Imports `module.path.attr` (the longest importable module prefix)."""
  parts = name.split('.')
  for i in range(len(parts) - 1, 0, -1):
    try:
      obj = importlib.import_module('.'.join(parts[:i]))
    except ImportError:
      continue
    try:
      for attr in parts[i:]:
        obj = getattr(obj, attr)
    except AttributeError:
      continue
    if not callable(obj):
      raise TypeError(f'{owner}: keras_factory={name!r} is a '
                      f'{type(obj).__name__}, not a callable')
    return obj
  raise ValueError(f'{owner}: keras_factory={name!r} names nothing '
                   'importable; give module.path.name of a module-level '
                   "function or class, e.g. 'keras.layers.Dense'")



class SeededPythonRandom:
  """Seeds Python's `random` (Keras' default initializer seeds) in a block.

  Keras initializers without a seed draw one from Python's `random` when
  they are made; seeding it while the object is built makes the initial
  weights a function of the layer path and random_seed, like every
  TensorPipe layer's. The caller's random state is restored afterwards.
  """

  def __init__(self, seed: int):
    self._seed = seed

  def __enter__(self):
    self._state = random.getstate()
    random.seed(self._seed)

  def __exit__(self, *args):
    random.setstate(self._state)


@contextlib.contextmanager
def NoAllocation():
  """Keras variables made inside get no storage (deferred initialisation).

  Keras defers the initialisation of variables created in a StatelessScope
  and registers them for a later `initialize_all_variables`; the
  registrations made inside are dropped on exit so that nothing allocates
  them later: objects built inside are only good for shapes, configs and
  costs. Building a Keras model inside runs no TensorFlow op, so it does not
  initialise TensorFlow's devices (experiments make Params before the
  trainer sets up logical devices).
  """
  from keras.src.backend.common import global_state  # pylint: disable=g-import-not-at-top
  key = 'uninitialized_variables'
  before = list(global_state.get_global_attribute(key, []) or [])
  try:
    with keras.StatelessScope(initialize_variables=False):
      yield
  finally:
    global_state.set_global_attribute(key, before)


def FlattenLayers(obj) -> List[Any]:
  """The Keras object and all its sublayers, depth first, deduplicated."""
  # Keras 3 has no public recursive walk; _flatten_layers is what its own
  # Model.summary and saving use.
  return list(obj._flatten_layers(include_self=True, recursive=True))  # pylint: disable=protected-access


def RebindVariable(keras_variable, variable) -> None:
  """Makes a Keras variable read and write `variable` (a tf.Variable)."""
  keras_variable._value = variable  # pylint: disable=protected-access


def NoiseShape(layer, inputs) -> Any:
  """A SpatialDropout's noise shape for `inputs` (Keras' own rule)."""
  return layer._get_noise_shape(inputs)  # pylint: disable=protected-access


def SeedGenerators(layer) -> List[Any]:
  """The keras.random.SeedGenerators a layer draws from."""
  return list(getattr(layer, '_seed_generators', []))


def InSymbolicScope() -> bool:
  """Whether Keras is tracing a model only for its output specs."""
  try:
    from keras.src.backend.common import symbolic_scope  # pylint: disable=g-import-not-at-top
  except ImportError:
    return False
  return symbolic_scope.in_symbolic_scope()


def FinalizeState(obj) -> None:
  """Re-derives the state Keras computes from weights outside `call`.

  Keras' `Normalization` reads `mean` / `variance` tensors that
  `finalize_state()` derives from its `adapt_mean` / `adapt_variance`
  weights after `adapt` or a load, but not after `set_weights`: called
  after new weights are assigned (TensorPipeModel.to_keras), as Keras'
  legacy loader does for every layer with weights.
  """
  for layer in FlattenLayers(obj):
    if layer.weights and callable(getattr(layer, 'finalize_state', None)):
      layer.finalize_state()


@contextlib.contextmanager
def DerivedState(layer):
  """A Normalization's `mean` / `variance` derived inside the block.

  From the weights in effect (a substituted theta inside a StatelessScope)
  for an adapted layer, as constants of the current graph for one given a
  mean and variance; the layer's own tensors are put back on exit, so no
  graph tensor outlives the call.
  """
  saved = layer.mean, getattr(layer, 'variance', None)
  if layer.input_mean is None:
    layer.finalize_state()
  else:
    layer.mean, layer.variance = (
        tf.constant(np.asarray(t)) for t in saved)
  try:
    yield
  finally:
    layer.mean, layer.variance = saved


def WeightOrder(model: Any, layers: Optional[Sequence[Any]] = None
                ) -> List[List[Any]]:
  """[Keras layer name, index in that layer's weights] per model weight.

  The order of `model.weights` (what `get_weights` / `set_weights` use),
  stated by the layer of `layers` (default: the model's top-level layers)
  that holds each weight.
  """
  owner = {}
  for layer in model.layers if layers is None else layers:
    for j, w in enumerate(layer.weights):
      owner.setdefault(id(w), [layer.name, j])
  order = []
  for w in model.weights:
    if id(w) not in owner:
      raise ValueError(f'keras_graph: weight {w.path!r} of model '
                       f'{model.name!r} belongs to no layer of the model')
    order.append(owner[id(w)])
  return order


def SubstitutedValue(variable) -> Optional[Any]:
  """The tensor a StatelessScope substitutes for a Keras variable, as it
  was given (not autocast); None outside a scope that maps it."""
  from keras.src.backend.common import stateless_scope  # pylint: disable=g-import-not-at-top
  scope = stateless_scope.get_stateless_scope()
  if scope is None:
    return None
  return scope.get_current_value(variable)


def AutocastOf(variable) -> Optional[Any]:
  """The cast Keras applies to `variable`'s value when it is read here (a
  function of the value; its AutocastScope, under mixed precision), or
  None where it applies none. Keras' own `maybe_cast`, kept for a later
  call outside the scope (a weight-gradient cell)."""
  from keras.src import backend  # pylint: disable=g-import-not-at-top
  scope = backend.get_autocast_scope()
  if scope is None or not getattr(variable, '_autocast', True):
    return None
  return scope.maybe_cast


def RawKernel(layer) -> Any:
  """The kernel variable of a Dense, EinsumDense or convolution (its
  `kernel` property derives a tensor under LoRA or quantization)."""
  return layer._kernel  # pylint: disable=protected-access


def RawEmbeddings(layer) -> Any:
  """The table variable of an Embedding (see RawKernel)."""
  return layer._embeddings  # pylint: disable=protected-access


def SetKerasMask(tensor, mask) -> None:
  """Attaches a Keras mask to a tensor, as Keras' layers do in `call`."""
  from keras.src.backend import set_keras_mask  # pylint: disable=g-import-not-at-top
  set_keras_mask(tensor, mask)
