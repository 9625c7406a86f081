"""The paper's consistency model (16 3x3 convs) on synthetic images.

GPipe (Huang et al. 2018, supplement figure 1): the loss and gradients of a
stack of 16 single-channel 3x3 convolutions are the same for any number of
partitions K. Here the stack, a flatten and a softmax layer are trained on
synthetic 8x8 images, so K=1 and K=4 runs can be compared step by step.
"""

from tensorpipe import base_experiment
from tensorpipe import lr_schedules
from tensorpipe import model_registry
from tensorpipe import optimizers
from tensorpipe import pipeline
from tensorpipe import synthetic_input
from tensorpipe import tasks
from tensorpipe.layers import linear


@model_registry.RegisterSingleTaskModel
class Consistency4x8(base_experiment.BaseExperiment):
  """16 conv layers 3x3x1x1 + FC softmax, K=4, T=8, on synthetic 8x8 images."""

  NUM_LAYERS = 16
  NUM_PARTITIONS = 4
  NUM_MICRO_BATCHES = 8
  BATCH_SIZE = 16
  IMAGE_SIZE = 8
  NUM_CLASSES = 4
  LEARNING_RATE = 0.05
  MAX_STEPS = 50

  def Train(self):
    return synthetic_input.SyntheticImageInput.Params().Set(
        name='train', split='train', batch_size=self.BATCH_SIZE,
        image_shape=(self.IMAGE_SIZE, self.IMAGE_SIZE, 1),
        num_classes=self.NUM_CLASSES, num_examples=1024, shuffle_buffer=256)

  def Test(self):
    return self.Train().Set(name='test', split='test', num_examples=256)

  def Task(self):
    from models import consistency_cnn  # pylint: disable=g-import-not-at-top
    layers = consistency_cnn.ConsistencyLayers(self.NUM_LAYERS) + [
        linear.FlattenLayer.Params().Set(name='flatten'),
        linear.FCLayer.Params().Set(
            name='logits', input_dim=self.IMAGE_SIZE * self.IMAGE_SIZE,
            output_dim=self.NUM_CLASSES, activation='NONE')]
    model = pipeline.TensorPipeLayer.Params().Set(
        name='TensorPipe', layers=layers,
        num_partitions=self.NUM_PARTITIONS,
        num_micro_batches=self.NUM_MICRO_BATCHES,
        input_shapes=[[self.BATCH_SIZE, self.IMAGE_SIZE, self.IMAGE_SIZE, 1]])
    p = tasks.ClassificationTask.Params().Set(
        name='task', model=model, num_classes=self.NUM_CLASSES)
    tp = p.train
    tp.optimizer = optimizers.SGD.Params().Set(momentum=0.9)
    tp.lr_schedule = lr_schedules.Constant.Params().Set(
        value=self.LEARNING_RATE)
    tp.max_steps = self.MAX_STEPS
    tp.save_interval_steps = 10
    tp.summary_interval_steps = 10
    tp.log_interval_steps = 10
    tp.eval_steps = 4
    return p


@model_registry.RegisterSingleTaskModel
class Consistency1x8(Consistency4x8):
  """The same with one partition (no pipelining), for comparison."""
  NUM_PARTITIONS = 1


# Keys of the names before the <Model><K>x<T> scheme (users type them).
model_registry.RegisterAlias('Consistency16', Consistency4x8)
model_registry.RegisterAlias('Consistency16K1', Consistency1x8)
