"""Normalization layers: batch norm (pipeline-aware statistics) and layer norm.

Batch norm in a pipeline: each FProp call sees one micro-batch. In training a
BatchNormLayer normalises with the statistics of the examples it is given (the
micro-batch, as in GPipe) and reports their sufficient statistics (count, sum,
sum of squares) with `py_utils.AddBatchStats`. The pipeline merges the reports
of all micro-batches and calls `UpdateMovingStats` once per step, so the moving
averages are those of the whole mini-batch, independent of the number of
micro-batches. Outside a `py_utils.CollectBatchStats()` block the update
happens at once (plain training).

Statistics of very few values are meaningless: with one value per channel
(a one-example micro-batch of [N, C] features) the output is beta for every
input. A BatchNormLayer therefore warns once, when traced in training, if a
call normalises fewer than `MIN_VALUES_PER_CHANNEL` values per channel.
"""

import math
from typing import Any, List

from absl import logging
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import hyperparams
from tensorpipe import py_utils

# Approximate FLOPs per element: moments (sum, square, sum) and the
# normalisation (subtract, multiply-add) in training; counted the same in eval.
_BN_FLOPS_PER_ELEMENT = 5
# Mean, variance (subtract, square, sum), normalise (subtract, multiply) and
# scale + bias (multiply-add).
_LN_FLOPS_PER_ELEMENT = 8
# Fewest values per channel (examples x positions of one call) a training
# batch norm normalises over without a warning. The relative error of a
# standard deviation estimated from n values is about 1 / sqrt(2 (n - 1)):
# 18% at 16, 38% at 4, undefined at 1 (the output is then beta).
MIN_VALUES_PER_CHANNEL = 16


def _CheckChannels(cls_name: str, p, x_shape) -> tf.TensorShape:
  """Checks that the last axis of `x_shape` is `p.dim`; returns the shape."""
  shape = base_layer.ToShape(x_shape)
  if shape.rank is None or shape.rank < 2:
    raise ValueError(f'{cls_name} {p.name!r}: input shape {shape} must have '
                     'rank >= 2 ([batch, ..., channels])')
  if shape[-1] is not None and shape[-1] != p.dim:
    raise ValueError(f'{cls_name} {p.name!r}: input has {shape[-1]} channels '
                     f'(last axis) but dim={p.dim}; set dim={shape[-1]} or fix '
                     'the previous layer')
  return shape


def _CheckDim(cls_name: str, p) -> None:
  if not isinstance(p.dim, int) or p.dim <= 0:
    raise ValueError(f'{cls_name} {p.name!r}: dim={p.dim!r} must be a '
                     'positive int, the number of channels (last axis)')
  if p.epsilon <= 0:
    raise ValueError(f'{cls_name} {p.name!r}: epsilon={p.epsilon!r} must be '
                     '> 0, e.g. 1e-3')


class BatchNormLayer(base_layer.BaseLayer):
  """Batch normalization over all axes but the last (channels).

  Usage:
    p = BatchNormLayer.Params().Set(name='bn', dim=64)

  FProp, training:
    mean, var = moments(x over all axes but the last)   # this call's examples
    AddBatchStats(self, BatchStats(count, sum(x), sum(x**2)))
    y = (x - mean) / sqrt(var + epsilon) * gamma + beta
  FProp, eval: the same with moving_mean / moving_variance.
  Statistics and normalisation are computed in float32 (also for bfloat16
  activations), in float64 for float64 activations
  (py_utils.AccumulationDtype); the output is in fprop_dtype.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', None, 'Number of channels (size of the last input axis); '
             'required.')
    p.Define('decay', 0.999, 'Momentum of the moving averages: moving = '
             'decay * moving + (1 - decay) * batch statistic, once per step.')
    p.Define('epsilon', 1e-3, 'Added to the variance before the square root, '
             'for numerical stability.')
    p.Define('use_moving_avg_in_training', False, 'If True, training also '
             'normalises with the moving mean and variance (which are still '
             'updated from the batch statistics), avoiding a train/eval '
             'mismatch.')
    p.Define('gamma_init', 1.0, 'Initial value of the scale gamma (e.g. 0.0 '
             'to start a residual branch as the identity).')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    _CheckDim('BatchNormLayer', p)
    if not 0.0 <= p.decay <= 1.0:
      raise ValueError(f'BatchNormLayer {p.name!r}: decay={p.decay!r} must '
                       'be in [0, 1], e.g. 0.999')
    const = base_layer.WeightInit.Constant
    self.CreateVariable('beta', base_layer.WeightParams(
        shape=[p.dim], init=const(0.0)))
    self.CreateVariable('gamma', base_layer.WeightParams(
        shape=[p.dim], init=const(p.gamma_init)))
    self.CreateVariable('moving_mean', base_layer.WeightParams(
        shape=[p.dim], init=const(0.0), trainable=False))
    self.CreateVariable('moving_variance', base_layer.WeightParams(
        shape=[p.dim], init=const(1.0), trainable=False))

  def FProp(self, theta, x: tf.Tensor) -> tf.Tensor:
    """Normalises x.

    Args:
      theta: NestedMap with beta, gamma, moving_mean, moving_variance.
      x: [batch, ..., dim] float tensor.

    Returns:
      [batch, ..., dim] tensor in fprop_dtype.
    """
    p = self.params
    _CheckChannels('BatchNormLayer', p, x.shape)
    acc = py_utils.AccumulationDtype(x.dtype)
    x32 = tf.cast(x, acc)
    # Read the moving statistics before a report below may update them.
    moving_mean = tf.cast(theta.moving_mean, acc)
    moving_variance = tf.cast(theta.moving_variance, acc)
    if py_utils.IsTraining(
        f'BatchNormLayer {self.path or self.layer_name!r}'):
      if not p.use_moving_avg_in_training:
        WarnIfFewValuesPerChannel(
            self, f'BatchNormLayer {self.path or self.layer_name!r}', x.shape,
            p.dim)
      axes = list(range(x.shape.rank - 1))
      mean, variance = tf.nn.moments(x32, axes)
      if x.shape.is_fully_defined():
        count = tf.constant(x.shape.num_elements() // p.dim, acc)
      else:
        count = tf.cast(tf.size(x32, out_type=tf.int64) // p.dim, acc)
      py_utils.AddBatchStats(self, py_utils.BatchStats(
          count=tf.stop_gradient(count),
          total=tf.stop_gradient(tf.reduce_sum(x32, axes)),
          total_sq=tf.stop_gradient(tf.reduce_sum(tf.square(x32), axes))))
      if p.use_moving_avg_in_training:
        mean, variance = moving_mean, moving_variance
    else:
      mean, variance = moving_mean, moving_variance
    scale = tf.cast(theta.gamma, acc) * tf.math.rsqrt(variance + p.epsilon)
    y = (x32 - mean) * scale + tf.cast(theta.beta, acc)
    return tf.cast(y, self.fprop_dtype)

  def UpdateMovingStats(self, stats: py_utils.BatchStats) -> None:
    """moving = decay * moving + (1 - decay) * statistic of `stats`."""
    decay = self.params.decay
    mean, variance = stats.MeanAndVariance()
    for var, value in ((self.vars.moving_mean, mean),
                       (self.vars.moving_variance, variance)):
      value = tf.cast(value, var.dtype)
      var.assign(decay * var + (1.0 - decay) * value)

  @classmethod
  def FPropMeta(cls, p, x_shape):
    _CheckDim(cls.__name__, p)
    shape = _CheckChannels(cls.__name__, p, x_shape)
    return base_layer.FPropMetaResult(
        _BN_FLOPS_PER_ELEMENT * base_layer.NumElements(shape), shape, 4 * p.dim)


def WarnIfFewValuesPerChannel(layer: Any, what: str, shape: tf.TensorShape,
                              num_channels: int,
                              fix: str = 'set use_moving_avg_in_training=True'
                              ', or use LayerNormLayer') -> None:
  """Warns once per `layer` if a training call normalises too few values.

  Batch norm over one example of [N, C] features (T equal to the batch)
  gives beta for every input. Called at trace time by BatchNormLayer and by
  KerasLayer for Keras' BatchNormalization.

  Args:
    layer: the layer object (remembers that it warned).
    what: the layer as the warning names it, e.g. "BatchNormLayer 'bn'".
    shape: the static shape of the call's input; unknown shapes are skipped.
    num_channels: the size of the channel axis.
    fix: the layer's own remedy, after "Use more examples per micro-batch".
  """
  if (getattr(layer, '_warned_few_values', False) or
      not shape.is_fully_defined()):
    return
  n = shape.num_elements() // num_channels
  if n >= MIN_VALUES_PER_CHANNEL:
    return
  object.__setattr__(layer, '_warned_few_values', True)
  result = ('the output is beta for every input' if n == 1 else
            'its batch statistics are too noisy to normalise with')
  logging.warning(
      '%s normalises each channel over only %d value(s) per call (input %s: '
      'examples x positions; in a pipeline one micro-batch), fewer than %d: '
      '%s. Use more examples per micro-batch (fewer num_micro_batches or a '
      'larger batch), or %s.', what, n, shape.as_list(),
      MIN_VALUES_PER_CHANNEL, result, fix)


# Past this share of their initial values left in the moving averages at the
# end of training, the trainer warns (MovingAverageWarnings).
MAX_INITIAL_SHARE = 0.01


def SetBatchNormDecay(params: Any, decay: float) -> int:
  """Sets `decay` of every BatchNormLayer Params nested in `params`.

  Walks nested Params, lists, tuples and dicts (layer lists, templates such
  as a conv layer's bn_tpl). Returns how many were set.

  Raises:
    ValueError: decay is not in [0, 1].
  """
  if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not (
      0.0 <= decay <= 1.0):
    raise ValueError(f'batch norm decay={decay!r} must be a number in [0, 1], '
                     'e.g. 0.99')
  count = 0
  stack = [params]
  while stack:
    value = stack.pop()
    if isinstance(value, hyperparams.Params):
      cls = value.Get('cls') if 'cls' in value else None
      if isinstance(cls, type) and issubclass(cls, BatchNormLayer):
        value.decay = float(decay)
        count += 1
      stack.extend(v for _, v in value.IterParams())
    elif isinstance(value, (list, tuple)):
      stack.extend(value)
    elif isinstance(value, dict):
      stack.extend(value.values())
  return count


def MovingAverageWarnings(layer: base_layer.BaseLayer,
                          num_steps: int) -> List[str]:
  """Warnings for batch-norm layers whose averages a run leaves stale.

  After n updates, moving = decay^n x initial value + the statistics of the
  last ~1 / (1 - decay) steps. Evaluation normalises with it, so while
  decay^n is large the eval model differs from the trained one (measured:
  Fashion-MNIST ResNet, 936 steps, decay 0.999: 62% test accuracy with the
  moving averages, 90.5% with statistics recomputed on training batches).
  One line per distinct decay, naming the layers' count and a first path.

  Args:
    layer: the model (every descendant is checked).
    num_steps: the updates the run makes (training steps).
  """
  if num_steps <= 0:
    return []
  by_decay = {}
  for sub in base_layer.Layers(layer):
    if (isinstance(sub, BatchNormLayer) and
        sub.params.decay ** num_steps > MAX_INITIAL_SHARE):
      by_decay.setdefault(sub.params.decay, []).append(
          sub.path or sub.layer_name)
  suggested = MAX_INITIAL_SHARE ** (1.0 / num_steps)
  out = []
  for decay, paths in sorted(by_decay.items()):
    out.append(
        f'{len(paths)} batch norm layer(s) (e.g. {paths[0]!r}) have '
        f'decay={decay}: after {num_steps} training steps their moving '
        f'averages still hold {decay ** num_steps:.0%} of their initial '
        'values and weigh early-training statistics heavily, and evaluation '
        'normalises with them, so eval accuracy can be far below training '
        f'accuracy. Set decay <= {math.floor(suggested * 1e4) / 1e4} (the '
        'layers\' `decay` param, or normalization.SetBatchNormDecay on the '
        'model params), train longer, or evaluate with statistics '
        'recomputed from training batches (tools/trainer '
        '--recompute_bn_stats=N).')
  return out


class LayerNormLayer(base_layer.BaseLayer):
  """Layer normalization over the last axis, with learned scale and bias.

  Usage:
    p = LayerNormLayer.Params().Set(name='ln', dim=512)

  y = (x - mean(x, -1)) / sqrt(var(x, -1) + epsilon) * scale + bias, computed
  in float32 (float64 for float64 inputs) and returned in fprop_dtype.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', None, 'Size of the last input axis (the normalised one); '
             'required.')
    p.Define('epsilon', 1e-6, 'Added to the variance before the square root, '
             'for numerical stability.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    _CheckDim('LayerNormLayer', p)
    const = base_layer.WeightInit.Constant
    self.CreateVariable('scale', base_layer.WeightParams(
        shape=[p.dim], init=const(1.0)))
    self.CreateVariable('bias', base_layer.WeightParams(
        shape=[p.dim], init=const(0.0)))

  def FProp(self, theta, x: tf.Tensor) -> tf.Tensor:
    """Normalises x: [batch, ..., dim] -> [batch, ..., dim] in fprop_dtype."""
    p = self.params
    _CheckChannels('LayerNormLayer', p, x.shape)
    acc = py_utils.AccumulationDtype(x.dtype)
    x32 = tf.cast(x, acc)
    mean, variance = tf.nn.moments(x32, [-1], keepdims=True)
    y = (x32 - mean) * tf.math.rsqrt(variance + p.epsilon)
    y = y * tf.cast(theta.scale, acc) + tf.cast(theta.bias, acc)
    return tf.cast(y, self.fprop_dtype)

  @classmethod
  def FPropMeta(cls, p, x_shape):
    _CheckDim(cls.__name__, p)
    shape = _CheckChannels(cls.__name__, p, x_shape)
    return base_layer.FPropMetaResult(
        _LN_FLOPS_PER_ELEMENT * base_layer.NumElements(shape), shape, 2 * p.dim)
