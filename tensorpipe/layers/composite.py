"""Composite layers: sequential, parallel (residual / concat) and identity.

A layer's FProp may return one tensor, a tuple of tensors (passed on as
several positional inputs) or a NestedMap (passed on as one input). This is
how AmoebaNet cells take the two previous cells' outputs and a Transformer
decoder carries the encoder output through a sequence of layers.
"""

from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import tied_weights
from tensorpipe.nested_map import NestedMap


def AsArgs(outputs: Any) -> Tuple[Any, ...]:
  """A layer's outputs as the positional inputs of the next layer."""
  return outputs if isinstance(outputs, tuple) else (outputs,)


def FromArgs(args: Tuple[Any, ...]) -> Any:
  """Inverse of AsArgs: one output stays bare, several become a tuple."""
  return args[0] if len(args) == 1 else tuple(args)


def ChainFPropMeta(layer_params: Sequence[Any], input_shapes: Tuple[Any, ...],
                   owner: str = 'layers'):
  """Runs FPropMeta through a chain of layer Params.

  Returns:
    (list of per-layer FPropMeta results, final out_shapes tuple).

  Raises:
    ValueError: naming the layer whose input does not fit.
  """
  metas = []
  shapes = tuple(input_shapes)
  for i, p in enumerate(layer_params):
    try:
      meta = p.cls.FPropMeta(p, *shapes)
    except (ValueError, TypeError) as e:
      raise ValueError(
          f'{owner}: layer {i} ({p.cls.__name__} {p.name!r}) does not accept '
          f'the output of the layer before it (shapes {_Fmt(shapes)}): {e}'
      ) from None
    metas.append(meta)
    shapes = meta.out_shapes
  return metas, shapes


def _Fmt(shapes: Tuple[Any, ...]) -> str:
  def One(s):
    if isinstance(s, tf.TensorShape):
      return str(s.as_list() if s.rank is not None else s)
    if isinstance(s, dict):
      return '{' + ', '.join(f'{k}: {One(v)}' for k, v in sorted(s.items())) + '}'
    if isinstance(s, (list, tuple)):
      return '(' + ', '.join(One(v) for v in s) + ')'
    return repr(s)
  return ', '.join(One(s) for s in shapes)


class IdentityLayer(base_layer.BaseLayer):
  """Returns its inputs unchanged (the skip branch of a residual block)."""

  def FProp(self, theta, *inputs):
    return FromArgs(inputs)

  @classmethod
  def FPropMeta(cls, p, *input_shapes):
    return base_layer.FPropMetaResult(0, tuple(input_shapes), 0)


class SequentialLayer(base_layer.BaseLayer):
  """Applies `sub` layers one after the other.

  Usage:
    p = SequentialLayer.Params().Set(name='stack', sub=[conv_p, pool_p])
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('sub', [], 'List of layer Params applied in order; the outputs '
             'of layer i (a tuple means several inputs) are the inputs of '
             'layer i+1.')
    return p

  def __init__(self, params):
    super().__init__(params)
    if not self.params.sub:
      raise ValueError(f'SequentialLayer {self.layer_name!r} has no layers in '
                       '`sub`; give it at least one layer Params')
    self.CreateChildren('sub', self.params.sub)
    # Weights one layer reads from another (tied_weights.py).
    object.__setattr__(self, '_ties', tied_weights.Resolve(
        self, [self.children.sub]))

  def LayersWithTheta(self, theta: Optional[NestedMap] = None
                      ) -> List[Tuple[base_layer.BaseLayer, NestedMap]]:
    """The `sub` layers in order, each with its part of `theta`.

    Args:
      theta: this layer's theta (default `self.theta`).
    """
    theta = self.theta if theta is None else theta
    (sub,) = tied_weights.Inject(self._ties, [theta.sub])
    return list(zip(self.children.sub, sub))

  def FProp(self, theta, *inputs):
    args = tuple(inputs)
    for layer, layer_theta in self.LayersWithTheta(theta):
      args = AsArgs(layer.FProp(layer_theta, *args))
    return FromArgs(args)

  @classmethod
  def FPropMeta(cls, p, *input_shapes):
    metas, out_shapes = ChainFPropMeta(p.sub, input_shapes,
                                       owner=f'SequentialLayer {p.name!r}')
    return base_layer.FPropMetaResult(
        sum(m.flops for m in metas), out_shapes,
        sum(m.num_params for m in metas))


_MERGES = ('sum', 'concat')


class ParallelLayer(base_layer.BaseLayer):
  """Applies every `sub` layer to the same inputs and merges their outputs.

  A residual block is ParallelLayer(sub=[IdentityLayer, block], merge='sum').
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('sub', [], 'List of branch layer Params; each gets the same '
             'inputs and must return outputs of the same structure.')
    p.Define('merge', 'sum', "How branch outputs are merged: 'sum' "
             "(element-wise; shapes must match) or 'concat' (along the "
             'last axis).')
    p.Define('activation', 'NONE', 'Activation applied after the merge, e.g. '
             "'RELU' for a ResNet block.")
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if not p.sub:
      raise ValueError(f'ParallelLayer {p.name!r} has no branches in `sub`')
    if p.merge not in _MERGES:
      raise ValueError(f'ParallelLayer {p.name!r}: merge={p.merge!r} is not '
                       f'one of {_MERGES}')
    from tensorpipe.layers import activations  # pylint: disable=g-import-not-at-top
    self._activation = activations.GetActivation(p.activation)
    self.CreateChildren('sub', p.sub)

  def FProp(self, theta, *inputs):
    outs = [layer.FProp(t, *inputs)
            for layer, t in zip(self.children.sub, theta.sub)]
    if self.params.merge == 'sum':
      merged = tf.nest.map_structure(lambda *xs: tf.add_n(list(xs)), *outs)
    else:
      merged = tf.nest.map_structure(lambda *xs: tf.concat(xs, axis=-1), *outs)
    return tf.nest.map_structure(self._activation, merged)

  @classmethod
  def FPropMeta(cls, p, *input_shapes):
    metas = []
    for i, sub in enumerate(p.sub):
      metas.append(ChainFPropMeta([sub], input_shapes,
                                  owner=f'ParallelLayer {p.name!r} branch {i}')
                   [0][0])
    first = metas[0].out_shapes
    for i, m in enumerate(metas[1:], 1):
      try:
        tf.nest.assert_same_structure(first, m.out_shapes)
      except (ValueError, TypeError):
        raise ValueError(f'ParallelLayer {p.name!r}: branch {i} returns '
                         f'{_Fmt(m.out_shapes)} but branch 0 returns '
                         f'{_Fmt(first)}') from None

    def Merge(*shapes):
      shapes = [base_layer.ToShape(s) for s in shapes]
      if p.merge == 'sum':
        for s in shapes[1:]:
          if not s.is_compatible_with(shapes[0]):
            raise ValueError(f'ParallelLayer {p.name!r}: merge=sum needs equal '
                             f'branch shapes, got {[x.as_list() for x in shapes]}')
        return shapes[0]
      last = sum(s[-1] for s in shapes)
      return shapes[0][:-1].concatenate([last])

    out_shapes = tf.nest.map_structure(Merge, *[m.out_shapes for m in metas])
    merge_flops = 0
    if p.merge == 'sum':
      merge_flops = (len(metas) - 1) * sum(
          base_layer.NumElements(s) for s in tf.nest.flatten(out_shapes))
    return base_layer.FPropMetaResult(
        sum(m.flops for m in metas) + merge_flops, out_shapes,
        sum(m.num_params for m in metas))
