"""Tests of tensorpipe/synthetic_input.py: keys, shapes, learnable labels."""

import numpy as np
import tensorflow as tf

from tensorpipe import synthetic_input


def _First(p):
  return next(iter(p.Instantiate().Dataset()))


class SyntheticImageInputTest(tf.test.TestCase):

  def testLabelIsTheBrightestBand(self):
    batch = _First(synthetic_input.SyntheticImageInput.Params().Set(
        image_shape=(8, 8, 1), num_classes=4, batch_size=16, split='test'))
    images, labels = batch.image.numpy(), batch.label.numpy()
    self.assertEqual(images.shape, (16, 8, 8, 1))
    self.assertEqual(labels.dtype, np.int32)
    # Band k = rows 2k, 2k+1 (8 rows / 4 classes) gets + 0.5 over U[0, 0.5).
    band_means = images[..., 0].reshape(16, 4, 2 * 8).mean(-1)
    self.assertAllEqual(band_means.argmax(-1), labels)

  def testExamplesAreAFunctionOfSeedSplitAndIndex(self):
    p = synthetic_input.SyntheticImageInput.Params().Set(
        batch_size=4, split='test', seed=5)
    self.assertAllEqual(_First(p).image, _First(p).image)
    self.assertNotAllClose(_First(p).image,
                           _First(p.Copy().Set(seed=6)).image)
    self.assertNotAllClose(_First(p).image, _First(p.Copy().Set(
        split='train', shuffle_buffer=0)).image)

  def testOneClassRaises(self):
    with self.assertRaisesRegex(ValueError, 'num_classes=1'):
      synthetic_input.SyntheticImageInput.Params().Set(
          num_classes=1).Instantiate()


class SyntheticSequenceInputTest(tf.test.TestCase):

  def testTranslationTargetsCopyTheSourceAndEndWithEos(self):
    batch = _First(synthetic_input.SyntheticSequenceInput.Params().Set(
        task='nmt', batch_size=8, max_length=6, split='test'))
    # An eval split (read once) also has its example weights (base_input).
    self.assertCountEqual(batch, ['src_ids', 'src_paddings', 'tgt_ids',
                                  'tgt_labels', 'tgt_paddings',
                                  'example_weight'])
    labels = batch.tgt_labels.numpy()
    self.assertAllEqual(batch.src_ids, labels)
    # Decoder input = <s> (1) then the labels shifted right.
    self.assertAllEqual(batch.tgt_ids.numpy()[:, 0], np.ones(8))
    self.assertAllEqual(batch.tgt_ids.numpy()[:, 1:], labels[:, :-1])
    for row, pads in zip(labels, batch.tgt_paddings.numpy()):
      n = int((pads == 0).sum())      # tokens and the </s>
      self.assertEqual(row[n - 1], 2)
      self.assertTrue(np.all(row[:n - 1] >= 3))
      self.assertTrue(np.all(row[n:] == 0))

  def testLanguageModelKeys(self):
    batch = _First(synthetic_input.SyntheticSequenceInput.Params().Set(
        task='lm', batch_size=4, max_length=5, split='test'))
    self.assertCountEqual(batch, ['ids', 'labels', 'paddings',
                                  'example_weight'])
    self.assertAllEqual(batch.ids.numpy()[:, 1:], batch.labels.numpy()[:, :-1])

  def testDetokenizerWritesWordsUpToEos(self):
    inp = synthetic_input.SyntheticSequenceInput.Params().Set(
        task='nmt').Instantiate()
    self.assertEqual(inp.Detokenizer()([5, 0, 3, 2, 7]), 'w5 w3')
    self.assertIsNone(inp.ReferenceTexts())

  def testUnknownTaskRaises(self):
    with self.assertRaisesRegex(ValueError, "task='mt'"):
      synthetic_input.SyntheticSequenceInput.Params().Set(
          task='mt').Instantiate()


if __name__ == '__main__':
  tf.test.main()
