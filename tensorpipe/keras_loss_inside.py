"""Keras' compiled loss as micro-batch sums: TensorPipeModel's loss inside.

Under a schedule that runs the loss inside the pipeline (every schedule but
'gpipe', `schedules.LossInside`), the last stage computes each micro-batch's
loss as it finishes (`TensorPipeLayer.FPropLoss`): it needs the loss of a
micro-batch as a SUM, and the whole batch's normaliser before the loop.
Keras' compiled loss reduces each output i's per-example values
l_i = L_i.call(y_i, y_pred_i), weighted by the sample weights w_i, as
(keras/src/losses/loss.py, `reduce_weighted_values`):

  'sum_over_batch_size', 'mean':  S_i / N_i = sum(l_i w_i) / (elements of
                                                            l_i w_i)
  'mean_with_sample_weight':      S_i / N_i = sum(l_i w_i) / sum(w_i)
  'sum':                          S_i / N_i = sum(l_i w_i) / 1

and the compiled loss is sum_i weight_i S_i / N_i (keras/src/trainers/
compile_utils.py, `CompileLoss.call`). Each S_i splits by micro-batch
(`OutputLoss.Weighted`, the same weighting code as Keras) and each N_i is
counted on the whole batch before the loop (`Normalisers`), so:

  one loss:      the pipeline sums S(t) over micro-batches t and divides by
                 N; the loss weight multiplies the result (`Total`);
  several:       micro-batch t contributes sum_i weight_i S_i(t) / N_i, the
                 pipeline sums the contributions (normaliser 1), and each
                 S_i(t) also travels as a metric, so that Keras' per-output
                 loss trackers ('<output>_loss', which compile adds when
                 there are several losses) log S_i / N_i as Keras does
                 (`UpdateLossTrackers`).

Equal to Keras up to the order of the additions. Which output, labels and
sample weights each loss reads is decided once per step on the whole batch
(`Targets`): Keras' paths (`CompileLoss._flat_losses`) resolved on y and
on the outputs aligned as `CompileLoss.call` aligns them (a dict of labels
for a list of outputs, dict losses over list outputs), and the metrics'
outputs as `CompileMetrics._flatten_y` orders them; the pipeline then only
splits those tensors into micro-batches.

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
'none', losses added by layers (`add_loss`), labels that cannot be paired
with the outputs as Keras pairs them (losses for some outputs only, with
labels for those only), and compiled metrics that are not a weighted mean
(AUC, Precision, RootMeanSquaredError ...: their state is not a sum over
rows, and a loss-inside schedule never holds the whole batch's predictions
in one place).

Private Keras API used (Keras 3.15.1): `Trainer._compile_loss` /
`_compile_metrics` (the compiled loss and metrics), `CompileLoss.build`,
`CompileLoss._flat_losses` (the losses resolved per output, as compile's
loss call uses them), `CompileLoss._y_pred_build_structure` /
`_y_true_build_structure` (the structures its call aligns y and y_pred to),
`CompileMetrics.build` / `_flat_metrics` / `_flat_weighted_metrics` /
`_flatten_y` (the metrics resolved per output, and the output order they
pair with), `MeanMetricWrapper._fn` / `_fn_kwargs` and `Mean.total` /
`count` (a weighted mean's function and state),
`keras.src.metrics.reduction_metrics.reduce_to_samplewise_values` and
`keras.src.losses.loss.reduce_weighted_values` /
`unscale_loss_for_distribution` (Keras' own weighting).
"""

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

import keras
import tensorflow as tf
from keras import tree
from keras.src.losses import loss as keras_loss
from keras.src.metrics import reduction_metrics

from tensorpipe import schedules
from tensorpipe.nested_map import NestedMap

# The reductions whose loss is a sum over examples divided by a normaliser.
_REDUCTIONS = ('sum_over_batch_size', 'mean', 'mean_with_sample_weight',
               'sum')


def _Resolve(path: Tuple[Any, ...], value: Any) -> Any:
  """value[path[0]][path[1]]...: CompileLoss.call's `resolve_path`."""
  for key in path:
    value = value[key]
  return value


@dataclasses.dataclass(frozen=True)
class OutputLoss:
  """One compiled loss, of one model output, as sums.

  Attributes:
    key: its key among FPropLoss's targets and metrics ('l<i>').
    path: where Keras finds it in y, the outputs and nested sample weights.
    output: the index of its output among the pipeline's flat outputs.
    loss: the keras.losses.Loss compile resolved for the output.
    weight: compile's loss_weights for it (None: 1).
    tracker: the keras.metrics.Mean logging it unweighted ('<name>_loss',
      compile adds one per loss when there are several), or None.
  """
  key: str
  path: Tuple[Any, ...]
  output: int
  loss: keras.losses.Loss
  weight: Optional[float]
  tracker: Optional[keras.metrics.Mean]

  def Weighted(self, y: Any, y_pred: Any, sample_weight: Any) -> tf.Tensor:
    """Keras' per-example losses times the sample weights (unreduced)."""
    dtype = self.loss.dtype
    y_pred = keras.ops.convert_to_tensor(y_pred, dtype=dtype)
    y = keras.ops.convert_to_tensor(y, dtype=dtype)
    return keras_loss.reduce_weighted_values(
        self.loss.call(y, y_pred), sample_weight=sample_weight,
        reduction='none', dtype=dtype)

  def Normaliser(self, y: Any, y_pred_rows0: Any, sample_weight: Any,
                 rows: Any) -> tf.Tensor:
    """N: what Keras divides this loss's batch sum by.

    Args:
      y, sample_weight: the whole batch's labels and weights (or None).
      y_pred_rows0: zeros shaped like the output of 0 rows: the weighted
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
    per_row = tf.shape(self.Weighted(y[:0], y_pred_rows0, w0))[1:]
    return tf.cast(rows * tf.reduce_prod(per_row), dtype)

  def Value(self, loss: tf.Tensor, dtype: str) -> tf.Tensor:
    """Keras' term of the compiled loss from this loss's S / N: cast to
    the compiled dtype, times the loss weight."""
    loss = tf.cast(loss, dtype)
    if self.weight is not None:
      # Keras' op: tf.cast(0.7, 'float64') would round 0.7 to float32 first.
      loss = keras.ops.multiply(loss, self.weight)
    return loss


@dataclasses.dataclass(frozen=True)
class MeanMetric:
  """One compiled weighted-mean metric.

  Attributes:
    key: its key among FPropLoss's metrics ('m<i>').
    output: the index of its output among the pipeline's flat outputs.
    target: the key of its labels (and weights) in `Targets` ('o<i>').
    metric: the keras.metrics.MeanMetricWrapper compile resolved.
    weighted: from compile's weighted_metrics (gets the sample weights).
  """
  key: str
  output: int
  target: str
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


def _Pair(y: Any, sample_weight: Any) -> NestedMap:
  """NestedMap(y=labels, w=sample weights), w absent when None."""
  return NestedMap(y=y) if sample_weight is None else NestedMap(
      y=y, w=sample_weight)


@dataclasses.dataclass(frozen=True)
class CompiledLoss:
  """The compiled losses (and weighted-mean metrics) of a model, as sums.

  Per step:
    targets = compiled.Targets(y, sample_weight)      # whole batch
    norms = compiled.Normalisers(targets, zeros of 0 rows per output, rows)
    res = pipe.FPropLoss(theta, xs, targets, compiled.LossFn(norms),
                         compiled.PipelineNormaliser(norms))
    loss = compiled.Total(res.loss)
    compiled.UpdateLossTrackers(res.metrics, norms, rows)
    compiled.UpdateMetrics(res.metrics)

  Attributes:
    where: the start of every error message (the model and schedule).
    losses: one per compiled loss, in Keras' order.
    dtype: the compiled loss's dtype (Keras casts each loss to it).
    metrics: the compiled metrics, each a weighted mean.
    output_index: the model's output structure (a dict keyed as its outputs,
      a list, or one leaf) with each output's index among the pipeline's
      flat outputs as its leaf.
    keras_loss: Keras' CompileLoss (its alignment of y and the outputs).
    keras_metrics: Keras' CompileMetrics, or None.
  """
  where: str
  losses: Tuple[OutputLoss, ...]
  dtype: str
  metrics: Tuple[MeanMetric, ...]
  output_index: Any
  keras_loss: Any
  keras_metrics: Any

  # -- before the loop, on the whole batch ----------------------------------

  def Targets(self, y: Any, sample_weight: Any) -> NestedMap:
    """What the pipeline splits into micro-batches with the inputs: per
    loss 'l<i>' and per output read by metrics 'o<i>', NestedMap(y=its
    labels, w=its sample weights if any)."""
    out = NestedMap()
    y_aligned, _ = _AlignedToBuild(self.keras_loss, y, self.output_index,
                                   self.where)
    nested_w = sample_weight is not None and tree.is_nested(sample_weight)
    for l in self.losses:
      w = _Resolve(l.path, sample_weight) if nested_w else sample_weight
      out[l.key] = _Pair(_Resolve(l.path, y_aligned), w)
    if self.metrics:
      flatten = self.keras_metrics._flatten_y  # pylint: disable=protected-access
      ys = flatten(y)
      ws = [None] * len(ys)
      if sample_weight is not None:
        ws = flatten(sample_weight)
        if len(ws) < len(ys):  # one array for every output, as Keras
          ws = [ws[0]] * len(ys)
      outputs = flatten(self.output_index)
      for m in self.metrics:
        i = outputs.index(m.output)
        out[m.target] = _Pair(ys[i], ws[i])
    return out

  def Normalisers(self, targets: NestedMap, y_pred_rows0: Sequence[Any],
                  rows: Any) -> List[tf.Tensor]:
    """N_i per loss, on the whole batch (`Targets`' result); y_pred_rows0:
    zeros of 0 rows per flat output."""
    return [l.Normaliser(targets[l.key].y, y_pred_rows0[l.output],
                         targets[l.key].get('w'), rows)
            for l in self.losses]

  def PipelineNormaliser(self, normalisers: Sequence[tf.Tensor]) -> Any:
    """What FPropLoss divides the summed micro-batch losses by: N for one
    loss; 1 for several (each micro-batch divides by its N_i itself)."""
    return normalisers[0] if len(self.losses) == 1 else 1.0

  # -- per micro-batch, on the last stage -----------------------------------

  def LossFn(self, normalisers: Sequence[tf.Tensor]) -> Any:
    """FPropLoss's loss_fn: (flat outputs, targets of one micro-batch) ->
    NestedMap(loss=its loss sum, metrics=key -> (sum, count))."""
    def LossSums(outs: Any, targets: NestedMap) -> NestedMap:
      outs = _Flat(outs)
      sums = [tf.reduce_sum(l.Weighted(targets[l.key].y, outs[l.output],
                                       targets[l.key].get('w')))
              for l in self.losses]
      metrics = self.MetricSums(outs, targets)
      if len(self.losses) == 1:
        return NestedMap(loss=sums[0], metrics=metrics)
      for l, s in zip(self.losses, sums):
        metrics[l.key] = (s, tf.ones([], s.dtype))
      return NestedMap(loss=tf.add_n([
          l.Value(s / n, self.dtype)
          for l, s, n in zip(self.losses, sums, normalisers)]),
                       metrics=metrics)
    return LossSums

  def MetricSums(self, outs: Any, targets: NestedMap) -> NestedMap:
    """key -> (sum, count) of each metric over these rows; outs: the
    pipeline's flat outputs (or its one output)."""
    outs = _Flat(outs)
    return NestedMap({
        m.key: m.Sums(targets[m.target].y, outs[m.output],
                      targets[m.target].get('w')) for m in self.metrics})

  # -- after the loop ---------------------------------------------------------

  def Total(self, loss: tf.Tensor) -> tf.Tensor:
    """The compiled loss from the pipeline's (sum / normaliser)."""
    if len(self.losses) == 1:
      return self.losses[0].Value(loss, self.dtype)
    return tf.cast(loss, self.dtype)

  def UpdateLossTrackers(self, sums: Any, normalisers: Sequence[tf.Tensor],
                         rows: Optional[int]) -> None:
    """Keras' per-loss trackers ('<output>_loss', several losses only)
    updated as CompileLoss.call does: S_i / N_i unweighted, cast to the
    compiled dtype, weighted by the outputs' static rows (None: 1)."""
    for l, n in zip(self.losses, normalisers):
      if l.tracker is not None:
        value = tf.cast(sums[l.key][0] / n, self.dtype)
        l.tracker.update_state(
            keras_loss.unscale_loss_for_distribution(value),
            sample_weight=rows)

  def MetricPairs(self, sums: Any) -> Dict[str, Any]:
    """The metrics' (sum, count) pairs among FPropLoss's metrics."""
    return {m.key: tuple(sums[m.key]) for m in self.metrics}

  def UpdateMetrics(self, sums: Any) -> None:
    """Keras' metric states updated once from the step's summed pairs."""
    for m in self.metrics:
      m.Update(*sums[m.key])


def _Flat(outs: Any) -> Tuple[Any, ...]:
  """The pipeline's outputs as a tuple (one output: a 1-tuple)."""
  return tuple(outs) if isinstance(outs, (list, tuple)) else (outs,)


def _AlignedToBuild(keras_loss_: Any, y: Any, index: Any,
                    where: str) -> Tuple[Any, Any]:
  """(y, output index) in the structures Keras' CompileLoss.call resolves
  each loss's path in: its alignment, run on index leaves for the outputs.

  Args:
    keras_loss_: Keras' built CompileLoss.
    y: the labels as fit passes them.
    index: the outputs' structure with their flat indices as leaves.
    where: the start of an error message.
  """
  if not tree.is_nested(y) and not tree.is_nested(index):
    return y, index
  y = _AlignLabels(y, index, keras_loss_.output_names, where)
  # pylint: disable=protected-access
  built = ((keras_loss_._y_true_build_structure, y),
           (keras_loss_._y_pred_build_structure, index))
  # pylint: enable=protected-access
  out = []
  for structure, value in built:
    try:
      tree.assert_same_structure(structure, value)
    except ValueError:
      value = tree.pack_sequence_as(structure, tree.flatten(value))
    out.append(value)
  return out[0], out[1]


def _AlignLabels(y: Any, index: Any, output_names: Any, where: str) -> Any:
  """y in the outputs' structure, as CompileLoss.call aligns it before
  resolving the losses' paths, or ValueError (one line)."""
  try:
    tree.assert_same_structure(index, y)
    return y
  except ValueError:
    pass
  if not tree.is_nested(y) and hasattr(index, '__len__') and len(index) == 1:
    y = [y]
  elif (isinstance(index, (list, tuple)) and isinstance(y, dict) and
        output_names and set(output_names) == set(y)):
    y = [y[name] for name in output_names]
  flat = tree.flatten(y)
  if len(flat) != len(tree.flatten(index)):
    raise ValueError(
        f'{where}, which pairs one array of labels with each of the model\'s '
        f'{len(tree.flatten(index))} outputs; got {len(flat)}: pass labels '
        "for every output (a list, or a dict keyed by output name), or use "
        "schedule='gpipe'")
  return tree.pack_sequence_as(index, flat)


def Check(model: keras.Model, schedule: Any, y: Any, y_pred_like: Any,
          output_index: Any) -> CompiledLoss:
  """The model's compiled losses as sums, or ValueError (one line) where
  the loss inside the pipeline cannot reproduce Keras' step exactly.

  Args:
    model: the compiled TensorPipeModel.
    schedule: its schedule (for the messages).
    y: the step's labels, as fit passes them.
    y_pred_like: the outputs' structure, as the model returns them.
    output_index: the same structure, each output's index among the
      pipeline's flat outputs as its leaf.
  """
  where = (f'TensorPipeModel {model.name!r}: schedule='
           f'{schedules.Label(schedule)!r} runs the loss inside the pipeline')
  if model.losses:
    raise ValueError(f'{where}; the {len(model.losses)} losses added by '
                     "layers (add_loss) are not supported: use "
                     "schedule='gpipe'")
  compiled = getattr(model, '_compile_loss', None)
  if compiled is None:
    raise ValueError(f'{where} and needs a loss: compile(optimizer, loss)')
  if not compiled.built:
    compiled.build(_AlignLabels(y, output_index, compiled.output_names, where)
                   if tree.is_nested(output_index) else y, y_pred_like)
  flat = compiled._flat_losses  # pylint: disable=protected-access
  trackers = list(compiled.metrics) or [None] * len(flat)
  _, index = _AlignedToBuild(compiled, y, output_index, where)
  losses = []
  for i, ((path, loss, weight, _), tracker) in enumerate(zip(flat, trackers)):
    if loss.reduction not in _REDUCTIONS:
      raise ValueError(
          f'{where}, which needs the loss as a sum over examples; the loss '
          f'{loss.name!r} has reduction={loss.reduction!r}: use one of '
          f"{list(_REDUCTIONS)}, or schedule='gpipe'")
    losses.append(OutputLoss(f'l{i}', tuple(path), _Resolve(path, index),
                             loss, weight, tracker))
  keras_metrics = getattr(model, '_compile_metrics', None)
  return CompiledLoss(
      where, tuple(losses), compiled.dtype,
      _MeanMetrics(keras_metrics, where, y, y_pred_like, output_index),
      output_index, compiled, keras_metrics)


def _MeanMetrics(compiled: Any, where: str, y: Any, y_pred_like: Any,
                 output_index: Any) -> Tuple[MeanMetric, ...]:
  """The compiled metrics, each a weighted mean, or ValueError naming the
  first that is not."""
  if compiled is None:
    return ()
  if not compiled.built:
    compiled.build(y, y_pred_like)
  outputs = compiled._flatten_y(output_index)  # pylint: disable=protected-access
  out: List[MeanMetric] = []
  # pylint: disable=protected-access
  per_output = ((False, compiled._flat_metrics),
                (True, compiled._flat_weighted_metrics))
  # pylint: enable=protected-access
  for weighted, lists in per_output:
    for i, mls in enumerate(lists):
      for metric in (mls.metrics if mls else ()):
        if not IsWeightedMean(metric):
          raise ValueError(
              f'{where}, which never holds the whole batch\'s predictions '
              f'that the compiled metric {metric.name!r} '
              f'({type(metric).__name__}) needs: only weighted means '
              '(MeanMetricWrapper: accuracy, MAE, ...) are summed per '
              'micro-batch; compile without it (and evaluate() with it after '
              "training), or use schedule='gpipe'")
        out.append(MeanMetric(f'm{len(out)}', outputs[i], f'o{outputs[i]}',
                              metric, weighted))
  return tuple(out)


def IsWeightedMean(metric: Any) -> bool:
  """Whether `metric` is a Keras MeanMetricWrapper with Keras' own
  update_state and result (its state: sum of v w, sum of w)."""
  cls = type(metric)
  return (isinstance(metric, reduction_metrics.MeanMetricWrapper) and
          cls.update_state is reduction_metrics.MeanMetricWrapper.update_state
          and cls.result is reduction_metrics.Mean.result)
