"""FGVC Aircraft experiments (GPipe supplement: learning rate 0.075, weight decay 4e-8)."""

from params.image import base_image
from tensorpipe import model_registry


@model_registry.RegisterSingleTaskModel
class AmoebaNetB4x8(base_image.AmoebaNetExperiment):
  """AmoebaNet-B fine-tuning recipe: SGD momentum 0.9, lr 0.075, wd 4e-8; K=4, T=8."""

  # Not in tensorflow-datasets 4.9.10: needs a user-written TFDS builder.
  TFDS_NAME = 'fgvc_aircraft'
  NUM_TRAIN_EXAMPLES = 6667
  NUM_CLASSES = 100
  LEARNING_RATE = 0.075
  WEIGHT_DECAY = 4e-8


# The key of the name before the <Model><K>x<T> scheme (users type it).
model_registry.RegisterAlias('AmoebaNetB_4x8', AmoebaNetB4x8)
