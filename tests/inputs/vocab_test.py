"""Tests of the SentencePiece vocabulary wrapper."""

import os
import tempfile
import unittest

from tensorpipe.inputs import vocab as vocab_lib

_TEXTS = [
    'In the beginning God created the heaven and the earth.',
    'And the earth was without form, and void.',
    'EN el principio crió Dios los cielos y la tierra.',
    'Y la tierra estaba desordenada y vacía.',
    'And God said, Let there be light: and there was light.',
    'Y dijo Dios: Sea la luz: y fué la luz.',
] * 3


class SentencePieceVocabTest(unittest.TestCase):

  @classmethod
  def setUpClass(cls):
    cls.tmp = tempfile.TemporaryDirectory()
    cls.path = os.path.join(cls.tmp.name, 'sub', 'v.model')
    cls.vocab = vocab_lib.SentencePieceVocab.Train(
        _TEXTS, cls.path, vocab_size=60, extra_symbols=['<2en>', '<2es>'])

  @classmethod
  def tearDownClass(cls):
    cls.tmp.cleanup()

  def testRoundTrip(self):
    for text in _TEXTS[:6] + ['God said light.']:
      ids = self.vocab.Encode([text])[0]
      self.assertNotIn(vocab_lib.UNK_ID, ids)
      self.assertEqual(self.vocab.Decode(ids), text)

  def testFixedAndExtraIds(self):
    self.assertEqual(self.vocab.size, 60)
    self.assertEqual(self.vocab.PieceToId('<2en>'), 4)
    self.assertEqual(self.vocab.PieceToId('<2es>'), 5)
    with self.assertRaisesRegex(ValueError, 'not a piece'):
      self.vocab.PieceToId('<2fr>')

  def testDecodeStopsAtEosAndSkipsPadding(self):
    ids = self.vocab.Encode(['la luz'])[0]
    row = [5] + ids + [vocab_lib.EOS_ID, 7, 8, vocab_lib.PAD_ID]
    self.assertEqual(self.vocab.Decode(row, strip_extra=[5]), 'la luz')

  def testSameTextsGiveTheSameModel(self):
    other = vocab_lib.SentencePieceVocab.Train(
        _TEXTS, os.path.join(self.tmp.name, 'w.model'), vocab_size=60,
        extra_symbols=['<2en>', '<2es>'])
    self.assertEqual(other.Encode(_TEXTS), self.vocab.Encode(_TEXTS))

  def testMissingModelRaises(self):
    with self.assertRaisesRegex(FileNotFoundError, 'nope.model'):
      vocab_lib.SentencePieceVocab('/nonexistent/nope.model')


class LoadOrTrainTest(unittest.TestCase):

  def testTrainsOnceAtTheDefaultPathThenLoads(self):
    with tempfile.TemporaryDirectory() as data_dir:
      reads = []

      def Texts():
        reads.append(1)
        return _TEXTS
      first = vocab_lib.LoadOrTrain(data_dir, 'bible', 60, None, Texts,
                                    extra_symbols=['<2es>'])
      self.assertEqual(first.path, os.path.join(data_dir, 'vocabs',
                                                'bible_spm60.model'))
      self.assertEqual(first.PieceToId('<2es>'), 4)
      again = vocab_lib.LoadOrTrain(data_dir, 'bible', 60, None, Texts)
      self.assertEqual((again.path, len(reads)), (first.path, 1))

  def testAMissingVocabFileIsNotTrained(self):
    with tempfile.TemporaryDirectory() as data_dir:
      missing = os.path.join(data_dir, 'v.model')
      with self.assertRaisesRegex(FileNotFoundError,
                                  'does not exist; set vocab_file=None'):
        vocab_lib.LoadOrTrain(data_dir, 'brown', 60, missing,
                              lambda: self.fail('read the texts'))
      self.assertFalse(os.path.exists(missing))


if __name__ == '__main__':
  unittest.main()
