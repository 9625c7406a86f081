"""Subword vocabularies: SentencePiece models trained on a training split.

Ids 0-3 are fixed: 0 <pad>, 1 <unk>, 2 <s>, 3 </s>; `extra_symbols` (e.g.
target-language tokens '<2es>') come next, each always one piece.

Usage:
  vocab = SentencePieceVocab.Train(texts, '/tmp/v.model', vocab_size=8000)
  ids = vocab.Encode(['Hello world'])[0]
  vocab.Decode(ids) == 'Hello world'
"""

import os
import tempfile
from typing import Callable, Iterable, List, Optional, Sequence

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


class SentencePieceVocab:
  """A loaded SentencePiece model (PyPI `sentencepiece`)."""

  def __init__(self, model_path: str):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    if not os.path.exists(model_path):
      raise FileNotFoundError(f'vocabulary model {model_path!r} not found')
    self._path = model_path
    self._sp = spm.SentencePieceProcessor(model_file=model_path)

  @classmethod
  def Train(cls, texts: Iterable[str], model_path: str, vocab_size: int,
            extra_symbols: Sequence[str] = (),
            model_type: str = 'unigram') -> 'SentencePieceVocab':
    """Trains a model on `texts` and writes it to `model_path` (atomically).

    Training uses every sentence (no sampling), so the same texts give the same
    model.

    Args:
      texts: training sentences.
      model_path: where the .model file goes (its folder is created).
      vocab_size: number of pieces, including the 4 fixed and extra symbols.
      extra_symbols: pieces that are never split, ids 4, 5, ...
      model_type: 'unigram' or 'bpe'.
    """
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    folder = os.path.dirname(os.path.abspath(model_path))
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
      prefix = os.path.join(tmp, 'spm')
      spm.SentencePieceTrainer.train(
          sentence_iterator=iter(list(texts)), model_prefix=prefix,
          vocab_size=vocab_size, model_type=model_type,
          character_coverage=1.0, pad_id=PAD_ID, unk_id=UNK_ID,
          bos_id=BOS_ID, eos_id=EOS_ID,
          user_defined_symbols=list(extra_symbols),
          input_sentence_size=0, shuffle_input_sentence=False,
          num_threads=1, minloglevel=2)
      os.replace(prefix + '.model', model_path)
    return cls(model_path)

  @property
  def path(self) -> str:
    return self._path

  @property
  def size(self) -> int:
    return self._sp.get_piece_size()

  def PieceToId(self, piece: str) -> int:
    """Id of `piece`; ValueError if it is not a single known piece."""
    i = self._sp.piece_to_id(piece)
    if i == UNK_ID and piece != '<unk>':
      raise ValueError(f'{piece!r} is not a piece of {self._path}')
    return i

  def Encode(self, texts: Sequence[str]) -> List[List[int]]:
    """Ids of each text (no <s> or </s> added)."""
    return self._sp.encode(list(texts))

  def Decode(self, ids: Sequence[int],
             strip_extra: Optional[Sequence[int]] = None) -> str:
    """Text of `ids`, stopping at the first </s> and skipping <pad>, <s>.

    Args:
      ids: ids, e.g. a row of tgt_labels or a decoder output.
      strip_extra: further ids to drop (e.g. target-language tokens).
    """
    drop = {PAD_ID, BOS_ID} | set(strip_extra or ())
    out = []
    for i in ids:
      i = int(i)
      if i == EOS_ID:
        break
      if i not in drop:
        out.append(i)
    return self._sp.decode(out)


def LoadOrTrain(data_dir: str, name: str, vocab_size: int,
                vocab_file: Optional[str],
                texts: Callable[[], Iterable[str]],
                extra_symbols: Sequence[str] = ()) -> SentencePieceVocab:
  """A data set's vocabulary: `vocab_file`, else its default model file,
  trained there on `texts()` if not there yet.

  Args:
    data_dir: the data folder; the default model file is
      <data_dir>/vocabs/<name>_spm<vocab_size>.model.
    name: the data set's short name, e.g. 'brown'.
    vocab_size: pieces of a vocabulary trained here.
    vocab_file: a model file to load instead of the default, or None.
    texts: the training sentences, read only when a model is trained.
    extra_symbols: see `SentencePieceVocab.Train`.

  Raises:
    FileNotFoundError: `vocab_file` does not exist.
  """
  path = vocab_file or os.path.join(data_dir, 'vocabs',
                                    f'{name}_spm{vocab_size}.model')
  if os.path.exists(path):
    return SentencePieceVocab(path)
  if vocab_file:
    raise FileNotFoundError(f'vocab_file={vocab_file!r} does not exist; set '
                            'vocab_file=None to build the default one')
  return SentencePieceVocab.Train(texts(), path, vocab_size,
                                  extra_symbols=extra_symbols)
