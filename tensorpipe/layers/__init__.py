"""TensorPipe layers, one module per family; the layer classes re-exported."""

from tensorpipe.layers import activations
from tensorpipe.layers import composite
from tensorpipe.layers import conv
from tensorpipe.layers import dropout
from tensorpipe.layers import linear
from tensorpipe.layers import losses
from tensorpipe.layers import normalization
from tensorpipe.layers import pooling
from tensorpipe.layers.activations import ActivationLayer
from tensorpipe.layers.activations import GetActivation
from tensorpipe.layers.composite import IdentityLayer
from tensorpipe.layers.composite import ParallelLayer
from tensorpipe.layers.composite import SequentialLayer
from tensorpipe.layers.conv import Conv2DLayer
from tensorpipe.layers.conv import DepthwiseConv2DLayer
from tensorpipe.layers.conv import SeparableConv2DLayer
from tensorpipe.layers.dropout import DropoutLayer
from tensorpipe.layers.linear import FCLayer
from tensorpipe.layers.linear import FlattenLayer
from tensorpipe.layers.losses import SoftmaxCrossEntropyLoss
from tensorpipe.layers.losses import SoftmaxLayer
from tensorpipe.layers.losses import TopKAccuracy
from tensorpipe.layers.normalization import BatchNormLayer
from tensorpipe.layers.normalization import LayerNormLayer
from tensorpipe.layers.pooling import GlobalPoolingLayer
from tensorpipe.layers.pooling import PoolingLayer
