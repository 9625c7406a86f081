"""Layers of NASNet-style networks: cells, factorized reduction, heads.

A cell (Zoph et al. 2018; AmoebaNet, Real et al. 2018) takes the outputs of
the two previous cells, `prev` and `cur`, and makes 5 new hidden states, each
the sum of two operations applied to earlier states:

  states = [relu-1x1-bn(cur), adjust(prev)]           # states 0 and 1
  for i in range(5):
    a, b = hiddenstate_indices[2i], hiddenstate_indices[2i + 1]
    states.append(drop_path(op[2i](states[a])) + drop_path(op[2i+1](states[b])))
  output = concat(states[j] for j where used_hiddenstates[j] == 0)

`adjust(prev)` is a factorized reduction when prev has twice cur's spatial
size, a relu-1x1-bn when only the channels differ, else the identity. In a
reduction cell the operations on states 0 and 1 have stride 2. `none` (the
identity) is not dropped; the other operations are (drop-path).

Each cell is ONE layer so a pipeline can cut between cells. Its FProp takes
(prev, cur, *extra) and returns (cur, output, *extra): both previous outputs
cross partition boundaries, and `extra` (e.g. the auxiliary head's logits)
travels along to the model output. The first cell after the stem has no prev
(`prev_channels=None`) and takes (cur, *extra), using cur as prev.

Drop-path schedule (NASNet): in training an operation's output is kept with
probability keep = 1 - progress * (cell_num + 1) / total_num_cells *
(1 - drop_path_keep_prob), one mask value per example drawn with
`py_utils.StatelessUniform` (so masks do not depend on the number of
micro-batches or partitions), and divided by keep. `progress` in [0, 1] is the
training progress, part of the FProp context: the trainer's train step sets
`py_utils.DropPathProgress(step / max_steps)` (without it, 1.0: full
drop-path). In eval mode there is no drop-path.
"""

import re
from typing import Any, List

import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import checks
from tensorpipe import py_utils
from tensorpipe.layers import activations
from tensorpipe.layers import composite
from tensorpipe.layers import conv
from tensorpipe.layers import dropout
from tensorpipe.layers import linear
from tensorpipe.layers import normalization
from tensorpipe.layers import pooling
from tensorpipe.nested_map import NestedMap

# Multiply and compare per element of a dropped operation output; 1 add per
# element of a combined state.
_DROP_PATH_FLOPS_PER_ELEMENT = 2


# The drop-path progress is part of py_utils' FProp context (restored by the
# recompute pass, carried into replica threads); these names stay for users.
DropPathProgress = py_utils.DropPathProgress
CurrentDropPathProgress = py_utils.CurrentDropPathProgress


def _Relu(name: str = 'relu'):
  return activations.ActivationLayer.Params().Set(name=name, activation='RELU')


def _ConvBn(name: str, kh: int, kw: int, cin: int, cout: int,
            stride=(1, 1), padding: str = 'SAME', activation: str = 'NONE'):
  return conv.Conv2DLayer.Params().Set(
      name=name, filter_shape=(kh, kw, cin, cout), filter_stride=tuple(stride),
      padding=padding, batch_norm=True, activation=activation)


def _Seq(name: str, sub: List[Any]):
  return composite.SequentialLayer.Params().Set(name=name, sub=sub)


_SEP_RE = re.compile(r'(?:dil_(\d+)_)?separable_(\d+)x(\d+)_(\d+)$')
_POOL_RE = re.compile(r'(avg|max)_pool_(\d+)x(\d+)$')
_CONV_OPS = {'3x3': ((3, 3),), '1x7_7x1': ((1, 7), (7, 1)),
             '1x3_3x1': ((1, 3), (3, 1))}


def OperationParams(name: str, op: str, cin: int, filters: int,
                    stride: int) -> Any:
  """Layer Params of one cell operation (NASNet / AmoebaNet conventions).

  Args:
    name: layer name.
    op: 'none', '1x1', '3x3', '1x7_7x1', '1x3_3x1', '{avg,max}_pool_KxK',
      'separable_KxK_N' or 'dil_D_separable_KxK_N'.
    cin: input channels.
    filters: output channels.
    stride: 1, or 2 for operations on a reduction cell's inputs.

  Returns:
    Layer Params mapping [b, h, w, cin] -> [b, h/stride, w/stride, filters].
  """
  s = (stride, stride)
  if op in ('none', '1x1'):
    if stride > 1 or op == '1x1' or cin != filters:
      return _Seq(name, [_Relu(), _ConvBn('conv_1x1', 1, 1, cin, filters, s)])
    return composite.IdentityLayer.Params().Set(name=name)
  m = _SEP_RE.match(op)
  if m:
    dilation = int(m.group(1) or 1)
    k, num = int(m.group(2)), int(m.group(4))
    sub, c = [], cin
    for i in range(num):
      st = s if i == 0 else (1, 1)
      sub += [_Relu(f'relu_{i}'), conv.SeparableConv2DLayer.Params().Set(
          name=f'sep_{i}', filter_shape=(k, k, c, filters), filter_stride=st,
          dilation_rate=(dilation, dilation) if st == (1, 1) else (1, 1),
          batch_norm=True, activation='NONE')]
      c = filters
    return _Seq(name, sub)
  m = _POOL_RE.match(op)
  if m:
    k = int(m.group(2))
    sub = [pooling.PoolingLayer.Params().Set(
        name='pool', window_shape=(k, k), window_stride=s,
        pooling_type=m.group(1).upper(), padding='SAME')]
    if cin != filters:
      sub.append(_ConvBn('conv_1x1', 1, 1, cin, filters))
    return _Seq(name, sub)
  if op in _CONV_OPS:
    # A bottleneck: 1x1 down to a quarter (3/8 for 1x3_3x1) of the filters,
    # the convolution(s), 1x1 back up; relu before and BN after each.
    mid = filters * 3 // 8 if op == '1x3_3x1' else filters // 4
    if mid < 1:
      mid = None
    c = cin
    sub = [_Relu('relu_pre')]
    if mid:
      sub += [_ConvBn('pre_1x1', 1, 1, cin, mid), _Relu('relu_mid')]
      c = mid
    shapes = _CONV_OPS[op]
    out = mid or filters
    for i, (kh, kw) in enumerate(shapes):
      if len(shapes) == 1:
        st = s
      else:  # 1xK strides the width, Kx1 the height
        st = (1, stride) if i == 0 else (stride, 1)
      sub.append(_ConvBn(f'conv_{kh}x{kw}', kh, kw, c, out, st,
                         activation='RELU' if (i + 1 < len(shapes) or mid)
                         else 'NONE'))
      c = out
    if mid:
      sub.append(_ConvBn('post_1x1', 1, 1, mid, filters))
    return _Seq(name, sub)
  raise ValueError(f'unknown cell operation {op!r}; use none, 1x1, 3x3, '
                   '1x7_7x1, 1x3_3x1, avg_pool_KxK, max_pool_KxK, '
                   'separable_KxK_N or dil_D_separable_KxK_N')


class FactorizedReductionLayer(base_layer.BaseLayer):
  """Halves the spatial size without losing pixels (NASNet).

  stride 2: concat(1x1 conv of x[:, ::2, ::2], 1x1 conv of x[:, 1::2, 1::2]
  (zero-padded at the bottom/right)) then BN; each conv makes half of
  `out_channels`. stride 1: 1x1 conv + BN.

  Usage:
    p = FactorizedReductionLayer.Params().Set(name='fr', in_channels=64,
                                              out_channels=128)
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('in_channels', None, 'Input channels; required.')
    p.Define('out_channels', None, 'Output channels; required, even for '
             'stride 2.')
    p.Define('stride', 2, 'Spatial stride: 2 (halve height and width) or 1.')
    return p

  @classmethod
  def _Validate(cls, p):
    if p.stride not in (1, 2):
      raise ValueError(f'FactorizedReductionLayer {p.name!r}: stride='
                       f'{p.stride!r} must be 1 or 2')
    if not isinstance(p.out_channels, int) or p.out_channels <= 0 or (
        p.stride == 2 and p.out_channels % 2):
      raise ValueError(f'FactorizedReductionLayer {p.name!r}: out_channels='
                       f'{p.out_channels!r} must be a positive int (even for '
                       'stride 2); use an even number of filters')

  @classmethod
  def _Shapes(cls, p):
    if p.stride == 1:
      return {'w': [1, 1, p.in_channels, p.out_channels]}
    half = p.out_channels // 2
    return {'w1': [1, 1, p.in_channels, half], 'w2': [1, 1, p.in_channels,
                                                       half]}

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self._Validate(p)
    for name, shape in self._Shapes(p).items():
      self.CreateVariable(name, base_layer.WeightParams(shape=shape))
    self.CreateChild('bn', normalization.BatchNormLayer.Params().Set(
        dim=p.out_channels))

  @classmethod
  def SubLayerParams(cls, p):
    return [normalization.BatchNormLayer.Params().Set(name='bn',
                                                      dim=p.out_channels)]

  def FProp(self, theta, x):
    """x: [b, h, w, in] -> [b, ceil(h/stride), ceil(w/stride), out]."""
    p = self.params
    bn_theta = theta.bn
    theta = self.CastTheta(theta)
    x = tf.cast(x, self.fprop_dtype)
    if p.stride == 1:
      y = tf.nn.conv2d(x, theta.w, 1, 'VALID')
    else:
      path1 = x[:, ::2, ::2, :]
      shifted = tf.pad(x, [[0, 0], [0, 1], [0, 1], [0, 0]])[:, 1:, 1:, :]
      path2 = shifted[:, ::2, ::2, :]
      y = tf.concat([tf.nn.conv2d(path1, theta.w1, 1, 'VALID'),
                     tf.nn.conv2d(path2, theta.w2, 1, 'VALID')], axis=-1)
    return self.children.bn.FProp(bn_theta, y)

  @classmethod
  def FPropMeta(cls, p, x_shape):
    cls._Validate(p)
    shape = base_layer.ToShape(x_shape)
    if shape.rank != 4 or shape[3] != p.in_channels:
      raise ValueError(f'FactorizedReductionLayer {p.name!r}: input {shape} '
                       f'must be [batch, h, w, {p.in_channels}]')
    b, h, w, _ = shape.as_list()
    s = p.stride
    out = tf.TensorShape([b, -(-h // s), -(-w // s), p.out_channels])
    n = base_layer.NumElements(out)
    bn = cls.SubLayerParams(p)[0]
    bn_meta = bn.cls.FPropMeta(bn, out)
    num_params = sum(a * b * c * d for a, b, c, d in cls._Shapes(p).values())
    return base_layer.FPropMetaResult(2 * p.in_channels * n + bn_meta.flops,
                                      out, num_params + bn_meta.num_params)


class NASCellLayer(base_layer.BaseLayer):
  """A normal (stride 1) or reduction (stride 2) NASNet-style cell.

  Usage (see models/amoebanet.py for the genotypes):
    p = NASCellLayer.Params().Set(
        name='cell_3', operations=OPS, hiddenstate_indices=IDX,
        used_hiddenstates=USED, num_filters=64, cur_channels=256,
        prev_channels=256, stride=1, cell_num=3, total_num_cells=24)
    cur, out = cell.FProp(theta, prev, cur)   # see the module docstring
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('operations', None, 'The 10 operation names, two per combined '
             'state (see OperationParams).')
    p.Define('hiddenstate_indices', None, 'The 10 state indices the '
             'operations apply to (0 = cur, 1 = prev, 2.. = new states).')
    p.Define('used_hiddenstates', None, '7 flags: states with 0 are '
             'concatenated into the output.')
    p.Define('num_filters', None, 'Channels of every hidden state; the output '
             'has (number of unused states) * num_filters channels.')
    p.Define('cur_channels', None, 'Channels of the `cur` input.')
    p.Define('prev_channels', None, 'Channels of the `prev` input; None: the '
             'cell has no prev input (first cell after the stem) and uses '
             'cur as prev.')
    p.Define('prev_spatial_reduction', False, 'Whether prev has twice the '
             "spatial size of cur (it then gets a factorized reduction).")
    p.Define('stride', 1, '1 for a normal cell, 2 for a reduction cell.')
    p.Define('cell_num', 0, 'Index of this cell in the network (stem cells '
             'included), for the drop-path schedule.')
    p.Define('total_num_cells', 1, 'Number of cells in the network, for the '
             'drop-path schedule.')
    p.Define('drop_path_keep_prob', 1.0, 'Keep probability of drop-path at '
             'the last cell and full training progress; 1.0 disables it.')
    return p

  @classmethod
  def _Validate(cls, p):
    name = f'NASCellLayer {p.name!r}'
    if (not isinstance(p.operations, (list, tuple)) or len(p.operations) != 10
        or not isinstance(p.hiddenstate_indices, (list, tuple)) or
        len(p.hiddenstate_indices) != 10):
      raise ValueError(f'{name}: operations={p.operations!r} and '
                       f'hiddenstate_indices={p.hiddenstate_indices!r} must '
                       'be lists of 10')
    for i, idx in enumerate(p.hiddenstate_indices):
      if not 0 <= idx < 2 + i // 2:
        raise ValueError(f'{name}: hiddenstate_indices[{i}]={idx} refers to '
                         f'a state not made yet (use 0..{1 + i // 2})')
    if (not isinstance(p.used_hiddenstates, (list, tuple)) or
        len(p.used_hiddenstates) != 7 or all(p.used_hiddenstates)):
      raise ValueError(f'{name}: used_hiddenstates={p.used_hiddenstates!r} '
                       'must be 7 flags, not all 1')
    checks.CheckPositiveInts(name, num_filters=p.num_filters,
                             cur_channels=p.cur_channels)
    if p.stride not in (1, 2):
      raise ValueError(f'{name}: stride={p.stride!r} must be 1 or 2')
    if not 0.0 < p.drop_path_keep_prob <= 1.0:
      raise ValueError(f'{name}: drop_path_keep_prob={p.drop_path_keep_prob!r}'
                       ' must be in (0, 1]')

  @classmethod
  def _Children(cls, p) -> NestedMap:
    """Child Params: prev_adjust (or None), cur_base, ops, reductions."""
    cls._Validate(p)
    f = p.num_filters
    out = NestedMap(prev_adjust=None, reductions={})
    if p.prev_channels is None:
      prev_ch = p.cur_channels
    else:
      prev_ch = f
      if p.prev_spatial_reduction:
        out.prev_adjust = _Seq('prev_adjust', [
            _Relu(), FactorizedReductionLayer.Params().Set(
                name='reduce', in_channels=p.prev_channels, out_channels=f)])
      elif p.prev_channels != f:
        out.prev_adjust = _Seq('prev_adjust', [
            _Relu(), _ConvBn('conv_1x1', 1, 1, p.prev_channels, f)])
    out.cur_base = _Seq('cur_base', [_Relu(),
                                     _ConvBn('conv_1x1', 1, 1,
                                             p.cur_channels, f)])
    channels = [f, prev_ch] + [f] * 5
    ops = []
    for i, (op, idx) in enumerate(zip(p.operations, p.hiddenstate_indices)):
      stride = p.stride if idx < 2 else 1
      side = 'left' if i % 2 == 0 else 'right'
      ops.append(OperationParams(f'comb{i // 2}_{side}', op, channels[idx],
                                 f, stride))
    out.ops = ops
    for j, used in enumerate(p.used_hiddenstates):
      if not used and j < 2 and (p.stride > 1 or channels[j] != f):
        out.reductions[j] = FactorizedReductionLayer.Params().Set(
            name=f'reduction_{j}', in_channels=channels[j], out_channels=f,
            stride=p.stride)
    return out

  @classmethod
  def SubLayerParams(cls, p):
    c = cls._Children(p)
    return ([c.prev_adjust] if c.prev_adjust else []) + [c.cur_base] + list(
        c.ops) + list(c.reductions.values())

  def __init__(self, params):
    super().__init__(params)
    c = self._Children(self.params)
    if c.prev_adjust is not None:
      self.CreateChild('prev_adjust', c.prev_adjust)
    self.CreateChild('cur_base', c.cur_base)
    self.CreateChildren('ops', c.ops)
    object.__setattr__(self, '_reduction_keys', sorted(c.reductions))
    for j in sorted(c.reductions):
      self.CreateChild(f'reduction_{j}', c.reductions[j])

  def _KeepProb(self):
    p = self.params
    if p.drop_path_keep_prob >= 1.0 or not py_utils.IsTraining(
        f'drop-path of {type(self).__name__} {self.path or self.layer_name!r}'):
      return None
    ratio = (p.cell_num + 1) / float(p.total_num_cells)
    progress = CurrentDropPathProgress()
    if isinstance(progress, (int, float)) and progress == 0:
      return None
    return 1.0 - tf.cast(progress, tf.float32) * ratio * (
        1.0 - p.drop_path_keep_prob)

  def _DropPath(self, x, keep, i):
    seed = py_utils.LayerSeed(f'{self._ChildPath("drop_path")}_{i}',
                              self.params.random_seed)
    u = py_utils.StatelessUniform(py_utils.PerExampleShape(x.shape), seed)
    mask = tf.cast(u < keep, tf.float32) / keep
    return x * tf.cast(mask, x.dtype)

  def FProp(self, theta, *inputs):
    """Runs the cell.

    Args:
      theta: the cell's weights.
      *inputs: (prev, cur, *extra), or (cur, *extra) when prev_channels is
        None; prev / cur: [batch, h, w, c].

    Returns:
      (cur, output, *extra): output [batch, h/stride, w/stride, n * filters].
    """
    p = self.params
    if p.prev_channels is None:
      cur, extra = inputs[0], inputs[1:]
      prev = cur
    else:
      if len(inputs) < 2:
        raise ValueError(f'NASCellLayer {p.name!r} needs (prev, cur) inputs, '
                         f'got {len(inputs)} tensor(s)')
      prev, cur, extra = inputs[0], inputs[1], inputs[2:]
    ch = self.children
    prev_state = prev
    if 'prev_adjust' in ch:
      prev_state = ch.prev_adjust.FProp(theta.prev_adjust, prev)
    states = [ch.cur_base.FProp(theta.cur_base, cur), prev_state]
    keep = self._KeepProb()
    for c in range(5):
      hs = []
      for i in (2 * c, 2 * c + 1):
        op = ch.ops[i]
        h = op.FProp(theta.ops[i], states[p.hiddenstate_indices[i]])
        if keep is not None and p.operations[i] != 'none':
          h = self._DropPath(h, keep, i)
        hs.append(h)
      states.append(hs[0] + hs[1])
    for j in self._reduction_keys:
      states[j] = ch[f'reduction_{j}'].FProp(theta[f'reduction_{j}'],
                                              states[j])
    out = tf.concat([s for s, used in zip(states, p.used_hiddenstates)
                     if not used], axis=-1)
    return (cur, out) + tuple(extra)

  @classmethod
  def FPropMeta(cls, p, *input_shapes):
    c = cls._Children(p)
    name = f'NASCellLayer {p.name!r}'
    shapes = [base_layer.ToShape(s) if not isinstance(s, dict) else s
              for s in input_shapes]
    if p.prev_channels is None:
      cur, extra = shapes[0], tuple(input_shapes[1:])
      prev = cur
    else:
      if len(shapes) < 2:
        raise ValueError(f'{name} needs (prev, cur) inputs, got '
                         f'{len(shapes)}')
      prev, cur, extra = shapes[0], shapes[1], tuple(input_shapes[2:])
    for label, s, want in (('cur', cur, p.cur_channels),
                           ('prev', prev, p.prev_channels or p.cur_channels)):
      if s.rank != 4 or s[3] != want:
        raise ValueError(f'{name}: {label} input {s} must be [batch, h, w, '
                         f'{want}]')
    if p.prev_channels is not None:
      ph, ch_ = prev[1], cur[1]
      reduced = ph != ch_
      if reduced != bool(p.prev_spatial_reduction) or (
          reduced and -(-ph // 2) != ch_):
        raise ValueError(f'{name}: prev {prev} and cur {cur} spatial sizes '
                         'do not match prev_spatial_reduction='
                         f'{p.prev_spatial_reduction}')
    flops, num_params = 0.0, 0

    def Run(lp, shape):
      nonlocal flops, num_params
      m = composite.ChainFPropMeta([lp], (shape,), owner=name)[0][0]
      flops += m.flops
      num_params += m.num_params
      return m.out_shapes[0]

    prev_state = Run(c.prev_adjust, prev) if c.prev_adjust else prev
    states = [Run(c.cur_base, cur), prev_state]
    for k in range(5):
      hs = []
      for i in (2 * k, 2 * k + 1):
        h = Run(c.ops[i], states[p.hiddenstate_indices[i]])
        if p.drop_path_keep_prob < 1.0 and p.operations[i] != 'none':
          flops += _DROP_PATH_FLOPS_PER_ELEMENT * base_layer.NumElements(h)
        hs.append(h)
      if hs[0] != hs[1]:
        raise ValueError(f'{name}: combination {k} adds shapes {hs[0]} and '
                         f'{hs[1]}; check the genotype and strides')
      flops += base_layer.NumElements(hs[0])
      states.append(hs[0])
    for j, lp in c.reductions.items():
      states[j] = Run(lp, states[j])
    kept = [s for s, used in zip(states, p.used_hiddenstates) if not used]
    for s in kept[1:]:
      if s[:3] != kept[0][:3]:
        raise ValueError(f'{name}: output states {kept} differ in size')
    out = kept[0][:3].concatenate([sum(s[3] for s in kept)])
    return base_layer.FPropMetaResult(flops, (cur, out) + extra, num_params)


class AuxHeadLayer(base_layer.BaseLayer):
  """NASNet auxiliary classifier on `cur`; passes (prev, cur) through.

  relu, avg pool 5x5/3 VALID, 1x1 conv + BN + relu, conv over the whole
  remaining map + BN + relu, FC logits. FProp(theta, prev, cur) returns
  (prev, cur, aux_logits [batch, num_classes]).
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('in_channels', None, 'Channels of cur; required.')
    p.Define('in_size', None, '(height, width) of cur; required (the second '
             'conv covers the pooled map).')
    p.Define('hidden_dims', (128, 768), 'Channels of the two convolutions.')
    p.Define('num_classes', None, 'Number of logits; required.')
    return p

  @classmethod
  def _HeadParams(cls, p):
    h, w = p.in_size
    ph, pw = (h - 5) // 3 + 1, (w - 5) // 3 + 1
    if ph < 1 or pw < 1:
      raise ValueError(f'AuxHeadLayer {p.name!r}: in_size={p.in_size!r} is '
                       'smaller than the 5x5 pooling window; use larger '
                       'images or aux_head=False')
    d1, d2 = p.hidden_dims
    return _Seq('head', [
        _Relu(),
        pooling.PoolingLayer.Params().Set(name='pool', window_shape=(5, 5),
                                          window_stride=(3, 3),
                                          pooling_type='AVG', padding='VALID'),
        _ConvBn('proj', 1, 1, p.in_channels, d1, activation='RELU'),
        _ConvBn('conv', ph, pw, d1, d2, padding='VALID', activation='RELU'),
        linear.FlattenLayer.Params().Set(name='flatten'),
        linear.FCLayer.Params().Set(name='logits', input_dim=d2,
                                    output_dim=p.num_classes,
                                    activation='NONE')])

  @classmethod
  def SubLayerParams(cls, p):
    return [cls._HeadParams(p)]

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('head', self._HeadParams(self.params))

  def FProp(self, theta, prev, cur, *extra):
    aux = self.children.head.FProp(theta.head, cur)
    return (prev, cur) + tuple(extra) + (tf.cast(aux, tf.float32),)

  @classmethod
  def FPropMeta(cls, p, prev, cur, *extra):
    hp = cls._HeadParams(p)
    m = hp.cls.FPropMeta(hp, cur)
    return base_layer.FPropMetaResult(
        m.flops, (prev, cur) + tuple(extra) + m.out_shapes, m.num_params)


class NASHeadLayer(base_layer.BaseLayer):
  """Final classifier: relu, global average pool, dropout, FC logits.

  FProp(theta, prev, cur) returns logits [batch, num_classes];
  FProp(theta, prev, cur, aux_logits) returns NestedMap(logits=...,
  aux_logits=...).
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('in_channels', None, 'Channels of cur; required.')
    p.Define('num_classes', None, 'Number of logits; required.')
    p.Define('dropout_keep_prob', 1.0, 'Keep probability of dropout before '
             'the FC layer.')
    return p

  @classmethod
  def _HeadParams(cls, p):
    return _Seq('head', [
        _Relu(),
        pooling.GlobalPoolingLayer.Params().Set(name='pool',
                                                pooling_type='AVG'),
        dropout.DropoutLayer.Params().Set(name='dropout',
                                          keep_prob=p.dropout_keep_prob),
        linear.FCLayer.Params().Set(name='logits', input_dim=p.in_channels,
                                    output_dim=p.num_classes,
                                    activation='NONE')])

  @classmethod
  def SubLayerParams(cls, p):
    return [cls._HeadParams(p)]

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('head', self._HeadParams(self.params))

  def FProp(self, theta, prev, cur, *extra):
    del prev
    logits = tf.cast(self.children.head.FProp(theta.head, cur), tf.float32)
    if not extra:
      return logits
    return NestedMap(logits=logits, aux_logits=extra[0])

  @classmethod
  def FPropMeta(cls, p, prev, cur, *extra):
    del prev
    hp = cls._HeadParams(p)
    m = hp.cls.FPropMeta(hp, cur)
    out = m.out_shapes[0]
    if extra:
      out = NestedMap(logits=out, aux_logits=extra[0])
    return base_layer.FPropMetaResult(m.flops, out, m.num_params)
