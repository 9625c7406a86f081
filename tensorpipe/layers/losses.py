"""Softmax cross-entropy loss, top-k accuracy and a softmax loss layer."""

from typing import Optional

import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import checks
from tensorpipe import py_utils
from tensorpipe.nested_map import NestedMap

# Approximate FLOPs per logit: exp, sum, log, subtract, multiply-sum.
_SOFTMAX_FLOPS_PER_LOGIT = 5


def _Targets(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
  """Labels as target distributions shaped like logits, in their dtype."""
  num_classes = logits.shape[-1]
  if labels.dtype.is_integer:
    if labels.shape.rank is not None and logits.shape.rank is not None and (
        labels.shape.rank != logits.shape.rank - 1):
      raise ValueError(f'class-id labels of shape {labels.shape} need rank '
                       f'{logits.shape.rank - 1} for logits of shape '
                       f'{logits.shape} ([..., num_classes])')
    depth = num_classes if num_classes is not None else tf.shape(logits)[-1]
    return tf.one_hot(labels, depth, dtype=logits.dtype)
  if not labels.shape.is_compatible_with(logits.shape):
    raise ValueError(f'probability labels of shape {labels.shape} must have '
                     f'the shape of the logits {logits.shape}; or pass int '
                     'class ids')
  return tf.cast(labels, logits.dtype)


def SoftmaxCrossEntropyLoss(logits: tf.Tensor, labels: tf.Tensor,
                            label_smoothing: float = 0.0,
                            num_classes: Optional[int] = None) -> tf.Tensor:
  """Per-example softmax cross-entropy, computed in float32 (float64 for
  float64 logits: py_utils.AccumulationDtype).

  With smoothing s and C classes the target is (1 - s) * labels + s / C.

  Args:
    logits: [batch, ..., C] float.
    labels: [batch, ...] int class ids, or [batch, ..., C] one-hot vectors or
      probabilities.
    label_smoothing: s in [0, 1).
    num_classes: optional C, checked against the logits.

  Returns:
    [batch, ...] float32 (or float64) loss.

  Raises:
    ValueError: on mismatched shapes or a bad label_smoothing.
  """
  if not 0.0 <= label_smoothing < 1.0:
    raise ValueError(f'label_smoothing={label_smoothing!r} must be in [0, 1)')
  if (num_classes is not None and logits.shape[-1] is not None and
      logits.shape[-1] != num_classes):
    raise ValueError(f'logits of shape {logits.shape} have '
                     f'{logits.shape[-1]} classes but num_classes='
                     f'{num_classes}')
  logits = tf.cast(logits, py_utils.AccumulationDtype(logits.dtype))
  targets = _Targets(logits, labels)
  if label_smoothing:
    depth = tf.cast(tf.shape(logits)[-1], logits.dtype)
    targets = targets * (1.0 - label_smoothing) + label_smoothing / depth
  return tf.nn.softmax_cross_entropy_with_logits(labels=targets, logits=logits)


def TopKAccuracy(logits: tf.Tensor, labels: tf.Tensor, k: int = 1,
                 per_example: bool = False) -> tf.Tensor:
  """Fraction of examples whose label is among the k largest logits.

  Ties are broken towards the lower class id (as tf.math.top_k does), so
  constant logits are not counted as correct for every class.

  Args:
    logits: [batch, ..., C] float.
    labels: [batch, ...] int class ids, or [batch, ..., C] one-hot vectors or
      probabilities (their argmax is the class).
    k: how many top classes count.
    per_example: if True return [batch, ...] 0/1 values instead of the mean.

  Returns:
    float32 (float64 for float64 logits) scalar mean (or per-example
    values).
  """
  checks.CheckPositiveInts('', k=k)
  if not labels.dtype.is_integer:
    labels = tf.argmax(labels, axis=-1)
  dtype = py_utils.AccumulationDtype(logits.dtype)
  top = tf.math.top_k(tf.cast(logits, dtype), k=k).indices
  hit = tf.reduce_any(
      tf.equal(top, tf.cast(labels, top.dtype)[..., tf.newaxis]), axis=-1)
  hit = tf.cast(hit, dtype)
  return hit if per_example else tf.reduce_mean(hit)


class SoftmaxLayer(base_layer.BaseLayer):
  """Softmax cross-entropy loss and top-1 accuracy of logits; no weights.

  Usage:
    p = SoftmaxLayer.Params().Set(name='softmax', num_classes=10)
    out = layer.FProp(theta, logits, labels)   # out.loss, out.accuracy, ...
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('num_classes', None, 'Number of classes C (last axis of the '
             'logits); required.')
    p.Define('label_smoothing', 0.0, 'Smoothing s in [0, 1): targets are '
             '(1 - s) * labels + s / C.')
    return p

  @classmethod
  def _Validate(cls, p) -> None:
    checks.CheckPositiveInts(f'{cls.__name__} {p.name!r}',
                             num_classes=p.num_classes)
    if not 0.0 <= p.label_smoothing < 1.0:
      raise ValueError(f'{cls.__name__} {p.name!r}: label_smoothing='
                       f'{p.label_smoothing!r} must be in [0, 1)')

  def __init__(self, params):
    super().__init__(params)
    self._Validate(self.params)

  def FProp(self, theta, logits: tf.Tensor, labels: tf.Tensor) -> NestedMap:
    """Computes the loss.

    Args:
      theta: unused (no weights).
      logits: [batch, num_classes].
      labels: [batch] int class ids or [batch, num_classes] probabilities.

    Returns:
      NestedMap(per_example_loss [batch] float32, loss scalar float32 (mean),
      accuracy scalar float32 (mean top-1), logits as given).
    """
    del theta  # no weights
    p = self.params
    per_example = SoftmaxCrossEntropyLoss(logits, labels, p.label_smoothing,
                                          p.num_classes)
    return NestedMap(per_example_loss=per_example,
                     loss=tf.reduce_mean(per_example),
                     accuracy=TopKAccuracy(logits, labels, 1),
                     logits=logits)

  @classmethod
  def FPropMeta(cls, p, logits_shape, labels_shape=None):
    cls._Validate(p)
    shape = base_layer.ToShape(logits_shape)
    if shape.rank is None or shape.rank < 2 or shape[-1] != p.num_classes:
      raise ValueError(f'{cls.__name__} {p.name!r}: logits shape {shape} '
                       f'must be [batch, ..., {p.num_classes}] '
                       f'(num_classes={p.num_classes})')
    del labels_shape  # int ids or probabilities: both fit.
    scalar = tf.TensorShape([])
    out = NestedMap(per_example_loss=shape[:-1], loss=scalar,
                    accuracy=scalar, logits=shape)
    return base_layer.FPropMetaResult(
        _SOFTMAX_FLOPS_PER_LOGIT * base_layer.NumElements(shape), out, 0)
