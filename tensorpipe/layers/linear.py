"""Fully connected and flatten layers."""

import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import checks
from tensorpipe import py_utils
from tensorpipe.layers import activations


def MatMul(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
  """A projection's weight op (py_utils.WeightOp): x [rows, d] @ w [d, h],
  the weight cast to x's dtype by the op itself."""
  return tf.matmul(x, tf.cast(w, x.dtype))


class FCLayer(base_layer.BaseLayer):
  """Fully connected layer: activation(x @ w + b) over the last axis.

  Works on inputs of any rank >= 2, [..., input_dim] -> [..., output_dim].

  Usage:
    p = FCLayer.Params().Set(name='logits', input_dim=512, output_dim=10,
                             activation='NONE')
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', None, 'Size of the last input axis; required.')
    p.Define('output_dim', None, 'Size of the last output axis; required.')
    p.Define('bias', True, 'Whether to add a learned bias [output_dim].')
    p.Define('activation', 'RELU', 'Activation applied last, one of '
             f"{list(activations.NAMES)}; use 'NONE' for logits.")
    return p

  @classmethod
  def _Validate(cls, p) -> None:
    checks.CheckPositiveInts(f'{cls.__name__} {p.name!r}',
                             input_dim=p.input_dim, output_dim=p.output_dim)
    activations.GetActivation(p.activation)

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self._Validate(p)
    self.CreateVariable('w', base_layer.WeightParams(
        shape=[p.input_dim, p.output_dim]))
    if p.bias:
      self.CreateVariable('b', base_layer.WeightParams(
          shape=[p.output_dim], init=base_layer.WeightInit.Constant(0.0)))
    self._activation = activations.GetActivation(p.activation)

  @classmethod
  def _CheckInput(cls, p, x_shape) -> tf.TensorShape:
    shape = base_layer.ToShape(x_shape)
    if shape.rank is None or shape.rank < 2:
      raise ValueError(f'{cls.__name__} {p.name!r}: input shape {shape} must '
                       'have rank >= 2 ([batch, ..., input_dim])')
    if shape[-1] is not None and shape[-1] != p.input_dim:
      raise ValueError(f'{cls.__name__} {p.name!r}: input has last dim '
                       f'{shape[-1]} but input_dim={p.input_dim}; set '
                       f'input_dim={shape[-1]} or fix the previous layer '
                       '(a FlattenLayer before it?)')
    return shape

  def FProp(self, theta, x: tf.Tensor) -> tf.Tensor:
    """Applies the layer.

    Args:
      theta: NestedMap with w [input_dim, output_dim] and b [output_dim].
      x: [batch, ..., input_dim].

    Returns:
      [batch, ..., output_dim] in fprop_dtype.
    """
    p = self.params
    self._CheckInput(p, x.shape)
    w = theta.w
    theta = self.CastTheta(theta)
    x = tf.cast(x, self.fprop_dtype)
    if x.shape.rank == 2:
      y = py_utils.WeightOp(MatMul, x, w)
    else:
      # A 2-D matmul (rather than a broadcast batch matmul) keeps the
      # gradient of w a single matmul.
      y = py_utils.WeightOp(MatMul, tf.reshape(x, [-1, p.input_dim]), w)
      y = tf.reshape(y, tf.concat([tf.shape(x)[:-1], [p.output_dim]], 0))
      y.set_shape(x.shape[:-1].concatenate([p.output_dim]))
    if p.bias:
      y += theta.b
    return self._activation(y)

  @classmethod
  def FPropMeta(cls, p, x_shape):
    """FLOPs: 2 * rows * input_dim * output_dim, + bias and activation."""
    cls._Validate(p)
    shape = cls._CheckInput(p, x_shape)
    out_shape = shape[:-1].concatenate([p.output_dim])
    out_elements = base_layer.NumElements(out_shape)
    flops = 2 * p.input_dim * out_elements
    num_params = p.input_dim * p.output_dim
    if p.bias:
      flops += out_elements
      num_params += p.output_dim
    flops += activations.ActivationFlops(p.activation) * out_elements
    return base_layer.FPropMetaResult(flops, out_shape, num_params)


class FlattenLayer(base_layer.BaseLayer):
  """Flattens all axes but the batch: [b, d1, ..., dn] -> [b, d1 * ... * dn].

  Usage:
    p = FlattenLayer.Params().Set(name='flatten')
  """

  def FProp(self, theta, x: tf.Tensor) -> tf.Tensor:
    del theta  # no weights
    x = tf.cast(x, self.fprop_dtype) if x.dtype.is_floating else x
    inner = x.shape[1:]
    if inner.is_fully_defined():
      return tf.reshape(x, [-1, inner.num_elements()])
    return tf.reshape(x, [tf.shape(x)[0], -1])

  @classmethod
  def FPropMeta(cls, p, x_shape):
    shape = base_layer.ToShape(x_shape)
    if shape.rank is None or shape.rank < 1:
      raise ValueError(f'{cls.__name__} {p.name!r}: input shape {shape} must '
                       'have a batch axis')
    inner = shape[1:]
    if not inner.is_fully_defined():
      raise ValueError(f'{cls.__name__} {p.name!r}: input shape {shape} '
                       'needs static non-batch dims')
    return base_layer.FPropMetaResult(
        0, tf.TensorShape([shape[0], inner.num_elements()]), 0)
