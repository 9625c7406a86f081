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

Two kinds of Keras layers carry state or randomness that a pipeline must
control, and their `call` is rebound on the private object:

  * BatchNormalization: Keras' own code normalises each call with its
    examples' statistics (a micro-batch in a pipeline); the layer also
    reports the per-channel count, sum and sum of squares with
    `py_utils.AddBatchStats`, and the moving averages are updated from the
    statistics of all micro-batches once per step (moving = momentum *
    moving + (1 - momentum) * statistic, Keras' formula), exactly as
    `BatchNormLayer`. The recompute pass reports into a discarded collector.
  * Dropout (and SpatialDropout1D/2D/3D): the mask is drawn per example
    with `py_utils.StatelessUniform`, keyed by the sublayer's seed, the
    step seed and the example's index in the global batch, instead of
    Keras' SeedGenerator. The forward and the recompute pass therefore
    draw the same mask, and it does not depend on K or T.

A third kind derives state from its weights outside the call:

  * Normalization: Keras' `finalize_state()` turns the adapted (or loaded)
    `adapt_mean` / `adapt_variance` weights into the `mean` / `variance`
    tensors `call` reads, so a call on theta would ignore them (and a
    traced graph capture Keras' eager tensors). The rebound `call` derives
    them from the weights in effect, inside the call (DeriveStateInCalls);
    the Keras objects of the cost model get the same `call`.

The mode of the call (`training`) is passed to every Keras object, as
Keras' functional call passes it to every layer: Keras drops it from the
call of a layer whose `call` takes none and keeps it in its call context,
where the Dropout and BatchNormalization inside a custom layer read it
(the recompute pass runs outside any Keras call, so nothing else would
carry it there).

A Keras object that comes back from its config marked built but with
unbuilt sublayers (a registered custom layer without `build()` whose
sublayers are built by its first call, as keras.io's examples write them)
is called once on symbolic inputs of its recorded shape, as Keras'
functional loader calls every layer; where that call fails, one line names
the layer and the fix (a `build()` method).

Other random Keras layers (GaussianNoise, GaussianDropout, AlphaDropout,
random augmentation) keep Keras' code; their SeedGenerator state is set
from the sublayer seed, step seed and example offset for each call, so the
recompute pass reproduces the forward pass, but their draws depend on T.

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

import copy
import functools
import inspect
import json
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import flops as flops_lib
from tensorpipe import keras_utils
from tensorpipe import py_utils
from tensorpipe.layers import normalization
from tensorpipe.nested_map import NestedMap


def _Owner(p) -> str:
  return f'KerasLayer {p.name!r}'


def _PerExampleShape(p) -> Optional[List[Any]]:
  """p.input_shape as a list of per-example shapes (None if unset)."""
  shape = p.input_shape
  if shape is None:
    return None
  if isinstance(shape, (list, tuple)) and shape and all(
      isinstance(s, (list, tuple)) for s in shape):
    return [list(s) for s in shape]
  return [list(shape)]


def _SymbolicInputs(shapes: List[List[Any]], dtype) -> Any:
  inputs = [keras.KerasTensor([None] + list(s), dtype=dtype) for s in shapes]
  return inputs[0] if len(inputs) == 1 else inputs


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
          f'{_Owner(p)}: the Keras model is built for batch size {size} (its '
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
          f'{_Owner(p)}: output {i} of the Keras layer is a {kind} tensor, '
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


def _ErrorLine(e: Exception) -> str:
  """The line of a Keras error that says what went wrong.

  Keras wraps an exception raised in a layer's call: 'Exception
  encountered when calling X.call().', for a symbolic call 'Could not
  automatically infer the output shape ...', then the cause, then
  'Arguments received by ...'.
  """
  lines = [re.sub(r'\x1b\[[0-9;]*m', '', line).strip()
           for line in str(e).splitlines()]
  lines = [line for line in lines if line]
  wrappers = ('Exception encountered when', 'Could not automatically infer')
  for line in lines:
    if line.startswith('Arguments received by'):
      break
    if not line.startswith(wrappers):
      return line
  return lines[0] if lines else type(e).__name__


def CallArgs(obj) -> set:
  """The parameter names of a Keras object's `call` (e.g. 'training')."""
  return set(inspect.signature(obj.call).parameters)


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


class KerasBatchNormStats:
  """Receives one Keras BatchNormalization's merged batch statistics.

  The reporter the rebound `call` hands to `py_utils.AddBatchStats`; the
  pipeline merges its reports over micro-batches and calls
  `UpdateMovingStats` once per step.
  """

  def __init__(self, name: str, moving_mean: tf.Variable,
               moving_variance: tf.Variable, momentum: float):
    self.name = name
    self.moving_mean = moving_mean
    self.moving_variance = moving_variance
    self.momentum = float(momentum)

  def UpdateMovingStats(self, stats: py_utils.BatchStats) -> None:
    """moving = momentum * moving + (1 - momentum) * statistic (Keras')."""
    mean, variance = stats.MeanAndVariance()
    for var, value in ((self.moving_mean, mean),
                       (self.moving_variance, variance)):
      value = tf.cast(value, var.dtype)
      var.assign(var * self.momentum + value * (1.0 - self.momentum))

  def __repr__(self) -> str:
    return f'KerasBatchNormStats({self.name!r})'


class _Once:
  """Remembers that a once-per-process warning was given."""


_FEW_VALUES_WARNING = _Once()


def _BatchNormCall(bn, reporter: KerasBatchNormStats, inputs, training=None,
                   mask=None):
  """Keras' BatchNormalization.call, also reporting the batch statistics."""
  if training and bn.trainable:
    # Once per process (a keras.applications model has dozens of them).
    normalization.WarnIfFewValuesPerChannel(
        _FEW_VALUES_WARNING, f'Keras BatchNormalization {bn.name!r} (the '
        'first of the Keras batch norms that do; said once)', inputs.shape,
        inputs.shape[bn.axis], fix='use keras.layers.LayerNormalization')
    if mask is not None:
      raise ValueError(f'Keras BatchNormalization {bn.name!r} got a mask: '
                       'masked batch statistics are not supported in a '
                       'KerasLayer; drop the mask before it')
    dtype = tf.float64 if inputs.dtype == tf.float64 else tf.float32
    x = tf.cast(inputs, dtype)
    axes = [a for a in range(x.shape.rank) if a != bn.axis % x.shape.rank]
    if x.shape.is_fully_defined():
      count = tf.constant(
          x.shape.num_elements() // x.shape[bn.axis], dtype)
    else:
      count = tf.cast(tf.size(x) // tf.shape(x)[bn.axis], dtype)
    py_utils.AddBatchStats(reporter, py_utils.BatchStats(
        count=tf.stop_gradient(count),
        total=tf.stop_gradient(tf.reduce_sum(x, axes)),
        total_sq=tf.stop_gradient(tf.reduce_sum(tf.square(x), axes))))
  # Keras' own normalisation; its moving-average assigns go to the
  # enclosing StatelessScope and are dropped.
  return type(bn).call(bn, inputs, training=training, mask=mask)


def _DropoutCall(layer, seed: int, inputs, training=False):
  """Keras Dropout with a per-example mask (py_utils.StatelessUniform)."""
  if not training or not layer.rate:
    return inputs
  shape = inputs.shape
  if shape.rank is None or not shape[1:].is_fully_defined():
    raise ValueError(f'Keras {type(layer).__name__} {layer.name!r}: input '
                     f'shape {shape} must be static (but for the batch) to '
                     'draw a per-example mask')
  if hasattr(layer, '_get_noise_shape') and type(layer).call is not (
      keras.layers.Dropout.call):
    noise = keras_utils.NoiseShape(layer, inputs)
  else:
    noise = layer.noise_shape
  mask_shape = shape.as_list()
  if noise is not None:
    for i, d in enumerate(noise):
      if i and isinstance(d, (int, np.integer)):
        mask_shape[i] = int(d)
    if isinstance(noise[0], (int, np.integer)) and int(noise[0]) == 1 and (
        mask_shape[0] != 1):
      raise ValueError(
          f'Keras {type(layer).__name__} {layer.name!r}: noise_shape={noise} '
          'shares one mask across the batch; masks must differ per example '
          '(so that micro-batches agree with the whole batch): use None for '
          'the batch axis')
  if mask_shape[0] is None:
    mask_shape[0] = tf.shape(inputs)[0]
  keep = 1.0 - float(layer.rate)
  uniform = py_utils.StatelessUniform(mask_shape, seed, batch_axis=0)
  scaled = tf.cast(uniform < keep, inputs.dtype) / tf.cast(keep, inputs.dtype)
  return inputs * scaled


def _NormalizationCall(layer, inputs):
  """Keras' Normalization.call on a mean and variance derived in the call."""
  with keras_utils.DerivedState(layer):
    return type(layer).call(layer, inputs)


def DeriveStateInCalls(obj) -> None:
  """Makes obj's Normalization sublayers derive their state in each call.

  Keras derives the `mean` / `variance` tensors a Normalization's `call`
  reads from its weights outside the call (`finalize_state`, after adapt
  or a load): a call on substituted weights would ignore them, and a
  traced graph would capture Keras' eager tensors. The rebound `call`
  derives them from the weights in effect (theta inside the
  StatelessScope); see keras_utils.DerivedState.
  """
  if not isinstance(obj, keras.Layer):
    return  # a keras.ops Operation
  for layer in keras_utils.FlattenLayers(obj):
    if isinstance(layer, keras.layers.Normalization):
      object.__setattr__(layer, 'call', functools.partial(
          _NormalizationCall, layer))


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
    return p

  # -- construction --------------------------------------------------------

  @classmethod
  def _Validate(cls, p) -> None:
    owner = _Owner(p)
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
      for shape in _PerExampleShape(p):
        if not all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                   or d is None for d in shape):
          raise ValueError(f'{owner}: input_shape={p.input_shape!r} must be '
                           'one example\'s shape (positive ints, no batch '
                           'axis), e.g. [28, 28, 1]')
    if p.flops_per_example is not None and (
        not isinstance(p.flops_per_example, (int, float)) or
        isinstance(p.flops_per_example, bool) or p.flops_per_example < 0):
      raise ValueError(f'{owner}: flops_per_example='
                       f'{p.flops_per_example!r} must be a number >= 0')

  @classmethod
  def _NewKerasObject(cls, p, seed: int):
    """Builds the Keras object described by `p` (unbuilt or built)."""
    owner = _Owner(p)
    with keras_utils.SeededPythonRandom(seed):
      if p.keras_factory is not None:
        factory = keras_utils.ResolveFactory(owner, p.keras_factory)
        try:
          obj = factory(**(p.keras_kwargs or {}))
        except TypeError as e:
          raise TypeError(f'{owner}: {p.keras_factory}(**{p.keras_kwargs!r}) '
                          f'failed: {e}') from None
        what = f'the object keras_factory {p.keras_factory!r} returned'
      else:
        try:
          # A copy: Keras 3.15 empties a functional model's config dict in
          # place, and the Params' dict is deserialised again on every build.
          obj = keras.saving.deserialize_keras_object(
              copy.deepcopy(p.keras_config))
        except (TypeError, ValueError) as e:
          first = (str(e).strip().splitlines() or [''])[0]
          raise ValueError(
              f'{owner}: keras_config cannot be deserialised by Keras 3: '
              f'{first} (a Lambda layer needs safe_mode=False: write a '
              'keras.Layer subclass registered with '
              '@keras.saving.register_keras_serializable, or name a factory)'
          ) from None
        what = 'the object keras_config describes'
    if keras_utils.IsKeras2(obj):
      raise keras_utils.Keras2Error(owner, what, obj)
    if not isinstance(obj, keras.Layer):
      raise TypeError(f'{owner}: {what} is a {type(obj).__name__}, not a '
                      'Keras 3 layer or model')
    return obj

  @classmethod
  def _BuildSublayers(cls, p, obj, seed: int) -> None:
    """Calls a built object with unbuilt sublayers once, symbolically.

    A custom layer without `build()` whose sublayers are made in
    `__init__` and built by its first call comes back from its config
    marked built (its build_config) without weights. Keras' functional
    loader calls every layer on symbolic inputs, which builds them; this
    does the same, on the recorded shapes (input_shape, else the
    build_config's).
    """
    unbuilt = [l.name for l in keras_utils.FlattenLayers(obj) if not l.built]
    if not unbuilt:
      return
    dtype = p.input_dtype or obj.compute_dtype
    shapes = _PerExampleShape(p)
    build = (p.keras_config or {}).get('build_config') or {}
    if shapes is not None:
      args, kwargs, what = (_SymbolicInputs(shapes, dtype),), {}, shapes
    elif 'input_shape' in build:
      what = build['input_shape']
      args, kwargs = (keras.KerasTensor(what, dtype=dtype),), {}
    elif 'shapes_dict' in build:
      what = build['shapes_dict']
      args, kwargs = (), {k[:-len('_shape')]: keras.KerasTensor(v, dtype=dtype)
                          for k, v in what.items()}
    else:
      args, kwargs, what = None, {}, None
    try:
      if args is None:
        raise ValueError('its config records no input shape')
      with keras_utils.SeededPythonRandom(seed + 1):
        obj(*args, **kwargs)
    except Exception as e:  # pylint: disable=broad-except
      first = _ErrorLine(e)
      raise ValueError(
          f'{_Owner(p)}: Keras {type(obj).__name__} {obj.name!r} comes back '
          f'from its config marked built, but its sublayers {unbuilt} are '
          f'not, and calling it on symbolic inputs of its recorded shape '
          f'{what} failed ({first}); give {type(obj).__name__} a build() '
          'method that builds its sublayers (e.g. self.dense.build('
          'input_shape))') from None

  @classmethod
  def _BuildKerasObject(cls, p, seed: int):
    """The built Keras object of `p` (on the current device)."""
    obj = cls._NewKerasObject(p, seed)
    if not obj.built:
      shapes = _PerExampleShape(p)
      if shapes is None:
        raise ValueError(
            f'{_Owner(p)}: the Keras {type(obj).__name__} {obj.name!r} is '
            'not built and input_shape is not set; set input_shape to one '
            "example's shape, e.g. [28, 28, 1]")
      dtype = p.input_dtype or obj.compute_dtype
      with keras_utils.SeededPythonRandom(seed + 1):
        obj(_SymbolicInputs(shapes, dtype))
    else:
      cls._BuildSublayers(p, obj, seed)
    DeriveStateInCalls(obj)
    for layer in keras_utils.FlattenLayers(obj):
      if isinstance(layer, keras.layers.BatchNormalization):
        if layer.renorm or layer.synchronized:
          flag = 'renorm' if layer.renorm else 'synchronized'
          raise ValueError(
              f'{_Owner(p)}: Keras BatchNormalization {layer.name!r} has '
              f'{flag}=True, which KerasLayer does not support: a pipeline '
              'normalises with micro-batch statistics and updates the moving '
              'averages once per step (summed over replicas); set '
              f'{flag}=False')
      for attr in ('activity_regularizer',):
        if getattr(layer, attr, None) is not None:
          raise ValueError(
              f'{_Owner(p)}: Keras layer {layer.name!r} has an '
              f'{attr}, whose loss a KerasLayer cannot return; remove it '
              'and add the penalty to the task loss')
    for w in obj.weights:
      if getattr(w, 'regularizer', None) is not None:
        raise ValueError(
            f'{_Owner(p)}: Keras weight {w.path!r} has a regularizer, whose '
            'loss a KerasLayer cannot return; remove it and use the task\'s '
            'task.train.l2_regularizer_weight (or add the penalty to the '
            'Keras loss of a TensorPipeModel)')
    return obj

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self._Validate(p)
    abstract = base_layer._abstract_scope.records is not None  # pylint: disable=protected-access
    if abstract:
      with keras_utils.NoAllocation():
        obj = self._BuildKerasObject(p, self.LayerSeed())
    else:
      obj = self._BuildKerasObject(p, self.LayerSeed())
    weights, taken = [], set()
    for kv in obj.weights:
      key = _VariableKey(obj, kv, taken)
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
      by_id = {id(kv): key for kv, key in weights}
      for layer in keras_utils.FlattenLayers(obj):
        if isinstance(layer, keras.layers.BatchNormalization):
          reporter = KerasBatchNormStats(
              f'{self.path or self.layer_name}/{layer.name}',
              self.vars[by_id[id(layer.moving_mean)]],
              self.vars[by_id[id(layer.moving_variance)]], layer.momentum)
          reporters.append(reporter)
          object.__setattr__(layer, 'call', functools.partial(
              _BatchNormCall, layer, reporter))
        elif isinstance(layer, keras.layers.Dropout):
          object.__setattr__(layer, 'call', functools.partial(
              _DropoutCall, layer, seeds[id(layer)]))
    gens = []
    for layer in keras_utils.FlattenLayers(obj):
      for gen in keras_utils.SeedGenerators(layer):
        if all(gen is not g for g, _ in gens):
          gens.append((gen, seeds[id(layer)]))
    # Plain attributes: the Keras object must not be walked by tf.Module
    # (its variables are ours, tracked under their keys).
    object.__setattr__(self, '_keras', _Holder(obj))
    object.__setattr__(self, '_weights', weights)
    object.__setattr__(self, '_seed_gens', gens)
    object.__setattr__(self, '_seeds', seeds)
    object.__setattr__(self, '_bn_reporters', reporters)
    # Whether the output depends on the mode (py_utils.IsTraining warns
    # once when such a layer trains only for want of a mode block).
    object.__setattr__(self, '_mode_dependent', any(
        isinstance(l, (keras.layers.BatchNormalization, keras.layers.Dropout))
        for l in keras_utils.FlattenLayers(obj)))
    object.__setattr__(self, '_declared_batch', _DeclaredBatchSizes(obj))

  # -- accessors -----------------------------------------------------------

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
      raise ValueError(f'{_Owner(self.params)}: FProp needs an input')
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
          f'{_Owner(p)}: Keras layers take the batch on axis 0, but the '
          f'context batch axis is {py_utils.CurrentBatchAxis()}; use '
          'TensorPipeLayer batch_dim=0')
    obj = self.keras_object
    shapes = [list(x.shape) for x in tf.nest.flatten((args, kwargs))
              if hasattr(x, 'shape')]
    batch = shapes[0][0] if shapes and shapes[0] else None
    _CheckDeclaredBatch(p, self._declared_batch, batch, shapes)
    mapping = [(kv, theta[key]) for kv, key in self._weights]
    for gen, seed in self._seed_gens:
      mapping.append((gen.state, self._SeedState(seed, gen.state.dtype)))
    kwargs = dict(kwargs)
    # Keras 3.15's functional call does the same: the mode of the call wins
    # over a recorded `training=` (keras/src/models/functional.py,
    # operation_fn); a frozen layer is one with trainable=False. It is
    # passed to every layer: Keras drops it from the call of a layer whose
    # `call` takes no `training` but keeps it in the call context, where
    # the Dropout and BatchNormalization inside a custom layer read it.
    kwargs['training'] = py_utils.IsTraining(
        f'KerasLayer {self.path or self.layer_name!r}'
        if self._mode_dependent else None)
    with tf.name_scope(self.layer_name), keras.StatelessScope(
        state_mapping=mapping, collect_losses=True) as scope:
      out = obj(*args, **kwargs)
    if scope.losses:
      raise ValueError(
          f'{_Owner(p)}: the Keras object added {len(scope.losses)} loss(es) '
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
      raise ValueError(f'{_Owner(p)}: FPropMeta takes tensor shapes, got a '
                       'dict of shapes; for a dict-input Keras model set '
                       'flops_per_example and give partitions manually')
    shapes = [base_layer.ToShape(s) for s in input_shapes]
    for s in shapes:
      if s.rank is None or s.rank < 1:
        raise ValueError(f'{_Owner(p)}: input shape {s} needs a batch axis')
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
      obj = cls._NewKerasObject(p, 0)
      DeriveStateInCalls(obj)
      dtype = p.input_dtype or obj.compute_dtype
      declared = tuple(_DeclaredBatchSizes(obj))
      # The symbolic call builds the object on the given shapes (its
      # variables get no storage inside NoAllocation).
      try:
        out = obj(_SymbolicInputs(per_example, dtype))
      except (ValueError, TypeError) as e:
        first = (str(e).strip().splitlines() or [''])[0]
        raise ValueError(f'{_Owner(p)}: Keras {type(obj).__name__} '
                         f'{obj.name!r} does not accept inputs of one-example '
                         f'shape {per_example}: {first}') from None
      _CheckDenseSpecs(p, out)
      out_specs = tf.nest.map_structure(lambda t: tf.TensorShape(t.shape),
                                        out)
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
