"""Tasks: a model plus its loss, metrics and training settings (`p.train`).

A task is a layer holding the model (a TensorPipeLayer or any layer) as child
`model`. `FProp(theta, batch)` maps a NestedMap batch (conventions in
base_input.py) to NestedMap(loss=scalar, metrics=NestedMap(name=(value,
weight))). The training settings live in `p.train` as in Lingvo: optimizer and
learning-rate schedule Params, gradient clipping, L2 weight, steps and
intervals (`train_params.py`); the trainer (trainer_lib) reads them.

Usage:
  p = ClassificationTask.Params().Set(name='task', model=pipeline_p,
                                      num_classes=10)
  p.train.optimizer = optimizers.RMSProp.Params()
  task = p.Instantiate()
  out = task.FPropDefaultTheta(batch)     # out.loss, out.metrics.accuracy
"""

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from tensorpipe import base_input
from tensorpipe import base_layer
from tensorpipe import decode_metrics
from tensorpipe import errors
from tensorpipe import microbatch
from tensorpipe import pipeline
from tensorpipe import py_utils
from tensorpipe import schedules
from tensorpipe import train_params
from tensorpipe.layers import composite
from tensorpipe.layers import losses
from tensorpipe.layers import transformer
from tensorpipe.nested_map import NestedMap


class BaseTask(base_layer.BaseLayer):
  """Base class of tasks: the model as child `model`, settings in `train`."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('model', None, 'Params of the model layer (e.g. a '
             'TensorPipeLayer).')
    p.Define('train', train_params.TrainParams(), 'Training settings: optimizer, '
             'lr_schedule, clipping, L2, steps and intervals.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.model is None:
      raise ValueError(f'{type(self).__name__} {p.name!r}: p.model is None; '
                       'set the model layer Params, e.g. a TensorPipeLayer')
    self.CreateChild('model', p.model)

  def RegularizationLoss(self) -> tf.Tensor:
    """train.l2_regularizer_weight * sum(w^2) / 2 over regularised weights.

    float64 when every regularised weight is float64, else float32.
    """
    tp = self.params.train
    regularised = [v for v in self.trainable_variables
                   if tp.l2_regularize_all or v.shape.rank >= 2]
    dtype = (tf.float64 if regularised and all(
        v.dtype == tf.float64 for v in regularised) else tf.float32)
    if not tp.l2_regularizer_weight or not regularised:
      return tf.constant(0.0, dtype)
    terms = [tf.nn.l2_loss(tf.cast(v, dtype)) for v in regularised]
    return tp.l2_regularizer_weight * tf.add_n(terms)

  def ComputeLoss(self, batch: NestedMap) -> NestedMap:
    """FProp with the variables plus the L2 term (what the trainer calls).

    Returns:
      NestedMap(loss=total loss, metrics=...); metrics.loss is the data loss
      and metrics.total_loss includes the L2 term.
    """
    out = self.FPropDefaultTheta(batch)
    reg = self.RegularizationLoss()
    out.loss = out.loss + reg
    one = tf.constant(1.0)
    out.metrics.total_loss = (out.loss, one)
    if self.params.train.l2_regularizer_weight:
      out.metrics.l2_loss = (reg, one)
    return out

  def CheckInputSpec(self, element_spec, batch_size: int, name: str) -> None:
    """Checks batches of `element_spec` fit the task, before any tracing.

    Args:
      element_spec: the input dataset's element_spec.
      batch_size: the examples this task's model gets per step.
      name: the input's Params key ('input', 'eval_input') for messages.

    Raises:
      ValueError: the batches lack the task's input key, or the batch does
        not split into the pipeline's micro-batches (naming the fix).
    """
    keys = sorted(element_spec.keys()) if isinstance(element_spec,
                                                      dict) else []
    input_key = getattr(self.params, 'input_key', None)
    if isinstance(element_spec, dict) and input_key is not None and (
        input_key not in element_spec):
      raise ValueError(
          f'task.input_key={input_key!r} is not a key of the {name} batches; '
          f'they have {keys}: set task.input_key to one of them')
    model = self.children.get('model')
    if isinstance(model, pipeline.TensorPipeLayer):
      mp = model.params
      try:
        microbatch.NumMicroBatches(batch_size, mp.num_micro_batches,
                                   mp.micro_batch_size)
      except (ValueError, TypeError) as e:
        first = errors.FirstLine(e)
        raise type(e)(f'{name}.batch_size={batch_size} does not fit the '
                      f'pipeline task.model: {first}') from None

  def BatchSize(self, batch: NestedMap) -> tf.Tensor:
    return tf.shape(tf.nest.flatten(batch)[0])[0]

  @staticmethod
  def SplitExampleWeights(batch: NestedMap
                          ) -> Tuple[NestedMap, Optional[tf.Tensor]]:
    """(the batch without base_input.EXAMPLE_WEIGHT, those weights or None).

    An eval batch padded up to the batch size weighs its padding 0
    (tensorpipe/base_input.py); metrics leave those rows out.
    """
    if base_input.EXAMPLE_WEIGHT not in batch:
      return batch, None
    rest = NestedMap({k: v for k, v in batch.items()
                      if k != base_input.EXAMPLE_WEIGHT})
    return rest, tf.cast(batch[base_input.EXAMPLE_WEIGHT], tf.float32)

  @staticmethod
  def AggregateMetrics(per_batch: list) -> Dict[str, float]:
    """Weighted means of metric (value, weight) pairs over batches."""
    sums: Dict[str, Tuple[float, float]] = {}
    for metrics in per_batch:
      for name, (value, weight) in metrics.items():
        s, w = sums.get(name, (0.0, 0.0))
        sums[name] = (s + float(value) * float(weight), w + float(weight))
    return {name: s / w if w else float('nan')
            for name, (s, w) in sums.items()}

  def PostProcessEvalMetrics(self, metrics: Dict[str, float]) -> Dict[
      str, float]:
    """Derived eval metrics (e.g. perplexity); default: unchanged."""
    return metrics

  def CreateDecodeMetrics(self, eval_input: base_input.BaseInput) -> Optional[
      decode_metrics.DecodeMetrics]:
    """Metrics of decoded outputs for one evaluation on `eval_input`.

    Trainer.Evaluate calls Update(batch) on the result for every eval batch
    and adds its Finalize() values to the eval metrics. Default: None (the
    task does not decode).
    """
    del eval_input  # unused
    return None


def _TrainsWith1F1B(model: base_layer.BaseLayer) -> bool:
  """Whether `model` trains with the loss inside it (schedule not 'gpipe')."""
  return (isinstance(model, pipeline.TensorPipeLayer) and
          schedules.LossInside(model.params.schedule) and
          py_utils.IsTraining())


def _AccumulationCast(x: tf.Tensor) -> tf.Tensor:
  """x in float32, or float64 for float64 x (py_utils.AccumulationDtype)."""
  return tf.cast(x, py_utils.AccumulationDtype(x.dtype))


def _MeanMetrics(sums: NestedMap) -> NestedMap:
  """(value sum, weight sum) pairs -> (weighted mean, weight sum) pairs."""
  return NestedMap({name: (value / tf.maximum(weight, 1.0), weight)
                    for name, (value, weight) in sums.items()})


class ClassificationTask(BaseTask):
  """Image classification: softmax loss, top-1 / top-5 accuracy.

  The model maps batch.image [b, h, w, c] to logits [b, num_classes], or to
  NestedMap(logits=..., aux_logits=...) with an auxiliary head whose loss is
  added with weight `aux_loss_weight`.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('num_classes', None, 'Number of classes C.')
    p.Define('label_smoothing', 0.0, 'Label smoothing s in [0, 1): targets '
             '(1 - s) * onehot + s / C.')
    p.Define('aux_loss_weight', 0.4, 'Weight of the auxiliary head loss when '
             'the model returns aux_logits.')
    p.Define('input_key', 'image', 'Batch key of the model input.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if not isinstance(p.num_classes, int) or p.num_classes < 2:
      raise ValueError(f'num_classes={p.num_classes!r} must be an int >= 2')
    if not 0.0 <= p.label_smoothing < 1.0:
      raise ValueError(f'label_smoothing={p.label_smoothing!r} must be in '
                       '[0, 1)')

  def _LossTerms(self, out, labels, reduce: Callable[[tf.Tensor], tf.Tensor],
                 n: tf.Tensor) -> NestedMap:
    """The loss and its metrics, written once for every schedule.

    `reduce` turns per-example values into the reported number: the
    (weighted) mean over the whole batch (`FProp`), or the sum over a
    micro-batch (the loss-inside schedules, which divide by the batch's rows
    after the pipeline). `n`: the weight of each metric.
    """
    p = self.params
    logits = out['logits'] if isinstance(out, dict) else out
    aux = out.get('aux_logits') if isinstance(out, dict) else None
    # float32 (float64 for a float64 model), as are n and the weights.
    logits = tf.cast(logits, py_utils.AccumulationDtype(logits.dtype))

    def Xent(x):
      return reduce(losses.SoftmaxCrossEntropyLoss(
          tf.cast(x, logits.dtype), labels, p.label_smoothing, p.num_classes))

    def Hits(k):
      return reduce(losses.TopKAccuracy(logits, labels, k, per_example=True))
    xent = Xent(logits)
    terms = NestedMap(loss=xent, logits=logits, metrics=NestedMap(
        loss=(xent, n), accuracy=(Hits(1), n),
        acc5=(Hits(min(5, p.num_classes)), n)))
    if aux is not None:
      aux_xent = Xent(aux)
      terms.loss += p.aux_loss_weight * aux_xent
      terms.metrics.aux_loss = (aux_xent, n)
    return terms

  def FProp(self, theta, batch):
    p = self.params
    if _TrainsWith1F1B(self.children.model):
      return self._FPropLossInPipeline(theta, batch)
    batch, weights = self.SplitExampleWeights(batch)
    out = self.children.model.FProp(theta.model, batch[p.input_key])
    logits = out['logits'] if isinstance(out, dict) else out
    dtype = py_utils.AccumulationDtype(logits.dtype)
    n = tf.cast(tf.shape(logits)[0], dtype)
    if weights is None:
      mean = tf.reduce_mean
    else:  # padded eval batch: means over the weighted (real) rows
      weights = tf.cast(weights, dtype)
      n = tf.reduce_sum(weights)
      mean = lambda x: tf.reduce_sum(x * weights) / tf.maximum(n, 1.0)
    return self._LossTerms(out, batch.label, mean, n)

  def _FPropLossInPipeline(self, theta, batch):
    """Training with the loss inside the pipeline: per micro-batch sums."""
    p = self.params

    def LossSums(out, labels):
      logits = out['logits'] if isinstance(out, dict) else out
      m = tf.cast(tf.shape(logits)[0], py_utils.AccumulationDtype(
          logits.dtype))
      terms = self._LossTerms(out, labels, tf.reduce_sum, m)
      return NestedMap(loss=terms.loss, metrics=terms.metrics)

    images = batch[p.input_key]
    n = float(images.shape[self.children.model.params.batch_dim])
    out = self.children.model.FPropLoss(theta.model, (images,), batch.label,
                                        LossSums, n)
    return NestedMap(loss=out.loss, metrics=_MeanMetrics(out.metrics))


class SequenceTask(BaseTask):
  """Token-level loss for translation and language modelling.

  The model maps the whole batch NestedMap either to
  NestedMap(per_example_loss, per_example_tokens, per_example_correct and,
  if the loss is label-smoothed, per_example_log_pplx without smoothing) (a
  model ending in a SequenceSoftmaxLayer, which computes the loss inside the
  pipeline, models/transformer.py), or to logits [b, L, V] (or
  NestedMap(logits=...)), scored here against batch.tgt_labels /
  batch.tgt_paddings (translation) or batch.labels / batch.paddings (LM).
  Metrics: loss, log_pplx (= loss without label smoothing), token_accuracy;
  eval adds perplexity = exp(log_pplx).
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('vocab_size', None, 'Vocabulary size V (last axis of logits).')
    p.Define('label_smoothing', 0.0, 'Label smoothing s in [0, 1) when the '
             'model returns logits (a model computing its own loss smooths '
             'with its own setting).')
    p.Define('model_inputs', None, 'None: the model gets the whole batch '
             'NestedMap. Else {model input name: batch key} for a model '
             'with named inputs (a Keras model through '
             'keras_params.PipelineParams, e.g. a keras_hub LM): the model '
             "gets NestedMap(name=batch[key]); a key '1-<key>' gives an "
             'int32 mask, 1 where batch[<key>] is 0 (keras_hub\'s '
             "padding_mask from 'paddings').")
    p.Define('decode_eos_id', None, 'End-of-sentence id: greedy decoding '
             'stops once every row has produced it (later positions stay 0; '
             'detokenisers stop at the first </s>). None decodes the full '
             'target length.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if not isinstance(p.vocab_size, int) or p.vocab_size < 2:
      raise ValueError(f'vocab_size={p.vocab_size!r} must be an int >= 2')
    if not 0.0 <= p.label_smoothing < 1.0:
      raise ValueError(f'label_smoothing={p.label_smoothing!r} must be in '
                       '[0, 1)')
    if p.model_inputs is not None and not (
        isinstance(p.model_inputs, dict) and p.model_inputs and all(
            isinstance(k, str) and isinstance(v, str) and v not in ('', '1-')
            for k, v in p.model_inputs.items())):
      raise ValueError(
          f'model_inputs={p.model_inputs!r} must be None or a non-empty dict '
          "{model input name: batch key}, e.g. {'token_ids': 'ids', "
          "'padding_mask': '1-paddings'}")

  def _Sources(self) -> Dict[str, Tuple[str, bool]]:
    """model_inputs as {model input name: (batch key, as a 1-mask)}."""
    return {name: (key[2:], True) if key.startswith('1-') else (key, False)
            for name, key in (self.params.model_inputs or {}).items()}

  def CheckInputSpec(self, element_spec, batch_size: int, name: str) -> None:
    super().CheckInputSpec(element_spec, batch_size, name)
    missing = [k for k, _ in self._Sources().values()
               if isinstance(element_spec, dict) and k not in element_spec]
    if missing:
      raise ValueError(
          f'task.model_inputs={self.params.model_inputs!r} reads batch keys '
          f'{missing} that the {name} batches do not have (they have '
          f'{sorted(element_spec)}); map the model inputs to those keys')

  def ModelInputs(self, batch: NestedMap) -> Any:
    """What the model gets of `batch` (see Params: model_inputs)."""
    if self.params.model_inputs is None:
      return batch
    out = NestedMap()
    for name, (key, mask) in self._Sources().items():
      out[name] = (tf.cast(tf.equal(batch[key], 0), tf.int32) if mask
                   else batch[key])
    return out

  @staticmethod
  def _LabelsAndWeights(batch, dtype: tf.DType = tf.float32):
    """(labels [b, L], token weights [b, L] in `dtype`; 0 at padding)."""
    if 'tgt_labels' in batch:
      labels, paddings = batch.tgt_labels, batch.tgt_paddings
    else:
      labels, paddings = batch.labels, batch.paddings
    return labels, 1.0 - tf.cast(paddings, dtype)

  def _TokenSums(self, out, batch, example_weights=None):
    """(summed loss, summed unsmoothed loss, tokens, correct tokens).

    The sums are float32, float64 for a float64 model
    (py_utils.AccumulationDtype of its logits or per-example loss).

    example_weights: None, or [b] weights of the rows (0: padding).
    """
    p = self.params
    if isinstance(out, dict) and 'per_example_loss' in out:
      dtype = out['per_example_loss'].dtype
      w = 1.0 if example_weights is None else tf.cast(example_weights, dtype)

      def Sum(key):
        return tf.reduce_sum(tf.cast(out[key], dtype) * w)
      loss_sum = Sum('per_example_loss')
      # log_pplx must not include label smoothing: a model that smooths
      # reports its unsmoothed sums as per_example_log_pplx.
      plain_sum = (Sum('per_example_log_pplx')
                   if 'per_example_log_pplx' in out else loss_sum)
      return (loss_sum, plain_sum, Sum('per_example_tokens'),
              Sum('per_example_correct'))
    logits = out['logits'] if isinstance(out, dict) else out
    logits = tf.cast(logits, py_utils.AccumulationDtype(logits.dtype))
    labels, weights = self._LabelsAndWeights(batch, logits.dtype)
    if example_weights is not None:
      weights *= tf.cast(example_weights, logits.dtype)[:, tf.newaxis]
    xent = losses.SoftmaxCrossEntropyLoss(logits, labels, 0.0, p.vocab_size)
    plain = tf.reduce_sum(xent * weights)
    smoothed = plain
    if p.label_smoothing:
      smoothed = tf.reduce_sum(losses.SoftmaxCrossEntropyLoss(
          logits, labels, p.label_smoothing, p.vocab_size) * weights)
    correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32),
                               tf.cast(labels, tf.int32)), logits.dtype)
    return (smoothed, plain, tf.reduce_sum(weights),
            tf.reduce_sum(correct * weights))

  def FProp(self, theta, batch):
    if _TrainsWith1F1B(self.children.model):
      return self._FPropLossInPipeline(theta, batch)
    batch, example_weights = self.SplitExampleWeights(batch)
    out = self.children.model.FProp(theta.model, self.ModelInputs(batch))
    loss_sum, plain_sum, tokens, correct = self._TokenSums(out, batch,
                                                           example_weights)
    num_tokens = tf.maximum(tokens, 1.0)
    loss = loss_sum / num_tokens
    metrics = NestedMap(loss=(loss, num_tokens),
                        log_pplx=(plain_sum / num_tokens, num_tokens),
                        token_accuracy=(correct / num_tokens, num_tokens),
                        num_tokens=(tokens, tf.constant(1.0, tokens.dtype)))
    return NestedMap(loss=loss, metrics=metrics)

  def _FPropLossInPipeline(self, theta, batch):
    """Training with schedule='1f1b': token sums per micro-batch, divided
    by the batch's real tokens (from its paddings, known up front; float64
    in a float64 model, as are the sums)."""
    keys = (('tgt_labels', 'tgt_paddings') if 'tgt_labels' in batch else
            ('labels', 'paddings'))
    targets = NestedMap({k: batch[k] for k in keys})
    _, weights = self._LabelsAndWeights(batch, py_utils.AccumulationDtype(
        self.children.model.fprop_dtype))
    tokens = tf.reduce_sum(weights)
    num_tokens = tf.maximum(tokens, 1.0)

    def LossSums(out, tgt):
      loss_sum, plain_sum, n, correct = self._TokenSums(out, tgt)
      return NestedMap(loss=loss_sum, metrics=NestedMap(
          loss=(loss_sum, n), log_pplx=(plain_sum, n),
          token_accuracy=(correct, n)))

    out = self.children.model.FPropLoss(
        theta.model, (self.ModelInputs(batch),), targets, LossSums,
        num_tokens)
    # A Keras model's sums follow its own dtype (float64 in a float64
    # model), not the pipeline's fprop_dtype.
    metrics = NestedMap({
        name: (value / tf.cast(num_tokens, value.dtype),
               tf.cast(num_tokens, value.dtype))
        for name, (value, _) in out.metrics.items()})
    metrics.num_tokens = (tokens, tf.constant(1.0, tokens.dtype))
    return NestedMap(loss=out.loss, metrics=metrics)

  def PostProcessEvalMetrics(self, metrics):
    metrics = dict(metrics)
    if 'log_pplx' in metrics:
      metrics['perplexity'] = float(np.exp(min(metrics['log_pplx'], 50.0)))
    return metrics

  def _LayersWithTheta(self) -> List[Tuple[base_layer.BaseLayer, NestedMap]]:
    """The model's layers in order with their thetas (pipeline unrolled)."""
    model = self.children.model
    if isinstance(model, (pipeline.TensorPipeLayer,
                          composite.SequentialLayer)):
      return model.LayersWithTheta()
    return [(model, model.theta)]

  def Logits(self, batch: NestedMap) -> tf.Tensor:
    """Logits [b, L, V] of the model, run unpipelined.

    A last layer computing its own loss (SequenceSoftmaxLayer) gives its
    `Logits` of its input instead. float32, float64 for a float64 model.
    """
    layers = self._LayersWithTheta()
    args = (self.ModelInputs(batch),)
    for i, (layer, theta) in enumerate(layers):
      if (i == len(layers) - 1 and
          isinstance(layer, transformer.SequenceSoftmaxLayer)):
        return _AccumulationCast(layer.Logits(theta, args[0]))
      args = composite.AsArgs(layer.FProp(theta, *args))
    out = composite.FromArgs(args)
    return _AccumulationCast(out['logits'] if isinstance(out, dict) else out)

  def CreateDecodeMetrics(self, eval_input: base_input.BaseInput) -> Optional[
      decode_metrics.DecodeMetrics]:
    """BLEU of greedy decodes for translation inputs with a detokenizer,
    and BLEU and log_pplx per reference group (e.g. direction).

    Needs batches with tgt_labels (translation) and
    `eval_input.Detokenizer()`; else None (e.g. language modelling).
    """
    detokenize = eval_input.Detokenizer()
    spec = eval_input.Dataset().element_spec
    if detokenize is None or not isinstance(spec, dict) or (
        'tgt_labels' not in spec):
      return None

    def Decode(batch):
      with py_utils.EvalMode():
        return self.GreedyDecode(batch)

    def Score(batch):
      """Per-row summed unsmoothed token loss and tokens (log_pplx_<group>)."""
      with py_utils.EvalMode():
        logits = self.Logits(batch)
      labels, weights = self._LabelsAndWeights(batch, logits.dtype)
      xent = losses.SoftmaxCrossEntropyLoss(logits, labels, 0.0,
                                            self.params.vocab_size)
      return (tf.reduce_sum(xent * weights, axis=1),
              tf.reduce_sum(weights, axis=1))
    return decode_metrics.BleuMetrics(Decode, detokenize,
                                      eval_input.ReferenceTexts,
                                      eval_input.ReferenceGroups, Score)

  def GreedyDecode(self, batch: NestedMap) -> tf.Tensor:
    """Greedy decoding of translation targets, [b, Lt] int32 token ids.

    Position 0 of batch.tgt_ids (<s> or the target-language token) is kept;
    step i runs the model on the prefix decoded so far and takes the argmax
    at position i, which becomes the decoder input at i + 1. Position i of
    the result is the prediction for label i. Needs a causal decoder.
    """
    batch, _ = self.SplitExampleWeights(batch)  # decodes padding too
    tgt_ids = tf.cast(batch.tgt_ids, tf.int32)
    length = tgt_ids.shape[1]
    dec = NestedMap(batch)
    dec.tgt_paddings = tf.zeros_like(batch.tgt_paddings)
    dec.tgt_labels = tf.zeros_like(batch.tgt_labels)
    step_logits = self._DecodeStepLogits(dec)

    def Body(i, ids, hyp):
      step_batch = NestedMap(dec)
      step_batch.tgt_ids = tf.cast(ids, batch.tgt_ids.dtype)
      if step_logits is None:
        logits_i = tf.gather(self.Logits(step_batch), i, axis=1)
      else:
        logits_i = step_logits(step_batch, i)
      next_ids = tf.argmax(logits_i, -1, output_type=tf.int32)
      at_i = tf.one_hot(i, length, dtype=tf.int32)[tf.newaxis]
      at_next = tf.one_hot(i + 1, length, dtype=tf.int32)[tf.newaxis]
      ids = ids * (1 - at_next) + next_ids[:, tf.newaxis] * at_next
      hyp = hyp + next_ids[:, tf.newaxis] * at_i
      return i + 1, ids, hyp

    ids = tf.concat([tgt_ids[:, :1], tf.zeros_like(tgt_ids[:, 1:])], 1)
    eos = self.params.decode_eos_id

    def Continue(i, unused_ids, hyp):
      if eos is None:
        return i < length
      # Every row has emitted </s> (at a position < i): nothing left to do.
      ended = tf.reduce_all(tf.reduce_any(tf.equal(hyp, eos), axis=1))
      return tf.logical_and(i < length, tf.logical_not(ended))

    _, _, hyp = tf.while_loop(Continue, Body,
                              (tf.constant(0), ids, tf.zeros_like(tgt_ids)))
    return hyp

  def _DecodeStepLogits(self, batch: NestedMap):
    """fn(step_batch, i) -> logits [b, V] at target position i, or None.

    For models laid out as models/transformer.py's TransformerLayers
    (embedding, encoder layers, decoder layers, SequenceSoftmaxLayer) the
    encoder runs once here on `batch`; each step runs only the embedding,
    the decoder layers and the softmax of position i: what Logits gives at
    position i, without recomputing the encoder and the other positions'
    softmax every step. None for any other layout (GreedyDecode then runs
    Logits on the whole model each step).
    """
    layers = self._LayersWithTheta()
    kinds = [type(layer) for layer, _ in layers]
    if transformer.TransformerDecoderLayer not in kinds:
      return None
    first_dec = kinds.index(transformer.TransformerDecoderLayer)
    if (first_dec < 2 or kinds[-1] is not transformer.SequenceSoftmaxLayer or
        any(k is not transformer.TransformerEncoderLayer
            for k in kinds[1:first_dec]) or
        any(k is not transformer.TransformerDecoderLayer
            for k in kinds[first_dec:-1])):
      return None
    args = (batch,)
    for layer, theta in layers[:first_dec]:
      args = composite.AsArgs(layer.FProp(theta, *args))
    encoded = composite.FromArgs(args)
    if not isinstance(encoded, dict) or 'src_vecs' not in encoded:
      return None
    src_vecs = encoded['src_vecs']
    (emb, emb_theta), (softmax, softmax_theta) = layers[0], layers[-1]

    def StepLogits(step_batch, i):
      nm = emb.FProp(emb_theta, step_batch)
      if not isinstance(nm, dict) or 'src_vecs' not in nm:
        raise ValueError(f'{type(emb).__name__} {emb.params.name!r} must '
                         'return a NestedMap with src_vecs to decode')
      nm = NestedMap(nm)
      nm.src_vecs = src_vecs  # the encoder's output, computed once
      args = (nm,)
      for layer, theta in layers[first_dec:-1]:
        args = composite.AsArgs(layer.FProp(theta, *args))
      out = NestedMap(composite.FromArgs(args))
      key = softmax.params.input_key
      out[key] = tf.gather(out[key], [i], axis=1)
      return _AccumulationCast(softmax.Logits(softmax_theta, out))[:, 0]
    return StepLogits
