"""Fashion-MNIST experiments: a small ResNet, a small AmoebaNet-D and a Keras
CNN, pipelined.

Data: Debian's `dataset-fashion-mnist`, prepared offline as TFDS
`fashion_mnist` by `bash tools/prepare_data.sh`. The default experiment of the
README is `image.fashion_mnist.ResNet4x8`: a small ResNet with batch norm on
K=4 partitions (4 logical CPU devices without an accelerator) and T=8
micro-batches. The `...K1` variants run the same model unpipelined (K=1,
same T) for comparison. `KerasCnn4x8` is a model written in Keras
(models/keras_models.py), pipelined through tensorpipe/keras_params.py;
`KerasResNet4x8` a functional Keras model (residual blocks) cut by
tensorpipe/keras_graph.py.

  python -m tools.trainer --model=image.fashion_mnist.ResNet4x8 \
      --logdir=/tmp/fmnist
"""

from models import resnet
from tensorpipe import base_experiment
from tensorpipe import hyperparams
from tensorpipe import lr_schedules
from tensorpipe import model_registry
from tensorpipe import optimizers
from tensorpipe import pipeline
from tensorpipe import tasks
from tensorpipe.layers import normalization

NUM_TRAIN_EXAMPLES = 60000


# Moved to models/resnet.py; kept here for code that imported it.
SmallResNetLayers = resnet.SmallResNetLayers


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
  # Batch-norm moving averages: 0.99 averages about the last 100 steps. The
  # layers' default 0.999 (Lingvo's, for runs of 100k+ steps) still held 39%
  # of the initial values after 936 steps: 62% test accuracy against 90.5%
  # with statistics recomputed on training batches (the trainer warns).
  BN_DECAY = 0.99
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
    model = self.Model()
    normalization.SetBatchNormDecay(model, self.BN_DECAY)
    p = tasks.ClassificationTask.Params().Set(
        name='task', model=model, num_classes=10,
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
        layers=resnet.SmallResNetLayers(self.FILTERS, self.BLOCKS_PER_STAGE),
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


@model_registry.RegisterSingleTaskModel
class KerasCnn4x8(_FashionMnistBase):
  """A CNN written in Keras (models/keras_models.py), K=4, T=8.

  The Params route of the Keras front door (tensorpipe/keras_params.py)
  makes one KerasLayer per Keras layer, each holding its layer's config,
  split into K partitions by the layers' FLOPs. The same model trains with model.fit in
  tools/keras_fit.py.
  """

  FILTERS = 16
  HIDDEN_DIM = 128
  DROPOUT_RATE = 0.25

  def Model(self):
    from models import keras_models  # pylint: disable=g-import-not-at-top
    from tensorpipe import keras_params  # pylint: disable=g-import-not-at-top
    # A function: the Sequential is built for its configs only (no
    # weights, no TensorFlow op before the trainer sets up devices).
    return keras_params.PipelineParams(
        lambda: keras_models.FashionMnistCnn(self.FILTERS, self.HIDDEN_DIM,
                                             self.DROPOUT_RATE),
        num_partitions=self.NUM_PARTITIONS,
        num_micro_batches=self.NUM_MICRO_BATCHES, batch_size=self.BATCH_SIZE)


@model_registry.RegisterSingleTaskModel
class KerasResNet4x8(_FashionMnistBase):
  """A functional Keras ResNet (models/keras_models.py), K=4, T=8.

  A graph with a skip per block: tensorpipe/keras_graph.py cuts its layer
  calls into K partitions by FLOPs and sends each cut's skip tensor along.
  """

  FILTERS = 16
  BLOCKS = 2

  def Model(self):
    from models import keras_models  # pylint: disable=g-import-not-at-top
    from tensorpipe import keras_params  # pylint: disable=g-import-not-at-top
    return keras_params.PipelineParams(
        lambda: keras_models.FashionMnistResNet(self.FILTERS, self.BLOCKS),
        num_partitions=self.NUM_PARTITIONS,
        num_micro_batches=self.NUM_MICRO_BATCHES, batch_size=self.BATCH_SIZE)
