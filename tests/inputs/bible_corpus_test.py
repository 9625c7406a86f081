"""Tests of the Bible corpus: cleaning, misalignment detection, splits."""

import collections
import hashlib
import unittest

from tensorpipe.inputs import bible_corpus as bc

_WORDS = ('alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu '
          'nu xi omicron pi rho sigma tau upsilon').split()


def _Text(n, salt=0):
  return ' '.join(_WORDS[(i + salt) % len(_WORDS)] for i in range(n))


def _Chapter(book, chapter, lengths, shift=0):
  """Verses whose es text has the en length of verse v+shift (0 past the end)."""
  verses = []
  for v in range(1, len(lengths) + 1):
    j = v - 1 + shift
    es_len = lengths[j] if 0 <= j < len(lengths) else 0
    verses.append(bc.Verse(book, chapter, v, {
        'en': _Text(lengths[v - 1]), 'es': _Text(es_len, 3)}))
  return verses


_LENGTHS = [3, 12, 5, 20, 7, 15, 4, 18, 9, 25, 6, 14]


class CleanVerseTest(unittest.TestCase):

  def testDropsNotesAndTagsAndFixesSpaces(self):
    raw = ('<w lemma="x">In</w> <w>the</w> <w>beginning</w>, '
           '<w>God</w><note placement="foot">A note.</note><w>created</w> '
           '\u00b6 <w>it</w> .')
    self.assertEqual(bc.CleanVerse(raw), 'In the beginning, God created it.')


class MisalignmentTest(unittest.TestCase):

  def testAlignedChapterIsKept(self):
    verses = _Chapter('Gen', 1, _LENGTHS)
    self.assertEqual(bc.FindMisalignedChapters(verses), {})

  def testShiftedChapterIsFound(self):
    verses = _Chapter('Gen', 1, _LENGTHS) + _Chapter('Jonah', 2, _LENGTHS + [8],
                                                     shift=1)
    # The last Spanish verse is empty there: drop that signal to test the
    # length correlation alone.
    verses[-1].text['en'] = ''
    verses[-1].text['es'] = ''
    bad = bc.FindMisalignedChapters(verses)
    self.assertEqual(list(bad), [('Jonah', 2)])
    self.assertIn('shifted', bad[('Jonah', 2)])

  def testEmptyVerseOnOneSideFlagsTheChapter(self):
    verses = _Chapter('Job', 38, [5, 6, 7])
    verses[1].text['es'] = ''
    self.assertIn(('Job', 38), bc.FindMisalignedChapters(verses))

  def testAlignedPairsCountsWhatItDrops(self):
    good = _Chapter('Gen', 1, _LENGTHS)
    shifted = _Chapter('Jonah', 2, _LENGTHS, shift=1)
    outlier = bc.Verse('Gen', 2, 1, {'en': _Text(40), 'es': _Text(2)})
    stats = {}
    kept = bc.AlignedPairs(good + shifted + [outlier], stats=stats)
    self.assertEqual([v.ref for v in kept], [v.ref for v in good])
    self.assertEqual(stats, dict(total=25, empty=1, misaligned_chapters=1,
                                 misaligned=11, ratio_outliers=1, kept=12))

  def testShiftScore(self):
    shifted, same = bc.ShiftScore(_LENGTHS, _LENGTHS[1:] + [0])
    self.assertGreater(shifted, 0.99)
    self.assertLess(same, 0.5)


class SplitTest(unittest.TestCase):

  def testSplitsAreDeterministicByChapterAndRoughlyOfTheirSizes(self):
    names = [(f'B{b}', c) for b in range(40) for c in range(1, 51)]
    counts = collections.Counter(bc.SplitOf(b, c) for b, c in names)
    self.assertEqual(set(counts), {'train', 'validation', 'test'})
    self.assertAlmostEqual(counts['test'] / len(names), 0.04, delta=0.015)
    self.assertAlmostEqual(counts['validation'] / len(names), 0.04,
                           delta=0.015)

  def testSplitIsTheMd5OfTheChapterName(self):
    # The split must not change between versions or processes (Python's
    # hash() does): prepared data would move chapters between train and
    # test. The rule: the first 8 hex digits of MD5('Book.chapter') modulo
    # 1000 per mille; below 40 test, below 80 validation.
    for b in range(40):
      for c in range(1, 51):
        digest = hashlib.md5(f'B{b}.{c}'.encode()).hexdigest()
        permille = int(digest[:8], 16) % 1000
        want = ('test' if permille < 40 else
                'validation' if permille < 80 else 'train')
        self.assertEqual(bc.SplitOf(f'B{b}', c), want, (b, c))


if __name__ == '__main__':
  unittest.main()
