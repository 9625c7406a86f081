"""Fashion-MNIST experiments: a small ResNet and a small AmoebaNet-D, pipelined.

Data: Debian's `dataset-fashion-mnist`, prepared offline as TFDS
`fashion_mnist` by `bash tools/prepare_data.sh`. The default experiment of the
README is `image.fashion_mnist.ResNet4x8`: a small ResNet with batch norm on
K=4 partitions (4 logical CPU devices without an accelerator) and T=8
micro-batches. The `...K1` variants run the same model unpipelined (K=1,
same T) for comparison.

  python -m tools.trainer --model=image.fashion_mnist.ResNet4x8 \
      --logdir=/tmp/fmnist
"""

from typing import List

from tensorpipe import base_experiment
from tensorpipe import hyperparams
from tensorpipe import lr_schedules
from tensorpipe import model_registry
from tensorpipe import optimizers
from tensorpipe import pipeline
from tensorpipe import tasks
from tensorpipe.layers import composite
from tensorpipe.layers import conv
from tensorpipe.layers import linear
from tensorpipe.layers import pooling

NUM_TRAIN_EXAMPLES = 60000


def _Conv(name, cin, cout, stride=1, activation='RELU'):
  return conv.Conv2DLayer.Params().Set(
      name=name, filter_shape=(3, 3, cin, cout),
      filter_stride=(stride, stride), batch_norm=True, activation=activation)


def _BasicBlock(name: str, channels: int) -> hyperparams.Params:
  """relu(x + conv3x3-BN-relu-conv3x3-BN(x)), a ResNet basic block."""
  return composite.ParallelLayer.Params().Set(
      name=name, merge='sum', activation='RELU', sub=[
          composite.IdentityLayer.Params().Set(name='shortcut'),
          composite.SequentialLayer.Params().Set(name='branch', sub=[
              _Conv('conv_a', channels, channels),
              _Conv('conv_b', channels, channels, activation='NONE')])])


def SmallResNetLayers(filters: int = 32, blocks_per_stage: int = 1,
                      num_classes: int = 10,
                      in_channels: int = 1) -> List[hyperparams.Params]:
  """A small ResNet for 28x28 images as a flat list of layer Params.

  stem conv 3x3 (F) | stage 1 at 28x28 (F) | conv 3x3/2 (2F) | stage 2 at
  14x14 | conv 3x3/2 (4F) | stage 3 at 7x7 | global average pool | FC.
  Each stage has `blocks_per_stage` basic blocks; every conv has BN.
  """
  layers = [_Conv('stem', in_channels, filters)]
  channels = filters
  for stage in range(3):
    if stage:
      layers.append(_Conv(f'down{stage}', channels, 2 * channels, stride=2))
      channels *= 2
    for b in range(blocks_per_stage):
      layers.append(_BasicBlock(f'block{stage}_{b}', channels))
  layers += [
      pooling.GlobalPoolingLayer.Params().Set(name='gap', pooling_type='AVG'),
      linear.FCLayer.Params().Set(name='logits', input_dim=channels,
                                  output_dim=num_classes, activation='NONE')]
  return layers


class _FashionMnistBase(base_experiment.BaseExperiment):
  """Shared input and training recipe; subclasses give the model."""

  BATCH_SIZE = 128
  EVAL_BATCH_SIZE = 400      # divides the 10000 test images and T=8
  NUM_PARTITIONS = 4
  NUM_MICRO_BATCHES = 8
  NUM_EPOCHS = 4            # ~1870 steps: fits 20 minutes on 2 CPU cores
  LEARNING_RATE = 0.1       # peak of SGD with momentum
  WARMUP_STEPS = 100
  WEIGHT_DECAY = 5e-5
  LABEL_SMOOTHING = 0.0
  DATA_DIR = None           # None: tfds_utils' default (data/tfds)

  @property
  def steps_per_epoch(self) -> int:
    return NUM_TRAIN_EXAMPLES // self.BATCH_SIZE

  def Train(self):
    from tensorpipe.inputs import image_inputs  # pylint: disable=g-import-not-at-top
    return image_inputs.FashionMnistInput.Params().Set(
        name='train', split='train', batch_size=self.BATCH_SIZE,
        data_dir=self.DATA_DIR)

  def Test(self):
    from tensorpipe.inputs import image_inputs  # pylint: disable=g-import-not-at-top
    return image_inputs.FashionMnistInput.Params().Set(
        name='test', split='test', batch_size=self.EVAL_BATCH_SIZE,
        data_dir=self.DATA_DIR)

  def Model(self) -> hyperparams.Params:
    raise NotImplementedError

  def Task(self):
    p = tasks.ClassificationTask.Params().Set(
        name='task', model=self.Model(), num_classes=10,
        label_smoothing=self.LABEL_SMOOTHING)
    tp = p.train
    tp.optimizer = optimizers.SGD.Params().Set(momentum=0.9, nesterov=True)
    tp.lr_schedule = lr_schedules.WarmupCosineDecay.Params().Set(
        peak=self.LEARNING_RATE, warmup_steps=self.WARMUP_STEPS,
        total_steps=self.NUM_EPOCHS * self.steps_per_epoch)
    tp.l2_regularizer_weight = self.WEIGHT_DECAY
    tp.max_steps = self.NUM_EPOCHS * self.steps_per_epoch
    tp.save_interval_steps = 200
    tp.summary_interval_steps = 20
    tp.log_interval_steps = 50
    return p


@model_registry.RegisterSingleTaskModel
class ResNet4x8(_FashionMnistBase):
  """Small ResNet (F=32, one block per stage), K=4, T=8: the default."""

  FILTERS = 32
  BLOCKS_PER_STAGE = 1

  def Model(self):
    return pipeline.TensorPipeLayer.Params().Set(
        name='TensorPipe',
        layers=SmallResNetLayers(self.FILTERS, self.BLOCKS_PER_STAGE),
        num_partitions=self.NUM_PARTITIONS,
        num_micro_batches=self.NUM_MICRO_BATCHES,
        input_shapes=[[self.BATCH_SIZE, 28, 28, 1]])


@model_registry.RegisterSingleTaskModel
class ResNet1x8(ResNet4x8):
  """ResNet4x8 on one partition (K=1, T=8), for comparison."""
  NUM_PARTITIONS = 1


@model_registry.RegisterSingleTaskModel
class AmoebaNetD4x8(_FashionMnistBase):
  """A small AmoebaNet-D (L=1 normal cell per stage, F=16), K=4, T=8."""

  NUM_NORMAL_CELLS = 1
  NUM_FILTERS = 16
  AUX_HEAD = False
  DROP_PATH_KEEP_PROB = 1.0
  DROPOUT_KEEP_PROB = 1.0
  LEARNING_RATE = 0.05

  def Model(self):
    from models import amoebanet  # pylint: disable=g-import-not-at-top
    return amoebanet.AmoebaNetPipeline(
        variant='D', num_normal_cells=self.NUM_NORMAL_CELLS,
        num_filters=self.NUM_FILTERS, num_classes=10, image_size=28,
        batch_size=self.BATCH_SIZE, num_partitions=self.NUM_PARTITIONS,
        num_micro_batches=self.NUM_MICRO_BATCHES, in_channels=1,
        small_stem=True, aux_head=self.AUX_HEAD,
        drop_path_keep_prob=self.DROP_PATH_KEEP_PROB,
        dropout_keep_prob=self.DROPOUT_KEEP_PROB)


@model_registry.RegisterSingleTaskModel
class AmoebaNetD1x8(AmoebaNetD4x8):
  """AmoebaNetD4x8 on one partition (K=1, T=8), for comparison."""
  NUM_PARTITIONS = 1
