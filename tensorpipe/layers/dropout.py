"""Dropout whose mask does not depend on how the batch is split.

The mask is drawn with `py_utils.StatelessUniform`, counter-based randomness
keyed by the layer's seed, the step seed and the example index within the
global batch, example by example along the context's batch axis
(`py_utils.BatchAxis`, which `TensorPipeLayer` sets from its batch_dim). A
micro-batch therefore gets exactly the examples' part of the mask the whole
mini-batch would get, whatever the number of micro-batches or partitions and
whichever axis holds the batch, and a recomputed forward pass
(rematerialization) reproduces it.
"""

from typing import List

import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import py_utils

# FLOPs per element in training: compare, multiply by the scaled mask.
_DROPOUT_FLOPS_PER_ELEMENT = 2


class DropoutLayer(base_layer.BaseLayer):
  """Inverted dropout: x * mask / keep_prob in training, identity in eval.

  Usage:
    p = DropoutLayer.Params().Set(name='dropout', keep_prob=0.9)
    # Spatial dropout: one mask value per (example, channel).
    p.noise_shape_broadcast_dims = [1, 2]
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('keep_prob', 1.0, 'Probability of keeping each element, in '
             '(0, 1]; 1.0 disables dropout.')
    p.Define('noise_shape_broadcast_dims', None, 'Optional list of input '
             'axes along which one mask value is shared (e.g. [1, 2] drops '
             'whole channels of [batch, h, w, c]); the batch axis '
             '(py_utils.BatchAxis, 0 by default) cannot be one of them.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if not (isinstance(p.keep_prob, (int, float)) and 0.0 < p.keep_prob <= 1.0):
      raise ValueError(f'DropoutLayer {p.name!r}: keep_prob={p.keep_prob!r} '
                       'must be in (0, 1]; use 1.0 for no dropout')
    dims = p.noise_shape_broadcast_dims
    if dims is not None:
      if (not isinstance(dims, (list, tuple)) or
          not all(isinstance(d, int) for d in dims)):
        raise ValueError(f'DropoutLayer {p.name!r}: noise_shape_broadcast_dims'
                         f'={dims!r} must be None or a list of ints')

  def _MaskShape(self, shape: tf.TensorShape) -> List[int]:
    p = self.params
    if not shape.is_fully_defined():
      raise ValueError(f'DropoutLayer {p.name!r}: input shape {shape} must be '
                       'static to draw a mask')
    mask_shape = shape.as_list()
    batch_axis = py_utils.CurrentBatchAxis()
    for d in p.noise_shape_broadcast_dims or ():
      axis = d + shape.rank if d < 0 else d
      if not 0 <= axis < shape.rank:
        raise ValueError(f'DropoutLayer {p.name!r}: broadcast dim {d} is out '
                         f'of range for an input of shape {shape}')
      if axis == batch_axis:
        # The batch axis is known only here (the context's, at trace time).
        raise ValueError(f'DropoutLayer {p.name!r}: noise_shape_broadcast_dims'
                         f'={p.noise_shape_broadcast_dims!r} includes the '
                         f'batch axis {batch_axis}, whose mask must differ '
                         'per example (so that micro-batches agree with the '
                         f'whole batch); remove {d}')
      mask_shape[axis] = 1
    return mask_shape

  def FProp(self, theta, x: tf.Tensor) -> tf.Tensor:
    """Applies dropout.

    Args:
      theta: unused (no weights).
      x: float tensor with the batch on the context's batch axis ([batch,
        ...] by default); its static shape must be known.

    Returns:
      A tensor like x, in fprop_dtype.
    """
    del theta  # no weights
    p = self.params
    x = tf.cast(x, self.fprop_dtype)
    if p.keep_prob == 1.0 or not py_utils.IsTraining(
        f'{type(self).__name__} {self.path or self.layer_name!r}'):
      return x
    uniform = py_utils.StatelessUniform(self._MaskShape(x.shape),
                                        self.LayerSeed())
    scaled_mask = tf.cast(uniform < p.keep_prob, tf.float32) / p.keep_prob
    return x * tf.cast(scaled_mask, x.dtype)

  @classmethod
  def FPropMeta(cls, p, x_shape):
    """FLOPs (counted as in training): 2 per element if keep_prob < 1."""
    shape = base_layer.ToShape(x_shape)
    flops = 0
    if p.keep_prob < 1.0:
      flops = _DROPOUT_FLOPS_PER_ELEMENT * base_layer.NumElements(shape)
    return base_layer.FPropMetaResult(flops, shape, 0)
