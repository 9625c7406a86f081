"""Transformer encoder / decoder layers and the sequence softmax (loss) layer.

The layers of Vaswani et al. (2017) shaped for GPipe (Huang et al. 2018): each
encoder or decoder layer takes and returns one NestedMap, so a Transformer is
a flat list of layers that `TensorPipeLayer` can cut at any boundary, and the
encoder output (`src_vecs`) travels with the decoder input (`tgt_vecs`) through
the decoder partitions. Keys of the NestedMap (made by
`embedding.TransformerEmbeddingLayer`):

  src_vecs [b, Ls, D], src_paddings [b, Ls]     (translation only)
  tgt_vecs [b, Lt, D], tgt_paddings [b, Lt], tgt_labels [b, Lt] int32

Each sub-layer (attention, feed-forward) is residual, in one of two orders:

  post-LN (the original):  x = LN(x + dropout(F(x)))
  pre-LN:                  x = x + dropout(F(LN(x)))   (+ a final LN at the end
                                                        of the stack)

Dropout uses `DropoutLayer`: masks are drawn per example, so they do not
depend on the number of partitions K or micro-batches T.
"""

import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import checks
from tensorpipe import py_utils
from tensorpipe.layers import attention
from tensorpipe.layers import dropout
from tensorpipe.layers import linear
from tensorpipe.layers import losses
from tensorpipe.layers import normalization
from tensorpipe.nested_map import NestedMap

# FLOPs per element of a residual add.
_ADD_FLOPS = 1


def _CheckProb(name: str, key: str, value) -> None:
  if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
    raise ValueError(f'{name}: {key}={value!r} must be a dropout rate in '
                     '[0, 1)')


def _DropoutMeta(prob: float, shape) -> float:
  return 2 * base_layer.NumElements(shape) if prob > 0 else 0


class _ResidualBlock(base_layer.BaseLayer):
  """Shared Params and the pre-/post-LN residual wiring of a sub-layer."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('model_dim', None, 'Model dimension D; required.')
    p.Define('pre_layer_norm', False, 'True: x + dropout(F(LN(x))) (pre-LN); '
             'False: LN(x + dropout(F(x))) (post-LN, the original).')
    p.Define('residual_dropout_prob', 0.0, 'Dropout rate on F(x) before the '
             'residual add.')
    return p

  def _CreateResidual(self):
    p = self.params
    self.CreateChild('ln', normalization.LayerNormLayer.Params().Set(
        dim=p.model_dim))
    self.CreateChild('residual_dropout', dropout.DropoutLayer.Params().Set(
        keep_prob=1.0 - p.residual_dropout_prob))

  def _Residual(self, theta, x, fn):
    """Applies fn in the configured residual order."""
    p = self.params
    ln = self.children.ln
    drop = self.children.residual_dropout
    if p.pre_layer_norm:
      y = fn(ln.FProp(theta.ln, x))
      return x + drop.FProp(theta.residual_dropout, y)
    y = drop.FProp(theta.residual_dropout, fn(x))
    return ln.FProp(theta.ln, x + y)

  @classmethod
  def _ResidualMeta(cls, p, x_shape):
    """FLOPs and params of LN, dropout and add for an input of x_shape."""
    ln = normalization.LayerNormLayer.FPropMeta(
        normalization.LayerNormLayer.Params().Set(dim=p.model_dim), x_shape)
    flops = ln.flops + _DropoutMeta(p.residual_dropout_prob, x_shape)
    flops += _ADD_FLOPS * base_layer.NumElements(x_shape)
    return flops, ln.num_params


class TransformerAttentionBlock(_ResidualBlock):
  """Residual multi-head attention: [b, Lq, D] -> [b, Lq, D].

  Usage:
    p = TransformerAttentionBlock.Params().Set(name='self_atten',
        model_dim=512, num_heads=8, causal=True)
    y = layer.FProp(theta, x, None, x_paddings)        # self-attention
    y = layer.FProp(theta, x, memory, memory_paddings)  # cross-attention

  In cross-attention (source given) only the query is layer-normalised.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('num_heads', None, 'Number of attention heads A; required.')
    p.Define('head_dim', None, 'Dimension of each head: the q / k / v width '
             'is num_heads * head_dim. None means model_dim / num_heads '
             '(width model_dim).')
    p.Define('causal', False, 'Mask future positions (decoder self-attention).')
    p.Define('atten_dropout_prob', 0.0, 'Dropout rate on attention '
             'probabilities.')
    return p

  @classmethod
  def _AttenParams(cls, p):
    if p.head_dim is not None and not checks.IsPositiveInt(p.head_dim):
      raise ValueError(f'{cls.__name__} {p.name!r}: head_dim={p.head_dim!r} '
                       'must be a positive int, or None for model_dim / '
                       'num_heads')
    width = None if p.head_dim is None else p.num_heads * p.head_dim
    return attention.MultiHeadedAttention.Params().Set(
        name='atten', input_dim=p.model_dim, num_heads=p.num_heads,
        hidden_dim=width, causal=p.causal,
        atten_dropout_prob=p.atten_dropout_prob)

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    _CheckProb(f'{type(self).__name__} {p.name!r}', 'residual_dropout_prob',
               p.residual_dropout_prob)
    self.CreateChild('atten', self._AttenParams(p))
    self._CreateResidual()

  def FProp(self, theta, x, source=None, source_paddings=None):
    """x: [b, Lq, D]; source: [b, Lk, D] or None; paddings [b, Lk] or None."""
    atten = self.children.atten
    return self._Residual(
        theta, x, lambda q: atten.FProp(theta.atten, q, source,
                                        source_paddings))

  @classmethod
  def FPropMeta(cls, p, x_shape, source_shape=None, paddings_shape=None):
    _CheckProb(f'{cls.__name__} {p.name!r}', 'residual_dropout_prob',
               p.residual_dropout_prob)
    ap = cls._AttenParams(p)
    meta = ap.cls.FPropMeta(ap, x_shape, source_shape, paddings_shape)
    flops, params = cls._ResidualMeta(p, x_shape)
    return base_layer.FPropMetaResult(meta.flops + flops, meta.out_shapes,
                                      meta.num_params + params)


class TransformerFeedForwardBlock(_ResidualBlock):
  """Residual feed-forward: x + W2 dropout(relu(W1 x + b1)) + b2.

  Usage:
    p = TransformerFeedForwardBlock.Params().Set(name='ff', model_dim=512,
                                                 hidden_dim=2048)
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('hidden_dim', None, 'Feed-forward hidden size H; required.')
    p.Define('relu_dropout_prob', 0.0, 'Dropout rate after the ReLU.')
    return p

  @classmethod
  def _FcParams(cls, p):
    fc = linear.FCLayer.Params
    return (fc().Set(name='fc1', input_dim=p.model_dim,
                     output_dim=p.hidden_dim, activation='RELU'),
            fc().Set(name='fc2', input_dim=p.hidden_dim,
                     output_dim=p.model_dim, activation='NONE'))

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    name = f'{type(self).__name__} {p.name!r}'
    _CheckProb(name, 'residual_dropout_prob', p.residual_dropout_prob)
    _CheckProb(name, 'relu_dropout_prob', p.relu_dropout_prob)
    fc1, fc2 = self._FcParams(p)
    self.CreateChild('fc1', fc1)
    self.CreateChild('relu_dropout', dropout.DropoutLayer.Params().Set(
        keep_prob=1.0 - p.relu_dropout_prob))
    self.CreateChild('fc2', fc2)
    self._CreateResidual()

  def FProp(self, theta, x):
    """x: [b, L, D] -> [b, L, D]."""
    c = self.children

    def Fn(h):
      h = c.fc1.FProp(theta.fc1, h)
      h = c.relu_dropout.FProp(theta.relu_dropout, h)
      return c.fc2.FProp(theta.fc2, h)
    return self._Residual(theta, x, Fn)

  @classmethod
  def FPropMeta(cls, p, x_shape):
    name = f'{cls.__name__} {p.name!r}'
    _CheckProb(name, 'residual_dropout_prob', p.residual_dropout_prob)
    _CheckProb(name, 'relu_dropout_prob', p.relu_dropout_prob)
    fc1, fc2 = cls._FcParams(p)
    m1 = fc1.cls.FPropMeta(fc1, x_shape)
    hidden = m1.out_shapes[0]
    m2 = fc2.cls.FPropMeta(fc2, hidden)
    flops, params = cls._ResidualMeta(p, x_shape)
    flops += m1.flops + m2.flops + _DropoutMeta(p.relu_dropout_prob, hidden)
    return base_layer.FPropMetaResult(flops, m2.out_shapes,
                                      m1.num_params + m2.num_params + params)


class _TransformerLayerBase(base_layer.BaseLayer):
  """Params shared by the encoder and decoder layers."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('model_dim', None, 'Model dimension D; required.')
    p.Define('hidden_dim', None, 'Feed-forward hidden size H; required.')
    p.Define('num_heads', None, 'Attention heads A; must divide model_dim '
             'unless head_dim is set.')
    p.Define('head_dim', None, 'Dimension of each attention head (width '
             'num_heads * head_dim); None means model_dim / num_heads.')
    p.Define('pre_layer_norm', False, 'Pre-LN residual order (see the module '
             'docstring); False is the original post-LN.')
    p.Define('final_layer_norm', False, 'Apply a LayerNorm to the output '
             '(set on the last layer of a pre-LN stack).')
    p.Define('residual_dropout_prob', 0.0, 'Dropout rate on each sub-layer '
             'output before the residual add.')
    p.Define('atten_dropout_prob', 0.0, 'Dropout rate on attention '
             'probabilities.')
    p.Define('relu_dropout_prob', 0.0, 'Dropout rate inside the feed-forward '
             'block, after the ReLU.')
    return p

  @classmethod
  def _BlockParams(cls, p, causal_self: bool, cross: bool):
    """[(child name, block Params)] in application order."""
    common = dict(model_dim=p.model_dim, pre_layer_norm=p.pre_layer_norm,
                  residual_dropout_prob=p.residual_dropout_prob)
    atten = TransformerAttentionBlock.Params
    blocks = [('self_atten', atten().Set(
        name='self_atten', num_heads=p.num_heads, head_dim=p.head_dim,
        causal=causal_self,
        atten_dropout_prob=p.atten_dropout_prob, **common))]
    if cross:
      blocks.append(('cross_atten', atten().Set(
          name='cross_atten', num_heads=p.num_heads, head_dim=p.head_dim,
          atten_dropout_prob=p.atten_dropout_prob, **common)))
    blocks.append(('ff', TransformerFeedForwardBlock.Params().Set(
        name='ff', hidden_dim=p.hidden_dim,
        relu_dropout_prob=p.relu_dropout_prob, **common)))
    return blocks

  def _Create(self, causal_self, cross):
    p = self.params
    for name, bp in self._BlockParams(p, causal_self, cross):
      self.CreateChild(name, bp)
    if p.final_layer_norm:
      self.CreateChild('final_ln', normalization.LayerNormLayer.Params().Set(
          dim=p.model_dim))

  def _Final(self, theta, x):
    if self.params.final_layer_norm:
      return self.children.final_ln.FProp(theta.final_ln, x)
    return x

  @classmethod
  def _CheckKeys(cls, p, nm, keys):
    if not isinstance(nm, dict):
      raise ValueError(f'{cls.__name__} {p.name!r}: input must be the '
                       f'NestedMap of a Transformer, got {nm!r}')
    missing = [k for k in keys if k not in nm]
    if missing:
      raise ValueError(f'{cls.__name__} {p.name!r}: input NestedMap lacks '
                       f'{missing} (has {sorted(nm)}); put a '
                       'TransformerEmbeddingLayer (mode=seq2seq for an '
                       'encoder or cross-attention) first')

  @classmethod
  def _Meta(cls, p, nm, key, causal_self, cross):
    """FPropMeta over the blocks, transforming nm[key]."""
    cls._CheckKeys(p, nm, [key, key.replace('vecs', 'paddings')] + (
        ['src_vecs', 'src_paddings'] if cross else []))
    x = base_layer.ToShape(nm[key])
    pad = base_layer.ToShape(nm[key.replace('vecs', 'paddings')])
    flops, params = 0, 0
    for name, bp in cls._BlockParams(p, causal_self, cross):
      if name == 'self_atten':
        m = bp.cls.FPropMeta(bp, x, None, pad)
      elif name == 'cross_atten':
        m = bp.cls.FPropMeta(bp, x, base_layer.ToShape(nm.src_vecs),
                             base_layer.ToShape(nm.src_paddings))
      else:
        m = bp.cls.FPropMeta(bp, x)
      flops += m.flops
      params += m.num_params
    if p.final_layer_norm:
      m = normalization.LayerNormLayer.FPropMeta(
          normalization.LayerNormLayer.Params().Set(dim=p.model_dim), x)
      flops += m.flops
      params += m.num_params
    out = NestedMap({k: base_layer.ToShape(v) for k, v in nm.items()})
    out[key] = x
    return base_layer.FPropMetaResult(flops, out, params)


class TransformerEncoderLayer(_TransformerLayerBase):
  """One encoder layer: self-attention + feed-forward on nm.src_vecs.

  Usage:
    p = TransformerEncoderLayer.Params().Set(name='enc0', model_dim=512,
        hidden_dim=2048, num_heads=8)
    nm = layer.FProp(theta, nm)   # nm.src_vecs replaced, other keys passed on
  """

  def __init__(self, params):
    super().__init__(params)
    self._Create(causal_self=False, cross=False)

  def FProp(self, theta, nm: NestedMap) -> NestedMap:
    self._CheckKeys(self.params, nm, ['src_vecs', 'src_paddings'])
    c = self.children
    x = c.self_atten.FProp(theta.self_atten, nm.src_vecs, None,
                           nm.src_paddings)
    x = c.ff.FProp(theta.ff, x)
    out = NestedMap(nm)
    out.src_vecs = self._Final(theta, x)
    return out

  @classmethod
  def FPropMeta(cls, p, nm):
    return cls._Meta(p, nm, 'src_vecs', causal_self=False, cross=False)


class TransformerDecoderLayer(_TransformerLayerBase):
  """One decoder layer: causal self-attention [+ cross-attention] + FF.

  Usage:
    p = TransformerDecoderLayer.Params().Set(name='dec0', model_dim=512,
        hidden_dim=2048, num_heads=8)
    nm = layer.FProp(theta, nm)   # nm.tgt_vecs replaced

  With has_cross_attention (translation) the decoder attends to nm.src_vecs
  (the encoder output) masked by nm.src_paddings; without it (language model)
  it is a decoder-only layer.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('has_cross_attention', True, 'Attend to the encoder output '
             'src_vecs (False for a decoder-only language model).')
    return p

  def __init__(self, params):
    super().__init__(params)
    self._Create(causal_self=True, cross=self.params.has_cross_attention)

  def FProp(self, theta, nm: NestedMap) -> NestedMap:
    p = self.params
    keys = ['tgt_vecs', 'tgt_paddings']
    if p.has_cross_attention:
      keys += ['src_vecs', 'src_paddings']
    self._CheckKeys(p, nm, keys)
    c = self.children
    x = c.self_atten.FProp(theta.self_atten, nm.tgt_vecs, None,
                           nm.tgt_paddings)
    if p.has_cross_attention:
      x = c.cross_atten.FProp(theta.cross_atten, x, nm.src_vecs,
                              nm.src_paddings)
    x = c.ff.FProp(theta.ff, x)
    out = NestedMap(nm)
    out.tgt_vecs = self._Final(theta, x)
    return out

  @classmethod
  def FPropMeta(cls, p, nm):
    return cls._Meta(p, nm, 'tgt_vecs', causal_self=True,
                     cross=p.has_cross_attention)


class SequenceSoftmaxLayer(base_layer.BaseLayer):
  """Output projection + label-smoothed cross-entropy over real tokens.

  The last layer of a Transformer. It computes the loss inside the pipeline
  so that the [b, L, V] logits never cross a partition boundary or get
  merged over micro-batches; it returns per-example sums, which merge by
  concatenation.

  Usage:
    p = SequenceSoftmaxLayer.Params().Set(name='softmax', input_dim=512,
                                          vocab_size=32000)
    out = layer.FProp(theta, nm)
    mean_loss = sum(out.per_example_loss) / max(sum(out.per_example_tokens), 1)

  Output NestedMap ([b] = examples of the batch), each float32 (float64 in
  a float64 model, as are the loss's logits and token weights:
  py_utils.AccumulationDtype):
    per_example_loss [b]: sum over real target tokens of the label-smoothed
      cross-entropy.
    per_example_log_pplx [b]: the same without label smoothing (the
      negative log-likelihood behind perplexity; per_example_loss itself
      when label_smoothing is 0).
    per_example_tokens [b]: number of real (unpadded) tokens.
    per_example_correct [b]: real tokens whose argmax is the label.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', None, 'Model dimension D; required.')
    p.Define('vocab_size', None, 'Output vocabulary V; required.')
    p.Define('label_smoothing', 0.1, 'Smoothing s in [0, 1): targets are '
             '(1 - s) * one_hot + s / V.')
    p.Define('input_key', 'tgt_vecs', 'NestedMap key of the decoder output.')
    p.Define('tied_embedding', None, 'Path below the pipeline of the '
             'embedding table [vocab_size, input_dim] to reuse, transposed, '
             "as the output projection (an LM's 'emb/tgt_emb/emb'): logits "
             '= x @ table^T, no bias, no weights of its own (the pipeline '
             'passes the table in theta.tied_emb, tied_weights.py). None: '
             'its own projection [input_dim, vocab_size] and bias.')
    return p

  @classmethod
  def _Validate(cls, p) -> None:
    checks.CheckPositiveInts(f'{cls.__name__} {p.name!r}',
                             input_dim=p.input_dim, vocab_size=p.vocab_size)
    if p.tied_embedding is not None and not (
        isinstance(p.tied_embedding, str) and p.tied_embedding):
      raise ValueError(f'{cls.__name__} {p.name!r}: tied_embedding='
                       f'{p.tied_embedding!r} must be a variable path such '
                       "as 'emb/tgt_emb/emb', or None")
    if not 0.0 <= p.label_smoothing < 1.0:
      raise ValueError(f'{cls.__name__} {p.name!r}: label_smoothing='
                       f'{p.label_smoothing!r} must be in [0, 1)')

  @classmethod
  def _FcParams(cls, p):
    return linear.FCLayer.Params().Set(
        name='logits', input_dim=p.input_dim, output_dim=p.vocab_size,
        activation='NONE')

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self._Validate(p)
    if p.tied_embedding is None:
      self.CreateChild('logits', self._FcParams(p))

  def TiedWeights(self):
    p = self.params
    return {} if p.tied_embedding is None else {'tied_emb': p.tied_embedding}

  def _CheckInput(self, nm: NestedMap, keys) -> None:
    for key in keys:
      if key not in nm:
        raise ValueError(f'{type(self).__name__} {self.params.name!r}: input '
                         f'lacks {key!r} (has {sorted(nm)})')

  def Logits(self, theta: NestedMap, nm: NestedMap) -> tf.Tensor:
    """The output projection alone: logits [b, L, V] of nm[input_key].

    For decoding and scoring, where the loss FProp computes is not wanted
    (nm needs no labels).
    """
    p = self.params
    self._CheckInput(nm, [p.input_key])
    x = nm[p.input_key]
    if p.tied_embedding is None:
      return self.children.logits.FProp(theta.logits, x)
    x = tf.cast(x, self.fprop_dtype)
    rows = tf.reshape(x, [-1, p.input_dim])
    # A weight op (py_utils.WeightOp): zero-bubble schedules defer its dw.
    y = py_utils.WeightOp(_TiedLogits, rows, theta.tied_emb)
    y = tf.reshape(y, tf.concat([tf.shape(x)[:-1], [p.vocab_size]], 0))
    y.set_shape(x.shape[:-1].concatenate([p.vocab_size]))
    return y

  def FProp(self, theta, nm: NestedMap) -> NestedMap:
    """nm: NestedMap with input_key [b, L, D], tgt_labels, tgt_paddings."""
    p = self.params
    self._CheckInput(nm, [p.input_key, 'tgt_labels', 'tgt_paddings'])
    logits = self.Logits(theta, nm)
    acc = py_utils.AccumulationDtype(logits.dtype)
    labels = tf.cast(nm.tgt_labels, tf.int32)
    weights = 1.0 - tf.cast(nm.tgt_paddings, acc)
    xent = losses.SoftmaxCrossEntropyLoss(logits, labels, p.label_smoothing,
                                          p.vocab_size)  # [b, L] in acc
    correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32),
                               labels), acc)
    loss = tf.reduce_sum(xent * weights, axis=1)
    log_pplx = loss
    if p.label_smoothing:
      # A metric only: no gradient flows through it.
      plain = losses.SoftmaxCrossEntropyLoss(tf.stop_gradient(logits), labels,
                                             0.0, p.vocab_size)
      log_pplx = tf.reduce_sum(plain * weights, axis=1)
    return NestedMap(
        per_example_loss=loss,
        per_example_log_pplx=log_pplx,
        per_example_tokens=tf.reduce_sum(weights, axis=1),
        per_example_correct=tf.reduce_sum(correct * weights, axis=1))

  @classmethod
  def FPropMeta(cls, p, nm):
    cls._Validate(p)
    if not isinstance(nm, dict) or p.input_key not in nm:
      raise ValueError(f'{cls.__name__} {p.name!r}: input must be a NestedMap '
                       f'with {p.input_key!r}, got {nm!r}')
    x = base_layer.ToShape(nm[p.input_key])
    fc = cls._FcParams(p)
    m = fc.cls.FPropMeta(fc, x)
    logits = m.out_shapes[0]
    num_params = m.num_params if p.tied_embedding is None else 0
    # softmax cross-entropy (~5 per logit), argmax (1 per logit)
    flops = m.flops + 6 * base_layer.NumElements(logits)
    b = tf.TensorShape([x[0]])
    out = NestedMap(per_example_loss=b, per_example_log_pplx=b,
                    per_example_tokens=b, per_example_correct=b)
    return base_layer.FPropMetaResult(flops, out, num_params)


def _TiedLogits(x: tf.Tensor, table: tf.Tensor) -> tf.Tensor:
  """A tied softmax's weight op: x [rows, d] @ table [V, d]^T, the table
  cast to x's dtype by the op itself."""
  return tf.matmul(x, tf.cast(table, x.dtype), transpose_b=True)


def MeanTokenLoss(out: NestedMap) -> tf.Tensor:
  """Mean loss over real tokens from a SequenceSoftmaxLayer output."""
  return tf.reduce_sum(out.per_example_loss) / tf.maximum(
      tf.reduce_sum(out.per_example_tokens), 1.0)
