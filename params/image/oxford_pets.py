"""Oxford-IIIT Pets experiments (GPipe supplement: learning rate 0.00375, weight decay 4e-6)."""

from params.image import base_image
from tensorpipe import model_registry


@model_registry.RegisterSingleTaskModel
class AmoebaNetB4x8(base_image.AmoebaNetExperiment):
  """AmoebaNet-B fine-tuning recipe: SGD momentum 0.9, lr 0.00375, wd 4e-6; K=4, T=8."""

  INPUT_CLASS_NAME = 'OxfordPetsInput'
  NUM_TRAIN_EXAMPLES = 3680
  NUM_CLASSES = 37
  LEARNING_RATE = 0.00375
  WEIGHT_DECAY = 4e-6


# The key of the name before the <Model><K>x<T> scheme (users type it).
model_registry.RegisterAlias('AmoebaNetB_4x8', AmoebaNetB4x8)
