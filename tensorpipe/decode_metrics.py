"""Metrics of decoded outputs over one evaluation (BLEU): a task hook.

A task whose model can decode returns a `DecodeMetrics` from
`CreateDecodeMetrics(eval_input)` (tasks.BaseTask); `Trainer.Evaluate`
calls `Update(batch)` on every eval batch and adds `Finalize()`'s values to
the eval metrics. The trainer stays generic: it knows nothing of decoders,
vocabularies or references.

Usage:
  metrics = BleuMetrics(decode_fn, eval_input.Detokenizer(),
                        eval_input.ReferenceTexts)
  for batch in eval_input.Dataset():
    metrics.Update(batch)
  metrics.Finalize()        # {'bleu': 23.4}
"""

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tensorpipe import base_input
from tensorpipe.nested_map import NestedMap


def RealRows(batch: NestedMap) -> np.ndarray:
  """[b] bool: the rows that are examples of the split, not padding.

  A padded eval batch (tensorpipe/base_input.py) weighs its padding 0; a
  batch without weights is all real.
  """
  weights = batch.get(base_input.EXAMPLE_WEIGHT)
  if weights is None:
    return np.ones([int(tf.shape(tf.nest.flatten(batch)[0])[0])], bool)
  return np.asarray(weights) > 0


class DecodeMetrics:
  """Accumulates metrics of decoded eval batches (subclasses implement)."""

  def Update(self, batch: NestedMap) -> None:
    """Decodes `batch` and accumulates what the metrics need."""
    raise NotImplementedError(f'{type(self).__name__}.Update')

  def Finalize(self) -> Dict[str, float]:
    """The metrics over every batch given to Update ({} if none)."""
    raise NotImplementedError(f'{type(self).__name__}.Finalize')

  def Description(self) -> str:
    """How the metrics are computed (logged with them); default ''."""
    return ''


def ComputeBleu(hypotheses: List[str], references: List[str]) -> float:
  """Corpus BLEU (sacrebleu, 13a tokenisation) of detokenised strings."""
  import sacrebleu  # pylint: disable=g-import-not-at-top
  return float(sacrebleu.corpus_bleu(hypotheses, [references]).score)


def BleuSignature() -> str:
  """sacrebleu's signature of ComputeBleu's settings (one reference)."""
  import sacrebleu  # pylint: disable=g-import-not-at-top
  bleu = sacrebleu.metrics.BLEU()
  bleu.corpus_score(['a'], [['a']])  # the signature names the references
  return str(bleu.get_signature())


def GroupMetricName(metric: str, group: str) -> str:
  """'bleu', 'en->es' -> 'bleu_en_es' (a valid summary name)."""
  return metric + '_' + ''.join(c if c.isalnum() else '_'
                                for c in group).replace('__', '_')


class BleuMetrics(DecodeMetrics):
  """Corpus BLEU of decoded targets against the references.

  Each batch's `tgt_labels` rows, detokenised, are the references, unless
  `reference_texts()` gives the split's untruncated target texts in
  Dataset() order (the labels are cut at the input's maximum length).
  """

  def __init__(self, decode_fn: Callable[[NestedMap], tf.Tensor],
               detokenize: Callable[[Sequence[int]], str],
               reference_texts: Callable[[], Optional[List[str]]],
               reference_groups: Optional[
                   Callable[[], Optional[List[Tuple[str, int]]]]] = None,
               score_fn: Optional[Callable[[NestedMap], Tuple[
                   tf.Tensor, tf.Tensor]]] = None):
    """Creates an empty accumulator.

    Args:
      decode_fn: batch -> token ids [b, L] int32, the hypotheses (position
        i predicts tgt_labels[:, i]); wrapped in a tf.function here.
      detokenize: token ids of one row -> text.
      reference_texts: () -> the split's target texts in Dataset() order,
        or None.
      reference_groups: optional () -> [(name, count)], consecutive groups
        of those texts (BaseInput.ReferenceGroups); when the whole split was
        decoded, Finalize adds bleu_<name> for each group.
      score_fn: optional batch -> ([b] summed negative log-likelihood of
        each row's reference tokens, [b] its token count), wrapped in a
        tf.function; with groups, Finalize adds log_pplx_<name> per group
        (the split-wide log_pplx is the task's own metric).
    """
    self._decode = tf.function(decode_fn, autograph=False)  # as TrainStep
    self._detokenize = detokenize
    self._reference_texts = reference_texts
    self._reference_groups = reference_groups or (lambda: None)
    self._score = (None if score_fn is None else
                   tf.function(score_fn, autograph=False))
    self._hyps: List[str] = []
    self._refs: List[str] = []
    self._nll: List[float] = []
    self._tokens: List[float] = []

  def Update(self, batch: NestedMap) -> None:
    """Decodes the batch; rows of example weight 0 (padding) are skipped."""
    hyp = self._decode(batch).numpy()
    keep = RealRows(batch)
    for h, r, k in zip(hyp, batch.tgt_labels.numpy(), keep):
      if k:
        self._hyps.append(self._detokenize(h))
        self._refs.append(self._detokenize(r))
    if self._score is not None:
      nll, tokens = (np.asarray(x, np.float64) for x in self._score(batch))
      self._nll.extend(nll[keep].tolist())
      self._tokens.extend(tokens[keep].tolist())

  def Finalize(self) -> Dict[str, float]:
    if not self._hyps:
      return {}
    refs = self._refs
    texts = self._reference_texts()
    if texts is not None and len(texts) >= len(self._hyps):
      refs = texts[:len(self._hyps)]
    out = {'bleu': ComputeBleu(self._hyps, refs)}
    groups = self._reference_groups()
    if groups and sum(n for _, n in groups) == len(self._hyps):
      start = 0
      for name, n in groups:
        out[GroupMetricName('bleu', name)] = ComputeBleu(
            self._hyps[start:start + n], refs[start:start + n])
        if len(self._nll) == len(self._hyps):
          tokens = sum(self._tokens[start:start + n])
          out[GroupMetricName('log_pplx', name)] = (
              sum(self._nll[start:start + n]) / max(tokens, 1.0))
        start += n
    return out

  def Description(self) -> str:
    return f'BLEU: sacrebleu {BleuSignature()}'
