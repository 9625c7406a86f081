"""Token embeddings, sinusoidal positions, and the Transformer's input layer.

`EmbeddingLayer` looks ids up in a [vocab, dim] table (scaled by sqrt(dim) as
in Vaswani et al. 2017). Its gradient is a dense [vocab, dim] tensor rather
than `tf.IndexedSlices`: a pipeline partition's weight gradients are summed
over micro-batches inside a loop, which needs dense tensors. The lookup is a
`py_utils.WeightOp` (x = the ids), so the zero-bubble schedules take that
scatter-add in their W cells: the I cell keeps the ids and the output
gradient dz ([b, ..., dim]) and builds no [vocab, dim] tensor.

`TransformerEmbeddingLayer` is layer 0 of the Transformer models in
models/transformer.py: it turns an input batch (NestedMap of ids and
paddings, see tensorpipe/base_input.py) into the NestedMap of vectors that the
encoder and decoder layers pass along the pipeline.
"""

import math

import numpy as np
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import checks
from tensorpipe import py_utils
from tensorpipe.layers import dropout
from tensorpipe.nested_map import NestedMap

_MODES = ('seq2seq', 'lm')


def PositionalEncoding(length: int, dim: int) -> np.ndarray:
  """Sinusoidal positions: pe[t, 2i] = sin(t / 10000^(2i/dim)), cos at 2i+1.

  Args:
    length: number of positions.
    dim: encoding size (even or odd).

  Returns:
    [length, dim] float32 NumPy array (a constant: no TF op at call time).
  """
  positions = np.arange(length, dtype=np.float64)[:, None]
  rates = 1.0 / np.power(10000.0, (2 * (np.arange(dim) // 2)) / float(dim))
  angles = positions * rates[None, :]
  pe = np.where(np.arange(dim)[None, :] % 2 == 0, np.sin(angles),
                np.cos(angles))
  return pe.astype(np.float32)


@tf.custom_gradient
def _GatherDenseGrad(table, ids):
  """tf.gather(table, ids) whose table gradient is dense (not IndexedSlices)."""
  out = tf.gather(table, ids)

  def Grad(dy):
    flat_ids = tf.reshape(ids, [-1])
    flat_dy = tf.reshape(dy, [-1, tf.shape(table)[-1]])
    d_table = tf.math.unsorted_segment_sum(flat_dy, flat_ids,
                                           tf.shape(table)[0])
    return d_table, None
  return out, Grad


class EmbeddingLayer(base_layer.BaseLayer):
  """Embedding lookup: ids [b, ...] -> vectors [b, ..., embedding_dim].

  Usage:
    p = EmbeddingLayer.Params().Set(name='emb', vocab_size=32000,
                                    embedding_dim=512)

  y = table[ids] * sqrt(embedding_dim) if scale_sqrt_depth. The default
  initialisation is N(0, 1 / embedding_dim), so y starts with unit variance.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('vocab_size', None, 'Number of ids V (rows of the table); '
             'required.')
    p.Define('embedding_dim', None, 'Size of each vector; required.')
    p.Define('scale_sqrt_depth', True, 'Multiply the looked-up vectors by '
             'sqrt(embedding_dim).')
    return p

  @classmethod
  def _Validate(cls, p) -> None:
    checks.CheckPositiveInts(f'{cls.__name__} {p.name!r}',
                             vocab_size=p.vocab_size,
                             embedding_dim=p.embedding_dim)

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self._Validate(p)
    self.CreateVariable('emb', base_layer.WeightParams(
        shape=[p.vocab_size, p.embedding_dim],
        init=base_layer.WeightInit.Gaussian(1.0 / math.sqrt(p.embedding_dim))))

  def FProp(self, theta, ids: tf.Tensor) -> tf.Tensor:
    """Looks up ids.

    Args:
      theta: NestedMap with emb [vocab_size, embedding_dim].
      ids: [batch, ...] int ids in [0, vocab_size).

    Returns:
      [batch, ..., embedding_dim] in fprop_dtype.
    """
    p = self.params
    if not ids.dtype.is_integer:
      raise TypeError(f'EmbeddingLayer {p.name!r}: ids must be integers, got '
                      f'{ids.dtype}')
    # The lookup is a weight op on the uncast table (it casts the table
    # itself): the zero-bubble schedules defer its scatter-add to W.
    dtype = self.fprop_dtype
    y = py_utils.WeightOp(
        lambda i, w: _GatherDenseGrad(tf.cast(w, dtype), i), ids, theta.emb)
    if p.scale_sqrt_depth:
      y *= math.sqrt(p.embedding_dim)
    return y

  @classmethod
  def FPropMeta(cls, p, ids_shape):
    cls._Validate(p)
    shape = base_layer.ToShape(ids_shape)
    out = shape.concatenate([p.embedding_dim])
    flops = base_layer.NumElements(out) if p.scale_sqrt_depth else 0
    return base_layer.FPropMetaResult(flops, out,
                                      p.vocab_size * p.embedding_dim)


class TransformerEmbeddingLayer(base_layer.BaseLayer):
  """Layer 0 of a Transformer: embeddings + positions + dropout.

  Usage:
    p = TransformerEmbeddingLayer.Params().Set(
        name='emb', vocab_size=32000, model_dim=512, mode='seq2seq')

  Input (NestedMap, keys of tensorpipe/base_input.py):
    mode='seq2seq': src_ids [b, Ls], src_paddings [b, Ls], tgt_ids [b, Lt],
      tgt_labels [b, Lt], tgt_paddings [b, Lt]
    mode='lm': ids [b, L], labels [b, L], paddings [b, L]
  Output (NestedMap carried through the encoder and decoder layers):
    seq2seq: src_vecs [b, Ls, D], src_paddings, tgt_vecs [b, Lt, D],
      tgt_paddings, tgt_labels
    lm: tgt_vecs [b, L, D], tgt_paddings, tgt_labels
  where vecs = dropout(emb(ids) * sqrt(D) + PositionalEncoding). Paddings are
  float32 (1.0 = pad), labels int32.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('vocab_size', None, 'Target vocabulary size (and source, unless '
             'src_vocab_size is set); required.')
    p.Define('src_vocab_size', None, 'Source vocabulary size for separate '
             'embeddings; None means vocab_size.')
    p.Define('model_dim', None, 'Model dimension D; required.')
    p.Define('mode', 'seq2seq', f'One of {_MODES}: translation batches '
             '(src_* and tgt_* keys) or language-model batches (ids, labels, '
             'paddings).')
    p.Define('shared_embeddings', False, 'seq2seq only: one table for source '
             'and target (needs src_vocab_size None or == vocab_size).')
    p.Define('max_len', 1024, 'Longest sequence accepted (positional '
             'encodings are computed up to this length).')
    p.Define('dropout_prob', 0.0, 'Dropout rate in [0, 1) on the summed '
             'embeddings and positions (per example, as in DropoutLayer).')
    return p

  @classmethod
  def _Validate(cls, p) -> None:
    name = f'{cls.__name__} {p.name!r}'
    if p.mode not in _MODES:
      raise ValueError(f'{name}: mode={p.mode!r} must be one of {_MODES}')
    checks.CheckPositiveInts(name, vocab_size=p.vocab_size,
                             model_dim=p.model_dim, max_len=p.max_len)
    if p.src_vocab_size is not None and not checks.IsPositiveInt(
        p.src_vocab_size):
      raise ValueError(f'{name}: src_vocab_size={p.src_vocab_size!r} must be '
                       'None or a positive int')
    if p.shared_embeddings and p.mode == 'seq2seq' and (
        p.src_vocab_size not in (None, p.vocab_size)):
      raise ValueError(f'{name}: shared_embeddings=True needs one vocabulary, '
                       f'got src_vocab_size={p.src_vocab_size} and vocab_size='
                       f'{p.vocab_size}; set src_vocab_size=None or '
                       'shared_embeddings=False')
    if not 0.0 <= p.dropout_prob < 1.0:
      raise ValueError(f'{name}: dropout_prob={p.dropout_prob!r} must be in '
                       '[0, 1)')

  @classmethod
  def _Tables(cls, p):
    """[(child name, vocab size)] of the embedding tables."""
    if p.mode == 'lm':
      return [('tgt_emb', p.vocab_size)]
    if p.shared_embeddings:
      return [('emb', p.vocab_size)]
    return [('src_emb', p.src_vocab_size or p.vocab_size),
            ('tgt_emb', p.vocab_size)]

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self._Validate(p)
    for name, vocab in self._Tables(p):
      self.CreateChild(name, EmbeddingLayer.Params().Set(
          vocab_size=vocab, embedding_dim=p.model_dim))
    keep = 1.0 - p.dropout_prob
    if p.mode == 'seq2seq':
      self.CreateChild('src_dropout', dropout.DropoutLayer.Params().Set(
          keep_prob=keep))
    self.CreateChild('tgt_dropout', dropout.DropoutLayer.Params().Set(
        keep_prob=keep))

  def _Embed(self, theta, side: str, ids: tf.Tensor) -> tf.Tensor:
    p = self.params
    table = 'emb' if (p.shared_embeddings and p.mode == 'seq2seq') else (
        f'{side}_emb')
    length = ids.shape[1]
    if length is None or length > p.max_len:
      raise ValueError(f'{type(self).__name__} {p.name!r}: {side} length '
                       f'{length} must be static and <= max_len={p.max_len}; '
                       'raise max_len or shorten the inputs')
    x = self.children[table].FProp(theta[table], ids)
    x += tf.cast(PositionalEncoding(length, p.model_dim), x.dtype)
    drop = f'{side}_dropout'
    return self.children[drop].FProp(theta[drop], x)

  def FProp(self, theta, batch: NestedMap) -> NestedMap:
    """Embeds a batch; see the class docstring for the keys."""
    p = self.params
    needed = (('src_ids', 'src_paddings', 'tgt_ids', 'tgt_labels',
               'tgt_paddings') if p.mode == 'seq2seq' else
              ('ids', 'labels', 'paddings'))
    missing = [k for k in needed if k not in batch]
    if missing:
      raise ValueError(f'{type(self).__name__} {p.name!r} (mode={p.mode!r}) '
                       f'needs batch keys {list(needed)}; missing {missing} '
                       f'in {sorted(batch)}')
    if p.mode == 'lm':
      return NestedMap(
          tgt_vecs=self._Embed(theta, 'tgt', batch.ids),
          tgt_paddings=tf.cast(batch.paddings, tf.float32),
          tgt_labels=tf.cast(batch.labels, tf.int32))
    return NestedMap(
        src_vecs=self._Embed(theta, 'src', batch.src_ids),
        src_paddings=tf.cast(batch.src_paddings, tf.float32),
        tgt_vecs=self._Embed(theta, 'tgt', batch.tgt_ids),
        tgt_paddings=tf.cast(batch.tgt_paddings, tf.float32),
        tgt_labels=tf.cast(batch.tgt_labels, tf.int32))

  @classmethod
  def FPropMeta(cls, p, batch_shapes):
    cls._Validate(p)
    name = f'{cls.__name__} {p.name!r}'
    if not isinstance(batch_shapes, dict):
      raise ValueError(f'{name}: input must be a NestedMap of shapes, got '
                       f'{batch_shapes!r}')
    shapes = NestedMap({k: base_layer.ToShape(v)
                        for k, v in batch_shapes.items()})
    sides = ([('tgt', 'ids', 'labels', 'paddings')] if p.mode == 'lm' else
             [('src', 'src_ids', None, 'src_paddings'),
              ('tgt', 'tgt_ids', 'tgt_labels', 'tgt_paddings')])
    out = NestedMap()
    flops = 0
    for side, ids_key, labels_key, pad_key in sides:
      for key in (ids_key, labels_key, pad_key):
        if key is not None and key not in shapes:
          raise ValueError(f'{name} (mode={p.mode!r}): batch key {key!r} '
                           f'missing in {sorted(shapes)}')
      ids = shapes[ids_key]
      if ids.rank != 2 or ids[1] is None or ids[1] > p.max_len:
        raise ValueError(f'{name}: {ids_key} shape {ids} must be [batch, '
                         f'length] with length <= max_len={p.max_len}')
      vecs = ids.concatenate([p.model_dim])
      # scale, add positions, dropout
      flops += (2 + (2 if p.dropout_prob > 0 else 0)) * (
          base_layer.NumElements(vecs))
      out[f'{side}_vecs'] = vecs
      out[f'{side}_paddings'] = shapes[pad_key]
      if labels_key is not None:
        out[f'{side}_labels'] = shapes[labels_key]
    num_params = sum(v * p.model_dim for _, v in cls._Tables(p))
    return base_layer.FPropMetaResult(flops, out, num_params)
