"""Tests for tensorpipe.nested_map."""

import collections
import copy
import pickle
import unittest

import numpy as np
import tensorflow as tf

from tensorpipe.nested_map import NestedMap

Point = collections.namedtuple('Point', ['x', 'y'])


def _Sample():
  return NestedMap(
      zeta=1,
      alpha=NestedMap(b=[2, (3, None)], a='s'),
      mid={'q': 4, 'p': Point(5, 6)})


class NestedMapAccessTest(unittest.TestCase):

  def testAttributeAccessIsItemAccess(self):
    m = NestedMap(x=1)
    m.y = NestedMap(z=2)
    self.assertEqual(m['y']['z'], 2)
    self.assertEqual(m.y.z, 2)
    m['w'] = 3
    self.assertEqual(m.w, 3)
    del m.w
    self.assertNotIn('w', m)
    self.assertIsInstance(m, dict)

  def testMissingAttributeGivesDidYouMean(self):
    m = NestedMap(images=1, labels=2)
    with self.assertRaisesRegex(AttributeError, "Did you mean 'images'") as ctx:
      _ = m.image
    self.assertIn("Keys: ['images', 'labels']", str(ctx.exception))
    self.assertFalse(hasattr(m, 'nothing_like_it'))
    with self.assertRaisesRegex(AttributeError, 'no key'):
      del m.nothing

  def testInvalidKeysAreRejectedEverywhere(self):
    m = NestedMap()
    bad_writes = [
        lambda: NestedMap({'1a': 1}),
        lambda: NestedMap(items=1),
        lambda: m.__setitem__('Flatten', 1),
        lambda: m.__setitem__(3, 1),
        lambda: setattr(m, 'keys', 1),
        lambda: m.update({'a b': 1}),
        lambda: m.update(values=1),
        lambda: m.setdefault('class', 1),
    ]
    for write in bad_writes:
      with self.assertRaises(ValueError):
        write()
    self.assertEqual(m, {})
    with self.assertRaisesRegex(ValueError, r"'get' clashes.*\"get_\""):
      NestedMap.CheckKey('get')
    with self.assertRaisesRegex(ValueError, "'a-b' is not a valid Python"):
      NestedMap.CheckKey('a-b')
    NestedMap.CheckKey('conv_1')  # Does not raise.

  def testUpdateAndSetdefaultStillWork(self):
    m = NestedMap(a=1)
    m.update({'b': 2}, c=3)
    self.assertEqual(m.setdefault('d', 4), 4)
    self.assertEqual(m.setdefault('a', 9), 1)
    self.assertEqual(m, {'a': 1, 'b': 2, 'c': 3, 'd': 4})

  def testCopyStaysNestedMap(self):
    m = _Sample()
    shallow = m.copy()
    self.assertIsInstance(shallow, NestedMap)
    self.assertIs(shallow.alpha, m.alpha)
    deep = copy.deepcopy(m)
    self.assertIsInstance(deep.alpha, NestedMap)
    self.assertEqual(deep, m)
    self.assertEqual(pickle.loads(pickle.dumps(m)), m)

  def testFromNestedDict(self):
    m = NestedMap.FromNestedDict(
        {'a': {'b': 1}, 'c': [{'d': 2}, 3], 'e': ({'f': 4},)})
    self.assertIsInstance(m, NestedMap)
    self.assertIsInstance(m.a, NestedMap)
    self.assertIsInstance(m.c[0], NestedMap)
    self.assertIsInstance(m.e, tuple)
    self.assertEqual(m.e[0].f, 4)
    self.assertEqual(m.c[0].d, 2)


class NestedMapStructureTest(unittest.TestCase):

  def testFlattenUsesSortedKeysAndKeepsNone(self):
    self.assertEqual(_Sample().Flatten(), ['s', 2, 3, None, 5, 6, 4, 1])

  def testFlattenItemsGivesDottedKeys(self):
    self.assertEqual(_Sample().FlattenItems(), [
        ('alpha.a', 's'),
        ('alpha.b[0]', 2),
        ('alpha.b[1][0]', 3),
        ('alpha.b[1][1]', None),
        ('mid.p[0]', 5),
        ('mid.p[1]', 6),
        ('mid.q', 4),
        ('zeta', 1),
    ])

  def testPackInvertsFlatten(self):
    m = _Sample()
    packed = m.Pack(list(range(8)))
    self.assertIsInstance(packed, NestedMap)
    self.assertIsInstance(packed.alpha, NestedMap)
    self.assertIs(type(packed.mid), dict)
    self.assertIsInstance(packed.mid['p'], Point)
    self.assertIsInstance(packed.alpha.b[1], tuple)
    self.assertEqual(packed.Flatten(), list(range(8)))
    self.assertEqual(list(packed), ['zeta', 'alpha', 'mid'])  # Key order kept.
    self.assertEqual(m.Pack(m.Flatten()), m)

  def testPackRaisesOnWrongLength(self):
    m = _Sample()
    with self.assertRaisesRegex(ValueError,
                                'Pack got 7 values .* has 8 leaves.*exactly 8'):
      m.Pack(range(7))
    with self.assertRaisesRegex(ValueError, 'Pack got 9 values'):
      m.Pack(range(9))

  def testTransformMapsLeavesAndKeepsStructure(self):
    m = NestedMap(a=1, b=NestedMap(c=[2, 3]))
    out = m.Transform(lambda v: v * 10)
    self.assertEqual(out, NestedMap(a=10, b=NestedMap(c=[20, 30])))
    self.assertIsInstance(out.b, NestedMap)
    self.assertEqual(m.a, 1)  # The input is untouched.

  def testFilterDropsLeavesAndEmptyContainers(self):
    m = NestedMap(a=1, b=NestedMap(c=[2, 3], d=4), e=NestedMap(f=5), g=(6, 7))
    out = m.Filter(lambda v: v % 2 == 0)
    self.assertEqual(out, NestedMap(b=NestedMap(c=[2], d=4), g=(6,)))
    self.assertIsInstance(out.b, NestedMap)
    self.assertIsInstance(out.g, tuple)
    self.assertEqual(m.Filter(lambda v: False), NestedMap())
    self.assertIsInstance(m.Filter(lambda v: False), NestedMap)

  def testIsCompatible(self):
    m = _Sample()
    self.assertTrue(m.IsCompatible(m.Transform(str)))
    self.assertTrue(NestedMap(a=1, b=2).IsCompatible(NestedMap(b=3, a=4)))
    self.assertFalse(m.IsCompatible(NestedMap(zeta=1)))
    self.assertFalse(NestedMap(a=[1]).IsCompatible(NestedMap(a=[1, 2])))
    self.assertFalse(NestedMap(a=[1]).IsCompatible(NestedMap(a=(1,))))
    self.assertFalse(NestedMap(a=1).IsCompatible(NestedMap(a=NestedMap(b=1))))
    self.assertFalse(NestedMap(a=1).IsCompatible([1]))

  def testDeepCopyCopiesStructureNotLeaves(self):
    leaf = np.zeros(3)
    m = NestedMap(a=NestedMap(b=[leaf]))
    c = m.DeepCopy()
    self.assertEqual(m.FlattenItems()[0][0], c.FlattenItems()[0][0])
    self.assertIs(c.a.b[0], leaf)
    c.a.b.append(1)
    c.a.x = 2
    self.assertEqual(len(m.a.b), 1)
    self.assertNotIn('x', m.a)


class NestedMapTfNestTest(unittest.TestCase):

  def testTfNestFlattenOrderMatchesFlatten(self):
    m = _Sample()
    self.assertEqual(tf.nest.flatten(m), m.Flatten())

  def testTfNestMapStructureReturnsNestedMap(self):
    m = NestedMap(x=tf.constant(1.0), y=NestedMap(z=[tf.constant(2.0)]))
    out = tf.nest.map_structure(lambda t: t * 2, m)
    self.assertIsInstance(out, NestedMap)
    self.assertIsInstance(out.y, NestedMap)
    self.assertEqual(out.y.z[0].numpy(), 4.0)
    self.assertEqual(out.x.numpy(), 2.0)

  def testTfNestPackSequenceAsMatchesPack(self):
    m = _Sample()
    packed = tf.nest.pack_sequence_as(m, list(range(8)))
    self.assertIsInstance(packed, NestedMap)
    self.assertEqual(packed, m.Pack(range(8)))
    tf.nest.assert_same_structure(m, packed)

  def testTfFunctionTakesAndReturnsNestedMap(self):

    @tf.function
    def Double(batch):
      return batch.Transform(lambda t: t * 2)

    out = Double(NestedMap(a=tf.ones([2]), b=NestedMap(c=tf.ones([1]))))
    self.assertIsInstance(out, NestedMap)
    self.assertEqual(out.b.c.numpy().tolist(), [2.0])


if __name__ == '__main__':
  unittest.main()
