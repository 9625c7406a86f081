"""Tests of the Bible TFDS builder and BibleTranslationInput on a small corpus."""

import tempfile

import numpy as np
import tensorflow as tf

from tensorpipe.inputs import bible_builder
from tensorpipe.inputs import bible_corpus
from tensorpipe.inputs import sampling
from tensorpipe.inputs import tfds_utils
from tensorpipe.inputs import translation_input as ti
from tensorpipe.inputs import vocab as vocab_lib

_EN = 'the light was good and god saw the earth and the water'.split()
_ES = 'la luz era buena y dios vio la tierra y el agua'.split()


def _Chapters():
  """('Gen', c) chapters so that every split has at least two."""
  by_split = {s: [] for s in bible_corpus.SPLITS}
  c = 0
  while min(len(v) for v in by_split.values()) < 2:
    c += 1
    s = bible_corpus.SplitOf('Gen', c)
    if len(by_split[s]) < 2:
      by_split[s].append(c)
  return sorted(sum(by_split.values(), []))


def _Verses():
  verses = []
  for i, c in enumerate(_Chapters()):
    for v in range(1, 9):
      n = 2 + (v * 5 + c) % 9
      text = {'en': ' '.join(_EN[:n]), 'es': ' '.join(_ES[:n]),
              'web': ' '.join(reversed(_EN[:n]))}
      if i % 2:  # Half the chapters lack the WEB text: fewer web-es pairs.
        text['web'] = ''
      verses.append(bible_corpus.Verse('Gen', c, v, text))
  return verses


class BibleTranslationInputTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.TemporaryDirectory()
    cls.data_dir = cls.tmp.name
    builder = bible_builder.BibleParallel(data_dir=cls.data_dir,
                                          verses=_Verses())
    builder.download_and_prepare()
    cls.splits = {k: v.num_examples for k, v in builder.info.splits.items()}

  @classmethod
  def tearDownClass(cls):
    cls.tmp.cleanup()
    super().tearDownClass()

  def _Params(self, **kw):
    p = ti.BibleTranslationInput.Params().Set(
        data_dir=self.data_dir, batch_size=4, vocab_size=40, max_src_len=8,
        max_tgt_len=8, shuffle_buffer=16)
    return p.Set(**kw)

  def testBuilderSplitsByChapter(self):
    self.assertEqual(sum(self.splits.values()), len(_Verses()))
    self.assertEqual(self.splits['test'], 16)
    self.assertTrue(tfds_utils.IsPrepared('bible_parallel', self.data_dir))

  def testBatchShapesAndConventions(self):
    inp = self._Params().Instantiate()
    batch = next(iter(inp.Dataset()))
    for key in ('src_ids', 'tgt_ids', 'tgt_labels'):
      self.assertEqual(batch[key].shape, (4, 8))
      self.assertEqual(batch[key].dtype, tf.int32)
    for key in ('src_paddings', 'tgt_paddings'):
      self.assertEqual(batch[key].dtype, tf.float32)
    lang_ids = {inp.LangTokenId('es'), inp.LangTokenId('en')}
    tgt_ids, labels = batch.tgt_ids.numpy(), batch.tgt_labels.numpy()
    pads = batch.tgt_paddings.numpy()
    for row in range(4):
      self.assertIn(tgt_ids[row, 0], lang_ids)
      n = int((pads[row] == 0).sum())
      # Labels are the decoder inputs shifted left, ending with </s>.
      self.assertAllEqual(labels[row, :n - 1], tgt_ids[row, 1:n])
      self.assertEqual(labels[row, n - 1], vocab_lib.EOS_ID)
      self.assertAllEqual(labels[row, n:], np.zeros(8 - n))
    src_pads = batch.src_paddings.numpy()
    self.assertAllEqual(src_pads == 1, batch.src_ids.numpy() == 0)

  def testEvalBatchesFollowReferencesAndDecode(self):
    inp = self._Params(split='test', directions=['en->es'], max_src_len=80,
                       max_tgt_len=80, batch_size=2).Instantiate()
    refs = inp.References()['en->es']
    decoded = []
    for batch in inp.Dataset():
      for row in range(2):
        decoded.append((inp.vocab.Decode(batch.src_ids[row].numpy()),
                        inp.vocab.Decode(batch.tgt_labels[row].numpy())))
    self.assertLen(refs, 16)
    self.assertEqual(decoded, refs)

  def testDecodingHooksGiveTheTargetsInDatasetOrder(self):
    inp = self._Params(split='test', directions=['en->es', 'es->en'],
                       max_src_len=80, max_tgt_len=80,
                       batch_size=2).Instantiate()
    refs = inp.References()
    self.assertEqual(inp.ReferenceTexts(),
                     [t for _, t in refs['en->es'] + refs['es->en']])
    detokenize = inp.Detokenizer()
    labels = [detokenize(row) for batch in inp.Dataset()
              for row in batch.tgt_labels.numpy()]
    self.assertEqual(labels, inp.ReferenceTexts())

  def testDirectionsAreTemperatureSampled(self):
    inp = self._Params(directions=['en->es', 'web->es'], batch_size=2,
                       temperature=5.0, max_src_len=16).Instantiate()
    ds = inp.Dataset()
    sizes = inp.direction_sizes
    self.assertGreater(sizes[0], sizes[1])
    self.assertAllClose(inp.direction_weights,
                        sampling.TemperatureSamplingWeights(sizes, 5.0))
    # Both directions target Spanish; a web source is an English prefix
    # reversed (_Verses), an en source the prefix itself.
    web = n = 0
    for batch in ds.take(1000):
      for row in batch.src_ids.numpy():
        words = inp.vocab.Decode(row).split()
        if words == _EN[:len(words)]:
          is_web = False
        else:
          self.assertEqual(words, _EN[:len(words)][::-1])
          is_web = True
        n += 1
        web += is_web
    w = inp.direction_weights[1]
    # 5 standard deviations of the binomial count's frequency. The band must
    # be narrower than the effect: T=1 (proportional) gives another share.
    band = 5 * np.sqrt(w * (1 - w) / n)
    proportional = sizes[1] / sum(sizes)
    self.assertGreater(abs(w - proportional), 2 * band)
    self.assertAllClose(web / n, w, atol=band)

  def testDirectionFractionsMakeALowResourceDirection(self):
    p = self._Params(directions=['en->es', 'es->en'], temperature=5.0)
    full = p.Copy().Instantiate()
    full.Dataset()
    low = p.Copy().Set(direction_fractions=[1.0, 0.25]).Instantiate()
    low.Dataset()
    n = full.direction_sizes[1]
    self.assertEqual(full.direction_sizes[0], n)  # the same verse pairs
    self.assertAllClose(full.direction_weights, [0.5, 0.5])
    self.assertEqual(low.direction_sizes, [n, max(1, round(0.25 * n))])
    self.assertAllClose(low.direction_weights,
                        sampling.TemperatureSamplingWeights(
                            low.direction_sizes, 5.0))
    self.assertLess(low.direction_weights[1], 0.5)
    # The subset is fixed by the seed; evaluation keeps every pair.
    again = p.Copy().Set(direction_fractions=[1.0, 0.25]).Instantiate()
    again.Dataset()
    self.assertEqual(again.direction_sizes, low.direction_sizes)
    test = p.Copy().Set(split='test',
                        direction_fractions=[1.0, 0.25]).Instantiate()
    self.assertEqual(test.ReferenceGroups(), [('en->es', 16), ('es->en', 16)])
    self.assertLen(test.ReferenceTexts(), 32)
    for bad in ([0.5], [1.0, 0.0], [1.0, 1.5], [1.0, True]):
      with self.assertRaisesRegex(ValueError,
                                  f'direction_fractions={bad!r}'.replace(
                                      '[', r'\[').replace(']', r'\]')):
        p.Copy().Set(direction_fractions=bad).Instantiate()

  def testKeepFraction(self):
    src, tgt = [f's{i}' for i in range(10)], [f't{i}' for i in range(10)]
    s, t = ti.KeepFraction(src, tgt, 0.3, seed=1)
    self.assertLen(s, 3)
    self.assertEqual([x[1:] for x in s], [x[1:] for x in t])  # still pairs
    self.assertEqual(s, sorted(s, key=lambda x: int(x[1:])))  # in order
    self.assertLen(ti.KeepFraction(src, tgt, 0.01, seed=1)[0], 1)
    self.assertEqual(ti.KeepFraction(src, tgt, 1.0, seed=1), (src, tgt))

  def testBadDirectionsRaise(self):
    with self.assertRaisesRegex(ValueError, "direction='en-es'"):
      self._Params(directions=['en-es']).Instantiate()
    with self.assertRaisesRegex(ValueError, 'duplicates'):
      self._Params(directions=['en->es', 'en->es']).Instantiate()

  def testMissingDataRaisesNamingPrepareScript(self):
    with tempfile.TemporaryDirectory() as d:
      inp = self._Params(data_dir=d).Instantiate()
      with self.assertRaisesRegex(tfds_utils.DataNotPreparedError,
                                  'prepare_data.sh'):
        inp.Dataset()


class MakeExamplesTest(tf.test.TestCase):

  def testTruncatesPadsAndShifts(self):
    ex = ti.MakeExamples([[7, 8, 9, 10], [7]], [[11, 12], [11, 12, 13, 14]],
                         lang_token_id=5, max_src_len=4, max_tgt_len=4)
    eos = vocab_lib.EOS_ID
    self.assertAllEqual(ex['src_ids'], [[7, 8, 9, eos], [7, eos, 0, 0]])
    self.assertAllEqual(ex['src_paddings'], [[0, 0, 0, 0], [0, 0, 1, 1]])
    self.assertAllEqual(ex['tgt_ids'], [[5, 11, 12, 0], [5, 11, 12, 13]])
    self.assertAllEqual(ex['tgt_labels'], [[11, 12, eos, 0],
                                           [11, 12, 13, eos]])
    self.assertAllEqual(ex['tgt_paddings'], [[0, 0, 0, 1], [0, 0, 0, 0]])


if __name__ == '__main__':
  tf.test.main()
