"""CIFAR-100 experiments (GPipe supplement: learning rate 0.0125, weight decay 4e-5)."""

from params.image import base_image
from tensorpipe import model_registry


@model_registry.RegisterSingleTaskModel
class AmoebaNetB4x8(base_image.AmoebaNetExperiment):
  """AmoebaNet-B fine-tuning recipe: SGD momentum 0.9, lr 0.0125, wd 4e-5; K=4, T=8."""

  INPUT_CLASS_NAME = 'Cifar100Input'
  NUM_TRAIN_EXAMPLES = 50000
  NUM_CLASSES = 100
  LEARNING_RATE = 0.0125
  WEIGHT_DECAY = 4e-5
  IMAGE_SIZE = 32
  SMALL_STEM = True


# The key of the name before the <Model><K>x<T> scheme (users type it).
model_registry.RegisterAlias('AmoebaNetB_4x8', AmoebaNetB4x8)
