"""Tests of tensorpipe/base_input.py: the shared dataset tail (_Finish)."""

import os
from unittest import mock

import tensorflow as tf

from tensorpipe import base_input
from tensorpipe.nested_map import NestedMap


class _RangeInput(base_input.BaseInput):
  """Examples {'x': i} for i in range(num_examples)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('num_examples', 10, 'Examples in the split.')
    p.Define('augment', False, 'Add the augmentation seed to x.')
    return p

  def _Dataset(self):
    p = self.params
    ds = tf.data.Dataset.range(p.num_examples).map(lambda i: {'x': i})
    augment = None
    if p.augment:
      augment = lambda d, seed: {'x': d['x'] * 1000 + seed[1]}
    return self._Finish(ds, augment=augment)


def _Values(ds, num_batches=None):
  out = []
  for i, batch in enumerate(ds):
    if num_batches is not None and i >= num_batches:
      break
    out.append(batch.x.numpy().tolist())
  return out


class FinishTest(tf.test.TestCase):

  def testEvalSplitIsOrderedAndItsLastBatchPadded(self):
    inp = _RangeInput.Params().Set(split='test', batch_size=3).Instantiate()
    self.assertFalse(inp.is_training)
    batches = list(inp.Dataset())
    self.assertIsInstance(batches[0], NestedMap)
    # Every example once; the padding repeats the last one, weighed 0.
    self.assertEqual(_Values(batches), [[0, 1, 2], [3, 4, 5], [6, 7, 8],
                                        [9, 9, 9]])
    self.assertEqual([b[base_input.EXAMPLE_WEIGHT].numpy().tolist()
                      for b in batches], [[1, 1, 1]] * 3 + [[1, 0, 0]])
    self.assertEqual(inp.Dataset().element_spec['x'].shape.as_list(), [3])

  def testMaxExamplesReadsThePrefix(self):
    inp = _RangeInput.Params().Set(split='test', batch_size=2,
                                   max_examples=5).Instantiate()
    self.assertEqual(_Values(inp.Dataset()), [[0, 1], [2, 3], [4, 4]])

  def testTrainingShufflesReproduciblyAndRepeats(self):
    p = _RangeInput.Params().Set(split='train', batch_size=5, seed=7)
    first = _Values(p.Instantiate().Dataset(), 4)
    self.assertEqual(first, _Values(p.Instantiate().Dataset(), 4))
    # Two epochs, each a permutation of the split, not in order.
    self.assertCountEqual(first[0] + first[1], range(10))
    self.assertCountEqual(first[2] + first[3], range(10))
    self.assertNotEqual(first[0] + first[1], list(range(10)))
    other = _Values(p.Copy().Set(seed=8).Instantiate().Dataset(), 2)
    self.assertNotEqual(other, first[:2])

  def testRepeatAndShuffleCanBeSwitchedOff(self):
    inp = _RangeInput.Params().Set(split='train', batch_size=5, repeat=False,
                                   shuffle_buffer=0).Instantiate()
    self.assertEqual(_Values(inp.Dataset()), [[0, 1, 2, 3, 4],
                                              [5, 6, 7, 8, 9]])

  def testAutotuneOffByEnvironmentKeepsTheBatches(self):
    p = _RangeInput.Params().Set(split='train', batch_size=3, seed=5,
                                 augment=True)
    with mock.patch.dict(os.environ, {base_input.AUTOTUNE_ENV: '1'}):
      tuned = p.Instantiate().Dataset()
    with mock.patch.dict(os.environ, {base_input.AUTOTUNE_ENV: '0'}):
      untuned = p.Instantiate().Dataset()
    self.assertIsNot(tuned.options().autotune.enabled, False)
    self.assertFalse(untuned.options().autotune.enabled)
    self.assertEqual(_Values(untuned, 6), _Values(tuned, 6))

  def testAugmentGetsTheRunningExampleCountAsSeed(self):
    inp = _RangeInput.Params().Set(split='test', batch_size=2, augment=True,
                                   seed=3).Instantiate()
    # seed = (p.seed, running count): example i gets count i.
    self.assertEqual(_Values(inp.Dataset()),
                     [[i * 1000 + i for i in (j, j + 1)]
                      for j in range(0, 10, 2)])

  def testBadBatchSizeRaises(self):
    for bad in (0, 2.5, None):
      with self.subTest(bad=bad):
        with self.assertRaisesRegex(ValueError, f'batch_size={bad!r} must be '
                                    'a positive int'):
          _RangeInput.Params().Set(batch_size=bad).Instantiate()

  def testNoTextHooksByDefault(self):
    inp = _RangeInput.Params().Instantiate()
    self.assertIsNone(inp.Detokenizer())
    self.assertIsNone(inp.ReferenceTexts())

  def testParamsAreFrozenCopies(self):
    p = _RangeInput.Params().Set(batch_size=4)
    inp = p.Instantiate()
    p.batch_size = 8
    self.assertEqual(inp.params.batch_size, 4)
    with self.assertRaisesRegex(TypeError, 'frozen'):
      inp.params.batch_size = 2


if __name__ == '__main__':
  tf.test.main()
