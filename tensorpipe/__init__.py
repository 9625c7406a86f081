"""TensorPipe: GPipe pipeline parallelism for TensorFlow 2, Lingvo style.

Importing the package defines no flags and runs no TensorFlow op.
"""

from tensorpipe.base_layer import BaseLayer
from tensorpipe.base_layer import WeightInit
from tensorpipe.base_layer import WeightParams
from tensorpipe.devices import SetNumLogicalCpuDevices
from tensorpipe.hyperparams import InstantiableParams
from tensorpipe.hyperparams import Params
from tensorpipe.nested_map import NestedMap
from tensorpipe.pipeline import TensorPipeLayer
from tensorpipe.py_utils import EvalMode
from tensorpipe.py_utils import StepSeed
from tensorpipe.py_utils import TrainingMode
from tensorpipe import layers
