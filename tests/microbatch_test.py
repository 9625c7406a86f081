"""Tests for tensorpipe.microbatch."""

import collections
import unittest

import numpy as np
import tensorflow as tf

from tensorpipe import microbatch


class _Map(dict):
  """A dict subclass standing in for NestedMap."""


_Pair = collections.namedtuple('_Pair', ['src', 'tgt'])


def _Batch(batch_size, batch_dim=0, seed=0):
  """A nested batch with the batch at `batch_dim`, as NumPy arrays."""
  rng = np.random.default_rng(seed)

  def Array(*other_dims, dtype=np.float32):
    shape = list(other_dims)
    shape.insert(batch_dim, batch_size)
    return rng.normal(size=shape).astype(dtype)

  return {
      'image': Array(2, 3),
      'label': Array(4).astype(np.int32),
      'extra': (Array(5), None),
  }


class _TestCase(unittest.TestCase):
  # Plain unittest: tf.test.TestCase would add a skipped test_session per class.

  def assertAllEqual(self, actual, expected):
    np.testing.assert_array_equal(np.asarray(actual), np.asarray(expected))


def _ToTensors(structure):
  return tf.nest.map_structure(
      lambda x: None if x is None else tf.constant(x), structure)


class NumMicroBatchesTest(_TestCase):

  def testFromNumMicroBatches(self):
    self.assertEqual(microbatch.NumMicroBatches(32, num_micro_batches=8), 8)

  def testFromMicroBatchSize(self):
    self.assertEqual(microbatch.NumMicroBatches(32, micro_batch_size=8), 4)
    self.assertEqual(microbatch.NumMicroBatches(5, micro_batch_size=5), 1)

  def testRaisesOnIndivisibleBatch(self):
    with self.assertRaises(ValueError) as context:
      microbatch.NumMicroBatches(30, num_micro_batches=8)
    self.assertEqual(
        str(context.exception),
        'batch size 30 is not divisible by num_micro_batches=8; use a batch '
        'size that is a multiple of 8 or set micro_batch_size')

  def testRaisesOnIndivisibleMicroBatchSize(self):
    with self.assertRaisesRegex(
        ValueError, r'batch size 30 is not divisible by micro_batch_size=8; '
        r'.*one of 1, 2, 3, 5, 6, 10, 15, 30'):
      microbatch.NumMicroBatches(30, micro_batch_size=8)

  def testRaisesWhenBothKnobsAreSet(self):
    with self.assertRaisesRegex(
        ValueError, r'exactly one.*num_micro_batches=4 and micro_batch_size=8;'
        r' set num_micro_batches=None to use micro_batch_size=8'):
      microbatch.NumMicroBatches(32, num_micro_batches=4, micro_batch_size=8)
    with self.assertRaisesRegex(ValueError, r'num_micro_batches=1 and '
                                r'micro_batch_size=4'):
      microbatch.CheckMicroBatchParams(1, 4)

  def testNeitherKnobMeansOneMicroBatch(self):
    self.assertEqual(microbatch.NumMicroBatches(32), 1)
    self.assertEqual(microbatch.NumMicroBatches(1), 1)

  def testCheckMicroBatchParamsRejectsBadTypesWithoutABatch(self):
    microbatch.CheckMicroBatchParams(None, None)
    microbatch.CheckMicroBatchParams(None, 4)
    with self.assertRaisesRegex(TypeError, r"num_micro_batches.*'4'.*str"):
      microbatch.CheckMicroBatchParams('4', None)
    with self.assertRaisesRegex(TypeError, r'micro_batch_size.*True.*bool'):
      microbatch.CheckMicroBatchParams(None, True)
    with self.assertRaisesRegex(ValueError, r'micro_batch_size=0.*>= 1'):
      microbatch.CheckMicroBatchParams(None, 0)

  def testRaisesOnNonPositiveValues(self):
    with self.assertRaisesRegex(ValueError, r'num_micro_batches=0'):
      microbatch.NumMicroBatches(32, num_micro_batches=0)
    with self.assertRaisesRegex(ValueError, r'micro_batch_size=-4'):
      microbatch.NumMicroBatches(32, micro_batch_size=-4)
    with self.assertRaisesRegex(ValueError, r'batch_size=0'):
      microbatch.NumMicroBatches(0, num_micro_batches=2)

  def testRaisesOnNonIntegers(self):
    with self.assertRaisesRegex(TypeError, r'num_micro_batches.*2\.0.*float'):
      microbatch.NumMicroBatches(32, num_micro_batches=2.0)


class BatchSizeTest(_TestCase):

  def testNestedStructure(self):
    self.assertEqual(microbatch.BatchSize(_ToTensors(_Batch(6))), 6)
    self.assertEqual(
        microbatch.BatchSize(_ToTensors(_Batch(6, batch_dim=1)), batch_dim=1),
        6)

  def testRaisesOnDisagreeingTensorsNamingBoth(self):
    inputs = {'a': tf.zeros([4, 2]), 'b': (tf.zeros([4]), tf.zeros([3, 1]))}
    with self.assertRaisesRegex(
        ValueError, r'a has 4 but b\[1\] has 3; all tensors need the same'):
      microbatch.BatchSize(inputs)

  def testNamedTuplePathsInErrors(self):
    inputs = _Pair(src=tf.zeros([4]), tgt=tf.zeros([5]))
    with self.assertRaisesRegex(ValueError, r'src has 4 but tgt has 5'):
      microbatch.BatchSize(inputs)

  def testRaisesOnRankTooSmallForBatchDim(self):
    inputs = {'ids': tf.zeros([4, 3]), 'scale': tf.constant(1.0)}
    with self.assertRaisesRegex(
        ValueError, r'scale has shape \[\] \(rank 0\).*batch_dim=0'):
      microbatch.BatchSize(inputs)
    with self.assertRaisesRegex(ValueError, r'ids has shape \[4, 3\] \(rank 2'):
      microbatch.BatchSize({'ids': tf.zeros([4, 3])}, batch_dim=2)

  def testRaisesOnDynamicBatchSize(self):

    @tf.function(input_signature=[tf.TensorSpec([None, 3])])
    def F(x):
      return microbatch.BatchSize({'x': x})

    with self.assertRaisesRegex(ValueError,
                                r'x has shape \[None, 3\].*not static'):
      F.get_concrete_function()

  def testRaisesWithoutTensors(self):
    with self.assertRaisesRegex(ValueError, r'no tensor.*\(None, 3\)'):
      microbatch.BatchSize((None, 3))


class SplitMergeTest(_TestCase):

  def testSplitShapes(self):
    self.assertEqual(
        microbatch.Split(tf.zeros([12, 3]), 4).shape.as_list(), [4, 3, 3])
    self.assertEqual(
        microbatch.Split(tf.zeros([2, 12, 5]), 4, batch_dim=1).shape.as_list(),
        [4, 2, 3, 5])

  def testMicroBatchEqualsNumpySlicing(self):
    batch = _Batch(12)
    stacked = microbatch.Split(_ToTensors(batch), 3)
    m = 4
    for t in range(3):
      micro = microbatch.Slice(stacked, t)
      self.assertAllEqual(micro['image'], batch['image'][t * m:(t + 1) * m])
      self.assertAllEqual(micro['label'], batch['label'][t * m:(t + 1) * m])
      self.assertAllEqual(micro['extra'][0],
                          batch['extra'][0][t * m:(t + 1) * m])
      self.assertIsNone(micro['extra'][1])

  def testMicroBatchEqualsNumpySlicingOnBatchDimOne(self):
    x = np.arange(2 * 12 * 5, dtype=np.float32).reshape([2, 12, 5])
    stacked = microbatch.Split(tf.constant(x), 4, batch_dim=1)
    m = 3
    for t in range(4):
      self.assertAllEqual(
          microbatch.Slice(stacked, t), x[:, t * m:(t + 1) * m])

  def testRoundTripOnNestedStructure(self):
    for batch_dim in (0, 1):
      batch = _Batch(8, batch_dim=batch_dim, seed=batch_dim)
      inputs = _Map(_ToTensors(batch))
      stacked = microbatch.Split(inputs, 4, batch_dim=batch_dim)
      self.assertEqual(stacked['image'].shape[0], 4)
      merged = microbatch.Merge(stacked, batch_dim=batch_dim)
      self.assertIsInstance(merged, _Map)
      self.assertIsInstance(merged['extra'], tuple)
      self.assertIsNone(merged['extra'][1])
      for key in ('image', 'label'):
        self.assertAllEqual(merged[key], batch[key])
        self.assertEqual(merged[key].dtype, inputs[key].dtype)
      self.assertAllEqual(merged['extra'][0], batch['extra'][0])

  def testDictSubclassAndNamedTupleTypesArePreserved(self):
    inputs = _Map(pair=_Pair(src=tf.zeros([4, 2]), tgt=tf.ones([4])))
    stacked = microbatch.Split(inputs, 2)
    self.assertIsInstance(stacked, _Map)
    self.assertIsInstance(stacked['pair'], _Pair)
    self.assertEqual(stacked['pair'].tgt.shape.as_list(), [2, 2])
    micro = microbatch.Slice(stacked, 1)
    self.assertIsInstance(micro, _Map)
    self.assertEqual(micro['pair'].src.shape.as_list(), [2, 2])

  def testNumpyInputsAreSplit(self):
    x = np.arange(6, dtype=np.float32)
    stacked = microbatch.Split([x], 3)
    self.assertAllEqual(stacked[0], x.reshape([3, 2]))

  def testOneMicroBatchIsTheWholeBatch(self):
    x = tf.reshape(tf.range(6.0), [3, 2])
    stacked = microbatch.Split(x, 1)
    self.assertEqual(stacked.shape.as_list(), [1, 3, 2])
    self.assertAllEqual(microbatch.Slice(stacked, 0), x)

  def testKeepsStaticShapesInsideTfFunction(self):
    x = np.arange(12 * 6, dtype=np.float32).reshape([12, 6])

    @tf.function(input_signature=[tf.TensorSpec([12, None])])
    def F(inputs):
      stacked = microbatch.Split({'x': inputs}, 4)
      self.assertEqual(stacked['x'].shape.as_list(), [4, 3, None])
      merged = microbatch.Merge(stacked)
      self.assertEqual(merged['x'].shape.as_list(), [12, None])
      return merged['x'], microbatch.Slice(stacked, tf.constant(2))['x']

    merged, micro = F(tf.constant(x))
    self.assertAllEqual(merged, x)
    self.assertAllEqual(micro, x[6:9])

  def testSliceWithLoopCounter(self):
    x = np.arange(8 * 2, dtype=np.float32).reshape([8, 2])
    stacked = microbatch.Split(tf.constant(x), 4)

    @tf.function
    def SumOfFirstRows():
      # The pipeline indexes micro-batches with a while-loop counter.
      def Body(t, acc):
        return t + 1, acc + microbatch.Slice(stacked, t)[0]

      _, acc = tf.while_loop(lambda t, _: t < 4, Body,
                             (tf.constant(0), tf.zeros([2])))
      return acc

    self.assertAllEqual(SumOfFirstRows(), x[::2].sum(axis=0))

  def testSplitRaisesOnIndivisibleBatch(self):
    with self.assertRaisesRegex(
        ValueError, r'batch size 30 is not divisible by num_micro_batches=8; '
        r'.*one of 1, 2, 3, 5, 6, 10, 15, 30'):
      microbatch.Split({'x': tf.zeros([30, 2])}, 8)

  def testSplitRaisesOnDisagreeingBatchSizes(self):
    with self.assertRaisesRegex(ValueError, r'a has 4 but b has 6'):
      microbatch.Split({'a': tf.zeros([4]), 'b': tf.zeros([6])}, 2)

  def testMergeRaisesOnDisagreeingMicroBatchCounts(self):
    with self.assertRaisesRegex(ValueError, r'a has 2 but b has 3'):
      microbatch.Merge({'a': tf.zeros([2, 4]), 'b': tf.zeros([3, 4])})

  def testMergeRaisesOnRankTooSmall(self):
    with self.assertRaisesRegex(ValueError, r'\[0\] has shape \[4\] \(rank 1'):
      microbatch.Merge([tf.zeros([4])])

  def testSliceRaisesOnOutOfRangeIndex(self):
    stacked = microbatch.Split({'x': tf.zeros([6, 2])}, 3)
    with self.assertRaisesRegex(ValueError,
                                r't=3 is out of range.*use 0 <= t < 3'):
      microbatch.Slice(stacked, 3)
    with self.assertRaisesRegex(ValueError, r't=-1'):
      microbatch.Slice(stacked, -1)

  def testFlattenAndPackKeepStaticLeaves(self):
    inputs = {'x': tf.ones([2, 3]), 'n': None, 'k': 3,
              'pair': (np.zeros([2]), 'text')}
    flat = microbatch.FlattenTensors(inputs)
    self.assertEqual(len(flat), 2)  # pair[0] then x, in tf.nest order
    doubled = microbatch.PackTensors(inputs, [2 * tf.convert_to_tensor(t)
                                              for t in flat])
    self.assertIsNone(doubled['n'])
    self.assertEqual(doubled['k'], 3)
    self.assertEqual(doubled['pair'][1], 'text')
    self.assertAllEqual(doubled['x'], 2 * np.ones([2, 3]))
    specs = microbatch.PackTensors(
        inputs, [tf.TensorSpec(t.shape, tf.float32) for t in flat])
    self.assertEqual(microbatch.FlattenTensors(specs)[1],
                     tf.TensorSpec([2, 3], tf.float32))
    with self.assertRaisesRegex(ValueError, r'1 tensors .* 2 tensor leaves'):
      microbatch.PackTensors(inputs, flat[:1])

  def testSliceRaisesOnNonIntegerIndex(self):
    stacked = microbatch.Split(tf.zeros([6, 2]), 3)
    with self.assertRaisesRegex(TypeError, r'dtype.*float32.*tf\.cast'):
      microbatch.Slice(stacked, tf.constant(1.0))
    with self.assertRaisesRegex(ValueError, r'scalar.*\[2\]'):
      microbatch.Slice(stacked, tf.constant([0, 1]))


if __name__ == '__main__':
  unittest.main()
