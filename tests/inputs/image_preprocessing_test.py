"""Tests of image_preprocessing against NumPy."""

import numpy as np
import tensorflow as tf

from tensorpipe.inputs import image_preprocessing as ip


def _Image(h=6, w=5, c=2):
  return np.arange(h * w * c, dtype=np.float32).reshape(h, w, c) + 1.0


class ImagePreprocessingTest(tf.test.TestCase):

  def testFlipIsIdentityOrMirrorAndBothOccur(self):
    image = _Image()
    seen = set()
    for i in range(16):
      out = ip.RandomHorizontalFlip(image, tf.constant([1, i])).numpy()
      if np.array_equal(out, image):
        seen.add('same')
      else:
        self.assertAllEqual(out, image[:, ::-1, :])
        seen.add('flipped')
    self.assertEqual(seen, {'same', 'flipped'})

  def testRandomCropIsAWindowOfThePaddedImage(self):
    image = _Image()
    padded = np.pad(image, [[2, 2], [2, 2], [0, 0]])
    offsets = set()
    for i in range(12):
      out = ip.RandomCrop(image, (6, 5), 2, tf.constant([3, i])).numpy()
      matches = [(y, x) for y in range(5) for x in range(5)
                 if np.array_equal(padded[y:y + 6, x:x + 5], out)]
      self.assertNotEmpty(matches)
      offsets.update(matches)
    self.assertGreater(len(offsets), 1)

  def testRandomCropIsDeterministicPerSeed(self):
    image = _Image()
    a = ip.RandomCrop(image, (4, 4), 1, tf.constant([5, 7]))
    b = ip.RandomCrop(image, (4, 4), 1, tf.constant([5, 7]))
    self.assertAllEqual(a, b)

  def testCutoutZeroesAClippedSquareOnly(self):
    image = _Image(8, 8, 1)
    for i in range(10):
      out = ip.Cutout(image, 4, tf.constant([2, i])).numpy()
      zero = out == 0
      ys, xs = np.nonzero(zero[:, :, 0])
      self.assertNotEmpty(ys)
      # The zeros form one axis-aligned rectangle of sides <= 4...
      self.assertEqual(len(ys), (ys.max() - ys.min() + 1) *
                       (xs.max() - xs.min() + 1))
      self.assertLessEqual(ys.max() - ys.min() + 1, 4)
      self.assertLessEqual(xs.max() - xs.min() + 1, 4)
      # ...and every other pixel is unchanged.
      self.assertAllEqual(out[~zero], image[~zero])

  def testCutoutSizeZeroIsIdentity(self):
    image = _Image()
    self.assertAllEqual(ip.Cutout(image, 0, tf.constant([0, 0])), image)

  def testNormalizeMatchesNumpy(self):
    image = np.random.RandomState(0).randint(0, 256, [4, 4, 3])
    mean, std = (0.1, 0.2, 0.3), (0.5, 0.25, 2.0)
    expected = (image / 255.0 - np.array(mean)) / np.array(std)
    self.assertAllClose(ip.Normalize(image.astype(np.uint8), mean, std),
                        expected, atol=1e-6)

  def testResizeKeepsSizeAndConstantImages(self):
    image = np.full([5, 7, 3], 3.0, np.float32)
    out = ip.Resize(image, (10, 4))
    self.assertEqual(out.shape, (10, 4, 3))
    self.assertAllClose(out, np.full([10, 4, 3], 3.0))

  def testCenterCropTakesTheMiddle(self):
    image = _Image(8, 8, 1)
    out = ip.CenterCrop(image, (4, 4), crop_fraction=0.5).numpy()
    self.assertAllClose(out, image[2:6, 2:6])

  def testRandomResizedCropShape(self):
    out = ip.RandomResizedCrop(_Image(20, 16, 3), (8, 8), tf.constant([1, 2]))
    self.assertEqual(out.shape, (8, 8, 3))
    self.assertEqual(out.dtype, tf.float32)

  def testBadArgumentsRaise(self):
    with self.assertRaisesRegex(ValueError, 'padding=-1'):
      ip.RandomCrop(_Image(), (2, 2), -1, tf.constant([0, 0]))
    with self.assertRaisesRegex(ValueError, 'crop_fraction=0'):
      ip.CenterCrop(_Image(), (2, 2), 0)


if __name__ == '__main__':
  tf.test.main()
