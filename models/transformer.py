"""Transformer T(L, H, A) for translation and a decoder-only language model.

GPipe's notation (Huang et al. 2018, section 4): T(L, H, A) has L encoder and
L decoder layers, feed-forward hidden size H and A attention heads; the model
dimension D is a separate value (1024 for the paper's Transformer-Big family).
The model is a flat list of layer Params, so `TensorPipeLayer` can cut it at
any layer boundary:

  layer 0                 TransformerEmbeddingLayer (source + target tables)
  layers 1 .. L           TransformerEncoderLayer   (transform src_vecs)
  layers L+1 .. 2L        TransformerDecoderLayer   (transform tgt_vecs,
                                                     attend to src_vecs)
  layer 2L+1              SequenceSoftmaxLayer      (label-smoothed loss)

The embeddings are in the first partition and the softmax in the last; the
encoder output travels in the NestedMap with the decoder's input through the
decoder partitions. The input is a NestedMap batch (src_ids, src_paddings,
tgt_ids, tgt_labels, tgt_paddings; tensorpipe/base_input.py); the output is
NestedMap(per_example_loss, per_example_log_pplx, per_example_tokens,
per_example_correct), each [batch], so the mean loss over real tokens is
`MeanTokenLoss(out)`.

Shared embeddings share the source and target tables. The translation
model's softmax has its own weights. The LM's can reuse its embedding table
(`tied_embeddings=True`, as GPT-2): logits = x @ table^T. The table then
lives in the first partition and is read by the last; the pipeline copies
it to the last partition's device each step and adds that partition's
gradient to the first's (tensorpipe/tied_weights.py), and checkpoints hold
it once.

Attention width. By default each of the A heads has model_dim / A dimensions
(width D, Vaswani et al.); `head_dim` decouples the two (width A x head_dim,
as Lingvo's GPipe Transformer does with its `atten_hidden_dim`). The paper's
sizes (`PAPER_TRANSFORMERS`, `PaperTransformerLayers`) use 64-dimensional
heads at D = 1024 with a 64k vocabulary, shared source / target embedding and
a separate softmax: only that reading reproduces the paper's table (400M,
1.3B, 1.3B, 6B); with width D, T(12, 16384, 32) would have 1.09B parameters
and T(64, 16384, 32) 5.24B.
"""

import dataclasses
from typing import Dict, List, Optional

import tensorflow as tf

from tensorpipe import checks
from tensorpipe import hyperparams
from tensorpipe import pipeline
from tensorpipe.layers import embedding
from tensorpipe.layers import transformer

MeanTokenLoss = transformer.MeanTokenLoss


def _CheckArgs(num_layers, hidden_dim, num_heads, model_dim, vocab_size,
               head_dim=None):
  checks.CheckPositiveInts('', num_layers=num_layers, hidden_dim=hidden_dim,
                           num_heads=num_heads, model_dim=model_dim,
                           vocab_size=vocab_size)
  if head_dim is not None:
    if not checks.IsPositiveInt(head_dim):
      raise ValueError(f'head_dim={head_dim!r} must be a positive int, or '
                       'None for model_dim / num_heads')
  elif model_dim % num_heads:
    raise ValueError(f'model_dim={model_dim} is not divisible by num_heads='
                     f'{num_heads}; choose num_heads dividing model_dim, or '
                     'set head_dim')


def _Stack(prefix, cls, num_layers, pre_layer_norm, **kwargs):
  layers = []
  for i in range(num_layers):
    layers.append(cls.Params().Set(
        name=f'{prefix}{i}', pre_layer_norm=pre_layer_norm,
        final_layer_norm=pre_layer_norm and i == num_layers - 1, **kwargs))
  return layers


def TransformerLayers(num_layers: int = 6,
                      hidden_dim: int = 4096,
                      num_heads: int = 16,
                      model_dim: int = 1024,
                      vocab_size: int = 32000,
                      max_len: int = 1024,
                      pre_layer_norm: bool = False,
                      shared_embeddings: bool = True,
                      label_smoothing: float = 0.1,
                      dropout: float = 0.1,
                      atten_dropout: float = 0.0,
                      relu_dropout: float = 0.0,
                      src_vocab_size: Optional[int] = None,
                      head_dim: Optional[int] = None
                      ) -> List[hyperparams.Params]:
  """Layer Params of T(L=num_layers, H=hidden_dim, A=num_heads).

  Args:
    num_layers: L, encoder layers (and as many decoder layers).
    hidden_dim: H, feed-forward hidden size.
    num_heads: A, attention heads (must divide model_dim unless head_dim).
    model_dim: D, model dimension (1024 for Transformer-Big).
    vocab_size: target vocabulary (and source unless src_vocab_size).
    max_len: longest source / target sequence.
    pre_layer_norm: pre-LN residuals (with a final LN after each stack)
      instead of the original post-LN.
    shared_embeddings: one embedding table for source and target.
    label_smoothing: label smoothing of the loss.
    dropout: residual dropout rate (also on the embeddings).
    atten_dropout: dropout rate on attention probabilities.
    relu_dropout: dropout rate inside the feed-forward blocks.
    src_vocab_size: source vocabulary for separate embeddings; None means
      vocab_size.
    head_dim: dimension of each attention head (attention width num_heads *
      head_dim); None means model_dim / num_heads.

  Returns:
    2 * num_layers + 2 layer Params (see the module docstring).
  """
  _CheckArgs(num_layers, hidden_dim, num_heads, model_dim, vocab_size,
             head_dim)
  common = dict(model_dim=model_dim, hidden_dim=hidden_dim,
                num_heads=num_heads, head_dim=head_dim,
                residual_dropout_prob=dropout,
                atten_dropout_prob=atten_dropout,
                relu_dropout_prob=relu_dropout)
  layers = [embedding.TransformerEmbeddingLayer.Params().Set(
      name='emb', vocab_size=vocab_size, src_vocab_size=src_vocab_size,
      model_dim=model_dim, mode='seq2seq',
      shared_embeddings=shared_embeddings, max_len=max_len,
      dropout_prob=dropout)]
  layers += _Stack('enc', transformer.TransformerEncoderLayer, num_layers,
                   pre_layer_norm, **common)
  layers += _Stack('dec', transformer.TransformerDecoderLayer, num_layers,
                   pre_layer_norm, has_cross_attention=True, **common)
  layers.append(transformer.SequenceSoftmaxLayer.Params().Set(
      name='softmax', input_dim=model_dim, vocab_size=vocab_size,
      label_smoothing=label_smoothing))
  return layers


def TransformerLmLayers(num_layers: int = 6,
                        hidden_dim: int = 2048,
                        num_heads: int = 8,
                        model_dim: int = 512,
                        vocab_size: int = 32000,
                        max_len: int = 1024,
                        pre_layer_norm: bool = True,
                        label_smoothing: float = 0.0,
                        dropout: float = 0.1,
                        atten_dropout: float = 0.0,
                        relu_dropout: float = 0.0,
                        head_dim: Optional[int] = None,
                        tied_embeddings: bool = False
                        ) -> List[hyperparams.Params]:
  """Layer Params of a decoder-only language model.

  Input NestedMap: ids [b, L], labels [b, L], paddings [b, L]; output as for
  TransformerLayers. Layers: embedding, num_layers decoder layers without
  cross-attention, softmax (num_layers + 2 in all). head_dim as for
  TransformerLayers. tied_embeddings: the softmax projects with the
  embedding table (transposed), one variable (`LM_TIED_TABLE`).
  """
  _CheckArgs(num_layers, hidden_dim, num_heads, model_dim, vocab_size,
             head_dim)
  layers = [embedding.TransformerEmbeddingLayer.Params().Set(
      name='emb', vocab_size=vocab_size, model_dim=model_dim, mode='lm',
      max_len=max_len, dropout_prob=dropout)]
  layers += _Stack('dec', transformer.TransformerDecoderLayer, num_layers,
                   pre_layer_norm, has_cross_attention=False,
                   model_dim=model_dim, hidden_dim=hidden_dim,
                   num_heads=num_heads, head_dim=head_dim,
                   residual_dropout_prob=dropout,
                   atten_dropout_prob=atten_dropout,
                   relu_dropout_prob=relu_dropout)
  layers.append(transformer.SequenceSoftmaxLayer.Params().Set(
      name='softmax', input_dim=model_dim, vocab_size=vocab_size,
      label_smoothing=label_smoothing,
      tied_embedding=LM_TIED_TABLE if tied_embeddings else None))
  return layers


# The LM's token table (layer 'emb', child 'tgt_emb', variable 'emb'), the
# path a tied softmax names.
LM_TIED_TABLE = 'emb/tgt_emb/emb'


@dataclasses.dataclass(frozen=True)
class PaperTransformer:
  """One row of the paper's Transformer table (Huang et al. 2018, section 5).

  T(L, H, A) at model dimension 1024 and a 64k wordpiece vocabulary;
  `paper_params` is the count the paper gives (rounded there).
  """
  num_layers: int      # L
  hidden_dim: int      # H
  num_heads: int       # A
  paper_params: float

  @property
  def name(self) -> str:
    return f'T({self.num_layers}, {self.hidden_dim}, {self.num_heads})'


# The paper's sizes, keyed by name. T(12, 16384, 32) and T(24, 8192, 16) are
# both "1.3B" there; with 64-dimensional heads they are equal here too.
PAPER_TRANSFORMERS: Dict[str, PaperTransformer] = {
    t.name: t for t in (
        PaperTransformer(6, 8192, 16, 400e6),
        PaperTransformer(12, 16384, 32, 1.3e9),
        PaperTransformer(24, 8192, 16, 1.3e9),
        PaperTransformer(64, 16384, 32, 6e9),
    )
}
PAPER_MODEL_DIM = 1024
PAPER_VOCAB_SIZE = 64000
PAPER_HEAD_DIM = 64


def PaperTransformerLayers(name: str,
                           head_dim: Optional[int] = PAPER_HEAD_DIM,
                           shared_embeddings: bool = True,
                           model_dim: int = PAPER_MODEL_DIM,
                           vocab_size: int = PAPER_VOCAB_SIZE,
                           **kwargs) -> List[hyperparams.Params]:
  """TransformerLayers of the paper's T(L, H, A) named `name`.

  Args:
    name: a key of PAPER_TRANSFORMERS, e.g. 'T(64, 16384, 32)'.
    head_dim: dimension of each head (64: width 64 x A, which reproduces the
      paper's counts); None gives model_dim = num_heads x head_dim.
    shared_embeddings: one source / target embedding table (the softmax
      has its own weights either way).
    model_dim, vocab_size: D and the vocabulary (the paper's 1024 and 64k).
    **kwargs: other TransformerLayers arguments (max_len, dropout, ...).

  Raises:
    ValueError: an unknown name (the message lists the known ones).
  """
  if name not in PAPER_TRANSFORMERS:
    raise ValueError(f'unknown Transformer preset {name!r}; use one of '
                     f'{sorted(PAPER_TRANSFORMERS)}')
  t = PAPER_TRANSFORMERS[name]
  return TransformerLayers(t.num_layers, t.hidden_dim, t.num_heads,
                           model_dim=model_dim, vocab_size=vocab_size,
                           shared_embeddings=shared_embeddings,
                           head_dim=head_dim, **kwargs)


def TranslationInputShapes(batch_size: int, src_len: int, tgt_len: int):
  """input_shapes (for TensorPipeLayer / model analysis) of a batch."""
  src = tf.TensorShape([batch_size, src_len])
  tgt = tf.TensorShape([batch_size, tgt_len])
  return [dict(src_ids=src, src_paddings=src, tgt_ids=tgt, tgt_labels=tgt,
               tgt_paddings=tgt)]


def LmInputShapes(batch_size: int, seq_len: int):
  """input_shapes of a language-model batch."""
  s = tf.TensorShape([batch_size, seq_len])
  return [dict(ids=s, labels=s, paddings=s)]


def TransformerPipeline(num_partitions: int, num_micro_batches: int,
                        batch_size: int, src_len: int, tgt_len: int,
                        **kwargs) -> hyperparams.Params:
  """TensorPipeLayer Params of TransformerLayers(**kwargs), split by FLOPs."""
  return pipeline.TensorPipeLayer.Params().Set(
      name='TensorPipe', layers=TransformerLayers(**kwargs),
      num_partitions=num_partitions, num_micro_batches=num_micro_batches,
      input_shapes=TranslationInputShapes(batch_size, src_len, tgt_len))


def TransformerLmPipeline(num_partitions: int, num_micro_batches: int,
                          batch_size: int, seq_len: int,
                          **kwargs) -> hyperparams.Params:
  """TensorPipeLayer Params of TransformerLmLayers(**kwargs)."""
  return pipeline.TensorPipeLayer.Params().Set(
      name='TensorPipe', layers=TransformerLmLayers(**kwargs),
      num_partitions=num_partitions, num_micro_batches=num_micro_batches,
      input_shapes=LmInputShapes(batch_size, seq_len))
