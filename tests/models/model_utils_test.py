"""Tests of models/model_utils.py against the variables layers create."""

import numpy as np
import tensorflow as tf

from models import model_utils
from tensorpipe import base_layer
from tensorpipe.layers import composite
from tensorpipe.layers import conv
from tensorpipe.layers import linear
from tensorpipe.layers import normalization


class _PairOfConvs(base_layer.BaseLayer):
  """Builds two BN convs from its own knobs (children not held as Params)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('channels', 4, 'Channels of both convolutions.')
    return p

  @classmethod
  def SubLayerParams(cls, p):
    return [conv.Conv2DLayer.Params().Set(
        name=f'c{i}', filter_shape=(1, 1, p.channels, p.channels),
        batch_norm=True) for i in range(2)]

  def __init__(self, params):
    super().__init__(params)
    self.CreateChildren('convs', self.SubLayerParams(self.params))

  def FProp(self, theta, x):
    for layer, t in zip(self.children.convs, theta.convs):
      x = layer.FProp(t, x)
    return x

  @classmethod
  def FPropMeta(cls, p, x_shape):
    metas, out = composite.ChainFPropMeta(cls.SubLayerParams(p), (x_shape,))
    return base_layer.FPropMetaResult(sum(m.flops for m in metas), out,
                                      sum(m.num_params for m in metas))


def _Layers():
  return [
      conv.Conv2DLayer.Params().Set(name='bn_conv', filter_shape=(3, 3, 2, 4),
                                    batch_norm=True),
      conv.Conv2DLayer.Params().Set(name='plain_conv',
                                    filter_shape=(3, 3, 4, 4), bias=True),
      composite.ParallelLayer.Params().Set(name='res', sub=[
          composite.IdentityLayer.Params().Set(name='id'),
          composite.SequentialLayer.Params().Set(name='seq', sub=[
              normalization.BatchNormLayer.Params().Set(name='bn', dim=4),
              _PairOfConvs.Params().Set(name='pair')])]),
      linear.FlattenLayer.Params().Set(name='flat'),
      linear.FCLayer.Params().Set(name='fc', input_dim=4 * 5 * 5,
                                  output_dim=3),
  ]


class ModelUtilsTest(tf.test.TestCase):

  def testBatchNormChannelsOfEachKindOfLayer(self):
    layers = _Layers()
    self.assertEqual([model_utils.NumBatchNormChannels(p) for p in layers],
                     [4, 0, 4 + 2 * 4, 0, 0])

  def testCountsEqualTheBuiltModelsVariables(self):
    layers = _Layers()
    model = composite.SequentialLayer.Params().Set(
        name='m', sub=layers).Instantiate()

    def Count(variables):
      return sum(int(np.prod(v.shape)) for v in variables)
    shape = [2, 5, 5, 2]
    self.assertEqual(model_utils.NumParams(layers, shape),
                     Count(model.variables))
    self.assertEqual(model_utils.NumTrainableParams(layers, shape),
                     Count(model.trainable_variables))
    self.assertLess(Count(model.trainable_variables), Count(model.variables))


if __name__ == '__main__':
  tf.test.main()
