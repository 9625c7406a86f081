"""Tests of tensorpipe/layers/composite.py against NumPy compositions."""

import numpy as np
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe.layers import composite
from tensorpipe.layers import linear
from tensorpipe.nested_map import NestedMap


def _Fc(name, din, dout, activation='NONE'):
  return linear.FCLayer.Params().Set(name=name, input_dim=din,
                                     output_dim=dout, activation=activation,
                                     dtype=tf.float64)


def _Dense(layer, x):
  """NumPy oracle of an FCLayer: x @ w + b."""
  return x @ layer.vars.w.numpy() + layer.vars.b.numpy()


class _SplitLayer(base_layer.BaseLayer):
  """Returns (x, 2 x): a layer with two outputs."""

  def FProp(self, theta, x):
    del theta
    return x, 2.0 * x


class _AddLayer(base_layer.BaseLayer):
  """Takes two inputs and returns their sum."""

  def FProp(self, theta, a, b):
    del theta
    return a + b


class _KeyLayer(base_layer.BaseLayer):
  """Reads nm.x, adds it to nm.y: a NestedMap passes through as one input."""

  def FProp(self, theta, nm):
    del theta
    return NestedMap(x=nm.x, y=nm.y + nm.x)


class ArgsTest(tf.test.TestCase):

  def testAsArgsAndFromArgsAreInverse(self):
    self.assertEqual(composite.AsArgs(1), (1,))
    self.assertEqual(composite.AsArgs((1, 2)), (1, 2))
    nm = NestedMap(a=1)
    self.assertEqual(composite.AsArgs(nm), (nm,))   # one input, not split
    self.assertEqual(composite.FromArgs((1,)), 1)
    self.assertEqual(composite.FromArgs((1, 2)), (1, 2))


class SequentialLayerTest(tf.test.TestCase):

  def _Layer(self):
    return composite.SequentialLayer.Params().Set(
        name='seq', sub=[_Fc('a', 3, 4, 'RELU'), _Fc('b', 4, 2)],
        dtype=tf.float64).Instantiate()

  def testFPropIsTheComposition(self):
    seq = self._Layer()
    x = np.random.RandomState(0).randn(5, 3)
    a, b = seq.children.sub
    want = _Dense(b, np.maximum(_Dense(a, x), 0.0))
    self.assertAllClose(seq.FPropDefaultTheta(tf.constant(x)), want,
                        rtol=1e-12, atol=1e-12)

  def testLayersWithThetaListsSubLayersInOrder(self):
    seq = self._Layer()
    pairs = seq.LayersWithTheta()
    self.assertEqual([layer.layer_name for layer, _ in pairs], ['a', 'b'])
    for layer, theta in pairs:
      self.assertIs(theta.w, layer.vars.w)
    # A given theta is split the same way (e.g. a transformed copy).
    doubled = tf.nest.map_structure(lambda v: 2.0 * v, seq.theta)
    for (layer, theta) in seq.LayersWithTheta(doubled):
      self.assertAllClose(theta.w, 2.0 * layer.vars.w.numpy())

  def testTupleOutputsBecomeSeveralInputs(self):
    seq = composite.SequentialLayer.Params().Set(
        name='seq', sub=[_SplitLayer.Params().Set(name='split'),
                         _AddLayer.Params().Set(name='add')]).Instantiate()
    self.assertAllClose(seq.FPropDefaultTheta(tf.constant([1.0, 2.0])),
                        [3.0, 6.0])

  def testNestedMapPassesAsOneInput(self):
    seq = composite.SequentialLayer.Params().Set(
        name='seq', sub=[_KeyLayer.Params().Set(name='k1'),
                         _KeyLayer.Params().Set(name='k2')]).Instantiate()
    out = seq.FPropDefaultTheta(NestedMap(x=tf.constant(1.0),
                                          y=tf.constant(0.0)))
    self.assertAllClose(out.y, 2.0)

  def testFPropMetaSumsTheLayers(self):
    p = composite.SequentialLayer.Params().Set(
        name='seq', sub=[_Fc('a', 3, 4, 'RELU'), _Fc('b', 4, 2)])
    meta = p.cls.FPropMeta(p, tf.TensorShape([5, 3]))
    # 2 * rows * in * out + bias (+ 1 per element for the ReLU).
    self.assertEqual(meta.flops, (2 * 5 * 3 * 4 + 5 * 4 + 5 * 4) +
                     (2 * 5 * 4 * 2 + 5 * 2))
    self.assertEqual(meta.out_shapes[0].as_list(), [5, 2])
    seq = p.Instantiate()
    self.assertEqual(meta.num_params,
                     sum(int(np.prod(v.shape)) for v in seq.variables))

  def testMismatchNamesTheLayer(self):
    p = composite.SequentialLayer.Params().Set(
        name='seq', sub=[_Fc('a', 3, 4), _Fc('b', 5, 2)])
    with self.assertRaisesRegex(ValueError, r"layer 1 \(FCLayer 'b'\) does "
                                r'not accept the output of the layer before '
                                r'it \(shapes \[5, 4\]\)'):
      p.cls.FPropMeta(p, tf.TensorShape([5, 3]))

  def testEmptyRaises(self):
    with self.assertRaisesRegex(ValueError, 'no layers in `sub`'):
      composite.SequentialLayer.Params().Set(name='seq').Instantiate()


class ParallelLayerTest(tf.test.TestCase):

  def testResidualSumWithActivation(self):
    p = composite.ParallelLayer.Params().Set(
        name='res', merge='sum', activation='RELU', dtype=tf.float64,
        sub=[composite.IdentityLayer.Params().Set(name='skip'),
             _Fc('f', 3, 3)])
    layer = p.Instantiate()
    x = np.random.RandomState(1).randn(4, 3)
    f = layer.children.sub[1]
    self.assertAllClose(layer.FPropDefaultTheta(tf.constant(x)),
                        np.maximum(x + _Dense(f, x), 0.0), rtol=1e-12,
                        atol=1e-12)
    meta = p.cls.FPropMeta(p, tf.TensorShape([4, 3]))
    # Branch FLOPs plus one add per output element.
    self.assertEqual(meta.flops, 2 * 4 * 3 * 3 + 4 * 3 + 4 * 3)
    self.assertEqual(meta.num_params, 3 * 3 + 3)

  def testConcatAlongLastAxis(self):
    p = composite.ParallelLayer.Params().Set(
        name='cat', merge='concat', dtype=tf.float64,
        sub=[_Fc('f', 3, 2), _Fc('g', 3, 5)])
    layer = p.Instantiate()
    x = np.random.RandomState(2).randn(4, 3)
    f, g = layer.children.sub
    self.assertAllClose(layer.FPropDefaultTheta(tf.constant(x)),
                        np.concatenate([_Dense(f, x), _Dense(g, x)], -1),
                        rtol=1e-12, atol=1e-12)
    meta = p.cls.FPropMeta(p, tf.TensorShape([4, 3]))
    self.assertEqual(meta.out_shapes[0].as_list(), [4, 7])

  def testBadMergesRaise(self):
    with self.assertRaisesRegex(ValueError, "merge='max'"):
      composite.ParallelLayer.Params().Set(
          name='p', merge='max',
          sub=[composite.IdentityLayer.Params()]).Instantiate()
    p = composite.ParallelLayer.Params().Set(
        name='p', merge='sum', sub=[_Fc('f', 3, 2), _Fc('g', 3, 5)])
    with self.assertRaisesRegex(ValueError, 'merge=sum needs equal branch '
                                r'shapes, got \[\[4, 2\], \[4, 5\]\]'):
      p.cls.FPropMeta(p, tf.TensorShape([4, 3]))


class IdentityLayerTest(tf.test.TestCase):

  def testReturnsItsInputs(self):
    layer = composite.IdentityLayer.Params().Set(name='id').Instantiate()
    x, y = tf.constant([1.0]), tf.constant([2.0])
    self.assertIs(layer.FPropDefaultTheta(x), x)
    self.assertEqual(layer.FPropDefaultTheta(x, y), (x, y))
    meta = composite.IdentityLayer.FPropMeta(layer.params,
                                             tf.TensorShape([1]))
    self.assertEqual((meta.flops, meta.num_params), (0, 0))


if __name__ == '__main__':
  tf.test.main()
