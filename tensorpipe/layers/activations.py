"""Element-wise activation functions by name, and a layer that applies one.

Layers name their activation in Params (`activation='RELU'`) so that Params
stay plain data; `GetActivation` maps the name to a function and
`ActivationFlops` gives the cost model its rough per-element FLOPs.
"""

from typing import Callable, Dict

import tensorflow as tf

from tensorpipe import base_layer

# Rough FLOPs per element for the cost model (counting a transcendental
# function as a few FLOPs); only their relative size matters for partitioning.
_ACTIVATIONS: Dict[str, Callable[[tf.Tensor], tf.Tensor]] = {
    'NONE': tf.identity,
    'RELU': tf.nn.relu,
    'RELU6': tf.nn.relu6,
    'SIGMOID': tf.math.sigmoid,
    'TANH': tf.math.tanh,
    # Exact (erf) GELU, as in BERT.
    'GELU': lambda x: tf.nn.gelu(x, approximate=False),
    'SWISH': tf.nn.silu,
}

_FLOPS_PER_ELEMENT: Dict[str, int] = {
    'NONE': 0,
    'RELU': 1,
    'RELU6': 2,
    'SIGMOID': 4,
    'TANH': 4,
    'GELU': 8,
    'SWISH': 5,
}

NAMES = tuple(_ACTIVATIONS)


def _Check(name: str) -> str:
  if not isinstance(name, str) or name.upper() not in _ACTIVATIONS:
    raise ValueError(f'unknown activation {name!r}; use one of {list(NAMES)}')
  return name.upper()


def GetActivation(name: str) -> Callable[[tf.Tensor], tf.Tensor]:
  """The element-wise function called `name` (case-insensitive).

  Raises:
    ValueError: if `name` is not one of `NAMES`.
  """
  return _ACTIVATIONS[_Check(name)]


def ActivationFlops(name: str) -> int:
  """Approximate FLOPs per element of activation `name` (0 for 'NONE')."""
  return _FLOPS_PER_ELEMENT[_Check(name)]


class ActivationLayer(base_layer.BaseLayer):
  """Applies an element-wise activation; has no weights.

  Usage:
    p = ActivationLayer.Params().Set(name='relu', activation='RELU')
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('activation', 'RELU', f'Name of the activation, one of '
             f'{list(NAMES)}; applied element-wise, output shape = input '
             'shape.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self._fn = GetActivation(self.params.activation)

  def FProp(self, theta, x: tf.Tensor) -> tf.Tensor:
    """Returns activation(x), same shape, in fprop_dtype."""
    del theta  # no weights
    return self._fn(tf.cast(x, self.fprop_dtype))

  @classmethod
  def FPropMeta(cls, p, x_shape):
    flops = ActivationFlops(p.activation) * base_layer.NumElements(x_shape)
    return base_layer.FPropMetaResult(flops, base_layer.ToShape(x_shape), 0)
