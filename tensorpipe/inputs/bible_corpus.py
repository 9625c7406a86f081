"""Verse-aligned English-Spanish Bible from Debian's SWORD modules.

Sources (Debian packages, read with PyPI `pysword`):
  en:  sword-text-kjv    engKJV2006eb  King James Version
  es:  sword-text-sparv  spaRV1909eb   Reina-Valera 1909
  web: sword-text-web    engWEB2015eb  World English Bible (a second English)

Verses are keyed by the KJV reference (book, chapter, verse). The Spanish module
uses KJV versification on paper, but in some chapters its text is shifted by a
verse (e.g. Jonah 1:17 is empty and its text sits in 2:1, and the chapter ends
of Job 38-41): those pairs are misaligned. `FindMisalignedChapters` finds such
chapters without a list, with two signals:

  1. a verse that is empty in one language but not in the other;
  2. verse lengths: in an aligned chapter the character lengths of verse v in
     both languages are strongly correlated; in a shifted chapter the lengths
     of verse v correlate better with verse v+d (d = +-1..3) of the other
     language. A chapter is flagged when such a shift raises the Pearson
     correlation of the lengths by more than `margin` over the unshifted one,
     or when the unshifted correlation is below `min_correlation` (longer
     shifts, as in Job 39, whose Spanish starts with KJV Job 38:39).
On the Debian modules this flags, for en-es, 39 chapters (Job 38-40, Jonah 1-2,
Hosea 11-12, Numbers 12-13 and 29-30, 1 Samuel 23-24, several Psalms whose
Spanish counts the title as verse 1, ...).

Whole flagged chapters are dropped (a shift usually runs to the chapter end).
Pairs whose length ratio is an extreme outlier (more than `max_ratio` times the
corpus median ratio either way) are also dropped, one by one.

Splits are deterministic and by chapter (no chapter is in two splits): the MD5
of 'Book.chapter' decides: 4% test, 4% validation, the rest train.
"""

import dataclasses
import functools
import hashlib
import math
import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

SWORD_DIR = '/usr/share/sword'
MODULES = {'en': 'engKJV2006eb', 'es': 'spaRV1909eb', 'web': 'engWEB2015eb'}
# Debian packages that hold MODULES.
DEBIAN_PACKAGES = ('sword-text-kjv', 'sword-text-sparv', 'sword-text-web')
SPLITS = ('train', 'validation', 'test')
# Per-mille of chapters in the test and validation splits.
_TEST_PERMILLE = 40
_VALIDATION_PERMILLE = 40


@dataclasses.dataclass
class Verse:
  """One verse in every language; '' where a module lacks it."""
  book: str  # OSIS book name, e.g. 'Gen'.
  chapter: int
  verse: int
  text: Dict[str, str]

  @property
  def ref(self) -> str:
    return f'{self.book}.{self.chapter}.{self.verse}'


_NOTE = re.compile(r'<note\b[^>]*>.*?</note>', re.S)
_TAG = re.compile(r'<[^>]+>')
_SPACE_BEFORE_PUNCT = re.compile(r'\s+([,.;:!?])')


def CleanVerse(raw: str) -> str:
  """Plain text of an OSIS verse: notes dropped, tags stripped, spaces fixed.

  A footnote is replaced by a space, because some modules put it between two
  words with no space around it ('God<note>..</note><w>created').
  """
  text = _NOTE.sub(' ', raw)
  text = _TAG.sub('', text)
  text = text.replace('\u00b6', ' ')  # pilcrow paragraph marks of the KJV
  text = ' '.join(text.split())
  return _SPACE_BEFORE_PUNCT.sub(r'\1', text)


def ReadVerses(sword_dir: str = SWORD_DIR,
               langs: Sequence[str] = tuple(MODULES)) -> List[Verse]:
  """All KJV-versification verses with their text in `langs`.

  Args:
    sword_dir: SWORD root holding mods.d/ and modules/ (Debian: SWORD_DIR).
    langs: keys of MODULES to read.

  Returns:
    Verses in canonical order (KJV structure), text[lang] '' where missing.

  Raises:
    FileNotFoundError: a module is not installed, naming the Debian package.
  """
  from pysword.modules import SwordModules  # pylint: disable=g-import-not-at-top
  modules = SwordModules(sword_dir)
  found = modules.parse_modules()
  bibles = {}
  for lang in langs:
    if MODULES[lang] not in found:
      raise FileNotFoundError(
          f'SWORD module {MODULES[lang]} ({lang}) not found in {sword_dir}; '
          f'install it: apt-get install {" ".join(DEBIAN_PACKAGES)} '
          '(or run `bash tools/prepare_data.sh`)')
    bible = modules.get_bible_from_module(MODULES[lang])
    # pysword decompresses a whole block (a book) for every verse it reads;
    # caching the last blocks makes reading the Bible ~40x faster.
    bible._decompressed_text = functools.lru_cache(maxsize=4)(  # pylint: disable=protected-access
        bible._decompressed_text)  # pylint: disable=protected-access
    bibles[lang] = bible
  structure = modules.get_bible_from_module(MODULES['en']).get_structure()
  verses = []
  for testament in structure.get_books().values():
    for book in testament:
      for chapter, length in enumerate(book.chapter_lengths, 1):
        for v in range(1, length + 1):
          text = {}
          for lang, bible in bibles.items():
            try:
              raw = bible.get(books=[book.osis_name], chapters=[chapter],
                              verses=[v], clean=False)
            except ValueError:  # Not in this module's versification.
              raw = ''
            text[lang] = CleanVerse(raw)
          verses.append(Verse(book.osis_name, chapter, v, text))
  return verses


def SplitOf(book: str, chapter: int) -> str:
  """'train', 'validation' or 'test' for a chapter, from an MD5 of its name."""
  h = int(hashlib.md5(f'{book}.{chapter}'.encode()).hexdigest()[:8], 16)
  permille = h % 1000
  if permille < _TEST_PERMILLE:
    return 'test'
  if permille < _TEST_PERMILLE + _VALIDATION_PERMILLE:
    return 'validation'
  return 'train'


def _Pearson(x: Sequence[float], y: Sequence[float]) -> float:
  n = len(x)
  if n < 2:
    return 0.0
  mx, my = sum(x) / n, sum(y) / n
  sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
  sxx = sum((a - mx)**2 for a in x)
  syy = sum((b - my)**2 for b in y)
  if sxx == 0 or syy == 0:
    return 0.0
  return sxy / math.sqrt(sxx * syy)


def ShiftScore(src_lengths: Sequence[int], tgt_lengths: Sequence[int],
               max_shift: int = 3) -> Tuple[float, float]:
  """(best length correlation at a shift of 1..max_shift verses, at none).

  All shifts are compared on the same verse range (the verses of `src` at
  least `max_shift` from either end), so the correlations are comparable.
  """
  n = len(src_lengths)
  s = min(max_shift, (n - 3) // 2)
  if s < 1:
    return 0.0, 1.0
  src = list(src_lengths[s:n - s])
  same = _Pearson(src, tgt_lengths[s:n - s])
  shifted = max(
      _Pearson(src, tgt_lengths[s + d:n - s + d])
      for d in range(-s, s + 1) if d)
  return shifted, same


def FindMisalignedChapters(verses: Iterable[Verse], src: str = 'en',
                           tgt: str = 'es', min_verses: int = 8,
                           margin: float = 0.15, min_correlation: float = 0.3
                           ) -> Dict[Tuple[str, int], str]:
  """Chapters whose `src` and `tgt` verses are not aligned, with the reason.

  Args:
    verses: verses of the corpus (any order).
    src: language key compared with `tgt`.
    tgt: language key.
    min_verses: chapters with fewer verses are checked for empty verses only
      (a correlation of a few points says little).
    margin: flag a chapter when a shift of 1 to 3 verses raises the length
      correlation by more than this.
    min_correlation: flag a chapter whose aligned length correlation is below
      this (a shift by more verses, or a garbled chapter).

  Returns:
    {(book, chapter): reason}.
  """
  chapters: Dict[Tuple[str, int], List[Verse]] = {}
  for verse in verses:
    chapters.setdefault((verse.book, verse.chapter), []).append(verse)
  bad = {}
  for key, chapter in chapters.items():
    chapter = sorted(chapter, key=lambda v: v.verse)
    empties = [v.verse for v in chapter
               if bool(v.text.get(src)) != bool(v.text.get(tgt))]
    if empties:
      bad[key] = f'verses {empties} empty in one language only'
      continue
    if len(chapter) < min_verses:
      continue
    shifted, same = ShiftScore([len(v.text[src]) for v in chapter],
                               [len(v.text[tgt]) for v in chapter])
    if shifted > same + margin:
      bad[key] = (f'verse lengths correlate better shifted by 1-3 verses '
                  f'({shifted:.2f}) than aligned ({same:.2f})')
    elif same < min_correlation:
      bad[key] = f'verse lengths barely correlate ({same:.2f})'

  return bad


def AlignedPairs(verses: Sequence[Verse], src: str = 'en', tgt: str = 'es',
                 max_ratio: float = 3.0,
                 stats: Optional[Dict[str, int]] = None) -> List[Verse]:
  """The verses fit for `src`-`tgt` training: aligned chapters, sane lengths.

  Args:
    verses: all verses.
    src: language key.
    tgt: language key.
    max_ratio: drop a pair whose tgt/src length ratio differs from the
      corpus median ratio by more than this factor either way.
    stats: if given, filled with counts: 'total', 'empty' (either side empty),
      'misaligned_chapters', 'misaligned' (pairs in them), 'ratio_outliers',
      'kept'.

  Returns:
    The kept verses, in the input order.
  """
  stats = {} if stats is None else stats
  bad_chapters = FindMisalignedChapters(verses, src, tgt)
  both = [v for v in verses if v.text.get(src) and v.text.get(tgt)]
  stats['total'] = len(verses)
  stats['empty'] = len(verses) - len(both)
  stats['misaligned_chapters'] = len(bad_chapters)
  aligned = [v for v in both if (v.book, v.chapter) not in bad_chapters]
  stats['misaligned'] = len(both) - len(aligned)
  ratios = sorted(len(v.text[tgt]) / len(v.text[src]) for v in aligned)
  median = ratios[len(ratios) // 2] if ratios else 1.0
  kept = [
      v for v in aligned
      if abs(math.log(len(v.text[tgt]) / len(v.text[src]) / median)) <=
      math.log(max_ratio)
  ]
  stats['ratio_outliers'] = len(aligned) - len(kept)
  stats['kept'] = len(kept)
  return kept
