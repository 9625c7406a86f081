"""Synthetic inputs for tests and quick runs, with base_input's batch keys.

The examples are a pure function of (seed, example index), so runs are
reproducible and the input position can be checkpointed like a real input's.

  SyntheticImageInput: image [b, h, w, c] float32, label [b] int32; the label
    is the brightest of num_classes horizontal bands, so it can be learnt.
  SyntheticSequenceInput: language model (ids, labels, paddings) or
    translation (src_ids, src_paddings, tgt_ids, tgt_labels, tgt_paddings);
    the targets copy the source, so a model can learn them.
"""

from typing import Callable, Sequence

import tensorflow as tf

from tensorpipe import base_input


class SyntheticImageInput(base_input.BaseInput):
  """Random images whose label is the brightest horizontal band (when the
  image has a band per class)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('image_shape', (8, 8, 1), 'Shape [h, w, c] of each image.')
    p.Define('num_classes', 4, 'Number of classes (<= image height).')
    p.Define('num_examples', 1024, 'Examples in the split.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if not isinstance(p.num_classes, int) or p.num_classes < 2:
      raise ValueError(f'num_classes={p.num_classes!r} must be an int >= 2')

  def _Example(self, index):
    p = self.params
    split_seed = 0 if self.is_training else 1
    seed = tf.stack([tf.constant(p.seed, tf.int64) * 2 + split_seed,
                     tf.cast(index, tf.int64)])
    image = tf.random.stateless_uniform(list(p.image_shape), seed)
    h = p.image_shape[0]
    band = max(1, h // p.num_classes)
    label = tf.random.stateless_uniform([], seed + 7, 0, p.num_classes,
                                        dtype=tf.int32)
    # With more classes than bands, only the first h // band are learnable.
    rows = tf.range(h) // band
    bright = tf.cast(tf.equal(rows, label), tf.float32)[:, None, None]
    image = image * 0.5 + bright * 0.5
    return {'image': image, 'label': label}

  def _Dataset(self):
    ds = tf.data.Dataset.range(self.params.num_examples).map(self._Example)
    return self._Finish(ds)


class SyntheticSequenceInput(base_input.BaseInput):
  """Random token sequences; targets copy the source (or the next token)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('task', 'lm', "'lm' (ids, labels, paddings) or 'nmt' (src_ids, "
             'src_paddings, tgt_ids, tgt_labels, tgt_paddings).')
    p.Define('vocab_size', 16, 'Vocabulary size; ids 0 (pad) and 1 (<s>) '
             'and 2 (</s>) are reserved.')
    p.Define('max_length', 8, 'Sequence length L (padded).')
    p.Define('num_examples', 256, 'Examples in the split.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.task not in ('lm', 'nmt'):
      raise ValueError(f"task={p.task!r} must be 'lm' or 'nmt'")

  def _Example(self, index):
    p = self.params
    split_seed = 0 if self.is_training else 1
    seed = tf.stack([tf.constant(p.seed, tf.int64) * 2 + split_seed,
                     tf.cast(index, tf.int64)])
    length = tf.random.stateless_uniform([], seed, 2, p.max_length,
                                         dtype=tf.int32)
    tokens = tf.random.stateless_uniform([p.max_length], seed + 1, 3,
                                         p.vocab_size, dtype=tf.int32)
    mask = tf.cast(tf.range(p.max_length) < length, tf.int32)
    paddings = 1.0 - tf.cast(tf.range(p.max_length) <= length, tf.float32)
    body = tokens * mask
    eos = tf.one_hot(length, p.max_length, dtype=tf.int32) * 2
    labels = body + eos
    inputs = tf.concat([[1], labels[:-1]], 0)
    if p.task == 'lm':
      return {'ids': inputs, 'labels': labels, 'paddings': paddings}
    return {'src_ids': labels, 'src_paddings': paddings, 'tgt_ids': inputs,
            'tgt_labels': labels, 'tgt_paddings': paddings}

  def _Dataset(self):
    ds = tf.data.Dataset.range(self.params.num_examples).map(self._Example)
    return self._Finish(ds)

  def Detokenizer(self) -> Callable[[Sequence[int]], str]:
    return self.IdsToString

  def IdsToString(self, ids) -> str:
    """Text of token ids: 'w<id>' words up to the first </s> (2), no <pad>."""
    words = []
    for i in ids:
      i = int(i)
      if i == 2:
        break
      if i > 2:
        words.append(f'w{i}')
    return ' '.join(words)
