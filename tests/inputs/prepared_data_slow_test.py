"""Reads the real prepared data sets (bash tools/prepare_data.sh) end to end.

Skipped when data/tfds (or $TENSORPIPE_DATA_DIR) lacks a data set, except
under tools/test.sh, where missing data fails (test_utils.CheckPrepared).
"""

import collections
import functools

import numpy as np
import tensorflow as tf

from tensorpipe import test_utils
from tensorpipe.inputs import image_inputs
from tensorpipe.inputs import lm_input
from tensorpipe.inputs import translation_input


def _SkipUnlessPrepared(name):
  """Decorator: test_utils.CheckPrepared(name) before the test."""
  def Decorator(method):
    @functools.wraps(method)
    def Wrapped(self, *args, **kwargs):
      test_utils.CheckPrepared(self, name)
      return method(self, *args, **kwargs)
    return Wrapped
  return Decorator


class PreparedDataTest(tf.test.TestCase):

  @_SkipUnlessPrepared('fashion_mnist')
  def testFashionMnistHas60000And10000BalancedExamples(self):
    # Published: 60000 train / 10000 test, 10 classes of 6000 / 1000.
    for split, per_class in (('train', 6000), ('test', 1000)):
      inp = image_inputs.FashionMnistInput.Params().Set(
          split=split, batch_size=1000, repeat=False,
          shuffle_buffer=0).Instantiate()
      counts = collections.Counter()
      n = 0
      for batch in inp.Dataset():
        self.assertEqual(batch.image.shape, (1000, 28, 28, 1))
        counts.update(batch.label.numpy().tolist())
        n += 1000
      self.assertEqual(n, per_class * 10)
      self.assertEqual(dict(counts), {c: per_class for c in range(10)})

  @_SkipUnlessPrepared('fashion_mnist')
  def testFashionMnistTrainingBatchIsNormalised(self):
    inp = image_inputs.FashionMnistInput.Params().Set(
        batch_size=512).Instantiate()
    batch = next(iter(inp.Dataset()))
    # Normalised with the data set's mean / stddev: about 0 and 1 (padding
    # from the random crop pulls the mean down a little).
    self.assertAllClose(np.mean(batch.image), 0.0, atol=0.15)
    self.assertAllClose(np.std(batch.image), 1.0, atol=0.15)

  @_SkipUnlessPrepared('bible_parallel')
  def testBiblePairs(self):
    total = {}
    for split in ('train', 'validation', 'test'):
      inp = translation_input.BibleTranslationInput.Params().Set(
          split=split, directions=['en->es', 'es->en', 'web->es'],
          batch_size=64, repeat=False).Instantiate()
      refs = inp.References()
      total[split] = {d: len(pairs) for d, pairs in refs.items()}
    print('bible aligned pairs per split and direction:', total)
    en_es = sum(t['en->es'] for t in total.values())
    # ~31100 KJV verses; a few hundred in shifted chapters are dropped.
    self.assertBetween(en_es, 29500, 31000)
    self.assertEqual(total['test']['en->es'], total['test']['es->en'])
    self.assertBetween(total['test']['en->es'], 800, 2500)
    test = translation_input.BibleTranslationInput.Params().Set(
        split='test', directions=['en->es'], batch_size=32,
        max_src_len=64, max_tgt_len=64).Instantiate()
    batch = next(iter(test.Dataset()))
    self.assertEqual(batch.src_ids.shape, (32, 64))
    self.assertEqual(test.vocab.size, 8000)
    src, tgt = test.References()['en->es'][0]
    self.assertEqual(test.vocab.Decode(batch.tgt_labels[0].numpy()), tgt)

  @_SkipUnlessPrepared('brown_corpus')
  def testBrownWindows(self):
    n = {}
    for split in ('train', 'validation', 'test'):
      inp = lm_input.BrownLmInput.Params().Set(
          split=split, batch_size=64, seq_len=128, repeat=False).Instantiate()
      n[split] = sum(int(b.ids.shape[0]) for b in inp.Dataset())
    print('brown 128-piece windows per split:', n)
    # ~1.16M words -> well over 1M pieces in all.
    self.assertGreater(sum(n.values()) * 128, 1_000_000)
    self.assertGreater(n['test'], 100)


if __name__ == '__main__':
  tf.test.main()
