"""Keras layers' kernel ops as `py_utils.WeightOp`: the I/W split for Keras.

The zero-bubble schedules (zb_h1, zb_v) split a stage's backward pass into
an input-gradient cell (I) and a deferred weight-gradient cell (W); a weight
gets its gradient in W only when the layer routes its op on the weight
through `py_utils.WeightOp` (z = fn(x, w), fn depending on x, w and Python
values only). Keras layers do not, so a `KerasLayer`'s kernels would get
their gradients in I. Without forking Keras, this module gives exact Keras
classes a `call` that does what Keras' own `call` does with the kernel op
routed: inside the `keras.StatelessScope` of `KerasLayer.CallKeras` a Keras
variable's value is the substituted theta tensor, which is passed to
`WeightOp` uncast (Keras autocasts a variable as it is read under mixed
precision: fn casts it the same way, inside the op).

  | Keras class (exact)       | routed op (fn(x, w))                       |
  |---------------------------|--------------------------------------------|
  | Dense                     | matmul(x, kernel)                          |
  | EinsumDense               | einsum(equation, x, kernel)                |
  | Conv1D / Conv2D / Conv3D  | conv(x, kernel) (Conv1D's causal padding   |
  |                           |   applied to x first, as Keras does)       |
  | ReversibleEmbedding       | take(embeddings, ids) (reverse=False) and  |
  |                           |   matmul(x, embeddings^T) or               |
  |                           |   matmul(x, reverse_embeddings)            |
  |                           |   (reverse=True; reverse_dtype cast inside)|

Both directions of a ReversibleEmbedding are routed: with tied weights one
table serves both, and a weight routed in one op must be routed in all.
Biases, activations, the logit soft cap and the mask are Keras' own code
around the op. Each entry equals Keras 3.15.1's `call` bit for bit (outputs,
input and weight gradients; tests/keras_weight_ops_test.py checks each).

Not routed (their weight gradients stay in I): subclasses (`type(layer)` is
not exactly the class: a subclass may change `call` or the kernel), layers
with a quantization mode or LoRA enabled (their kernel is derived from
several variables), and a call outside a StatelessScope that substitutes
the kernel (a plain Keras call, symbolic shape inference), which runs
Keras' own `call`.

The calls are installed only on a pipeline's own Keras objects
(`keras_rebuild.BindPipelineCalls`, one object per KerasLayer), never on
the class or on the user's model.
"""

import functools
from typing import Any, Callable, List, Optional

import keras

from tensorpipe import keras_utils
from tensorpipe import py_utils


def _Cast(variable) -> Callable[[Any], Any]:
  """The cast Keras applies when it reads `variable` here (autocast)."""
  cast = keras_utils.AutocastOf(variable)
  return cast if cast is not None else (lambda v: v)


def _Substituted(variable):
  """(theta tensor substituted for `variable`, its autocast) or (None,
  None) outside a StatelessScope that maps it."""
  w = keras_utils.SubstitutedValue(variable)
  return (None, None) if w is None else (w, _Cast(variable))


def _MatMulFn(cast, x, w):
  return keras.ops.matmul(x, cast(w))


def _EinsumFn(equation, cast, x, w):
  return keras.ops.einsum(equation, x, cast(w))


def _ConvFn(layer, padding, cast, x, w):
  return keras.ops.conv(x, cast(w), strides=list(layer.strides),
                        padding=padding, dilation_rate=layer.dilation_rate,
                        data_format=layer.data_format)


def _TakeFn(cast, ids, w):
  return keras.ops.take(cast(w), ids, axis=0)


def _ReverseFn(tied, reverse_dtype, cast, x, w):
  kernel = keras.ops.transpose(cast(w)) if tied else cast(w)
  if reverse_dtype is not None:
    kernel = keras.ops.cast(kernel, reverse_dtype)
  return keras.ops.matmul(x, kernel)


def _BiasAndActivation(layer, x):
  """Dense's and EinsumDense's tail, as Keras writes it."""
  if layer.bias is not None:
    x = keras.ops.add(x, layer.bias)
  if layer.activation is not None:
    x = layer.activation(x)
  return x


def _DenseCall(layer, inputs, training=None):
  """keras.layers.Dense.call with the matmul a WeightOp."""
  w, cast = _Substituted(keras_utils.RawKernel(layer))
  if w is None:
    return type(layer).call(layer, inputs, training=training)
  x = py_utils.WeightOp(functools.partial(_MatMulFn, cast), inputs, w)
  return _BiasAndActivation(layer, x)


def _EinsumDenseCall(layer, inputs, training=None):
  """keras.layers.EinsumDense.call with the einsum a WeightOp."""
  w, cast = _Substituted(keras_utils.RawKernel(layer))
  if w is None:
    return type(layer).call(layer, inputs, training=training)
  x = py_utils.WeightOp(functools.partial(_EinsumFn, layer.equation, cast),
                        inputs, w)
  return _BiasAndActivation(layer, x)


def _ConvCall(layer, inputs):
  """keras.layers.Conv1D/2D/3D.call with the convolution a WeightOp."""
  w, cast = _Substituted(keras_utils.RawKernel(layer))
  if w is None:
    return type(layer).call(layer, inputs)
  padding = layer.padding
  if padding == 'causal':  # Conv1D only
    inputs = keras.ops.pad(inputs, layer._compute_causal_padding())  # pylint: disable=protected-access
    padding = 'valid'
  outputs = py_utils.WeightOp(
      functools.partial(_ConvFn, layer, padding, cast), inputs, w)
  if layer.use_bias:
    if layer.data_format == 'channels_last':
      bias_shape = (1,) * (layer.rank + 1) + (layer.filters,)
    else:
      bias_shape = (1, layer.filters) + (1,) * layer.rank
    outputs = keras.ops.add(outputs, keras.ops.reshape(layer.bias, bias_shape))
  if layer.activation is not None:
    return layer.activation(outputs)
  return outputs


def _ReversibleEmbeddingCall(layer, inputs, reverse=False):
  """keras.layers.ReversibleEmbedding.call with the lookup (reverse=False)
  and the output projection (reverse=True) WeightOps."""
  table = keras_utils.RawEmbeddings(layer)
  if not reverse:
    w, cast = _Substituted(table)
    if w is None:
      return type(layer).call(layer, inputs, reverse=reverse)
    ids = inputs
    if ids.dtype != 'int32' and ids.dtype != 'int64':
      ids = keras.ops.cast(ids, 'int32')
    result = keras.ops.cast(
        py_utils.WeightOp(functools.partial(_TakeFn, cast), ids, w),
        dtype=layer.compute_dtype)
    mask = keras.layers.Embedding.compute_mask(layer, inputs)
    if mask is not None:
      keras_utils.SetKerasMask(result, mask)
    return result
  tied = layer.tie_weights
  w, cast = _Substituted(table if tied else layer.reverse_embeddings)
  if w is None:
    return type(layer).call(layer, inputs, reverse=reverse)
  if layer.reverse_dtype is not None:
    inputs = keras.ops.cast(inputs, layer.reverse_dtype)
  logits = py_utils.WeightOp(
      functools.partial(_ReverseFn, tied, layer.reverse_dtype, cast),
      inputs, w)
  if layer.logit_soft_cap is not None:
    soft_cap = layer.logit_soft_cap
    logits = keras.ops.multiply(
        keras.ops.tanh(keras.ops.divide(logits, soft_cap)), soft_cap)
  return logits


# Exact class -> its routed call (layer, *call args).
CALLS = {
    keras.layers.Dense: _DenseCall,
    keras.layers.EinsumDense: _EinsumDenseCall,
    keras.layers.Conv1D: _ConvCall,
    keras.layers.Conv2D: _ConvCall,
    keras.layers.Conv3D: _ConvCall,
    keras.layers.ReversibleEmbedding: _ReversibleEmbeddingCall,
}


def RoutedCall(layer) -> Optional[Callable[..., Any]]:
  """The routed call of `layer` (bound to it), or None where its weight
  gradients stay in I: not exactly a class of `CALLS`, quantized, or
  LoRA enabled."""
  call = CALLS.get(type(layer))
  if call is None or getattr(layer, 'quantization_mode', None) is not None:
    return None
  if getattr(layer, 'lora_enabled', False):
    return None
  return functools.partial(call, layer)


def RouteWeightOps(obj) -> List[Any]:
  """Installs the routed call on each routable sublayer of `obj` (itself
  included); returns those sublayers. For a pipeline's own Keras object
  only: the call is set on the instance."""
  routed = []
  if not isinstance(obj, keras.Layer):
    return routed  # a keras.ops Operation
  for layer in keras_utils.FlattenLayers(obj):
    call = RoutedCall(layer)
    if call is not None:
      object.__setattr__(layer, 'call', call)
      routed.append(layer)
  return routed
