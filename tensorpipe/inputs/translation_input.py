"""BibleTranslationInput: multi-direction translation batches from the Bible.

Reads the prepared TFDS `bible_parallel` (bible_builder.py), keeps the pairs
flagged aligned, encodes them with a SentencePiece vocabulary trained on the
training split of all three texts (built once into
`{data_dir}/vocabs/bible_spm{vocab_size}.model`), and yields the translation
keys of base_input.py:

  src_ids [b, max_src_len] int32: source pieces + </s>, then <pad> (0);
  src_paddings [b, max_src_len] float32: 1.0 on padding;
  tgt_ids [b, max_tgt_len] int32: the target-language token ('<2es>') then
    the target pieces (decoder input);
  tgt_labels [b, max_tgt_len] int32: the target pieces + </s> (tgt_ids shifted
    left by one);
  tgt_paddings [b, max_tgt_len] float32.
Longer sentences are truncated (the </s> is kept).

Several directions ('en->es', 'es->en', 'web->es', ...) are mixed for training
with the paper's temperature sampling (sampling.py, T=5) through
`tf.data.Dataset.sample_from_datasets`; evaluation splits concatenate the
directions in order.

Languages: 'en' King James Version, 'web' World English Bible, 'es'
Reina-Valera 1909.
"""

import functools
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tensorpipe import base_input
from tensorpipe import hyperparams
from tensorpipe.inputs import sampling
from tensorpipe.inputs import tfds_utils
from tensorpipe.inputs import vocab as vocab_lib

LANGS = ('en', 'es', 'web')
DATASET_NAME = 'bible_parallel'


def LangToken(lang: str) -> str:
  """The target-language token of `lang`, e.g. '<2es>'."""
  return f'<2{lang}>'


def ParseDirection(direction: str) -> Tuple[str, str]:
  """'en->es' -> ('en', 'es'); ValueError on anything else."""
  parts = direction.split('->')
  if (len(parts) != 2 or parts[0] not in LANGS or parts[1] not in LANGS or
      parts[0] == parts[1]):
    raise ValueError(
        f"direction={direction!r} must look like 'src->tgt' with two different "
        f"languages of {LANGS}, e.g. 'en->es'")
  return parts[0], parts[1]


@functools.lru_cache(maxsize=4)
def _ReadSplit(data_dir: str, split: str) -> List[Dict[str, object]]:
  """All examples of a split of bible_parallel as Python dicts (str, bool).

  Cached (a split is read for the vocabulary, the batches and the references);
  callers must not modify the result.
  """
  from tensorpipe.inputs import bible_builder  # pylint: disable=g-import-not-at-top
  builder = bible_builder.BibleParallel(data_dir=data_dir)
  ds = builder.as_dataset(split=split, shuffle_files=False)
  try:
    cols = tfds_utils.ReadColumns(ds)
    keys = sorted(cols)
    out = [{k: (v.decode('utf-8') if isinstance(v, bytes) else bool(v))
            for k, v in zip(keys, values)}
           for values in zip(*(cols[k] for k in keys))]
  except tf.errors.OpError as e:
    raise tfds_utils.CorruptDataError(tfds_utils.DescribeDamage(
        DATASET_NAME, data_dir, split, tfds_utils.SplitFiles(builder, split),
        e, f'`{tfds_utils.REPREPARE_COMMAND}`')) from None
  return out


def _PairsOf(examples, src: str, tgt: str) -> Tuple[List[str], List[str]]:
  from tensorpipe.inputs import bible_builder  # pylint: disable=g-import-not-at-top
  key = bible_builder.PairKey(src, tgt)
  kept = [ex for ex in examples if ex[key]]
  return [ex[src] for ex in kept], [ex[tgt] for ex in kept]


def LoadOrBuildVocab(data_dir: str, vocab_size: int,
                     vocab_file: Optional[str] = None
                     ) -> vocab_lib.SentencePieceVocab:
  """The Bible vocabulary; trained on the training split if not there yet."""
  return vocab_lib.LoadOrTrain(data_dir, 'bible', vocab_size, vocab_file,
                               lambda: _TrainingTexts(data_dir),
                               extra_symbols=[LangToken(l) for l in LANGS])


def _TrainingTexts(data_dir: str) -> List[str]:
  """The sentences of every language pair of the training split, sorted."""
  from tensorpipe.inputs import bible_builder  # pylint: disable=g-import-not-at-top
  train = _ReadSplit(data_dir, 'train')
  texts = []
  for a, b in bible_builder.PAIRS:
    src, tgt = _PairsOf(train, a, b)
    texts += src + tgt
  return sorted(set(texts))


def PadBatch(seqs: List[List[int]], max_len: int) -> Tuple[np.ndarray,
                                                           np.ndarray]:
  """(ids [n, max_len] int32 zero-padded/truncated, paddings float32)."""
  ids = np.zeros([len(seqs), max_len], np.int32)
  pads = np.ones([len(seqs), max_len], np.float32)
  for i, s in enumerate(seqs):
    s = s[:max_len]
    ids[i, :len(s)] = s
    pads[i, :len(s)] = 0.0
  return ids, pads


def MakeExamples(src_pieces: List[List[int]], tgt_pieces: List[List[int]],
                 lang_token_id: int, max_src_len: int,
                 max_tgt_len: int) -> Dict[str, np.ndarray]:
  """Translation arrays (the module docstring's keys) from piece ids."""
  src = [s[:max_src_len - 1] + [vocab_lib.EOS_ID] for s in src_pieces]
  tgt_in = [[lang_token_id] + t[:max_tgt_len - 1] for t in tgt_pieces]
  tgt_out = [t[:max_tgt_len - 1] + [vocab_lib.EOS_ID] for t in tgt_pieces]
  src_ids, src_pads = PadBatch(src, max_src_len)
  tgt_ids, tgt_pads = PadBatch(tgt_in, max_tgt_len)
  tgt_labels, _ = PadBatch(tgt_out, max_tgt_len)
  return dict(src_ids=src_ids, src_paddings=src_pads, tgt_ids=tgt_ids,
              tgt_labels=tgt_labels, tgt_paddings=tgt_pads)


def KeepFraction(src_text: Sequence[str], tgt_text: Sequence[str],
                 fraction: float, seed: int) -> Tuple[List[str], List[str]]:
  """A fixed random `fraction` of the pairs (at least one), in their order."""
  n = len(src_text)
  k = max(1, int(round(fraction * n)))
  if k >= n:
    return list(src_text), list(tgt_text)
  keep = np.sort(np.random.RandomState(seed).permutation(n)[:k])
  return [src_text[i] for i in keep], [tgt_text[i] for i in keep]


class BibleTranslationInput(base_input.BaseInput):
  """Translation batches of the English-Spanish Bible (see module docstring).

  Usage:
    p = BibleTranslationInput.Params().Set(batch_size=64, split='train',
                                           directions=['en->es', 'es->en'])
    inp = p.Instantiate()
    batch = next(iter(inp.Dataset()))
    inp.vocab.Decode(batch.tgt_labels[0])   # text of the first target
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('directions', ['en->es', 'es->en'], "Translation directions "
             f"'src->tgt' over languages {LANGS} ('en' KJV, 'web' World "
             "English Bible, 'es' Reina-Valera 1909).")
    p.Define('temperature', 5.0, 'Sampling temperature T of the directions '
             'when training: p_l ~ (D_l / sum D)^(1/T).')
    p.Define('direction_fractions', None, 'Training split only: the fraction '
             'in (0, 1] of each direction\'s pairs that is kept, one per '
             'direction (e.g. [1.0, 0.05] makes the second a low-resource '
             'direction, so that the directions have unequal sizes and the '
             'temperature matters); a fixed random subset (seed). None keeps '
             'every pair. Evaluation splits are never reduced.')
    p.Define('vocab_size', 8000, 'SentencePiece vocabulary size (pieces).')
    p.Define('vocab_file', None, 'SentencePiece .model to use; None builds '
             '(once) {data_dir}/vocabs/bible_spm{vocab_size}.model from the '
             'training split.')
    p.Define('max_src_len', 64, 'Source length in pieces (with </s>); longer '
             'sources are truncated.')
    p.Define('max_tgt_len', 64, 'Target length in pieces (with the language '
             'token / </s>); longer targets are truncated.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams):
    p = params.Copy()
    if not p.directions:
      raise ValueError(f'directions={p.directions!r}: give at least one, e.g. '
                       "['en->es']")
    p.directions = [str(d) for d in p.directions]
    self._directions = [ParseDirection(d) for d in p.directions]
    if len(set(p.directions)) != len(p.directions):
      raise ValueError(f'directions={p.directions!r} has duplicates')
    for key in ('max_src_len', 'max_tgt_len'):
      if getattr(p, key) < 2:
        raise ValueError(f'{key}={getattr(p, key)!r} must be >= 2')
    if p.direction_fractions is not None:
      fractions = list(p.direction_fractions)
      if len(fractions) != len(p.directions) or not all(
          isinstance(f, (int, float)) and not isinstance(f, bool) and
          0.0 < f <= 1.0 for f in fractions):
        raise ValueError(
            f'direction_fractions={p.direction_fractions!r} must give one '
            f'fraction in (0, 1] per direction of {p.directions}, e.g. '
            f'{[1.0] * (len(p.directions) - 1) + [0.05]}')
      p.direction_fractions = [float(f) for f in fractions]
    super().__init__(p)
    self._vocab = None
    self.direction_sizes = None  # Examples per direction, once read.
    self.direction_weights = None  # Their sampling probabilities.

  @property
  def data_dir(self) -> str:
    return tfds_utils.ResolveDataDir(self.params.data_dir)

  def _CheckPrepared(self) -> None:
    from tensorpipe.inputs import bible_builder  # pylint: disable=g-import-not-at-top
    tfds_utils.CheckPrepared(
        DATASET_NAME, self.data_dir,
        f'run `{tfds_utils.PREPARE_COMMAND}` (installs Debian '
        "'sword-text-kjv sword-text-sparv sword-text-web' and builds it into "
        'data/tfds), or pass data_dir / $TENSORPIPE_DATA_DIR')
    tfds_utils.CheckFiles(
        DATASET_NAME, self.data_dir, self.params.split,
        f'`{tfds_utils.REPREPARE_COMMAND}`',
        make_builder=lambda: bible_builder.BibleParallel(
            data_dir=self.data_dir))

  @property
  def vocab(self) -> vocab_lib.SentencePieceVocab:
    """The SentencePiece vocabulary (loaded or built on first use)."""
    if self._vocab is None:
      self._CheckPrepared()
      p = self.params
      self._vocab = LoadOrBuildVocab(self.data_dir, p.vocab_size,
                                     p.vocab_file)
    return self._vocab

  def LangTokenId(self, lang: str) -> int:
    return self.vocab.PieceToId(LangToken(lang))

  def References(self) -> Dict[str, List[Tuple[str, str]]]:
    """{direction: [(source text, target text)]} of the split, in order.

    With repeat False and max_examples None, Dataset() yields these pairs in
    this order (directions concatenated), which evaluation uses for BLEU.
    """
    self._CheckPrepared()
    examples = _ReadSplit(self.data_dir, self.params.split)
    out = {}
    for d, (src, tgt) in zip(self.params.directions, self._directions):
      out[d] = list(zip(*_PairsOf(examples, src, tgt)))
    return out

  def Detokenizer(self) -> Callable[[Sequence[int]], str]:
    """The vocabulary's Decode: piece ids of one row -> text."""
    return self.vocab.Decode

  def ReferenceTexts(self) -> List[str]:
    """Target texts of References(), directions concatenated."""
    return [tgt for pairs in self.References().values() for _, tgt in pairs]

  def ReferenceGroups(self) -> List[Tuple[str, int]]:
    """[(direction, its number of pairs)] in Dataset() order (repeat off):
    decoding metrics report BLEU per direction too."""
    return [(d, len(pairs)) for d, pairs in self.References().items()]

  def _DirectionArrays(self) -> List[Dict[str, np.ndarray]]:
    p = self.params
    self._CheckPrepared()
    vocab = self.vocab
    examples = _ReadSplit(self.data_dir, p.split)
    arrays = []
    for i, (src, tgt) in enumerate(self._directions):
      src_text, tgt_text = _PairsOf(examples, src, tgt)
      if not src_text:
        raise ValueError(f"split {p.split!r} has no aligned '{src}->{tgt}' "
                         'pairs')
      if self.is_training and p.direction_fractions:
        src_text, tgt_text = KeepFraction(src_text, tgt_text,
                                          p.direction_fractions[i], p.seed + i)
      arrays.append(
          MakeExamples(vocab.Encode(src_text), vocab.Encode(tgt_text),
                       self.LangTokenId(tgt), p.max_src_len, p.max_tgt_len))
    return arrays

  def _Dataset(self) -> tf.data.Dataset:
    p = self.params
    arrays = self._DirectionArrays()
    self.direction_sizes = [len(a['src_ids']) for a in arrays]
    self.direction_weights = sampling.TemperatureSamplingWeights(
        self.direction_sizes, p.temperature)
    datasets = [tf.data.Dataset.from_tensor_slices(a) for a in arrays]
    if not self.is_training or len(datasets) == 1:
      ds = datasets[0]
      for other in datasets[1:]:
        ds = ds.concatenate(other)
      return self._Finish(ds)
    if p.shuffle_buffer:
      datasets = [
          d.shuffle(p.shuffle_buffer, seed=p.seed + i,
                    reshuffle_each_iteration=True)
          for i, d in enumerate(datasets)
      ]
    if self._Repeat():
      datasets = [d.repeat() for d in datasets]
    ds = tf.data.Dataset.sample_from_datasets(
        datasets, weights=self.direction_weights, seed=p.seed,
        stop_on_empty_dataset=not self._Repeat())
    return self._Finish(ds, shuffle=False)
