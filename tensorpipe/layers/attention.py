"""Multi-head dot-product attention with padding and causal masks.

Scaled dot-product attention of Vaswani et al. (2017), used for the
Transformer's self-attention (source = query) and encoder-decoder attention
(source = the encoder output). Masked positions get a large negative logit
before the softmax, so they receive (numerically) zero probability.
"""

import math
from typing import Optional

import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import checks
from tensorpipe import py_utils
from tensorpipe.layers import dropout
from tensorpipe.layers import linear

# Added to the logits of masked positions. Large but finite so that a query
# whose keys are all masked gets a uniform (not NaN) distribution.
_MASK_LOGIT = -1e9
# Approximate FLOPs per attention logit: scale, mask add, softmax (exp, sum,
# divide), i.e. ~5.
_SOFTMAX_FLOPS_PER_LOGIT = 5


def CausalMask(length: int, dtype=tf.float32) -> tf.Tensor:
  """[length, length] mask, 1.0 where key j > query i (the future)."""
  return 1.0 - tf.linalg.band_part(tf.ones([length, length], dtype), -1, 0)


class MultiHeadedAttention(base_layer.BaseLayer):
  """Multi-head attention: softmax(q k^T / sqrt(d_head) + mask) v.

  Usage:
    p = MultiHeadedAttention.Params().Set(name='atten', input_dim=512,
                                          num_heads=8)
    self_out = layer.FProp(theta, x, None, x_paddings)      # self-attention
    cross_out = layer.FProp(theta, y, enc_out, enc_paddings)  # cross

  FProp:
    q = query @ wq + bq;  k = source @ wk + bk;  v = source @ wv + bv
    split into num_heads heads of hidden_dim / num_heads
    logits = q k^T / sqrt(d_head) + MASK * (source_paddings | causal)
    probs = dropout(softmax(logits))
    out = concat_heads(probs v) @ wo + bo
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', None, 'Model dimension D: last axis of the query, '
             'the source and the output; required.')
    p.Define('num_heads', None, 'Number of attention heads A; must divide '
             'hidden_dim; required.')
    p.Define('hidden_dim', None, 'Total size of the q / k / v projections '
             '(A heads of hidden_dim / A); None means input_dim.')
    p.Define('causal', False, 'If True, query position i attends only to '
             'source positions j <= i (decoder self-attention); needs equal '
             'query and source lengths.')
    p.Define('use_bias', True, 'Whether the four projections have biases.')
    p.Define('atten_dropout_prob', 0.0, 'Dropout rate in [0, 1) on the '
             'attention probabilities (drawn per example, independent of how '
             'the batch is split).')
    return p

  @classmethod
  def _HiddenDim(cls, p) -> int:
    return p.input_dim if p.hidden_dim is None else p.hidden_dim

  @classmethod
  def _Validate(cls, p) -> None:
    checks.CheckPositiveInts(f'{cls.__name__} {p.name!r}',
                             input_dim=p.input_dim, num_heads=p.num_heads)
    hidden = cls._HiddenDim(p)
    if not checks.IsPositiveInt(hidden):
      raise ValueError(f'{cls.__name__} {p.name!r}: hidden_dim={hidden!r} '
                       'must be a positive int or None')
    if hidden % p.num_heads:
      raise ValueError(f'{cls.__name__} {p.name!r}: hidden_dim={hidden} is not '
                       f'divisible by num_heads={p.num_heads}; choose a '
                       'num_heads that divides it')
    if not 0.0 <= p.atten_dropout_prob < 1.0:
      raise ValueError(f'{cls.__name__} {p.name!r}: atten_dropout_prob='
                       f'{p.atten_dropout_prob!r} must be in [0, 1)')

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self._Validate(p)
    d, h = p.input_dim, self._HiddenDim(p)
    zeros = base_layer.WeightInit.Constant(0.0)
    for name, shape in (('wq', [d, h]), ('wk', [d, h]), ('wv', [d, h]),
                        ('wo', [h, d])):
      self.CreateVariable(name, base_layer.WeightParams(shape=shape))
    if p.use_bias:
      for name, size in (('bq', h), ('bk', h), ('bv', h), ('bo', d)):
        self.CreateVariable(name, base_layer.WeightParams(
            shape=[size], init=zeros))
    self.CreateChild('atten_dropout', dropout.DropoutLayer.Params().Set(
        keep_prob=1.0 - p.atten_dropout_prob))

  def _Project(self, theta, raw, x, w, b):
    """[b, l, d] @ [d, h] (+ bias) -> [b, l, h] via a 2-D matmul.

    The matmul is a `py_utils.WeightOp` on the uncast weight raw[w] (it
    casts the weight itself), so the zero-bubble schedules defer its weight
    gradient to their W cells; the bias comes from the cast theta.
    """
    shape = x.shape
    y = py_utils.WeightOp(linear.MatMul, tf.reshape(x, [-1, shape[-1]]),
                          raw[w])
    if self.params.use_bias:
      y += theta[b]
    return tf.reshape(y, tf.concat([tf.shape(x)[:-1], tf.shape(y)[-1:]], 0))

  def _SplitHeads(self, x):
    """[b, l, h] -> [b, A, l, h / A]."""
    p = self.params
    dh = self._HiddenDim(p) // p.num_heads
    b, l = tf.shape(x)[0], tf.shape(x)[1]
    return tf.transpose(tf.reshape(x, [b, l, p.num_heads, dh]), [0, 2, 1, 3])

  def FProp(self, theta, query: tf.Tensor, source: Optional[tf.Tensor] = None,
            source_paddings: Optional[tf.Tensor] = None) -> tf.Tensor:
    """Attends from `query` to `source`.

    Args:
      theta: NestedMap of wq, wk, wv, wo [, bq, bk, bv, bo].
      query: [batch, query_len, input_dim].
      source: [batch, source_len, input_dim]; None means `query`
        (self-attention).
      source_paddings: optional [batch, source_len] float, 1.0 at padded
        source positions (never attended to).

    Returns:
      [batch, query_len, input_dim] in fprop_dtype.
    """
    p = self.params
    source_shape = None if source is None else source.shape
    paddings_shape = (None if source_paddings is None else
                      source_paddings.shape)
    self._CheckShapes(p, query.shape, source_shape, paddings_shape)
    raw = theta
    theta = self.CastTheta(theta)
    dtype = self.fprop_dtype
    query = tf.cast(query, dtype)
    source = query if source is None else tf.cast(source, dtype)
    dh = self._HiddenDim(p) // p.num_heads
    q = self._SplitHeads(self._Project(theta, raw, query, 'wq', 'bq'))
    k = self._SplitHeads(self._Project(theta, raw, source, 'wk', 'bk'))
    v = self._SplitHeads(self._Project(theta, raw, source, 'wv', 'bv'))
    # Logits and softmax in float32 (also for bfloat16 activations), in
    # float64 for a float64 model (py_utils.AccumulationDtype).
    acc = py_utils.AccumulationDtype(dtype)
    logits = tf.matmul(tf.cast(q, acc), tf.cast(k, acc),
                       transpose_b=True) / math.sqrt(dh)  # [b, A, lq, lk]
    mask = None
    if source_paddings is not None:
      mask = tf.cast(source_paddings, acc)[:, tf.newaxis, tf.newaxis, :]
    if p.causal:
      causal = CausalMask(query.shape[1], acc)[tf.newaxis, tf.newaxis]
      mask = causal if mask is None else tf.maximum(mask, causal)
    if mask is not None:
      logits += mask * _MASK_LOGIT
    probs = tf.nn.softmax(logits, axis=-1)
    probs = self.children.atten_dropout.FProp(theta.atten_dropout, probs)
    ctx = tf.matmul(tf.cast(probs, dtype), v)  # [b, A, lq, dh]
    ctx = tf.transpose(ctx, [0, 2, 1, 3])
    ctx = tf.reshape(ctx, tf.concat([tf.shape(ctx)[:2],
                                     [self._HiddenDim(p)]], 0))
    out = self._Project(theta, raw, ctx, 'wo', 'bo')
    out.set_shape(query.shape)
    return out

  @classmethod
  def _CheckShapes(cls, p, q_shape, src_shape, paddings_shape):
    q = base_layer.ToShape(q_shape)
    name = f'{cls.__name__} {p.name!r}'
    if q.rank != 3 or q[-1] != p.input_dim:
      raise ValueError(f'{name}: query shape {q} must be [batch, length, '
                       f'{p.input_dim}] (input_dim={p.input_dim})')
    s = q if src_shape is None else base_layer.ToShape(src_shape)
    if s.rank != 3 or s[-1] != p.input_dim or (
        s[0] is not None and q[0] is not None and s[0] != q[0]):
      raise ValueError(f'{name}: source shape {s} must be [{q[0]}, length, '
                       f'{p.input_dim}] for query shape {q}')
    if p.causal and src_shape is not None and s[1] != q[1]:
      raise ValueError(f'{name}: causal=True needs source length == query '
                       f'length, got {s[1]} vs {q[1]}; use causal=False for '
                       'cross-attention')
    if paddings_shape is not None:
      pad = base_layer.ToShape(paddings_shape)
      if not pad.is_compatible_with(s[:2]):
        raise ValueError(f'{name}: source_paddings shape {pad} must be '
                         f'[batch, source_len] = {s[:2]}')
    return q, s

  @classmethod
  def FPropMeta(cls, p, query_shape, source_shape=None, paddings_shape=None):
    """FLOPs: 4 projections, q k^T, probs v and the softmax."""
    cls._Validate(p)
    q, s = cls._CheckShapes(p, query_shape, source_shape, paddings_shape)
    b, lq, lk = q[0], q[1], s[1]
    for dim in (b, lq, lk):
      if dim is None:
        raise ValueError(f'{cls.__name__} {p.name!r}: FPropMeta needs static '
                         f'shapes, got query {q} and source {s}')
    d, h = p.input_dim, cls._HiddenDim(p)
    flops = 2 * b * lq * d * h * 2 + 2 * b * lk * d * h * 2  # q, o; k, v
    flops += 2 * 2 * b * lq * lk * h  # logits and context
    flops += _SOFTMAX_FLOPS_PER_LOGIT * b * p.num_heads * lq * lk
    if p.atten_dropout_prob > 0:
      flops += 2 * b * p.num_heads * lq * lk
    num_params = 4 * d * h
    if p.use_bias:
      flops += b * lq * (h + d) + 2 * b * lk * h  # biases of q, o and k, v
      num_params += 3 * h + d
    return base_layer.FPropMetaResult(flops, q, num_params)
