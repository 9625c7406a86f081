"""ResNet-50 / ResNet-101 (He et al. 2016), bottleneck v1.5, as a layer list.

(Also `SmallResNetLayers`, basic blocks for 28x28 images: the Fashion-MNIST
experiments' model.)

v1.5 puts the stride of a downsampling block on its 3x3 convolution (not on
the first 1x1), as torchvision and the MLPerf reference do. The model is a flat
list of layer Params so that `TensorPipeLayer` can cut it between any two
blocks:

  stem:   conv 7x7/2 (64) + BN + ReLU, max pool 3x3/2
  blocks: one ParallelLayer(merge='sum', activation='RELU') per bottleneck,
          branches [shortcut, 1x1 -> 3x3 (stride) -> 1x1 (x4) with BN]
          shortcut = 1x1 conv (stride) + BN where the shape changes, else
          the identity
  head:   global average pool, FC logits

Parameter counts at 1000 classes (trainable weights: convolutions without
bias, BN gamma and beta, FC weight and bias): ResNet-50 25,557,032 and
ResNet-101 44,549,160, as in torchvision. `FPropMeta` also counts the BN
moving mean and variance (non-trainable); `model_utils.NumTrainableParams`
subtracts them.
"""

from typing import List, Sequence

from tensorpipe import checks
from tensorpipe import hyperparams
from tensorpipe import pipeline
from tensorpipe.layers import composite
from tensorpipe.layers import conv
from tensorpipe.layers import linear
from tensorpipe.layers import pooling

# Bottleneck blocks per stage.
_BLOCKS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
_EXPANSION = 4


def _Conv(name: str, k: int, cin: int, cout: int, stride: int = 1,
          activation: str = 'RELU', gamma_init: float = 1.0):
  p = conv.Conv2DLayer.Params().Set(
      name=name, filter_shape=(k, k, cin, cout), filter_stride=(stride, stride),
      batch_norm=True, activation=activation)
  p.bn_tpl.gamma_init = gamma_init
  return p


def BottleneckBlock(name: str, cin: int, width: int, stride: int,
                    zero_init_residual: bool = False) -> hyperparams.Params:
  """One bottleneck block: relu(shortcut(x) + 1x1 -> 3x3/stride -> 1x1(x4)).

  Args:
    name: layer name.
    cin: input channels.
    width: channels of the 1x1 and 3x3 convolutions; the output has
      4 * width channels.
    stride: stride of the 3x3 convolution (and of the projection shortcut).
    zero_init_residual: start the last BN's gamma at 0 (block = identity).

  Returns:
    ParallelLayer Params.
  """
  cout = _EXPANSION * width
  if stride != 1 or cin != cout:
    shortcut = _Conv('shortcut', 1, cin, cout, stride, activation='NONE')
  else:
    shortcut = composite.IdentityLayer.Params().Set(name='shortcut')
  branch = composite.SequentialLayer.Params().Set(name='branch', sub=[
      _Conv('conv1', 1, cin, width),
      _Conv('conv2', 3, width, width, stride),
      _Conv('conv3', 1, width, cout, activation='NONE',
            gamma_init=0.0 if zero_init_residual else 1.0),
  ])
  return composite.ParallelLayer.Params().Set(
      name=name, sub=[shortcut, branch], merge='sum', activation='RELU')


def BasicBlock(name: str, channels: int) -> hyperparams.Params:
  """relu(x + conv3x3-BN-relu-conv3x3-BN(x)), a ResNet basic block.

  Args:
    name: layer name.
    channels: input = output channels.

  Returns:
    ParallelLayer Params.
  """
  return composite.ParallelLayer.Params().Set(
      name=name, merge='sum', activation='RELU', sub=[
          composite.IdentityLayer.Params().Set(name='shortcut'),
          composite.SequentialLayer.Params().Set(name='branch', sub=[
              _Conv('conv_a', 3, channels, channels),
              _Conv('conv_b', 3, channels, channels, activation='NONE')])])


def SmallResNetLayers(filters: int = 32, blocks_per_stage: int = 1,
                      num_classes: int = 10,
                      in_channels: int = 1) -> List[hyperparams.Params]:
  """A small ResNet for 28x28 images (Fashion-MNIST) as a flat layer list.

  stem conv 3x3 (F) | stage 1 at 28x28 (F) | conv 3x3/2 (2F) | stage 2 at
  14x14 | conv 3x3/2 (4F) | stage 3 at 7x7 | global average pool | FC.
  Each stage has `blocks_per_stage` basic blocks; every conv has BN.

  Raises:
    ValueError: a size that is not a positive int.
  """
  checks.CheckPositiveInts('SmallResNet', filters=filters,
                           blocks_per_stage=blocks_per_stage,
                           num_classes=num_classes, in_channels=in_channels)
  layers = [_Conv('stem', 3, in_channels, filters)]
  channels = filters
  for stage in range(3):
    if stage:
      layers.append(_Conv(f'down{stage}', 3, channels, 2 * channels,
                          stride=2))
      channels *= 2
    for b in range(blocks_per_stage):
      layers.append(BasicBlock(f'block{stage}_{b}', channels))
  layers += [
      pooling.GlobalPoolingLayer.Params().Set(name='gap', pooling_type='AVG'),
      linear.FCLayer.Params().Set(name='logits', input_dim=channels,
                                  output_dim=num_classes, activation='NONE')]
  return layers


def ResNetLayers(depth: int = 50, num_classes: int = 1000, width: int = 64,
                 input_shape: Sequence[int] = (None, 224, 224, 3),
                 small_stem: bool = False,
                 zero_init_residual: bool = False) -> List[hyperparams.Params]:
  """ResNet layer Params, one per stem layer, bottleneck block and head layer.

  Args:
    depth: 50 or 101 (or 152).
    num_classes: size of the logits.
    width: channels of the stem and the first stage's 3x3 convolutions (64 in
      the paper); stage s uses width * 2**s, its output 4x that.
    input_shape: [batch, height, width, channels] of the images; only the
      channels are used (the batch and spatial sizes may be None).
    small_stem: for 32x32 / 28x28 images: a 3x3/1 stem convolution and no max
      pool instead of 7x7/2 + max pool 3x3/2.
    zero_init_residual: start each block's last BN gamma at 0.

  Returns:
    A list of layer Params: [stem conv, (max pool), blocks..., pool, fc].
    Input [batch, h, w, c]; output logits [batch, num_classes].

  Raises:
    ValueError: for an unknown depth or bad sizes.
  """
  if depth not in _BLOCKS:
    raise ValueError(f'ResNet depth={depth!r} is not supported; use one of '
                     f'{sorted(_BLOCKS)}')
  checks.CheckPositiveInts('ResNet', num_classes=num_classes, width=width)
  if len(input_shape) != 4 or not isinstance(input_shape[3], int):
    raise ValueError(f'input_shape={input_shape!r} must be [batch, height, '
                     'width, channels] with the channels known')
  cin = input_shape[3]
  if small_stem:
    layers = [_Conv('stem', 3, cin, width)]
  else:
    layers = [_Conv('stem', 7, cin, width, stride=2),
              pooling.PoolingLayer.Params().Set(
                  name='stem_pool', window_shape=(3, 3), window_stride=(2, 2),
                  pooling_type='MAX', padding='SAME')]
  channels = width
  for stage, num_blocks in enumerate(_BLOCKS[depth]):
    stage_width = width * 2**stage
    for b in range(num_blocks):
      stride = 2 if (b == 0 and stage > 0) else 1
      layers.append(BottleneckBlock(f'stage{stage + 1}_block{b + 1}', channels,
                                    stage_width, stride, zero_init_residual))
      channels = _EXPANSION * stage_width
  layers.append(pooling.GlobalPoolingLayer.Params().Set(
      name='global_pool', pooling_type='AVG'))
  layers.append(linear.FCLayer.Params().Set(
      name='logits', input_dim=channels, output_dim=num_classes,
      activation='NONE'))
  return layers


def ResNetPipeline(depth: int = 50, num_classes: int = 1000,
                   input_shape: Sequence[int] = (32, 224, 224, 3),
                   num_partitions: int = 1, num_micro_batches: int = 1,
                   width: int = 64, small_stem: bool = False,
                   **pipeline_kwargs) -> hyperparams.Params:
  """TensorPipeLayer Params of a ResNet, partitioned by FPropMeta cost.

  Args:
    depth, num_classes, width, small_stem: see `ResNetLayers`.
    input_shape: [batch, height, width, channels] of a mini-batch (fully
      defined: automatic partitioning needs the costs).
    num_partitions: K.
    num_micro_batches: T.
    **pipeline_kwargs: other TensorPipeLayer Params (devices, recompute ...).
  """
  return pipeline.TensorPipeLayer.Params().Set(
      name='ResNet', layers=ResNetLayers(depth, num_classes, width,
                                         input_shape, small_stem),
      num_partitions=num_partitions, num_micro_batches=num_micro_batches,
      input_shapes=[list(input_shape)], **pipeline_kwargs)
