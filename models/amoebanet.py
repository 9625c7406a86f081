"""AmoebaNet-B / AmoebaNet-D (Real et al. 2018) as a list of cell layers.

AmoebaNet(L, F): L normal cells between reduction cells, F filters in the
first normal cell (the GPipe paper's AmoebaNet-D(L, D) notation):

  ImageNet stem: conv 3x3/2 VALID (32) + BN, reduction cells with F/4 and
                 F/2 filters                            224 -> 111 -> 56 -> 28
  small stem:    conv 3x3/1 VALID (32) + BN             32 -> 30, 28 -> 26
  cells:         L normal (F), reduction (2F), L normal (2F), [aux head],
                 reduction (4F), L normal (4F)
  head:          relu, global average pool, dropout, FC logits

The genotypes (operations, the states they read, the states concatenated into
the output) and the cell mechanics follow the public reference implementation
(tensorflow/tpu models/official/amoeba_net, `model_specs.py`,
`network_utils.py`); in particular AmoebaNet-D's normal cell concatenates
states [0, 3, 4, 6] as there, which reproduces the parameter counts of the
GPipe paper's Table 1 (see kakaobrain/torchgpipe's note on it).

Every cell is one layer (see models/amoebanet_cells.py): cells take and return
(prev, cur[, aux_logits]) so any cell boundary can be a partition boundary.
With `aux_head=True` the model output is NestedMap(logits=[batch, classes],
aux_logits=[batch, classes]); the training loss is then
CE(logits) + 0.4 * CE(aux_logits) (`AUX_LOSS_WEIGHT`). Without it the output
is the logits tensor. The auxiliary head is also computed in eval (its output
is just not used there), so the output structure does not change.

Trainable parameters at 224x224 and 1000 classes (`model_utils.
NumTrainableParams`, from FPropMeta alone) against the GPipe paper's Table 1:

  AmoebaNet-D(6, 208)     81,781,529   (paper 82M)
  AmoebaNet-D(6, 416)    318,270,652   (paper 318M)
  AmoebaNet-D(6, 544)    540,977,420   (paper 542M)
  AmoebaNet-D(12, 544) 1,054,074,956   (paper 1.05B)
  AmoebaNet-D(24, 512) 1,843,378,372   (paper 1.8B)
  AmoebaNet-B(6, 512)    558,045,988   (paper 557M)

Drop-path: see amoebanet_cells (`DropPathProgress` sets the training
progress the schedule uses).
"""

from typing import Any, Dict, List, Union

from tensorpipe import checks
from tensorpipe import hyperparams
from tensorpipe import pipeline
from tensorpipe.layers import conv

# Relative: the zoo is `models` in the clone and `tensorpipe.models` when
# installed (pyproject.toml).
from . import amoebanet_cells as cells

AUX_LOSS_WEIGHT = 0.4

# (operations, hiddenstate_indices, used_hiddenstates) of the normal and the
# reduction cell; states 0 = cur (after 1x1), 1 = prev (adjusted).
GENOTYPES = {
    'B': dict(
        normal=(['1x1', 'max_pool_3x3', 'none', 'separable_3x3_2', '1x1',
                 'separable_3x3_2', '1x1', 'none', 'avg_pool_3x3', '1x1'],
                [1, 1, 1, 0, 1, 0, 2, 2, 1, 5], [0, 1, 1, 0, 0, 1, 0]),
        reduction=(['max_pool_2x2', 'max_pool_3x3', 'none', '3x3',
                    'dil_2_separable_5x5_2', 'max_pool_3x3', 'none',
                    'separable_3x3_2', 'avg_pool_3x3', '1x1'],
                   [0, 0, 2, 1, 2, 2, 3, 1, 4, 3], [1, 1, 1, 1, 1, 0, 0])),
    'D': dict(
        normal=(['1x1', 'max_pool_3x3', 'none', '1x7_7x1', '1x1', '1x7_7x1',
                 'max_pool_3x3', 'none', 'avg_pool_3x3', '1x1'],
                [1, 1, 1, 0, 0, 0, 2, 2, 1, 5], [0, 1, 1, 0, 0, 1, 0]),
        reduction=(['max_pool_2x2', 'max_pool_3x3', 'none', '3x3', '1x7_7x1',
                    'max_pool_3x3', 'none', 'max_pool_2x2', 'avg_pool_3x3',
                    '1x1'],
                   [0, 0, 2, 1, 2, 2, 3, 1, 2, 3], [1, 1, 1, 1, 0, 0, 0])),
}


def AmoebaNetLayers(variant: Union[str, Dict[str, Any]] = 'D',
                    num_normal_cells: int = 6, num_filters: int = 208,
                    num_classes: int = 1000,
                    image_size: int = 224, in_channels: int = 3,
                    small_stem: bool = False, stem_filters: int = 32,
                    drop_path_keep_prob: float = 0.7,
                    dropout_keep_prob: float = 0.5, aux_head: bool = True,
                    aux_scaling: float = 0.4) -> List[hyperparams.Params]:
  """AmoebaNet layer Params: stem, one layer per cell, aux head, head.

  Args:
    variant: 'B' or 'D', or a genotype dict like GENOTYPES['D']: normal and
      reduction, each (10 operations, 10 state indices, 7 used flags).
    num_normal_cells: L, normal cells per stage (3 stages).
    num_filters: F, filters of the first stage's normal cells.
    num_classes: number of logits.
    image_size: height = width of the square input images.
    in_channels: channels of the input images.
    small_stem: the stem for 32x32 / 28x28 images (one 3x3/1 conv, no
      reduction cells) instead of the ImageNet stem.
    stem_filters: channels of the stem convolution.
    drop_path_keep_prob: drop-path keep probability of the last cell at the
      end of training (1.0 disables drop-path).
    dropout_keep_prob: keep probability of dropout before the logits.
    aux_head: add the auxiliary classifier after the second stage.
    aux_scaling: width factor of the auxiliary head's convolutions (128 and
      768 channels times it; 0.4 in the reference implementation).

  Returns:
    A list of layer Params. Input: [batch, image_size, image_size,
    in_channels]; output: logits [batch, num_classes], or
    NestedMap(logits, aux_logits) with aux_head=True.

  Raises:
    ValueError: for a bad variant or sizes.
  """
  if isinstance(variant, dict):
    if sorted(variant) != ['normal', 'reduction']:
      raise ValueError(f'a custom genotype needs keys normal and reduction, '
                       f'got {sorted(variant)}; see GENOTYPES')
    genotype = variant
  elif variant in GENOTYPES:
    genotype = GENOTYPES[variant]
  else:
    raise ValueError(f'AmoebaNet variant={variant!r} is not one of '
                     f'{sorted(GENOTYPES)} (or a genotype dict)')
  checks.CheckPositiveInts('AmoebaNet', num_normal_cells=num_normal_cells,
                           num_filters=num_filters, num_classes=num_classes,
                           image_size=image_size, stem_filters=stem_filters)
  if num_filters % 8:
    raise ValueError(f'AmoebaNet num_filters={num_filters} must be a multiple '
                     'of 8 (the stem cells use F/4 filters and factorized '
                     'reductions need an even number); e.g. '
                     f'{(num_filters + 7) // 8 * 8}')
  num_stem_cells = 0 if small_stem else 2
  total_cells = 3 * num_normal_cells + 2 + num_stem_cells
  stride = 1 if small_stem else 2
  size = (image_size - 3) // stride + 1
  if size < 1:
    raise ValueError(f'image_size={image_size} is too small for the stem')
  layers = [conv.Conv2DLayer.Params().Set(
      name='stem', filter_shape=(3, 3, in_channels, stem_filters),
      filter_stride=(stride, stride), padding='VALID', batch_norm=True,
      activation='NONE')]
  # (channels, size) of the last two outputs; prev None = no prev yet.
  prev, cur = None, (stem_filters, size)
  cell_num = 0

  def AddCell(kind, filters):
    nonlocal prev, cur, cell_num
    ops, idx, used = genotype[kind]
    cell_stride = 2 if kind == 'reduction' else 1
    p = cells.NASCellLayer.Params().Set(
        name=f'cell_{cell_num}_{kind}', operations=list(ops),
        hiddenstate_indices=list(idx), used_hiddenstates=list(used),
        num_filters=filters, cur_channels=cur[0],
        prev_channels=prev[0] if prev else None,
        prev_spatial_reduction=bool(prev and prev[1] != cur[1]),
        stride=cell_stride, cell_num=cell_num, total_num_cells=total_cells,
        drop_path_keep_prob=drop_path_keep_prob)
    layers.append(p)
    out = (filters * used.count(0), -(-cur[1] // cell_stride))
    prev, cur = cur, out
    cell_num += 1

  if not small_stem:
    AddCell('reduction', num_filters // 4)
    AddCell('reduction', num_filters // 2)
  for stage in range(3):
    filters = num_filters * 2**stage
    if stage > 0:
      AddCell('reduction', filters)
    for _ in range(num_normal_cells):
      AddCell('normal', filters)
    if stage == 1 and aux_head:
      if cur[1] < 5:
        raise ValueError(
            f'image_size={image_size}: the auxiliary head sees a {cur[1]}x'
            f'{cur[1]} map, smaller than its 5x5 pooling window; use larger '
            'images or aux_head=False')
      layers.append(cells.AuxHeadLayer.Params().Set(
          name='aux_head', in_channels=cur[0], in_size=(cur[1], cur[1]),
          hidden_dims=(int(128 * aux_scaling), int(768 * aux_scaling)),
          num_classes=num_classes))
  layers.append(cells.NASHeadLayer.Params().Set(
      name='head', in_channels=cur[0], num_classes=num_classes,
      dropout_keep_prob=dropout_keep_prob))
  return layers


def AmoebaNetPipeline(variant: str = 'D', num_normal_cells: int = 6,
                      num_filters: int = 208, num_classes: int = 1000,
                      image_size: int = 224, batch_size: int = 64,
                      num_partitions: int = 1, num_micro_batches: int = 1,
                      **kwargs) -> hyperparams.Params:
  """TensorPipeLayer Params of an AmoebaNet, partitioned by FPropMeta cost.

  Args:
    variant, num_normal_cells, num_filters, num_classes, image_size: see
      `AmoebaNetLayers`.
    batch_size: mini-batch size (for the cost model's shapes).
    num_partitions: K.
    num_micro_batches: T.
    **kwargs: other `AmoebaNetLayers` arguments (small_stem, in_channels,
      drop_path_keep_prob, dropout_keep_prob, aux_head, ...) and
      TensorPipeLayer Params (devices, recompute, ...).
  """
  layer_keys = ('in_channels', 'small_stem', 'stem_filters',
                'drop_path_keep_prob', 'dropout_keep_prob', 'aux_head',
                'aux_scaling')
  layer_kwargs = {k: kwargs.pop(k) for k in layer_keys if k in kwargs}
  in_channels = layer_kwargs.get('in_channels', 3)
  layers = AmoebaNetLayers(variant, num_normal_cells, num_filters,
                           num_classes, image_size, **layer_kwargs)
  return pipeline.TensorPipeLayer.Params().Set(
      name='AmoebaNet', layers=layers, num_partitions=num_partitions,
      num_micro_batches=num_micro_batches,
      input_shapes=[[batch_size, image_size, image_size, in_channels]],
      **kwargs)
