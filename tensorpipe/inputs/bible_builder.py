"""TFDS builder `bible_parallel`: the verse-aligned Bible of bible_corpus.py.

One example per KJV verse reference, with the text in every language and one
flag per language pair saying whether the pair is aligned (bible_corpus.
AlignedPairs: not in a misaligned chapter, both sides non-empty, sane length
ratio). Splits 'train' / 'validation' / 'test' by chapter (bible_corpus.
SplitOf). Nothing is downloaded: the Debian SWORD modules are read locally.

Usage:
  BibleParallel(data_dir=D).download_and_prepare()
  ds = BibleParallel(data_dir=D).as_dataset(split='train')
"""

from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow_datasets as tfds

from tensorpipe.inputs import bible_corpus

# Language pairs with an alignment flag: feature 'aligned_<a>_<b>'.
PAIRS = (('en', 'es'), ('web', 'es'), ('en', 'web'))


def PairKey(a: str, b: str) -> str:
  """Name of the alignment flag of languages a and b (either order)."""
  for x, y in PAIRS:
    if {x, y} == {a, b}:
      return f'aligned_{x}_{y}'
  raise ValueError(f'no language pair {a!r}-{b!r}; pairs are {PAIRS}')


class BibleParallel(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """English (KJV, WEB) - Spanish (RV 1909) Bible, aligned by verse."""

  name = 'bible_parallel'
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'KJV, WEB and RV1909 from Debian SWORD modules.'}

  def __init__(self, *, sword_dir: Optional[str] = None,
               verses: Optional[Sequence[bible_corpus.Verse]] = None,
               **kwargs):
    """Args: sword_dir: SWORD root; verses: use these instead (tests)."""
    self._sword_dir = sword_dir or bible_corpus.SWORD_DIR
    self._verses = verses
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    features = {'ref': tfds.features.Text()}
    for lang in bible_corpus.MODULES:
      features[lang] = tfds.features.Text()
    for a, b in PAIRS:
      features[PairKey(a, b)] = tfds.features.Scalar(dtype=np.bool_)
    return self.dataset_info_from_configs(
        description=__doc__,
        features=tfds.features.FeaturesDict(features),
        homepage='https://crosswire.org/sword/',
    )

  def _split_generators(self, dl_manager) -> Dict[str, object]:
    del dl_manager  # Everything is local.
    verses = self._verses
    if verses is None:
      verses = bible_corpus.ReadVerses(self._sword_dir)
    aligned = {}
    for a, b in PAIRS:
      aligned[PairKey(a, b)] = {
          v.ref for v in bible_corpus.AlignedPairs(verses, a, b)}
    by_split: Dict[str, List[bible_corpus.Verse]] = {
        s: [] for s in bible_corpus.SPLITS}
    for v in verses:
      by_split[bible_corpus.SplitOf(v.book, v.chapter)].append(v)
    return {s: self._generate_examples(vs, aligned)
            for s, vs in by_split.items()}

  def _generate_examples(self, verses, aligned):
    for v in verses:
      example = {'ref': v.ref}
      for lang in bible_corpus.MODULES:
        example[lang] = v.text.get(lang, '')
      for key, refs in aligned.items():
        example[key] = v.ref in refs
      yield v.ref, example
