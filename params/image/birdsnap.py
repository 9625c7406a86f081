"""Birdsnap experiments (GPipe supplement: learning rate 0.15, weight decay 4e-6)."""

from params.image import base_image
from tensorpipe import model_registry


@model_registry.RegisterSingleTaskModel
class AmoebaNetB4x8(base_image.AmoebaNetExperiment):
  """AmoebaNet-B fine-tuning recipe: SGD momentum 0.9, lr 0.15, wd 4e-6; K=4, T=8."""

  # Not in tensorflow-datasets 4.9.10: needs a user-written TFDS builder.
  TFDS_NAME = 'birdsnap'
  NUM_TRAIN_EXAMPLES = 47386
  NUM_CLASSES = 500
  LEARNING_RATE = 0.15
  WEIGHT_DECAY = 4e-6


# The key of the name before the <Model><K>x<T> scheme (users type it).
model_registry.RegisterAlias('AmoebaNetB_4x8', AmoebaNetB4x8)
