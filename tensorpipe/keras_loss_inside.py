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
Equal to Keras up to the order of the additions.

Compiled metrics: a weighted-mean metric (`keras.metrics.MeanMetricWrapper`
with Keras' own update_state and result: accuracy, MAE, MSE, crossentropy
...) keeps two numbers, total and count, and one batch adds

  total += sum(v * w),  count += sum(w)      (w = 1 per row without weights)

where v = the metric's per-row values (Keras' `reduce_to_samplewise_values`),
so each micro-batch's (sum, count) pair is computed on the last stage with
the loss (`MetricSums`, as the Params tasks' `LossSums` return theirs), the
pipeline sums the pairs over micro-batches, and Keras' metric states are
updated once after the step (`UpdateMetrics`): the logged metric is Keras'
on the whole batch, up to the order of the additions.

Not reproducible this way, and refused by `Check` in one line: reduction
'none', several outputs, losses added by layers (`add_loss`) and compiled
metrics that are not a weighted mean (AUC, Precision, RootMeanSquaredError
...: their state is not a sum over rows, and a loss-inside schedule never
holds the whole batch's predictions in one place).

Private Keras API used (Keras 3.15.1): `Trainer._compile_loss` /
`_compile_metrics` (the compiled loss and metrics), `CompileLoss.build`,
`CompileLoss._flat_losses` (the losses resolved per output, as compile's
loss call uses them), `CompileMetrics.build` / `_flat_metrics` /
`_flat_weighted_metrics` (the metrics resolved per output),
`MeanMetricWrapper._fn` / `_fn_kwargs` and `Mean.total` / `count` (a
weighted mean's function and state),
`keras.src.metrics.reduction_metrics.reduce_to_samplewise_values` and
`keras.src.losses.loss.reduce_weighted_values` (Keras' own weighting).
"""

import dataclasses
from typing import Any, List, Optional, Tuple

import keras
import tensorflow as tf
from keras.src.losses import loss as keras_loss
from keras.src.metrics import reduction_metrics

from tensorpipe import schedules
from tensorpipe.nested_map import NestedMap

# The reductions whose loss is a sum over examples divided by a normaliser.
_REDUCTIONS = ('sum_over_batch_size', 'mean', 'mean_with_sample_weight',
               'sum')


@dataclasses.dataclass(frozen=True)
class MeanMetric:
  """One compiled weighted-mean metric.

  Attributes:
    key: its key among FPropLoss's metrics ('m<i>').
    metric: the keras.metrics.MeanMetricWrapper compile resolved.
    weighted: from compile's weighted_metrics (gets the sample weights).
  """
  key: str
  metric: reduction_metrics.MeanMetricWrapper
  weighted: bool

  def Sums(self, y: Any, y_pred: Any, sample_weight: Any
           ) -> Tuple[tf.Tensor, tf.Tensor]:
    """(sum of the rows' values, their count or weight sum): what one
    `Mean.update_state` on these rows adds to (total, count)."""
    m = self.metric
    w = sample_weight if self.weighted else None
    values, w = reduction_metrics.reduce_to_samplewise_values(
        m._fn(y, y_pred, **m._fn_kwargs), w,  # pylint: disable=protected-access
        reduce_fn=keras.ops.mean, dtype=m.dtype)
    if w is not None:
      count = tf.reduce_sum(w)
    elif values.shape.rank:
      count = tf.shape(values)[0]
    else:
      count = 1
    return tf.reduce_sum(values), tf.cast(count, m.dtype)

  def Update(self, total: tf.Tensor, count: tf.Tensor) -> None:
    """Adds the step's sums to the metric's state (once per step)."""
    self.metric.total.assign_add(tf.cast(total, self.metric.total.dtype))
    self.metric.count.assign_add(tf.cast(count, self.metric.count.dtype))


@dataclasses.dataclass(frozen=True)
class CompiledLoss:
  """The compiled loss (and weighted-mean metrics) of a one-output model,
  as sums.

  Attributes:
    loss: the keras.losses.Loss compile resolved for the output.
    weight: compile's loss_weights for it (None: 1).
    dtype: the compiled loss's dtype (Keras casts the loss to it).
    metrics: the compiled metrics, each a weighted mean.
  """
  loss: keras.losses.Loss
  weight: Optional[float]
  dtype: str
  metrics: Tuple[MeanMetric, ...] = ()

  def _Weighted(self, y: Any, y_pred: Any, sample_weight: Any) -> tf.Tensor:
    """Keras' per-example losses times the sample weights (unreduced)."""
    dtype = self.loss.dtype
    y_pred = keras.ops.convert_to_tensor(y_pred, dtype=dtype)
    y = keras.ops.convert_to_tensor(y, dtype=dtype)
    return keras_loss.reduce_weighted_values(
        self.loss.call(y, y_pred), sample_weight=sample_weight,
        reduction='none', dtype=dtype)

  def LossSum(self, y_pred: Any, targets: Any) -> NestedMap:
    """FPropLoss's loss_fn: one micro-batch's NestedMap(loss=loss sum,
    metrics=key -> (sum, count)); targets is NestedMap(y=labels, w=sample
    weights or absent)."""
    w = targets.get('w')
    return NestedMap(
        loss=tf.reduce_sum(self._Weighted(targets.y, y_pred, w)),
        metrics=self.MetricSums(targets.y, y_pred, w))

  def MetricSums(self, y: Any, y_pred: Any, sample_weight: Any) -> NestedMap:
    """key -> (sum, count) of each metric over these rows."""
    return NestedMap({m.key: m.Sums(y, y_pred, sample_weight)
                      for m in self.metrics})

  def UpdateMetrics(self, sums: Any) -> None:
    """Keras' metric states updated once from the step's summed pairs."""
    for m in self.metrics:
      m.Update(*sums[m.key])

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
  return CompiledLoss(loss, weight, compiled.dtype,
                      _MeanMetrics(model, where, y, y_pred_like))


def _MeanMetrics(model: keras.Model, where: str, y: Any,
                 y_pred_like: Any) -> Tuple[MeanMetric, ...]:
  """The compiled metrics, each a weighted mean, or ValueError naming the
  first that is not."""
  compiled = getattr(model, '_compile_metrics', None)
  if compiled is None:
    return ()
  if not compiled.built:
    compiled.build(y, y_pred_like)
  out: List[MeanMetric] = []
  # pylint: disable=protected-access
  per_output = ((False, compiled._flat_metrics),
                (True, compiled._flat_weighted_metrics))
  # pylint: enable=protected-access
  for weighted, lists in per_output:
    for metric in [m for mls in lists if mls for m in mls.metrics]:
      if not IsWeightedMean(metric):
        raise ValueError(
            f'{where}, which never holds the whole batch\'s predictions '
            f'that the compiled metric {metric.name!r} '
            f'({type(metric).__name__}) needs: only weighted means '
            '(MeanMetricWrapper: accuracy, MAE, ...) are summed per '
            'micro-batch; compile without it (and evaluate() with it after '
            "training), or use schedule='gpipe'")
      out.append(MeanMetric(f'm{len(out)}', metric, weighted))
  return tuple(out)


def IsWeightedMean(metric: Any) -> bool:
  """Whether `metric` is a Keras MeanMetricWrapper with Keras' own
  update_state and result (its state: sum of v w, sum of w)."""
  cls = type(metric)
  return (isinstance(metric, reduction_metrics.MeanMetricWrapper) and
          cls.update_state is reduction_metrics.MeanMetricWrapper.update_state
          and cls.result is reduction_metrics.Mean.result)
