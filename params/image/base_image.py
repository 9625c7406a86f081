"""Shared recipe of the paper's image experiments (not registered itself).

GPipe (Huang et al. 2018): AmoebaNet trained on ImageNet with RMSProp
(decay 0.9, epsilon 0.1), learning rate 0.00125 x batch size decayed by 0.97
every 3 epochs, label smoothing 0.1, an auxiliary head with weight 0.4; and
fine-tuned on seven transfer data sets with SGD with momentum 0.9 and the
supplement's per-data-set learning rate and weight decay (see the modules
next to this one). Data: prepared TFDS data sets (tensorpipe/inputs/
image_inputs.py), read with download=False.
"""

from tensorpipe import base_experiment
from tensorpipe import lr_schedules
from tensorpipe import optimizers
from tensorpipe import tasks


class AmoebaNetExperiment(base_experiment.BaseExperiment):
  """AmoebaNet on a TFDS image data set; knobs are the class constants."""

  INPUT_CLASS_NAME = None   # name of the Input class in image_inputs
  TFDS_NAME = None          # else: the TFDS name, read by ImageTfdsInput
  NUM_TRAIN_EXAMPLES = 50000
  NUM_CLASSES = 10
  IMAGE_SIZE = 224
  BATCH_SIZE = 128
  EVAL_BATCH_SIZE = 128
  VARIANT = 'B'
  NUM_NORMAL_CELLS = 6
  NUM_FILTERS = 256
  SMALL_STEM = False
  AUX_HEAD = True
  AUX_LOSS_WEIGHT = 0.4
  DROP_PATH_KEEP_PROB = 0.7
  DROPOUT_KEEP_PROB = 0.5
  NUM_PARTITIONS = 4
  NUM_MICRO_BATCHES = 8
  LABEL_SMOOTHING = 0.1
  NUM_EPOCHS = 100
  # Optimisation: 'rmsprop' (ImageNet recipe) or 'sgd' (transfer recipe).
  OPTIMIZER = 'sgd'
  LEARNING_RATE = 0.0125
  WEIGHT_DECAY = 4e-5
  GRAD_NORM_CLIP = None
  DATA_DIR = None
  FPROP_DTYPE = None        # e.g. tf.bfloat16 activations (weights float32)

  def _InputParams(self):
    from tensorpipe.inputs import image_inputs  # pylint: disable=g-import-not-at-top
    if self.INPUT_CLASS_NAME:
      return getattr(image_inputs, self.INPUT_CLASS_NAME).Params()
    # Data sets without a TFDS builder: the input explains what is missing
    # when it is built.
    return image_inputs.ImageTfdsInput.Params().Set(
        dataset_name=self.TFDS_NAME, num_classes=self.NUM_CLASSES,
        preprocessing='imagenet', mean=(0.485, 0.456, 0.406),
        stddev=(0.229, 0.224, 0.225))

  def Train(self):
    return self._InputParams().Set(
        name='train', split='train', batch_size=self.BATCH_SIZE,
        image_size=(self.IMAGE_SIZE, self.IMAGE_SIZE), data_dir=self.DATA_DIR)

  def Test(self):
    from tensorpipe.inputs import image_inputs  # pylint: disable=g-import-not-at-top
    p = self._InputParams()
    split = image_inputs.DATASETS.get(p.dataset_name, {}).get('eval_split',
                                                               'test')
    return p.Set(name='test', split=split, batch_size=self.EVAL_BATCH_SIZE,
                 image_size=(self.IMAGE_SIZE, self.IMAGE_SIZE),
                 data_dir=self.DATA_DIR)

  def Model(self):
    from models import amoebanet  # pylint: disable=g-import-not-at-top
    return amoebanet.AmoebaNetPipeline(
        variant=self.VARIANT, num_normal_cells=self.NUM_NORMAL_CELLS,
        num_filters=self.NUM_FILTERS, num_classes=self.NUM_CLASSES,
        image_size=self.IMAGE_SIZE, batch_size=self.BATCH_SIZE,
        num_partitions=self.NUM_PARTITIONS,
        num_micro_batches=self.NUM_MICRO_BATCHES, in_channels=3,
        small_stem=self.SMALL_STEM, aux_head=self.AUX_HEAD,
        drop_path_keep_prob=self.DROP_PATH_KEEP_PROB,
        dropout_keep_prob=self.DROPOUT_KEEP_PROB)

  @property
  def steps_per_epoch(self) -> int:
    return max(1, self.NUM_TRAIN_EXAMPLES // self.BATCH_SIZE)

  def Task(self):
    p = tasks.ClassificationTask.Params().Set(
        name='task', model=self.Model(), num_classes=self.NUM_CLASSES,
        fprop_dtype=self.FPROP_DTYPE,
        label_smoothing=self.LABEL_SMOOTHING,
        aux_loss_weight=self.AUX_LOSS_WEIGHT)
    tp = p.train
    if self.OPTIMIZER == 'rmsprop':
      tp.optimizer = optimizers.RMSProp.Params().Set(decay=0.9, epsilon=0.1)
      tp.lr_schedule = lr_schedules.ExponentialDecay.Params().Set(
          base_lr_per_example=0.00125, batch_size=self.BATCH_SIZE,
          decay_rate=0.97, decay_epochs=3.0,
          steps_per_epoch=self.steps_per_epoch)
    elif self.OPTIMIZER == 'sgd':
      tp.optimizer = optimizers.SGD.Params().Set(momentum=0.9)
      tp.lr_schedule = lr_schedules.Constant.Params().Set(
          value=self.LEARNING_RATE)
    else:
      raise ValueError(f'OPTIMIZER={self.OPTIMIZER!r} must be rmsprop or sgd')
    tp.l2_regularizer_weight = self.WEIGHT_DECAY
    tp.grad_norm_clip = self.GRAD_NORM_CLIP
    tp.max_steps = self.NUM_EPOCHS * self.steps_per_epoch
    tp.save_interval_steps = 1000
    tp.summary_interval_steps = 100
    tp.log_interval_steps = 100
    return p
