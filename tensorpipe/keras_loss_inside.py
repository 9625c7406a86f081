"""Keras' compiled loss as micro-batch sums: TensorPipeModel's loss inside.

Under a schedule that runs the loss inside the pipeline (every schedule but
'gpipe', `schedules.LossInside`), the last stage computes each micro-batch's
loss as it finishes (`TensorPipeLayer.FPropLoss`): it needs the loss of a
micro-batch as a SUM, and the whole batch's normaliser before the loop.
Keras' compiled loss L (one output, a keras.losses.Loss) reduces its
per-example values l = L.call(y, y_pred), weighted by the sample weights
w, as (keras/src/losses/loss.py, `reduce_weighted_values`):

  'sum_over_batch_size', 'mean':  sum(l * w) / (elements of l * w)
  'mean_with_sample_weight':      sum(l * w) / sum(w)  (elements without w)
  'sum':                          sum(l * w)

so the sum splits by micro-batch (`LossSum`, the same weighting code as
Keras) and the normaliser (`Normaliser`) is counted on the whole batch.
Equal to Keras up to the order of the additions. Not reproducible this way,
and refused by `Check` in one line: reduction 'none', several outputs,
losses added by layers (`add_loss`) and compiled metrics (Keras computes
them from the whole batch's predictions, which a loss-inside schedule never
holds in one place).

Private Keras API used (Keras 3.15.1): `Trainer._compile_loss` /
`_compile_metrics` (the compiled loss and metrics), `CompileLoss.build`,
`CompileLoss._flat_losses` (the losses resolved per output, as compile's
loss call uses them), `CompileMetrics._user_metrics` /
`_user_weighted_metrics` (for the refusal's message) and
`keras.src.losses.loss.reduce_weighted_values` (Keras' own weighting).
"""

import dataclasses
from typing import Any, Optional

import keras
import tensorflow as tf
from keras.src.losses import loss as keras_loss

from tensorpipe import schedules

# The reductions whose loss is a sum over examples divided by a normaliser.
_REDUCTIONS = ('sum_over_batch_size', 'mean', 'mean_with_sample_weight',
               'sum')


@dataclasses.dataclass(frozen=True)
class CompiledLoss:
  """The compiled loss of a one-output model, as sums.

  Attributes:
    loss: the keras.losses.Loss compile resolved for the output.
    weight: compile's loss_weights for it (None: 1).
    dtype: the compiled loss's dtype (Keras casts the loss to it).
  """
  loss: keras.losses.Loss
  weight: Optional[float]
  dtype: str

  def _Weighted(self, y: Any, y_pred: Any, sample_weight: Any) -> tf.Tensor:
    """Keras' per-example losses times the sample weights (unreduced)."""
    dtype = self.loss.dtype
    y_pred = keras.ops.convert_to_tensor(y_pred, dtype=dtype)
    y = keras.ops.convert_to_tensor(y, dtype=dtype)
    return keras_loss.reduce_weighted_values(
        self.loss.call(y, y_pred), sample_weight=sample_weight,
        reduction='none', dtype=dtype)

  def LossSum(self, y_pred: Any, targets: Any) -> tf.Tensor:
    """One micro-batch's loss sum (FPropLoss's loss_fn); targets is
    NestedMap(y=labels, w=sample weights or absent)."""
    return tf.reduce_sum(self._Weighted(targets.y, y_pred, targets.get('w')))

  def Normaliser(self, y: Any, y_pred_rows0: Any, sample_weight: Any,
                 rows: Any) -> tf.Tensor:
    """What Keras divides the batch's summed loss by.

    Args:
      y, sample_weight: the whole batch's labels and weights (or None).
      y_pred_rows0: zeros shaped like the outputs of 0 rows: the weighted
        losses of 0 rows give the per-row shape without computing any.
      rows: the batch's rows.
    """
    dtype = self.loss.dtype
    reduction = self.loss.reduction
    if reduction == 'sum':
      return tf.constant(1, dtype)
    if reduction == 'mean_with_sample_weight' and sample_weight is not None:
      return tf.reduce_sum(tf.cast(sample_weight, dtype))
    w0 = None if sample_weight is None else sample_weight[:0]
    per_row = tf.shape(self._Weighted(y[:0], y_pred_rows0, w0))[1:]
    return tf.cast(rows * tf.reduce_prod(per_row), dtype)

  def Total(self, loss: tf.Tensor) -> tf.Tensor:
    """The compiled loss from the pipeline's (sum / normaliser): Keras'
    cast to the compiled dtype, times the loss weight."""
    loss = tf.cast(loss, self.dtype)
    if self.weight is not None:
      loss = loss * tf.cast(self.weight, self.dtype)
    return loss


def Check(model: keras.Model, schedule: Any, single_output: bool, y: Any,
          y_pred_like: Any) -> CompiledLoss:
  """The model's compiled loss as sums, or ValueError (one line) where the
  loss inside the pipeline cannot reproduce Keras' step exactly."""
  where = (f'TensorPipeModel {model.name!r}: schedule='
           f'{schedules.Label(schedule)!r} runs the loss inside the pipeline')
  if not single_output:
    raise ValueError(f'{where}, for a model with one output; this model has '
                     "several: use schedule='gpipe'")
  metrics = getattr(model, '_compile_metrics', None)
  if metrics is not None:
    user = [metrics._user_metrics, metrics._user_weighted_metrics]  # pylint: disable=protected-access
    names = [getattr(m, 'name', None) or str(m)
             for m in tf.nest.flatten(user) if m is not None]
    raise ValueError(
        f'{where}, which never holds the whole batch\'s predictions that '
        f'the compiled metrics {names} need; compile without metrics (and '
        "evaluate() with them after training), or use schedule='gpipe'")
  if model.losses:
    raise ValueError(f'{where}; the {len(model.losses)} losses added by '
                     "layers (add_loss) are not supported: use "
                     "schedule='gpipe'")
  compiled = getattr(model, '_compile_loss', None)
  if compiled is None:
    raise ValueError(f'{where} and needs a loss: compile(optimizer, loss)')
  if not compiled.built:
    compiled.build(y, y_pred_like)
  flat = compiled._flat_losses  # pylint: disable=protected-access
  if len(flat) != 1:
    raise ValueError(f'{where}, for one loss; got {len(flat)}: use '
                     "schedule='gpipe'")
  _, loss, weight, _ = flat[0]
  if loss.reduction not in _REDUCTIONS:
    raise ValueError(
        f'{where}, which needs the loss as a sum over examples; the loss '
        f'{loss.name!r} has reduction={loss.reduction!r}: use one of '
        f"{list(_REDUCTIONS)}, or schedule='gpipe'")
  return CompiledLoss(loss, weight, compiled.dtype)
