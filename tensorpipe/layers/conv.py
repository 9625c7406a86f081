"""2-D convolution layers (NHWC): regular, depthwise and separable.

Each applies, in order: convolution, optional bias, optional batch norm
(a BatchNormLayer child 'bn'), activation. Bias and batch norm exclude each
other: batch norm subtracts the per-channel mean, which cancels a bias, and
its beta plays the bias's role.
"""

import math
from typing import Dict, List

import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import checks
from tensorpipe import py_utils
from tensorpipe.layers import activations
from tensorpipe.layers import normalization

_PADDINGS = ('SAME', 'VALID')


def _IsPositiveInts(value, n: int) -> bool:
  return (isinstance(value, (list, tuple)) and len(value) == n and
          all(isinstance(v, int) and v > 0 for v in value))


def OutputSize(in_size: int, window: int, stride: int, dilation: int,
               padding: str) -> int:
  """Output length of a convolution or pooling along one spatial axis."""
  if padding == 'SAME':
    return -(-in_size // stride)
  effective = (window - 1) * dilation + 1
  return max(0, (in_size - effective) // stride + 1)


class _ConvBase(base_layer.BaseLayer):
  """Shared Params, validation, FProp and FPropMeta of the conv layers.

  Subclasses give the filter semantics through `_Weights`, `_InChannels`,
  `_OutChannels`, `_MacsPerPosition` and `_Convolve`.
  """

  _FILTER_DOC = ''

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('filter_shape', None, cls._FILTER_DOC)
    p.Define('filter_stride', (1, 1), 'Strides (height, width) of the '
             'convolution, in pixels.')
    p.Define('dilation_rate', (1, 1), 'Dilation (height, width) of the '
             'filter taps; values > 1 need filter_stride == (1, 1).')
    p.Define('padding', 'SAME', "'SAME' (output size = ceil(input / stride)) "
             "or 'VALID' (no padding).")
    p.Define('bias', False, 'Whether to add a learned per-output-channel '
             'bias; must be False with batch_norm=True.')
    p.Define('activation', 'RELU', 'Activation applied last, one of '
             f'{list(activations.NAMES)}.')
    p.Define('batch_norm', False, "If True, a BatchNormLayer child 'bn' "
             'normalises the convolution output before the activation.')
    p.Define('bn_tpl', normalization.BatchNormLayer.Params(), 'Params of the '
             'batch-norm child (decay, epsilon, ...); dim is set to the '
             'output channels.')
    return p

  # -- filter semantics (subclasses) ----------------------------------------

  @classmethod
  def _Weights(cls, p) -> Dict[str, List[int]]:
    raise NotImplementedError

  @classmethod
  def _InChannels(cls, p) -> int:
    return p.filter_shape[2]

  @classmethod
  def _OutChannels(cls, p) -> int:
    raise NotImplementedError

  @classmethod
  def _MacsPerPosition(cls, p) -> int:
    """Multiply-adds per output pixel, over all output channels."""
    raise NotImplementedError

  def _Convolve(self, theta, x: tf.Tensor) -> tf.Tensor:
    raise NotImplementedError

  # -- shared -------------------------------------------------------------

  @classmethod
  def _Validate(cls, p) -> None:
    name = f'{cls.__name__} {p.name!r}'
    if not _IsPositiveInts(p.filter_shape, 4):
      raise ValueError(f'{name}: filter_shape={p.filter_shape!r} must be 4 '
                       f'positive ints: {cls._FILTER_DOC}')
    for key in ('filter_stride', 'dilation_rate'):
      if not _IsPositiveInts(getattr(p, key), 2):
        raise ValueError(f'{name}: {key}={getattr(p, key)!r} must be 2 '
                         'positive ints (height, width)')
    if max(p.dilation_rate) > 1 and max(p.filter_stride) > 1:
      raise ValueError(f'{name}: dilation_rate={p.dilation_rate!r} with '
                       f'filter_stride={p.filter_stride!r} is not supported; '
                       'use dilation_rate=(1, 1) or filter_stride=(1, 1)')
    if p.padding not in _PADDINGS:
      raise ValueError(f'{name}: padding={p.padding!r}; use one of '
                       f'{_PADDINGS}')
    activations.GetActivation(p.activation)
    if p.batch_norm and p.bias:
      raise ValueError(f'{name}: bias=True with batch_norm=True is redundant '
                       "(batch norm's beta is the bias); set bias=False")

  @classmethod
  def _BnParams(cls, p):
    return p.bn_tpl.Copy().Set(dim=cls._OutChannels(p), name='bn')

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self._Validate(p)
    for name, shape in self._Weights(p).items():
      self.CreateVariable(name, base_layer.WeightParams(shape=shape))
    if p.bias:
      self.CreateVariable('b', base_layer.WeightParams(
          shape=[self._OutChannels(p)],
          init=base_layer.WeightInit.Constant(0.0)))
    if p.batch_norm:
      self.CreateChild('bn', self._BnParams(p))
    self._activation = activations.GetActivation(p.activation)

  def FProp(self, theta, x: tf.Tensor) -> tf.Tensor:
    """Applies the layer.

    Args:
      theta: NestedMap of weights (and `bn`, the batch-norm child's).
      x: [batch, height, width, in_channels].

    Returns:
      [batch, out_height, out_width, out_channels] in fprop_dtype.
    """
    p = self.params
    self._CheckInput(p, x.shape)
    # The batch-norm child gets its weights uncast: it computes in float32.
    bn_theta = theta.get('bn')
    raw = theta
    theta = self.CastTheta(theta)
    x = tf.cast(x, self.fprop_dtype)
    # The convolution casts its weights itself (py_utils.WeightOp).
    y = self._Convolve(raw, x)
    if p.bias:
      y += theta.b
    if p.batch_norm:
      y = self.children.bn.FProp(bn_theta, y)
    return self._activation(y)

  @classmethod
  def _CheckInput(cls, p, x_shape) -> tf.TensorShape:
    shape = base_layer.ToShape(x_shape)
    if shape.rank != 4:
      raise ValueError(f'{cls.__name__} {p.name!r}: input shape {shape} must '
                       'be [batch, height, width, channels]')
    cin = cls._InChannels(p)
    if shape[3] is not None and shape[3] != cin:
      raise ValueError(
          f'{cls.__name__} {p.name!r}: input has {shape[3]} channels but '
          f'filter_shape={tuple(p.filter_shape)} expects {cin}; set '
          f'filter_shape[2]={shape[3]} or make the previous layer output '
          f'{cin} channels')
    return shape

  @classmethod
  def FPropMeta(cls, p, x_shape):
    """FLOPs: 2 * multiply-adds of the convolution, + 1 per output element
    for the bias, + batch norm's, + the activation's per output element."""
    cls._Validate(p)
    shape = cls._CheckInput(p, x_shape)
    b, h, w, _ = shape.as_list()
    kh, kw = p.filter_shape[:2]
    out_hw = []
    for axis, (size, k, s, d) in enumerate(
        zip((h, w), (kh, kw), p.filter_stride, p.dilation_rate)):
      out = OutputSize(size, k, s, d, p.padding) if size is not None else None
      if out == 0:
        raise ValueError(
            f'{cls.__name__} {p.name!r}: input {"width" if axis else "height"}'
            f' {size} is smaller than the dilated filter ({(k - 1) * d + 1}) '
            "with padding='VALID'; use padding='SAME' or a larger input")
      out_hw.append(out)
    out_shape = tf.TensorShape([b] + out_hw + [cls._OutChannels(p)])
    out_elements = base_layer.NumElements(out_shape)
    positions = out_elements // cls._OutChannels(p)
    flops = 2 * cls._MacsPerPosition(p) * positions
    num_params = sum(math.prod(s) for s in cls._Weights(p).values())
    if p.bias:
      flops += out_elements
      num_params += cls._OutChannels(p)
    if p.batch_norm:
      bn_p = cls._BnParams(p)
      bn_meta = bn_p.cls.FPropMeta(bn_p, out_shape)
      flops += bn_meta.flops
      num_params += bn_meta.num_params
    flops += activations.ActivationFlops(p.activation) * out_elements
    return base_layer.FPropMetaResult(flops, out_shape, num_params)


class Conv2DLayer(_ConvBase):
  """2-D convolution.

  Usage:
    p = Conv2DLayer.Params().Set(name='conv1', filter_shape=(3, 3, 3, 32),
                                 filter_stride=(2, 2), batch_norm=True)
  """

  _FILTER_DOC = ('Filter shape (height, width, in_channels, out_channels); '
                 'required.')

  @classmethod
  def _Weights(cls, p):
    return {'w': list(p.filter_shape)}

  @classmethod
  def _OutChannels(cls, p):
    return p.filter_shape[3]

  @classmethod
  def _MacsPerPosition(cls, p):
    return math.prod(p.filter_shape)

  def _Convolve(self, theta, x):
    p = self.params

    def Conv(a, w):
      return tf.nn.convolution(a, tf.cast(w, a.dtype),
                               strides=list(p.filter_stride),
                               padding=p.padding,
                               dilations=list(p.dilation_rate))
    return py_utils.WeightOp(Conv, x, theta.w)


def _DepthwiseFn(p):
  """The weight op (a, w) -> depthwise convolution of a with w cast to a's
  dtype, at p's strides, padding and dilation (tf.nn.depthwise_conv2d)."""
  s = p.filter_stride

  def Depthwise(a, w):
    return tf.nn.depthwise_conv2d(a, tf.cast(w, a.dtype),
                                  strides=[1, s[0], s[1], 1],
                                  padding=p.padding,
                                  dilations=list(p.dilation_rate))
  return Depthwise


def _Pointwise(a: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
  """The 1x1 step of a separable convolution (tf.nn.separable_conv2d's)."""
  return tf.nn.conv2d(a, tf.cast(w, a.dtype), [1, 1, 1, 1], padding='VALID')


class _EqualStridesMixin:
  """Depthwise kernels need equal height and width strides."""

  @classmethod
  def _Validate(cls, p):
    super()._Validate(p)
    if p.filter_stride[0] != p.filter_stride[1]:
      raise ValueError(f'{cls.__name__} {p.name!r}: filter_stride='
                       f'{p.filter_stride!r} must have equal height and '
                       'width strides (a depthwise kernel limitation)')


class DepthwiseConv2DLayer(_EqualStridesMixin, _ConvBase):
  """Depthwise 2-D convolution: each input channel has its own filters.

  Output channels = in_channels * channel_multiplier, grouped by input channel.

  Usage:
    p = DepthwiseConv2DLayer.Params().Set(name='dw', filter_shape=(3, 3, 32, 1))
  """

  _FILTER_DOC = ('Filter shape (height, width, in_channels, '
                 'channel_multiplier); required.')

  @classmethod
  def _Weights(cls, p):
    return {'w': list(p.filter_shape)}

  @classmethod
  def _OutChannels(cls, p):
    return p.filter_shape[2] * p.filter_shape[3]

  @classmethod
  def _MacsPerPosition(cls, p):
    return math.prod(p.filter_shape)

  def _Convolve(self, theta, x):
    return py_utils.WeightOp(_DepthwiseFn(self.params), x, theta.w)


class SeparableConv2DLayer(_EqualStridesMixin, _ConvBase):
  """Depthwise convolution followed by a 1x1 (pointwise) convolution.

  Variables: depthwise_w [h, w, in, depth_multiplier] and pointwise_w
  [1, 1, in * depth_multiplier, out]. Batch norm and the activation, if any,
  come after the pointwise convolution.

  Usage:
    p = SeparableConv2DLayer.Params().Set(name='sep', filter_shape=(3, 3, 32,
                                          64), batch_norm=True)
  """

  _FILTER_DOC = ('Filter shape (height, width, in_channels, out_channels) of '
                 'the depthwise-then-pointwise pair; required.')

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('depth_multiplier', 1, 'Channels the depthwise step makes per '
             'input channel; the pointwise step sees in_channels * '
             'depth_multiplier channels.')
    return p

  @classmethod
  def _Validate(cls, p):
    super()._Validate(p)
    checks.CheckPositiveInts(f'{cls.__name__} {p.name!r}',
                             depth_multiplier=p.depth_multiplier)

  @classmethod
  def _Weights(cls, p):
    h, w, cin, cout = p.filter_shape
    m = p.depth_multiplier
    return {'depthwise_w': [h, w, cin, m], 'pointwise_w': [1, 1, cin * m, cout]}

  @classmethod
  def _OutChannels(cls, p):
    return p.filter_shape[3]

  @classmethod
  def _MacsPerPosition(cls, p):
    h, w, cin, cout = p.filter_shape
    m = p.depth_multiplier
    # Counted at output resolution: the depthwise output is computed only at
    # the strided positions.
    return h * w * cin * m + cin * m * cout

  def _Convolve(self, theta, x):
    # tf.nn.separable_conv2d's two ops, one weight op each (so both
    # kernels' gradients can be deferred): the depthwise convolution, then
    # the 1x1 convolution with stride 1 and 'VALID' padding.
    y = py_utils.WeightOp(_DepthwiseFn(self.params), x, theta.depthwise_w)
    return py_utils.WeightOp(_Pointwise, y, theta.pointwise_w)
