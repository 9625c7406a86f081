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
