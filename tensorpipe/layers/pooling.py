"""Pooling layers (NHWC): windowed max/average pooling and global pooling."""

import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe.layers import conv

_POOLING_TYPES = ('MAX', 'AVG')
_PADDINGS = ('SAME', 'VALID')


def _CheckRank4(cls_name: str, p, x_shape) -> tf.TensorShape:
  shape = base_layer.ToShape(x_shape)
  if shape.rank != 4:
    raise ValueError(f'{cls_name} {p.name!r}: input shape {shape} must be '
                     '[batch, height, width, channels]')
  return shape


def _CheckPoolingType(cls_name: str, p) -> None:
  if p.pooling_type not in _POOLING_TYPES:
    raise ValueError(f'{cls_name} {p.name!r}: pooling_type='
                     f'{p.pooling_type!r}; use one of {_POOLING_TYPES}')


class PoolingLayer(base_layer.BaseLayer):
  """Max or average pooling over height and width windows.

  With padding='SAME' average pooling divides by the number of real (not
  padded) pixels in each window, as tf.nn.avg_pool2d does.

  Usage:
    p = PoolingLayer.Params().Set(name='pool', window_shape=(3, 3),
                                  window_stride=(2, 2), pooling_type='MAX')
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('window_shape', (2, 2), 'Pooling window (height, width), in '
             'pixels.')
    p.Define('window_stride', (2, 2), 'Window strides (height, width), in '
             'pixels.')
    p.Define('pooling_type', 'MAX', "'MAX' or 'AVG'.")
    p.Define('padding', 'SAME', "'SAME' (output size = ceil(input / stride)) "
             "or 'VALID' (only full windows).")
    return p

  @classmethod
  def _Validate(cls, p) -> None:
    for key in ('window_shape', 'window_stride'):
      value = getattr(p, key)
      if not (isinstance(value, (list, tuple)) and len(value) == 2 and
              all(isinstance(v, int) and v > 0 for v in value)):
        raise ValueError(f'{cls.__name__} {p.name!r}: {key}={value!r} must '
                         'be 2 positive ints (height, width)')
    _CheckPoolingType(cls.__name__, p)
    if p.padding not in _PADDINGS:
      raise ValueError(f'{cls.__name__} {p.name!r}: padding={p.padding!r}; '
                       f'use one of {_PADDINGS}')

  def __init__(self, params):
    super().__init__(params)
    self._Validate(self.params)

  def FProp(self, theta, x: tf.Tensor) -> tf.Tensor:
    """Pools x: [batch, h, w, c] -> [batch, out_h, out_w, c] (fprop_dtype)."""
    del theta  # no weights
    p = self.params
    _CheckRank4(type(self).__name__, p, x.shape)
    x = tf.cast(x, self.fprop_dtype)
    pool = tf.nn.max_pool2d if p.pooling_type == 'MAX' else tf.nn.avg_pool2d
    return pool(x, ksize=list(p.window_shape), strides=list(p.window_stride),
                padding=p.padding)

  @classmethod
  def FPropMeta(cls, p, x_shape):
    """FLOPs: one compare or add per window element per output element."""
    cls._Validate(p)
    b, h, w, c = _CheckRank4(cls.__name__, p, x_shape).as_list()
    out_hw = []
    for size, k, s in zip((h, w), p.window_shape, p.window_stride):
      out = conv.OutputSize(size, k, s, 1, p.padding) if size else size
      if out == 0:
        raise ValueError(f'{cls.__name__} {p.name!r}: input {h}x{w} is '
                         f'smaller than window_shape={tuple(p.window_shape)} '
                         "with padding='VALID'; use padding='SAME'")
      out_hw.append(out)
    out_shape = tf.TensorShape([b] + out_hw + [c])
    kh, kw = p.window_shape
    flops = kh * kw * base_layer.NumElements(out_shape)
    return base_layer.FPropMetaResult(flops, out_shape, 0)


class GlobalPoolingLayer(base_layer.BaseLayer):
  """Pools over all of height and width: [b, h, w, c] -> [b, c].

  Usage:
    p = GlobalPoolingLayer.Params().Set(name='gap', pooling_type='AVG')
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('pooling_type', 'AVG', "'AVG' (mean) or 'MAX'.")
    p.Define('keepdims', False, 'If True the output is [batch, 1, 1, '
             'channels], else [batch, channels].')
    return p

  def __init__(self, params):
    super().__init__(params)
    _CheckPoolingType(type(self).__name__, self.params)

  def FProp(self, theta, x: tf.Tensor) -> tf.Tensor:
    """Pools x: [batch, h, w, c] -> [batch, c] or [batch, 1, 1, c]."""
    del theta  # no weights
    p = self.params
    _CheckRank4(type(self).__name__, p, x.shape)
    x = tf.cast(x, self.fprop_dtype)
    if p.pooling_type == 'MAX':
      return tf.reduce_max(x, axis=[1, 2], keepdims=p.keepdims)
    # Sum in float32: a bfloat16 sum over many pixels loses precision.
    mean = tf.reduce_mean(tf.cast(x, tf.float32), axis=[1, 2],
                          keepdims=p.keepdims)
    return tf.cast(mean, self.fprop_dtype)

  @classmethod
  def FPropMeta(cls, p, x_shape):
    """FLOPs: one compare or add per input element."""
    _CheckPoolingType(cls.__name__, p)
    shape = _CheckRank4(cls.__name__, p, x_shape)
    b, c = shape[0], shape[3]
    out_shape = tf.TensorShape([b, 1, 1, c] if p.keepdims else [b, c])
    return base_layer.FPropMetaResult(base_layer.NumElements(shape), out_shape,
                                      0)
