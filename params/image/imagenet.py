"""ImageNet (ILSVRC-2012) experiments with the paper's AmoebaNet recipe.

RMSProp (decay 0.9, epsilon 0.1), learning rate 0.00125 x batch size decayed
by 0.97 every 3 epochs, label smoothing 0.1, auxiliary head weight 0.4,
weight decay 4e-5 (GPipe, Huang et al. 2018, section 3).
"""

from params.image import base_image
from tensorpipe import model_registry


@model_registry.RegisterSingleTaskModel
class AmoebaNetB4x8(base_image.AmoebaNetExperiment):
  """AmoebaNet-B (6, 256) at 224x224, K=4, T=8."""

  INPUT_CLASS_NAME = 'ImageNetInput'
  NUM_TRAIN_EXAMPLES = 1281167
  NUM_CLASSES = 1000
  IMAGE_SIZE = 224
  OPTIMIZER = 'rmsprop'
  WEIGHT_DECAY = 4e-5
  NUM_EPOCHS = 100


@model_registry.RegisterSingleTaskModel
class AmoebaNetBLarge8x32(AmoebaNetB4x8):
  """The paper's AmoebaNet-B (18, 512) at 480x480, K=8, T=32."""

  NUM_NORMAL_CELLS = 18
  NUM_FILTERS = 512
  IMAGE_SIZE = 480
  NUM_PARTITIONS = 8
  NUM_MICRO_BATCHES = 32
  BATCH_SIZE = 256


# Keys of the names before the <Model><K>x<T> scheme (users type them).
model_registry.RegisterAlias('AmoebaNetB_4x8', AmoebaNetB4x8)
model_registry.RegisterAlias('AmoebaNetB_18x512_8x32',
                             AmoebaNetBLarge8x32)
