"""A KerasLayer's Keras object: rebuilt from Params, with its calls rebound.

`KerasLayer` (keras_layer.py) holds a private Keras object made from its
Params; this module makes and builds that object, and rebinds the `call`
of the sublayers whose state or randomness a pipeline must control:

  * BatchNormalization: Keras' own code normalises each call with its
    examples' statistics (a micro-batch in a pipeline); the rebound call
    also reports the per-channel count, sum and sum of squares with
    `py_utils.AddBatchStats` to a `KerasBatchNormStats`, which updates the
    moving averages once per step from the statistics of all micro-batches
    (moving = momentum * moving + (1 - momentum) * statistic, Keras'
    formula), exactly as `BatchNormLayer`. The recompute pass reports into
    a discarded collector.
  * Dropout (and SpatialDropout1D/2D/3D): the mask is drawn per example
    with `py_utils.StatelessUniform`, keyed by the sublayer's seed, the
    step seed and the example's index in the global batch, instead of
    Keras' SeedGenerator. The forward and the recompute pass therefore
    draw the same mask, and it does not depend on K or T.
  * Normalization: Keras' `finalize_state()` turns the adapted (or loaded)
    `adapt_mean` / `adapt_variance` weights into the `mean` / `variance`
    tensors `call` reads, so a call on theta would ignore them (and a
    traced graph capture Keras' eager tensors). The rebound `call` derives
    them from the weights in effect, inside the call (DeriveStateInCalls);
    the Keras objects of the cost model and of keras_graph get the same
    `call`.
  * Dense, EinsumDense, Conv1D/2D/3D and ReversibleEmbedding (exact
    classes, not quantized): the kernel op goes through
    `py_utils.WeightOp`, so the zero-bubble schedules defer its weight
    gradient to their W cells (keras_weight_ops.py); bit for bit Keras'
    own `call`.

The mode of the call (`training`) is passed to every Keras object
(WithMode), as Keras' functional call passes it to every layer: Keras
drops it from the call of a layer whose `call` takes none and keeps it in
its call context, where the Dropout and BatchNormalization inside a custom
layer read it (the recompute pass runs outside any Keras call, so nothing
else would carry it there).

A Keras object that comes back from its config marked built but with
unbuilt sublayers (a registered custom layer without `build()` whose
sublayers are built by its first call, as keras.io's examples write them)
is called once on symbolic inputs of its recorded shape, as Keras'
functional loader calls every layer; where that call fails, one line names
the layer and the fix (a `build()` method).
"""

import copy
import functools
import inspect
from typing import Any, Dict, List, Optional

import keras
import numpy as np
import tensorflow as tf

from tensorpipe import errors
from tensorpipe import keras_utils
from tensorpipe import keras_weight_ops
from tensorpipe import py_utils
from tensorpipe.layers import normalization


def Owner(p) -> str:
  """How errors name the KerasLayer of Params `p`."""
  return f'KerasLayer {p.name!r}'


def PerExampleShape(p) -> Optional[List[Any]]:
  """p.input_shape as a list of per-example shapes (None if unset)."""
  shape = p.input_shape
  if shape is None:
    return None
  if isinstance(shape, (list, tuple)) and shape and all(
      isinstance(s, (list, tuple)) for s in shape):
    return [list(s) for s in shape]
  return [list(shape)]


def SymbolicInputs(shapes: List[List[Any]], dtype) -> Any:
  """Keras symbolic inputs of per-example `shapes` (one, or a list)."""
  inputs = [keras.KerasTensor([None] + list(s), dtype=dtype) for s in shapes]
  return inputs[0] if len(inputs) == 1 else inputs


def CallArgs(obj) -> set:
  """The parameter names of a Keras object's `call` (e.g. 'training')."""
  return set(inspect.signature(obj.call).parameters)


def NewKerasObject(p, seed: int):
  """Builds the Keras object described by `p` (unbuilt or built)."""
  owner = Owner(p)
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
        first = errors.FirstLine(e)
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


def _RecordedInputs(p, obj):
  """Symbolic (args, kwargs, shape) to call `obj` on: the recorded
  input_shape, else its build_config's; None when neither is recorded."""
  dtype = p.input_dtype or obj.compute_dtype
  shapes = PerExampleShape(p)
  build = (p.keras_config or {}).get('build_config') or {}
  if shapes is not None:
    return (SymbolicInputs(shapes, dtype),), {}, shapes
  if 'input_shape' in build:
    what = build['input_shape']
    return (keras.KerasTensor(what, dtype=dtype),), {}, what
  if 'shapes_dict' in build:
    what = build['shapes_dict']
    return (), {k[:-len('_shape')]: keras.KerasTensor(v, dtype=dtype)
                for k, v in what.items()}, what
  return None


def _BuildSublayers(p, obj, seed: int) -> None:
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
  name = type(obj).__name__
  problem = (f'{Owner(p)}: Keras {name} {obj.name!r} comes back from its '
             f'config marked built, but its sublayers {unbuilt} are not, and ')
  fix = (f'; give {name} a build() method that builds its sublayers (e.g. '
         'self.dense.build(input_shape))')
  recorded = _RecordedInputs(p, obj)
  if recorded is None:
    raise ValueError(problem + 'its config records no input shape to build '
                     'them on' + fix)
  args, kwargs, what = recorded
  try:
    with keras_utils.SeededPythonRandom(seed + 1):
      obj(*args, **kwargs)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(
        problem + f'calling it on symbolic inputs of its recorded shape '
        f'{what} failed ({errors.FirstLine(e)})' + fix) from None


def BuildKerasObject(p, seed: int):
  """The built Keras object of `p` (on the current device)."""
  obj = NewKerasObject(p, seed)
  if not obj.built:
    shapes = PerExampleShape(p)
    if shapes is None:
      raise ValueError(
          f'{Owner(p)}: the Keras {type(obj).__name__} {obj.name!r} is '
          'not built and input_shape is not set; set input_shape to one '
          "example's shape, e.g. [28, 28, 1]")
    dtype = p.input_dtype or obj.compute_dtype
    with keras_utils.SeededPythonRandom(seed + 1):
      obj(SymbolicInputs(shapes, dtype))
  else:
    _BuildSublayers(p, obj, seed)
  DeriveStateInCalls(obj)
  for layer in keras_utils.FlattenLayers(obj):
    if isinstance(layer, keras.layers.BatchNormalization):
      if layer.renorm or layer.synchronized:
        flag = 'renorm' if layer.renorm else 'synchronized'
        raise ValueError(
            f'{Owner(p)}: Keras BatchNormalization {layer.name!r} has '
            f'{flag}=True, which KerasLayer does not support: a pipeline '
            'normalises with micro-batch statistics and updates the moving '
            'averages once per step (summed over replicas); set '
            f'{flag}=False')
    for attr in ('activity_regularizer',):
      if getattr(layer, attr, None) is not None:
        raise ValueError(
            f'{Owner(p)}: Keras layer {layer.name!r} has an '
            f'{attr}, whose loss a KerasLayer cannot return; remove it '
            'and add the penalty to the task loss')
  for w in obj.weights:
    if getattr(w, 'regularizer', None) is not None:
      raise ValueError(
          f'{Owner(p)}: Keras weight {w.path!r} has a regularizer, whose '
          'loss a KerasLayer cannot return; remove it and use the task\'s '
          'task.train.l2_regularizer_weight (or add the penalty to the '
          'Keras loss of a TensorPipeModel)')
  return obj


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


def BindPipelineCalls(obj, path: str, seeds: Dict[int, int],
                      variables: Dict[int, tf.Variable]
                      ) -> List[KerasBatchNormStats]:
  """Rebinds the `call` of obj's BatchNormalization and Dropout sublayers,
  and routes the kernel ops of its Dense, EinsumDense, convolution and
  ReversibleEmbedding sublayers (keras_weight_ops.RouteWeightOps).

  Args:
    obj: the built Keras object, its variables rebound to TensorPipe ones.
    path: the KerasLayer's path; names the batch-norm reporters.
    seeds: the seed of each sublayer's randomness, by `id(sublayer)`.
    variables: the TensorPipe variable of each Keras weight, by `id(weight)`.

  Returns:
    One KerasBatchNormStats per BatchNormalization, in FlattenLayers order.
  """
  reporters = []
  for layer in keras_utils.FlattenLayers(obj):
    if isinstance(layer, keras.layers.BatchNormalization):
      reporter = KerasBatchNormStats(
          f'{path}/{layer.name}', variables[id(layer.moving_mean)],
          variables[id(layer.moving_variance)], layer.momentum)
      reporters.append(reporter)
      object.__setattr__(layer, 'call', functools.partial(
          _BatchNormCall, layer, reporter))
    elif isinstance(layer, keras.layers.Dropout):
      object.__setattr__(layer, 'call', functools.partial(
          _DropoutCall, layer, seeds[id(layer)]))
  keras_weight_ops.RouteWeightOps(obj)
  return reporters


def ModeDependent(obj) -> bool:
  """Whether obj's output depends on the mode (has BatchNorm or Dropout)."""
  return any(
      isinstance(l, (keras.layers.BatchNormalization, keras.layers.Dropout))
      for l in keras_utils.FlattenLayers(obj))


def WithMode(kwargs: Dict[str, Any], owner: Optional[str]) -> Dict[str, Any]:
  """A copy of a Keras call's kwargs with `training` set to the call's mode.

  Args:
    kwargs: the call's keyword arguments (a recorded `training=` included).
    owner: names the layer in py_utils.IsTraining's warning when it trains
      only for want of a mode block; None for a mode-independent layer.
  """
  kwargs = dict(kwargs)
  # Keras 3.15's functional call does the same: the mode of the call wins
  # over a recorded `training=` (keras/src/models/functional.py,
  # operation_fn); a frozen layer is one with trainable=False. It is
  # passed to every layer: Keras drops it from the call of a layer whose
  # `call` takes no `training` but keeps it in the call context, where
  # the Dropout and BatchNormalization inside a custom layer read it.
  kwargs['training'] = py_utils.IsTraining(owner)
  return kwargs
