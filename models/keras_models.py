"""Models written in Keras 3, pipelined through tensorpipe.keras_pipeline.

`FashionMnistCnn` is the model of the experiment
`image.fashion_mnist.KerasCnn4x8` (TensorPipe's trainer) and of
`tools/keras_fit.py` (the same model with `TensorPipeModel.fit`): a plain
`keras.Sequential`, every layer named, so that its configs, the KerasLayer
names and the checkpoint keys do not depend on what else a process built.

  28x28x1 -> [conv 3x3 (F) + BN + ReLU] x 2 -> max pool 2       14x14xF
          -> [conv 3x3 (2F) + BN + ReLU] x 2 -> max pool 2      7x7x2F
          -> flatten -> dense (H) + BN + ReLU -> dropout -> dense (10 logits)

Two convolutions per resolution spread the cost over the layers, so that
K=4 partitions balanced by FLOPs are within about 1.5x of each other.

`FashionMnistResNet` is a functional Keras model (residual blocks: a graph,
not a sequence), the model of `image.fashion_mnist.KerasResNet4x8`:
tensorpipe.keras_graph cuts it into K partitions and carries each block's
skip tensor across a cut.

  28x28x1 -> conv 3x3 (F) + BN + ReLU                             28x28xF
          -> [block (F)] x B -> block (2F, stride 2)              14x14x2F
          -> [block (2F)] x (B - 1) -> global average pool -> dense (10)
  block(x) = ReLU(BN(conv(ReLU(BN(conv(x))))) + shortcut(x))
"""

import keras


def FashionMnistCnn(filters: int = 16, hidden_dim: int = 128,
                    dropout_rate: float = 0.25,
                    num_classes: int = 10) -> keras.Sequential:
  """A small CNN for 28x28x1 images (Fashion-MNIST), as a keras.Sequential.

  Args:
    filters: F, the channels of the first convolution (2F in the second).
    hidden_dim: H, the width of the hidden dense layer.
    dropout_rate: Keras' dropout rate before the logits (0 disables it).
    num_classes: the number of logits.

  Returns:
    The built Sequential (weights initialised by Keras).
  """
  layers = keras.layers

  def ConvBnRelu(name, channels):
    return [layers.Conv2D(channels, 3, padding='same', use_bias=False,
                          name=f'conv{name}'),
            layers.BatchNormalization(name=f'bn{name}'),
            layers.ReLU(name=f'relu{name}')]
  return keras.Sequential(
      [keras.Input((28, 28, 1))]
      + ConvBnRelu('1', filters) + ConvBnRelu('2', filters)
      + [layers.MaxPooling2D(2, name='pool1')]
      + ConvBnRelu('3', 2 * filters) + ConvBnRelu('4', 2 * filters)
      + [layers.MaxPooling2D(2, name='pool2'),
         layers.Flatten(name='flatten'),
         layers.Dense(hidden_dim, use_bias=False, name='fc'),
         layers.BatchNormalization(name='bn5'),
         layers.ReLU(name='relu5'),
         layers.Dropout(dropout_rate, name='dropout'),
         layers.Dense(num_classes, name='logits')],
      name='fashion_mnist_cnn')


def FashionMnistResNet(filters: int = 16, blocks: int = 2,
                       num_classes: int = 10) -> keras.Model:
  """A small functional ResNet for 28x28x1 images (Fashion-MNIST).

  Args:
    filters: F, the channels of the stem and first stage (2F in the second).
    blocks: B, residual blocks per stage.
    num_classes: the number of logits.

  Returns:
    The built functional keras.Model (weights initialised by Keras).
  """
  layers = keras.layers

  def ConvBn(x, name, channels, stride=1):
    x = layers.Conv2D(channels, 3, strides=stride, padding='same',
                      use_bias=False, name=f'{name}_conv')(x)
    return layers.BatchNormalization(name=f'{name}_bn')(x)

  def Block(x, name, channels, stride=1):
    shortcut = x
    if stride != 1 or x.shape[-1] != channels:
      shortcut = layers.Conv2D(channels, 1, strides=stride, use_bias=False,
                               name=f'{name}_proj')(x)
    y = layers.ReLU(name=f'{name}_relu1')(ConvBn(x, f'{name}_a', channels,
                                                 stride))
    y = ConvBn(y, f'{name}_b', channels)
    return layers.ReLU(name=f'{name}_out')(
        layers.Add(name=f'{name}_add')([y, shortcut]))

  inputs = keras.Input((28, 28, 1), name='image')
  x = layers.ReLU(name='stem_relu')(ConvBn(inputs, 'stem', filters))
  for i in range(blocks):
    x = Block(x, f'block1_{i}', filters)
  x = Block(x, 'block2_0', 2 * filters, stride=2)
  for i in range(1, blocks):
    x = Block(x, f'block2_{i}', 2 * filters)
  x = layers.GlobalAveragePooling2D(name='gap')(x)
  outputs = layers.Dense(num_classes, name='logits')(x)
  return keras.Model(inputs, outputs, name='fashion_mnist_resnet')
