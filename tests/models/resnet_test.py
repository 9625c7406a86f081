"""Tests of models/resnet.py: parameter counts, shapes, pipelining."""

import numpy as np
import tensorflow as tf

from models import model_utils
from models import resnet
from tensorpipe import py_utils
from tensorpipe import test_utils
from tensorpipe.layers import composite
from tests.models import resnet_testlib as testlib

test_utils.ConfigureTestDevices()


class ResNetParamCountTest(tf.test.TestCase):

  def testWellKnownCountsFromFPropMetaAlone(self):
    """torchvision's ResNet-50 / ResNet-101 at 1000 classes."""
    for depth, expected in ((50, 25557032), (101, 44549160)):
      layer_ps = resnet.ResNetLayers(depth, num_classes=1000)
      self.assertEqual(
          model_utils.NumTrainableParams(layer_ps, [1, 224, 224, 3]),
          expected, msg=f'ResNet-{depth}')
      # FPropMeta's total also has BN's moving mean and variance.
      self.assertGreater(model_utils.NumParams(layer_ps, [1, 224, 224, 3]),
                         expected)

  def testFPropMetaCountsEqualCreatedVariables(self):
    layer_ps = testlib.TinyLayers(101)
    model = testlib.Sequential(layer_ps)
    shape = [testlib.BATCH, testlib.SIZE, testlib.SIZE, 3]
    self.assertEqual(model_utils.NumParams(layer_ps, shape),
                     sum(int(np.prod(v.shape)) for v in model.variables))
    self.assertEqual(model_utils.NumTrainableParams(layer_ps, shape),
                     sum(int(np.prod(v.shape))
                         for v in model.trainable_variables))

  def testLayerStructure(self):
    layer_ps = resnet.ResNetLayers(50)
    # stem conv, max pool, 16 blocks, pool, fc
    self.assertLen(layer_ps, 20)
    self.assertEqual(layer_ps[2].sub[0].cls.__name__, 'Conv2DLayer')
    self.assertEqual(layer_ps[3].sub[0].cls.__name__, 'IdentityLayer')
    # v1.5: the stride of a downsampling block is on its 3x3 convolution.
    first_of_stage2 = layer_ps[5]
    convs = first_of_stage2.sub[1].sub
    self.assertEqual([tuple(c.filter_stride) for c in convs],
                     [(1, 1), (2, 2), (1, 1)])
    self.assertEqual(tuple(first_of_stage2.sub[0].filter_stride), (2, 2))

  def testBadDepthRaises(self):
    with self.assertRaisesRegex(ValueError, r'depth=34.*\[50, 101, 152\]'):
      resnet.ResNetLayers(34)


class SmallResNetTest(tf.test.TestCase):
  """The Fashion-MNIST experiments' small ResNet of basic blocks."""

  def testCountsMatchTheClosedFormAndTheCreatedVariables(self):
    f = 4
    layer_ps = resnet.SmallResNetLayers(filters=f, blocks_per_stage=1,
                                        num_classes=10, in_channels=1)
    # Every 3x3 conv has BN (gamma, beta) and no bias; the FC has a bias.
    convs = ([(1, f)] + 2 * [(f, f)] + [(f, 2 * f)] + 2 * [(2 * f, 2 * f)] +
             [(2 * f, 4 * f)] + 2 * [(4 * f, 4 * f)])
    trainable = (sum(9 * cin * cout + 2 * cout for cin, cout in convs) +
                 4 * f * 10 + 10)
    shape = [2, 28, 28, 1]
    self.assertEqual(model_utils.NumTrainableParams(layer_ps, shape),
                     trainable)
    model = testlib.Sequential(layer_ps)
    self.assertEqual(sum(int(np.prod(v.shape))
                         for v in model.trainable_variables), trainable)
    self.assertEqual(model_utils.NumParams(layer_ps, shape),
                     sum(int(np.prod(v.shape)) for v in model.variables))
    with py_utils.EvalMode():
      out = model.FPropDefaultTheta(tf.zeros(shape))
    self.assertEqual(out.shape, [2, 10])

  def testBadSizeRaises(self):
    with self.assertRaisesRegex(ValueError, 'SmallResNet: filters=0 must be '
                                'a positive int'):
      resnet.SmallResNetLayers(filters=0)


class ResNetShapesTest(tf.test.TestCase):

  def testFPropMetaShapesEqualRealShapes(self):
    layer_ps = resnet.ResNetLayers(50, num_classes=testlib.CLASSES, width=2,
                                   input_shape=(None, 32, 32, 3))
    x = tf.random.stateless_normal([2, 32, 32, 3], seed=[1, 2])
    model = testlib.Sequential(layer_ps)
    meta = composite.ChainFPropMeta(layer_ps, (x.shape,))[0]
    y = x
    for layer, m in zip(model.children.sub, meta):
      y = layer.FPropDefaultTheta(y)
      self.assertEqual(list(y.shape), list(m.out_shapes[0]), msg=layer.path)
    self.assertEqual(y.shape, [2, testlib.CLASSES])


class ResNetPipelineTest(tf.test.TestCase):

  def testPipelineMatchesUnpipelined(self):
    testlib.ComparePipelined(self, testlib.TrimmedLayers(), 2, 2,
                             testlib.Images())

  def testResNetPipelineParams(self):
    p = resnet.ResNetPipeline(50, num_classes=10, input_shape=(8, 32, 32, 3),
                              num_partitions=4, num_micro_batches=2,
                              width=2, small_stem=True)
    self.assertEqual(p.num_partitions, 4)
    self.assertLen(p.layers, 19)


if __name__ == '__main__':
  tf.test.main()
