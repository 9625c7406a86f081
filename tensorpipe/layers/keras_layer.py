"""KerasLayer: a Keras 3 layer or model as a functional TensorPipe layer.

A KerasLayer builds its own private Keras object from its Params (a factory's
dotted name plus keyword arguments, or a Keras config dict), so its Params
stay text (ToText / FromText) like every other layer's. Its weights are
TensorPipe variables made by `CreateVariable`, one per Keras weight, named
by the weight's Keras path (e.g. `kernel`, or `dense_1__kernel` inside a
wrapped model), placed on the partition's device and keyed by layer path in
checkpoints. The Keras object's variables are rebound to them, so the Keras
object holds no copy of its own.

FProp(theta, x) is functional: the weights in `theta` are substituted for
the Keras variables with `keras.StatelessScope` (the mechanism under Keras'
`stateless_call`) and the object is called through `__call__`, so that
`training` reaches every nested layer as Keras itself passes it. Keras'
own state updates inside the scope are discarded.

The Keras object is made, built and rebound by keras_rebuild.py: a
BatchNormalization reports its batch statistics, so that the moving
averages are updated once per step from all micro-batches (the recompute
pass reports into a discarded collector); a Dropout draws a per-example
mask with `py_utils.StatelessUniform`, so the forward and the recompute
pass draw the same mask, and it does not depend on K or T; a Normalization
derives its mean and variance from the weights in effect; the mode of the
call (`training`) reaches every nested layer; and a custom layer whose
sublayers are built by its first call is called once on symbolic inputs.

Other random Keras layers (GaussianNoise, GaussianDropout, AlphaDropout,
random augmentation) keep Keras' code; their SeedGenerator state is set
from the sublayer seed, step seed and example offset for each call, so the
recompute pass reproduces the forward pass, but their draws depend on T.

A Keras layer called in several pipeline stages (keras_graph: a causal LM's
token embedding, called again with reverse=True) is one KerasLayer holding
its variables in the first stage and, in each later one, a KerasLayer with
`tied_to` that creates none and reads them (`TiedWeights`; the pipeline
passes them in theta: tensorpipe/tied_weights.py).

FPropMeta comes from Keras' shape inference (a symbolic call on a Keras
object built without allocating weights) and the weights' sizes; FLOPs are
counted from the ops of one traced inference call (`flops.CountFlops`: 2 m k
n per matmul, 2 x output size x filter taps per convolution, one per element
for element-wise ops), or set with `flops_per_example`.

Keras 2 (tf-keras) is not supported: it has no supported way to run a layer
on substituted weights (no stateless call, no stateless scope), which
FProp(theta) and the recompute pass need; a tf_keras object gets a TypeError
that says how to rebuild it in Keras 3.

Usage:
  p = KerasLayer.Params().Set(
      name='fc1', keras_factory='keras.layers.Dense',
      keras_kwargs={'units': 64, 'activation': 'relu'}, input_shape=[784])
  # or from a Keras config:
  p = KerasLayer.Params().Set(
      name='fc1', keras_config=keras.saving.serialize_keras_object(layer))
"""

import inspect
import json
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import errors
from tensorpipe import flops as flops_lib
from tensorpipe import keras_utils
from tensorpipe import py_utils
from tensorpipe.layers import keras_rebuild
from tensorpipe.nested_map import NestedMap


def _IsValidKey(key: str) -> bool:
  try:
    NestedMap.CheckKey(key)
  except ValueError:
    return False
  return True


def _VariableKey(obj, variable, taken: set) -> str:
  """A NestedMap key for a Keras weight: its path below `obj`, '__'-joined.

  E.g. 'kernel' for a Dense's kernel, 'dense_1__kernel' for the kernel of
  sublayer 'dense_1' of a wrapped model.
  """
  parts = variable.path.split('/')
  if len(parts) > 1 and parts[0] == obj.name:
    parts = parts[1:]
  base = '__'.join(re.sub(r'\W', '_', part) for part in parts) or 'w'
  if base[0].isdigit():
    base = 'w_' + base
  key, n = base, 1
  while key in taken or not _IsValidKey(key):
    key = f'{base}_{n}'
    n += 1
  taken.add(key)
  return key


def _DeclaredBatchSizes(obj) -> List[int]:
  """Batch sizes the Keras object's inputs are fixed to (keras.Input)."""
  sizes = []
  try:
    inputs = obj.inputs
  except (AttributeError, ValueError):
    inputs = None
  for t in tf.nest.flatten(inputs or []):
    shape = getattr(t, 'shape', None)
    if shape is not None and len(shape) and shape[0] is not None:
      sizes.append(int(shape[0]))
  return sizes


def _CheckDeclaredBatch(p, declared: Sequence[int], batch: Optional[int],
                        shapes) -> None:
  """Raises if the Keras model's inputs fix a batch size other than batch."""
  if batch is None:
    return
  for size in declared:
    if size != batch:
      raise ValueError(
          f'{keras_rebuild.Owner(p)}: the Keras model is built for batch '
          f'size {size} (its '
          f'keras.Input has batch_size={size}) but gets inputs {shapes} with '
          f'batch {batch}; a pipeline feeds each partition micro-batches of '
          'N/T examples (and pads a last partial batch), so build it without '
          'a fixed batch size: keras.Input(shape=...) instead of '
          'keras.Input(batch_size=...)')


def _CheckDenseSpecs(p, outputs) -> None:
  """Raises if an output (KerasTensor or tensor) is ragged or sparse."""
  for i, out in enumerate(tf.nest.flatten(outputs)):
    kind = None
    if isinstance(out, tf.RaggedTensor) or getattr(out, 'ragged', False):
      kind = 'ragged'
    elif isinstance(out, tf.SparseTensor) or getattr(out, 'sparse', False):
      kind = 'sparse'
    if kind:
      raise ValueError(
          f'{keras_rebuild.Owner(p)}: output {i} of the Keras layer is a '
          f'{kind} tensor, '
          'which cannot cross a pipeline boundary (partitions exchange dense '
          'tensors of a fixed shape); make the layer return a dense tensor '
          '(e.g. sparse=False / ragged=False, or end it with .to_tensor() / '
          'tf.sparse.to_dense), or keep the ragged or sparse part inside one '
          'KerasLayer')


def _ToKerasInputs(inputs: Tuple[Any, ...]) -> Any:
  if len(inputs) == 1:
    x = inputs[0]
    return dict(x) if isinstance(x, NestedMap) else x
  return list(inputs)


def _FromKerasOutputs(out: Any) -> Any:
  if isinstance(out, dict):
    return NestedMap(out)
  if isinstance(out, list):
    return tuple(out)
  return out


class _KerasInit(base_layer.WeightInit):
  """A weight's initial value: the value Keras initialised it with."""

  def __init__(self, value: tf.Tensor):
    super().__init__('keras', 1.0)
    self._value = value

  def Initialize(self, shape, dtype, seed):
    del seed  # Keras drew the value (seeded by the layer path, see above).
    value = tf.cast(self._value, dtype)
    if value.shape.as_list() != [int(d) for d in shape]:
      raise ValueError(f'Keras initial value of shape {value.shape} does not '
                       f'match the weight shape {list(shape)}')
    return value


class KerasLayer(base_layer.BaseLayer):
  """A Keras 3 layer or model run functionally on TensorPipe weights.

  Usage:
    p = KerasLayer.Params().Set(
        name='conv', keras_factory='keras.layers.Conv2D',
        keras_kwargs={'filters': 32, 'kernel_size': 3, 'padding': 'same'},
        input_shape=[28, 28, 1])
    layer = p.Instantiate()
    y = layer.FPropDefaultTheta(x)     # training mode: batch statistics

  Dtypes are Keras': the weights take the Keras variables' dtypes and the
  call follows the layer's dtype policy (set `dtype` in its config or
  kwargs, e.g. 'float64' or 'mixed_bfloat16'); `dtype` and `fprop_dtype`
  of these Params are not used. The batch is on axis 0, as in Keras.
  """
  ABSTRACT_WEIGHT_OPS = False  # weight ops are bound to real weights only

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('keras_factory', None, "Dotted name of a module-level callable "
             "returning a Keras 3 layer or model, e.g. 'keras.layers.Dense' "
             "or 'models.keras_models.FashionMnistCnn'; set this or "
             'keras_config.')
    p.Define('keras_kwargs', None, 'Keyword arguments of keras_factory (a '
             'dict of numbers, strings, lists and dicts).')
    p.Define('keras_config', None, 'A Keras config dict, '
             'keras.saving.serialize_keras_object(layer) (a built layer\'s '
             'carries its build shape); set this or keras_factory.')
    p.Define('input_shape', None, 'Shape of one example of the input, '
             'without the batch axis, e.g. [28, 28, 1] (a list of such '
             'shapes for a layer of several inputs); needed to build a Keras '
             'object its factory or config leaves unbuilt.')
    p.Define('input_dtype', None, "Dtype name of the input the Keras object "
             "is built on, e.g. 'int32' for an Embedding; None means its "
             'compute dtype.')
    p.Define('flops_per_example', None, 'If set, the forward FLOPs of one '
             'example, used by FPropMeta instead of counting the ops of a '
             'traced call (for layers the count gets wrong).')
    p.Define('tied_to', None, 'Path of another KerasLayer of the same '
             'config whose Keras layer this one calls again in a later stage '
             '(a causal LM\'s token embedding, with reverse=True); this one '
             'creates no variables and reads that layer\'s, passed in its '
             'theta (tied_weights.py). None: its own weights.')
    p.Define('tied_weights', None, 'With tied_to: indices (in `weights` '
             'order) of the weights its calls read (from the traced call: an '
             'untied ReversibleEmbedding\'s reverse call reads only '
             'reverse_embeddings); only these are passed. None: all.')
    return p

  # -- construction --------------------------------------------------------

  @classmethod
  def _Validate(cls, p) -> None:
    owner = keras_rebuild.Owner(p)
    if (p.keras_factory is None) == (p.keras_config is None):
      raise ValueError(f'{owner}: set exactly one of keras_factory (a '
                       'dotted name) and keras_config (a Keras config dict); '
                       f'got keras_factory={p.keras_factory!r} and '
                       f'keras_config of type {type(p.keras_config).__name__}')
    if p.keras_factory is not None and not isinstance(p.keras_factory, str):
      if keras_utils.IsKeras2(p.keras_factory):
        raise keras_utils.Keras2Error(owner, 'keras_factory', p.keras_factory)
      what = getattr(p.keras_factory, '__qualname__', type(
          p.keras_factory).__name__)
      raise TypeError(f'{owner}: keras_factory must be the dotted name (a '
                      f'string) of a module-level callable, got {what!r}; '
                      'Params are text (ToText / FromText): write e.g. '
                      "'keras.layers.Dense' and put its arguments in "
                      'keras_kwargs')
    if p.keras_kwargs is not None:
      if not isinstance(p.keras_kwargs, dict):
        raise TypeError(f'{owner}: keras_kwargs must be a dict, got '
                        f'{type(p.keras_kwargs).__name__}')
      if p.keras_factory is None:
        raise ValueError(f'{owner}: keras_kwargs is set without '
                         'keras_factory; put them in the config instead')
      keras_utils.CheckTextValue(owner, 'keras_kwargs', p.keras_kwargs)
    if p.keras_config is not None:
      if not isinstance(p.keras_config, dict):
        keras_utils.CheckTextValue(owner, 'keras_config', p.keras_config)
        raise TypeError(f'{owner}: keras_config must be a dict, got '
                        f'{type(p.keras_config).__name__}')
      keras_utils.CheckTextValue(owner, 'keras_config', p.keras_config)
    if p.input_shape is not None:
      for shape in keras_rebuild.PerExampleShape(p):
        if not all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                   or d is None for d in shape):
          raise ValueError(f'{owner}: input_shape={p.input_shape!r} must be '
                           'one example\'s shape (positive ints, no batch '
                           'axis), e.g. [28, 28, 1]')
    if p.tied_weights is not None and (
        p.tied_to is None or not isinstance(p.tied_weights, (list, tuple)) or
        not all(type(i) is int and i >= 0 for i in p.tied_weights)):  # pylint: disable=unidiomatic-typecheck
      raise ValueError(f'{owner}: tied_weights={p.tied_weights!r} must be a '
                       'list of weight indices (ints >= 0), with tied_to set')
    if p.flops_per_example is not None and (
        not isinstance(p.flops_per_example, (int, float)) or
        isinstance(p.flops_per_example, bool) or p.flops_per_example < 0):
      raise ValueError(f'{owner}: flops_per_example='
                       f'{p.flops_per_example!r} must be a number >= 0')

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self._Validate(p)
    abstract = base_layer._abstract_scope.records is not None  # pylint: disable=protected-access
    # A tied reader's object gets no storage either: every call substitutes
    # the owner's weights (theta) for the variables it reads.
    if abstract or p.tied_to is not None:
      with keras_utils.NoAllocation():
        obj = keras_rebuild.BuildKerasObject(p, self.LayerSeed())
    else:
      obj = keras_rebuild.BuildKerasObject(p, self.LayerSeed())
    weights, taken = [], set()
    if p.tied_to is not None:
      _CheckTiedReader(p, obj)
    if any(i >= len(obj.weights) for i in p.tied_weights or ()):
      raise ValueError(f'{keras_rebuild.Owner(p)}: tied_weights='
                       f'{list(p.tied_weights)} names a weight beyond the '
                       f'{len(obj.weights)} of Keras layer {obj.name!r}')
    unread = []  # a tied reader's weights its calls do not read
    for i, kv in enumerate(obj.weights):
      key = _VariableKey(obj, kv, taken)
      if p.tied_to is not None:  # the owner's weights, passed in theta
        read = p.tied_weights is None or i in p.tied_weights
        (weights if read else unread).append((kv, key))
        continue
      var = self.CreateVariable(key, base_layer.WeightParams(
          shape=list(kv.shape), init=None if abstract else _KerasInit(kv.value),
          dtype=tf.as_dtype(kv.dtype), trainable=kv.trainable))
      if not abstract:
        # Rebind the Keras variable to the TensorPipe one: the Keras object
        # then holds no copy of its weights and reads ours in plain calls.
        keras_utils.RebindVariable(kv, var)
      weights.append((kv, key))
    seeds = {}
    for i, layer in enumerate(keras_utils.FlattenLayers(obj)):
      seeds[id(layer)] = py_utils.LayerSeed(
          f'{self.path or self.layer_name}/keras_{i}', p.random_seed)
    reporters = []
    if not abstract:
      reporters = keras_rebuild.BindPipelineCalls(
          obj, self.path or self.layer_name, seeds,
          {id(kv): self.vars[key] for kv, key in weights
           if key in self.vars})
    gens = []
    for layer in keras_utils.FlattenLayers(obj):
      for gen in keras_utils.SeedGenerators(layer):
        if all(gen is not g for g, _ in gens):
          gens.append((gen, seeds[id(layer)]))
    # Plain attributes: tf.Module must not walk the Keras object (its
    # variables are ours, tracked under their keys).
    object.__setattr__(self, '_keras', _Holder(obj))
    object.__setattr__(self, '_weights', weights)
    object.__setattr__(self, '_unread', unread)
    object.__setattr__(self, '_seed_gens', gens)
    object.__setattr__(self, '_seeds', seeds)
    object.__setattr__(self, '_bn_reporters', reporters)
    # Whether the output depends on the mode (py_utils.IsTraining warns
    # once when such a layer trains only for want of a mode block).
    object.__setattr__(self, '_mode_dependent',
                       keras_rebuild.ModeDependent(obj))
    object.__setattr__(self, '_declared_batch', _DeclaredBatchSizes(obj))

  # -- accessors -----------------------------------------------------------

  def TiedWeights(self) -> Dict[str, str]:
    """The weights read from `tied_to`'s layer (same keys), if set: all or
    `tied_weights`; one left out is NaN in CallKeras, never stale."""
    p = self.params
    if p.tied_to is None:
      return {}
    return {key: f'{p.tied_to}/{key}' for _, key in self._weights}

  @property
  def keras_object(self):
    """The private Keras object; its variables are this layer's."""
    return self._keras.obj

  def KerasWeights(self) -> List[Tuple[Any, str]]:
    """(Keras variable, theta key) pairs in `keras_object.weights` order."""
    return list(self._weights)

  def SublayerSeed(self, keras_sublayer) -> int:
    """The seed of a sublayer's randomness (Dropout masks)."""
    if id(keras_sublayer) not in self._seeds:
      raise ValueError(f'{keras_sublayer!r} is not a sublayer of '
                       f'KerasLayer {self.layer_name!r}')
    return self._seeds[id(keras_sublayer)]

  def AssignFromKeras(self, keras_obj) -> None:
    """Copies the weights of a Keras object of the same structure.

    Args:
      keras_obj: a built Keras layer or model with the same weights (in
        `weights` order, same shapes), e.g. the layer this one's config was
        taken from.

    Raises:
      ValueError: if the weights do not match in number or shape.
    """
    theirs = list(keras_obj.weights)
    if len(theirs) != len(self._weights):
      raise ValueError(
          f'KerasLayer {self.layer_name!r}: {keras_obj.name!r} has '
          f'{len(theirs)} weights but this layer has {len(self._weights)}; '
          'copy from the Keras layer this one was made from (a custom '
          'layer that makes weights in call() needs a build() method)')
    for (kv, key), w in zip(self._weights, theirs):
      if list(w.shape) != list(kv.shape):
        raise ValueError(
            f'KerasLayer {self.layer_name!r}: weight {key!r} has shape '
            f'{list(kv.shape)} but {w.path!r} has {list(w.shape)}')
      self.vars[key].assign(tf.cast(w.value, self.vars[key].dtype))

  # -- forward -------------------------------------------------------------

  def _SeedState(self, layer_seed: int, dtype) -> tf.Tensor:
    """A Keras SeedGenerator state for this call: seed, offset, step."""
    ctx = py_utils.Current()
    first = tf.cast(layer_seed, tf.int64) + tf.cast(
        ctx.example_offset, tf.int64) * 1000003
    return tf.cast(tf.stack([first, tf.cast(ctx.step_seed, tf.int64)]),
                   dtype)

  def FProp(self, theta, *inputs):
    """Calls the Keras object with the weights in `theta`.

    Args:
      theta: NestedMap of this layer's weights (keys as in KerasWeights).
      *inputs: the Keras call's input: one tensor (or NestedMap, passed as a
        dict), or several, passed as a list; batch on axis 0.

    Returns:
      The Keras outputs: a tensor, a tuple (a list output) or a NestedMap.

    Raises:
      ValueError: for a batch axis other than 0, a Keras object built for
        another batch size, or a ragged / sparse output.
    """
    if not inputs:
      raise ValueError(
          f'{keras_rebuild.Owner(self.params)}: FProp needs an input')
    return _FromKerasOutputs(self.CallKeras(theta, (_ToKerasInputs(inputs),),
                                            {}))

  def CallKeras(self, theta, args: Tuple[Any, ...], kwargs: Dict[str, Any]):
    """Calls the Keras object as `obj(*args, **kwargs)` on `theta`'s weights.

    The call of one node of a functional Keras graph (keras_graph): `args`
    and `kwargs` are the node's recorded call arguments with tensors filled
    in. The mode (`py_utils.IsTraining`) is passed as `training`,
    replacing a recorded value, as Keras' own functional call does when fit
    or predict passes `training` (Keras keeps it in the call context of a
    layer whose `call` takes none).

    Returns:
      The Keras outputs, as Keras returns them (a tensor, list or dict).
    """
    p = self.params
    if py_utils.CurrentBatchAxis() != 0:
      raise ValueError(
          f'{keras_rebuild.Owner(p)}: Keras layers take the batch on axis '
          '0, but the '
          f'context batch axis is {py_utils.CurrentBatchAxis()}; use '
          'TensorPipeLayer batch_dim=0')
    obj = self.keras_object
    shapes = [list(x.shape) for x in tf.nest.flatten((args, kwargs))
              if hasattr(x, 'shape')]
    batch = shapes[0][0] if shapes and shapes[0] else None
    _CheckDeclaredBatch(p, self._declared_batch, batch, shapes)
    mapping = [(kv, theta[key]) for kv, key in self._weights]
    mapping += [(kv, tf.fill(kv.shape, tf.constant(float('nan'), kv.dtype)))
                for kv, _ in self._unread  # pruned unless read: loud
                if tf.as_dtype(kv.dtype).is_floating]
    for gen, seed in self._seed_gens:
      mapping.append((gen.state, self._SeedState(seed, gen.state.dtype)))
    kwargs = keras_rebuild.WithMode(
        kwargs, f'KerasLayer {self.path or self.layer_name!r}'
        if self._mode_dependent else None)
    with tf.name_scope(self.layer_name), keras.StatelessScope(
        state_mapping=mapping, collect_losses=True) as scope:
      out = obj(*args, **kwargs)
    if scope.losses:
      raise ValueError(
          f'{keras_rebuild.Owner(p)}: the Keras object added '
          f'{len(scope.losses)} loss(es) '
          '(add_loss / activity regularizers) in its call, which a '
          'KerasLayer cannot return; add the penalty to the task loss')
    _CheckDenseSpecs(p, out)
    return out

  # -- cost model ----------------------------------------------------------

  @classmethod
  def FPropMeta(cls, p, *input_shapes):
    """Output shapes from Keras' shape inference; weights; counted FLOPs."""
    cls._Validate(p)
    if any(isinstance(s, dict) for s in input_shapes):
      raise ValueError(f'{keras_rebuild.Owner(p)}: FPropMeta takes tensor '
                       'shapes, got a '
                       'dict of shapes; for a dict-input Keras model set '
                       'flops_per_example and give partitions manually')
    shapes = [base_layer.ToShape(s) for s in input_shapes]
    for s in shapes:
      if s.rank is None or s.rank < 1:
        raise ValueError(f'{keras_rebuild.Owner(p)}: input shape {s} needs '
                         'a batch axis')
    batches = {s[0] for s in shapes}
    batch = batches.pop() if len(batches) == 1 else None
    per_example = tuple(tuple(s.as_list()[1:]) for s in shapes)
    key = (_SpecKey(p), per_example)
    meta = _META_CACHE.get(key)
    if meta is None:
      meta = cls._ComputeMeta(p, [list(s) for s in per_example])
      if len(_META_CACHE) > 512:
        _META_CACHE.clear()
      _META_CACHE[key] = meta
    out_specs, num_params, flops_per_example, declared = meta
    _CheckDeclaredBatch(p, declared, batch, [s.as_list() for s in shapes])

    def WithBatch(shape):
      return tf.TensorShape([batch] + shape.as_list()[1:]) if shape.rank else (
          shape)
    out_shapes = tf.nest.map_structure(WithBatch, out_specs)
    if p.flops_per_example is not None:
      flops_per_example = float(p.flops_per_example)
    return base_layer.FPropMetaResult(flops_per_example * (batch or 0),
                                      out_shapes, num_params)

  @classmethod
  def _ComputeMeta(cls, p, per_example: List[List[Any]]):
    """(output shapes, batch None; weights; FLOPs per example; the batch
    sizes the model's inputs are fixed to), for one example's shapes.

    FLOPs are counted on a traced call of one example: a layer's forward
    cost grows linearly with the batch (examples are independent).
    """
    with keras_utils.NoAllocation():
      obj = keras_rebuild.NewKerasObject(p, 0)
      keras_rebuild.DeriveStateInCalls(obj)
      dtype = p.input_dtype or obj.compute_dtype
      declared = tuple(_DeclaredBatchSizes(obj))
      # The symbolic call builds the object on the given shapes (its
      # variables get no storage inside NoAllocation).
      try:
        out = obj(keras_rebuild.SymbolicInputs(per_example, dtype))
      except (ValueError, TypeError) as e:
        first = errors.FirstLine(e)
        raise ValueError(f'{keras_rebuild.Owner(p)}: Keras '
                         f'{type(obj).__name__} '
                         f'{obj.name!r} does not accept inputs of one-example '
                         f'shape {per_example}: {first}') from None
      _CheckDenseSpecs(p, out)
      out_specs = tf.nest.map_structure(lambda t: tf.TensorShape(t.shape), out)
      if isinstance(out_specs, dict):
        out_specs = NestedMap(out_specs)
      elif isinstance(out_specs, list):
        out_specs = tuple(out_specs)
      num_params = int(sum(int(np.prod(w.shape)) for w in obj.weights))
      flops = 0.0
      if p.flops_per_example is None:
        batch = declared[0] if declared else 1
        flops = _TracedFlops(obj, per_example, batch, dtype) / batch
    return out_specs, num_params, flops, declared


def _CheckTiedReader(p, obj) -> None:
  """Raises for a layer that cannot be called in several stages."""
  frozen = [w.path for w in obj.weights if not w.trainable]
  if frozen:
    raise ValueError(
        f'{keras_rebuild.Owner(p)}: Keras layer {obj.name!r} is called in '
        f'several pipeline stages (tied to {p.tied_to!r}), but it has '
        f'non-trainable weights ({frozen[:3]}): state such as batch-norm '
        'moving averages is updated by one stage only; keep its calls in '
        'one partition (choose cut_after so that no cut falls between '
        'them)')


class _Holder:
  """Holds an object out of sight of tf.Module's attribute walk."""

  def __init__(self, obj):
    self.obj = obj


_META_CACHE: Dict[Any, Any] = {}


def _SpecKey(p) -> str:
  return json.dumps([p.keras_factory, p.keras_kwargs, p.keras_config,
                     p.input_shape, p.input_dtype], sort_keys=True,
                    default=repr)


def _TracedFlops(obj, per_example: List[List[Any]], batch: int,
                 dtype) -> float:
  """CountFlops of one inference call of `obj` on a batch of `batch`."""
  variables = list(obj.weights)
  var_specs = [tf.TensorSpec(v.shape, v.dtype) for v in variables]
  in_specs = [tf.TensorSpec([batch] + list(s), dtype) for s in per_example]

  def Call(*args):
    xs, ws = args[:len(in_specs)], args[len(in_specs):]
    with keras.StatelessScope(state_mapping=list(zip(variables, ws))):
      return obj(xs[0] if len(xs) == 1 else list(xs), training=False) if (
          'training' in inspect.signature(obj.call).parameters) else obj(
              xs[0] if len(xs) == 1 else list(xs))
  graph = tf.function(Call, autograph=False).get_concrete_function(
      *in_specs, *var_specs).graph
  return flops_lib.CountFlops(graph)
