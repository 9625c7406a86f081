"""TensorPipe inputs: TFDS-backed image, translation and language-model data.

Input classes (BaseInput subclasses) are exported here; the TFDS builders
(fashion_mnist_builder, bible_builder, brown_builder) import
tensorflow_datasets and are loaded only when data is prepared or read.
Prepare the offline data sets with `bash tools/prepare_data.sh`.
"""

from tensorpipe.inputs.image_inputs import CaltechBirdsInput
from tensorpipe.inputs.image_inputs import Cifar100Input
from tensorpipe.inputs.image_inputs import Cifar10Input
from tensorpipe.inputs.image_inputs import FashionMnistInput
from tensorpipe.inputs.image_inputs import Food101Input
from tensorpipe.inputs.image_inputs import ImageNetInput
from tensorpipe.inputs.image_inputs import ImageTfdsInput
from tensorpipe.inputs.image_inputs import OxfordPetsInput
from tensorpipe.inputs.image_inputs import StanfordCarsInput
from tensorpipe.inputs.lm_input import BrownLmInput
from tensorpipe.inputs.sampling import TemperatureSamplingWeights
from tensorpipe.inputs.tfds_utils import DataNotPreparedError
from tensorpipe.inputs.tfds_utils import DefaultDataDir
from tensorpipe.inputs.translation_input import BibleTranslationInput
