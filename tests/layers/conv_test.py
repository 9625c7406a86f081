"""Tests for tensorpipe.layers.conv."""

import numpy as np
import tensorflow as tf

from tensorpipe import py_utils
from tensorpipe.layers import conv
from tests import weight_op_testlib


def _NumVariableElements(layer):
  return sum(int(np.prod(v.shape)) for v in layer.variables)


class Conv2DLayerTest(tf.test.TestCase):

  def _Input(self, shape, seed=1):
    return tf.random.stateless_normal(shape, [seed, 0])

  def testMatchesTfConv2DWithBiasAndActivation(self):
    p = conv.Conv2DLayer.Params().Set(name='conv', filter_shape=(3, 3, 2, 4),
                                      filter_stride=(2, 2), bias=True,
                                      activation='TANH')
    layer = p.Instantiate()
    layer.vars.b.assign(tf.range(4, dtype=tf.float32) * 0.1)
    x = self._Input([2, 7, 7, 2])
    expected = tf.tanh(tf.nn.conv2d(x, layer.vars.w, strides=2,
                                    padding='SAME') + layer.vars.b)
    self.assertAllClose(expected, layer.FPropDefaultTheta(x))

  def testUsesThetaNotVariables(self):
    p = conv.Conv2DLayer.Params().Set(name='conv', filter_shape=(1, 1, 2, 3),
                                      activation='NONE')
    layer = p.Instantiate()
    w = tf.ones([1, 1, 2, 3])
    x = self._Input([1, 2, 2, 2])
    out = layer.FProp(layer.theta.Transform(lambda _: w), x)
    self.assertAllClose(tf.nn.conv2d(x, w, 1, 'SAME'), out)

  def testDilatedMatchesTfConv2D(self):
    p = conv.Conv2DLayer.Params().Set(name='conv', filter_shape=(3, 3, 1, 2),
                                      dilation_rate=(2, 2), padding='VALID',
                                      activation='NONE')
    layer = p.Instantiate()
    x = self._Input([1, 7, 7, 1])
    expected = tf.nn.conv2d(x, layer.vars.w, 1, 'VALID', dilations=2)
    self.assertAllClose(expected, layer.FPropDefaultTheta(x))

  def testOutputShapesMatchFPropMeta(self):
    for stride, padding, hw in [((1, 1), 'SAME', (5, 6)),
                                ((2, 2), 'SAME', (7, 5)),
                                ((2, 1), 'VALID', (7, 6)),
                                ((3, 3), 'VALID', (8, 8))]:
      with self.subTest(stride=stride, padding=padding, hw=hw):
        p = conv.Conv2DLayer.Params().Set(
            name='conv', filter_shape=(3, 2, 2, 3), filter_stride=stride,
            padding=padding)
        x = self._Input([2, hw[0], hw[1], 2])
        out = p.Instantiate().FPropDefaultTheta(x)
        meta = conv.Conv2DLayer.FPropMeta(p, x.shape)
        self.assertEqual(meta.out_shapes[0], out.shape)

  def testFPropMetaCountsConvFlopsAndParams(self):
    p = conv.Conv2DLayer.Params().Set(name='conv', filter_shape=(3, 3, 2, 5),
                                      filter_stride=(2, 2), activation='NONE')
    meta = conv.Conv2DLayer.FPropMeta(p, tf.TensorShape([4, 9, 9, 2]))
    out_h = out_w = 5
    self.assertEqual(2 * 3 * 3 * 2 * 5 * out_h * out_w * 4, meta.flops)
    self.assertEqual(_NumVariableElements(p.Instantiate()), meta.num_params)

  def testFPropMetaAddsBiasBatchNormAndActivation(self):
    base = conv.Conv2DLayer.Params().Set(name='conv', filter_shape=(3, 3, 2, 5),
                                         activation='NONE')
    shape = [2, 4, 4, 2]
    plain = conv.Conv2DLayer.FPropMeta(base, shape)
    for extra in [dict(bias=True), dict(batch_norm=True),
                  dict(activation='RELU')]:
      with self.subTest(**extra):
        p = base.Copy().Set(**extra)
        meta = conv.Conv2DLayer.FPropMeta(p, shape)
        self.assertGreater(meta.flops, plain.flops)
        self.assertEqual(_NumVariableElements(p.Instantiate()),
                         meta.num_params)

  def testFPropMetaRaisesOnChannelMismatch(self):
    p = conv.Conv2DLayer.Params().Set(name='conv3', filter_shape=(3, 3, 1, 1))
    with self.assertRaisesRegex(
        ValueError, r"Conv2DLayer 'conv3': input has 4 channels but "
        r'filter_shape=\(3, 3, 1, 1\) expects 1'):
      conv.Conv2DLayer.FPropMeta(p, tf.TensorShape([2, 8, 8, 4]))

  def testFPropMetaRaisesOnInputSmallerThanValidFilter(self):
    p = conv.Conv2DLayer.Params().Set(name='conv', filter_shape=(5, 5, 1, 1),
                                      padding='VALID')
    with self.assertRaisesRegex(ValueError, 'smaller than the dilated filter'):
      conv.Conv2DLayer.FPropMeta(p, [1, 3, 8, 1])

  def testConstructionRejectsBadParams(self):
    base = conv.Conv2DLayer.Params().Set(name='conv', filter_shape=(3, 3, 1, 1))
    for bad, pattern in [(dict(filter_shape=(3, 3, 1)), 'filter_shape'),
                         (dict(padding='FULL'), 'padding'),
                         (dict(activation='RELU7'), 'RELU7'),
                         (dict(bias=True, batch_norm=True), 'bias=False'),
                         (dict(filter_stride=(2, 2), dilation_rate=(2, 2)),
                          'dilation_rate')]:
      with self.subTest(**bad):
        with self.assertRaisesRegex(ValueError, pattern):
          base.Copy().Set(**bad).Instantiate()

  def testBatchNormAppliedBeforeActivation(self):
    p = conv.Conv2DLayer.Params().Set(name='conv', filter_shape=(3, 3, 2, 4),
                                      batch_norm=True, activation='RELU')
    layer = p.Instantiate()
    self.assertEqual(4, layer.children.bn.params.dim)
    x = self._Input([2, 5, 5, 2])
    y = tf.nn.conv2d(x, layer.vars.w, 1, 'SAME')
    mean, var = tf.nn.moments(y, [0, 1, 2])
    expected = tf.nn.relu((y - mean) / tf.sqrt(var + 1e-3))
    with py_utils.CollectBatchStats() as stats:
      out = layer.FPropDefaultTheta(x)
    self.assertAllClose(expected, out, atol=1e-5)
    self.assertLen(stats, 1)
    self.assertIs(layer.children.bn, stats[0][0])
    with py_utils.EvalMode():
      eval_out = layer.FPropDefaultTheta(x)
    # Fresh moving stats are mean 0, variance 1.
    self.assertAllClose(tf.nn.relu(y / tf.sqrt(1.0 + 1e-3)), eval_out)

  def testBfloat16ActivationsWithFloat32Weights(self):
    for cls in (conv.Conv2DLayer, conv.DepthwiseConv2DLayer,
                conv.SeparableConv2DLayer):
      with self.subTest(cls=cls.__name__):
        p = cls.Params().Set(name='conv', filter_shape=(3, 3, 2, 2),
                             fprop_dtype=tf.bfloat16, batch_norm=True)
        layer = p.Instantiate()
        x = self._Input([2, 4, 4, 2])
        out = layer.FPropDefaultTheta(x)
        self.assertEqual(tf.bfloat16, out.dtype)
        self.assertTrue(all(v.dtype == tf.float32 for v in layer.variables))
        ref = p.Copy().Set(fprop_dtype=None).Instantiate()
        self.assertAllClose(ref.FPropDefaultTheta(x), tf.cast(out, tf.float32),
                            atol=0.1, rtol=0.05)


class DepthwiseAndSeparableConvTest(tf.test.TestCase):

  def testDepthwiseMatchesTfDepthwiseConv2D(self):
    p = conv.DepthwiseConv2DLayer.Params().Set(
        name='dw', filter_shape=(3, 3, 3, 2), filter_stride=(2, 2),
        activation='NONE')
    layer = p.Instantiate()
    x = tf.random.stateless_normal([2, 6, 6, 3], [2, 0])
    expected = tf.nn.depthwise_conv2d(x, layer.vars.w, [1, 2, 2, 1], 'SAME')
    out = layer.FPropDefaultTheta(x)
    # The same op (a py_utils.WeightOp): the same bits.
    self.assertAllEqual(expected, out)
    meta = conv.DepthwiseConv2DLayer.FPropMeta(p, x.shape)
    self.assertEqual(meta.out_shapes[0], out.shape)
    self.assertEqual(2 * 3 * 3 * 3 * 2 * 3 * 3 * 2, meta.flops)
    self.assertEqual(_NumVariableElements(layer), meta.num_params)

  def testSeparableMatchesTfSeparableConv2D(self):
    p = conv.SeparableConv2DLayer.Params().Set(
        name='sep', filter_shape=(3, 3, 3, 5), depth_multiplier=2,
        filter_stride=(2, 2), bias=True, activation='RELU')
    layer = p.Instantiate()
    layer.vars.b.assign(tf.linspace(-0.5, 0.5, 5))
    x = tf.random.stateless_normal([2, 7, 7, 3], [3, 0])
    expected = tf.nn.relu(tf.nn.separable_conv2d(
        x, layer.vars.depthwise_w, layer.vars.pointwise_w, [1, 2, 2, 1],
        'SAME') + layer.vars.b)
    out = layer.FPropDefaultTheta(x)
    # tf.nn.separable_conv2d's two ops, as two py_utils.WeightOps: its bits.
    self.assertAllEqual(expected, out)
    self.assertEqual([3, 3, 3, 2], layer.vars.depthwise_w.shape.as_list())
    self.assertEqual([1, 1, 6, 5], layer.vars.pointwise_w.shape.as_list())
    meta = conv.SeparableConv2DLayer.FPropMeta(p, x.shape)
    self.assertEqual(meta.out_shapes[0], out.shape)
    self.assertEqual(_NumVariableElements(layer), meta.num_params)
    positions = 2 * 4 * 4
    macs = 3 * 3 * 3 * 2 + 6 * 5
    self.assertEqual(2 * macs * positions + 2 * positions * 5, meta.flops)

  def testKernelsAreWeightOpsThatSplitBitForBit(self):
    """Depthwise (1 op) and separable (depthwise then pointwise: 2 ops)
    kernels go through py_utils.WeightOp; I then W gives the tape's bits
    (batch norm's and the bias's weights in I)."""
    x = tf.random.stateless_normal([2, 6, 6, 3], [4, 0])
    for cls, kw, ops in (
        (conv.DepthwiseConv2DLayer, dict(filter_shape=(3, 3, 3, 2),
                                         dilation_rate=(2, 2), bias=True),
         ['w']),
        (conv.SeparableConv2DLayer, dict(filter_shape=(3, 3, 3, 5),
                                         depth_multiplier=2,
                                         filter_stride=(2, 2),
                                         batch_norm=True),
         ['depthwise_w', 'pointwise_w'])):
      with self.subTest(cls.__name__):
        layer = cls.Params().Set(name='c', activation='TANH',
                                 **kw).Instantiate()
        weight_op_testlib.AssertWeightOpsSplit(self, layer, [x], ops)

  def testSeparableRaisesOnChannelMismatch(self):
    p = conv.SeparableConv2DLayer.Params().Set(name='sep',
                                               filter_shape=(3, 3, 4, 8))
    with self.assertRaisesRegex(ValueError, 'input has 3 channels'):
      conv.SeparableConv2DLayer.FPropMeta(p, [1, 5, 5, 3])

  def testDepthwiseRejectsUnequalStrides(self):
    p = conv.DepthwiseConv2DLayer.Params().Set(
        name='dw', filter_shape=(3, 3, 1, 1), filter_stride=(1, 2))
    with self.assertRaisesRegex(ValueError, 'equal height and width'):
      p.Instantiate()


if __name__ == '__main__':
  tf.test.main()
