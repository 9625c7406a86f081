"""Tests of tensorpipe/decode_metrics.py and the tasks' decoding hook."""

import numpy as np
import tensorflow as tf

from models import transformer
from tensorpipe import decode_metrics
from tensorpipe import synthetic_input
from tensorpipe import tasks
from tensorpipe import test_utils
from tensorpipe.layers import composite
from tensorpipe.nested_map import NestedMap

test_utils.ConfigureTestDevices()


def _NmtInput(**kw):
  return synthetic_input.SyntheticSequenceInput.Params().Set(
      task='nmt', batch_size=4, max_length=6, num_examples=8, split='test',
      **kw).Instantiate()


class _TextsInput(synthetic_input.SyntheticSequenceInput):
  """The synthetic input with fixed reference texts."""

  TEXTS = ['w3 w4 w5 w6', 'w7 w8 w9', 'w3 w3 w3 w3', 'w10 w11'] * 2

  def ReferenceTexts(self):
    return list(self.TEXTS)


class BleuMetricsTest(tf.test.TestCase):

  def testComputeBleu(self):
    self.assertAllClose(decode_metrics.ComputeBleu(
        ['the cat sat on the mat'], ['the cat sat on the mat']), 100.0)
    # No word in common: no matching unigram, BLEU 0 (hand-computed values
    # of partial matches: trainer_lib_oracle_test.py).
    self.assertEqual(decode_metrics.ComputeBleu(
        ['a dog ran far away'], ['the cat sat on the mat']), 0.0)

  def _Labels(self, batch):
    return tf.cast(batch.tgt_labels, tf.int32)

  def testPerfectDecodesScore100AgainstTheLabels(self):
    inp = _NmtInput()
    m = decode_metrics.BleuMetrics(self._Labels, inp.Detokenizer(),
                                   lambda: None)
    self.assertEqual(m.Finalize(), {})       # no batch yet
    for batch in inp.Dataset():
      m.Update(batch)
    self.assertAllClose(m.Finalize()['bleu'], 100.0)

  def testReferenceTextsReplaceTheDetokenisedLabels(self):
    inp = _TextsInput.Params().Set(task='nmt', batch_size=4, max_length=6,
                                   num_examples=8, split='test').Instantiate()
    m = decode_metrics.BleuMetrics(self._Labels, inp.Detokenizer(),
                                   inp.ReferenceTexts)
    hyps = []
    for batch in inp.Dataset():
      m.Update(batch)
      hyps += [inp.IdsToString(row) for row in batch.tgt_labels.numpy()]
    want = decode_metrics.ComputeBleu(hyps, _TextsInput.TEXTS)
    self.assertAllClose(m.Finalize()['bleu'], want)
    self.assertLess(want, 100.0)

  def testTooFewReferenceTextsFallBackToTheLabels(self):
    inp = _NmtInput()
    m = decode_metrics.BleuMetrics(self._Labels, inp.Detokenizer(),
                                   lambda: ['only one'])
    for batch in inp.Dataset():
      m.Update(batch)
    self.assertAllClose(m.Finalize()['bleu'], 100.0)


  def testGroupsGetTheirOwnBleuAndPaddingIsSkipped(self):
    # 6 examples in batches of 4: the last batch has 2 padding rows.
    inp = _TextsInput.Params().Set(task='nmt', batch_size=4, max_length=6,
                                   num_examples=6, split='test').Instantiate()
    texts = _TextsInput.TEXTS[:6]
    m = decode_metrics.BleuMetrics(self._Labels, inp.Detokenizer(),
                                   lambda: texts,
                                   lambda: [('en->es', 4), ('es->en', 2)])
    hyps = []
    for batch in inp.Dataset():
      m.Update(batch)
      keep = decode_metrics.RealRows(batch)
      hyps += [inp.IdsToString(row) for row, k in
               zip(batch.tgt_labels.numpy(), keep) if k]
    self.assertLen(hyps, 6)
    out = m.Finalize()
    self.assertAllClose(out['bleu'], decode_metrics.ComputeBleu(hyps, texts))
    self.assertAllClose(out['bleu_en_es'],
                        decode_metrics.ComputeBleu(hyps[:4], texts[:4]))
    self.assertAllClose(out['bleu_es_en'],
                        decode_metrics.ComputeBleu(hyps[4:], texts[4:]))
    self.assertNotAlmostEqual(out['bleu_en_es'], out['bleu_es_en'], places=3)
    self.assertIn('tok:13a', m.Description())
    # Groups that do not add up to what was decoded (eval_steps) are left out.
    partial = decode_metrics.BleuMetrics(self._Labels, inp.Detokenizer(),
                                         lambda: texts,
                                         lambda: [('a', 4), ('b', 4)])
    partial.Update(next(iter(inp.Dataset())))
    self.assertEqual(sorted(partial.Finalize()), ['bleu'])


class TaskHookTest(tf.test.TestCase):

  def _SequenceTask(self):
    model = transformer.TransformerPipeline(
        2, 2, 4, 6, 6, num_layers=1, hidden_dim=16, num_heads=2, model_dim=8,
        vocab_size=16, max_len=6, label_smoothing=0.0, dropout=0.0)
    return tasks.SequenceTask.Params().Set(
        name='task', vocab_size=16, model=model).Instantiate()

  def testTranslationGetsBleuOfGreedyDecodes(self):
    task = self._SequenceTask()
    inp = _NmtInput()
    m = task.CreateDecodeMetrics(inp)
    self.assertIsInstance(m, decode_metrics.BleuMetrics)
    hyps, refs = [], []
    for batch in inp.Dataset():
      m.Update(batch)
      hyps += [inp.IdsToString(r) for r in task.GreedyDecode(batch).numpy()]
      refs += [inp.IdsToString(r) for r in batch.tgt_labels.numpy()]
    self.assertAllClose(m.Finalize()['bleu'],
                        decode_metrics.ComputeBleu(hyps, refs))

  def testGroupsGetLogPerplexityOfTheirOwnRows(self):
    task = self._SequenceTask()

    class Grouped(synthetic_input.SyntheticSequenceInput):

      def ReferenceGroups(self):
        return [('en->es', 5), ('es->en', 3)]

    inp = Grouped.Params().Set(task='nmt', batch_size=4, max_length=6,
                               num_examples=8, split='test').Instantiate()
    m = task.CreateDecodeMetrics(inp)
    nll, tokens = [], []
    for batch in inp.Dataset():
      m.Update(batch)
      logp = tf.nn.log_softmax(task.Logits(batch)).numpy().astype(np.float64)
      labels = batch.tgt_labels.numpy()
      w = 1.0 - batch.tgt_paddings.numpy()
      picked = np.take_along_axis(logp, labels[..., None], -1)[..., 0]
      nll += list(-(picked * w).sum(1))
      tokens += list(w.sum(1))
    out = m.Finalize()
    for name, rows in (('en_es', slice(0, 5)), ('es_en', slice(5, 8))):
      want = sum(nll[rows]) / sum(tokens[rows])
      self.assertAllClose(out['log_pplx_' + name], want, rtol=1e-5)
    self.assertNotAlmostEqual(out['log_pplx_en_es'], out['log_pplx_es_en'],
                              places=4)

  def testGreedyDecodeEqualsRecomputingTheWholeModelEachStep(self):
    # GreedyDecode runs the encoder once and one softmax position per step;
    # the reference reruns Logits on the whole model for every position.
    model = transformer.TransformerPipeline(
        2, 2, 4, 6, 6, num_layers=2, hidden_dim=16, num_heads=2, model_dim=8,
        vocab_size=16, max_len=6, dropout=0.0)
    task = tasks.SequenceTask.Params().Set(
        name='task', vocab_size=16, model=model).Instantiate()
    for v in task.trainable_variables:  # logits far from ties
      v.assign(v * 4.0)
    batch = next(iter(_NmtInput().Dataset()))
    batch, _ = tasks.BaseTask.SplitExampleWeights(batch)
    self.assertIsNotNone(task._DecodeStepLogits(batch))  # pylint: disable=protected-access
    ids = batch.tgt_ids.numpy().copy()
    ids[:, 1:] = 0
    want = np.zeros_like(ids)
    for i in range(ids.shape[1]):
      step = dict(batch, tgt_ids=tf.constant(ids),
                  tgt_paddings=tf.zeros_like(batch.tgt_paddings),
                  tgt_labels=tf.zeros_like(batch.tgt_labels))
      logits = task.Logits(NestedMap(step)).numpy()[:, i]
      want[:, i] = logits.argmax(-1)
      if i + 1 < ids.shape[1]:
        ids[:, i + 1] = want[:, i]
    got = task.GreedyDecode(batch).numpy()
    self.assertAllEqual(got, want)
    self.assertGreater(len(set(want.ravel().tolist())), 2)
    # decode_eos_id: the same up to each row's first </s>, zeros after, and
    # it stops early once all rows have one.
    eos = int(want[0, 1])
    stopping = tasks.SequenceTask.Params().Set(
        name='task', vocab_size=16, model=model,
        decode_eos_id=eos).Instantiate()
    for v, w in zip(stopping.variables, task.variables):
      v.assign(w)
    got = stopping.GreedyDecode(batch).numpy()
    for row_got, row_want in zip(got, want):
      hits = np.flatnonzero(row_want == eos)
      end = hits[0] + 1 if hits.size else len(row_want)
      self.assertAllEqual(row_got[:end], row_want[:end])
    ends = [np.flatnonzero(r == eos) for r in want]
    if all(e.size for e in ends):
      last = max(e[0] for e in ends)
      self.assertTrue(np.all(got[:, last + 1:] == 0))

  def testLanguageModelAndClassificationDecodeNothing(self):
    lm = synthetic_input.SyntheticSequenceInput.Params().Set(
        task='lm', batch_size=4, max_length=6, split='test').Instantiate()
    self.assertIsNone(self._SequenceTask().CreateDecodeMetrics(lm))
    images = synthetic_input.SyntheticImageInput.Params().Set(
        batch_size=4, split='test').Instantiate()
    classify = tasks.ClassificationTask.Params().Set(
        name='task', num_classes=4,
        model=composite.IdentityLayer.Params()).Instantiate()
    self.assertIsNone(classify.CreateDecodeMetrics(images))

  def testInputWithoutDetokenizerDecodesNothing(self):
    class _NoText(synthetic_input.SyntheticSequenceInput):

      def Detokenizer(self):
        return None
    inp = _NoText.Params().Set(task='nmt', batch_size=4, max_length=6,
                               split='test').Instantiate()
    self.assertIsNone(self._SequenceTask().CreateDecodeMetrics(inp))


if __name__ == '__main__':
  tf.test.main()
