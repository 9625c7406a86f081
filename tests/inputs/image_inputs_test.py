"""Tests of the image inputs (tfds.testing.mock_data) and the Fashion-MNIST builder."""

import gzip
import os
import struct
import tempfile
import time
from unittest import mock

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from tensorpipe.inputs import fashion_mnist_builder
from tensorpipe.inputs import image_inputs
from tensorpipe.inputs import tfds_utils


def _FirstBatch(input_params):
  with mock.patch.object(tfds_utils, 'CheckPrepared'):
    with tfds.testing.mock_data(num_examples=8):
      return next(iter(input_params.Instantiate().Dataset()))


class ImageInputsMockDataTest(tf.test.TestCase):

  def testCifar10TrainBatch(self):
    p = image_inputs.Cifar10Input.Params().Set(batch_size=4,
                                               shuffle_buffer=8)
    batch = _FirstBatch(p)
    self.assertEqual(batch.image.shape, (4, 32, 32, 3))
    self.assertEqual(batch.image.dtype, tf.float32)
    self.assertEqual(batch.label.shape, (4,))
    self.assertEqual(batch.label.dtype, tf.int32)
    self.assertTrue(np.all((batch.label >= 0) & (batch.label < 10)))

  def testCifar100EvalIsNormalisedWithoutAugmentation(self):
    p = image_inputs.Cifar100Input.Params().Set(batch_size=2, split='test')
    batch = _FirstBatch(p)
    self.assertEqual(batch.image.shape, (2, 32, 32, 3))
    # Every normalised value comes from a uint8 pixel: undo and check.
    mean = np.array(image_inputs.DATASETS['cifar100']['mean'])
    std = np.array(image_inputs.DATASETS['cifar100']['stddev'])
    pixels = (batch.image.numpy() * std + mean) * 255.0
    self.assertAllClose(pixels, np.round(pixels), atol=1e-3)

  def testImageNetRecipeAtSmallSize(self):
    for split in ('train', 'validation'):
      p = image_inputs.ImageNetInput.Params().Set(
          batch_size=2, split=split, image_size=(24, 24), shuffle_buffer=4)
      batch = _FirstBatch(p)
      self.assertEqual(batch.image.shape, (2, 24, 24, 3))
      self.assertEqual(batch.label.dtype, tf.int32)

  def testTransferSetsBuild(self):
    for cls, classes in ((image_inputs.StanfordCarsInput, 196),
                         (image_inputs.OxfordPetsInput, 37),
                         (image_inputs.Food101Input, 101),
                         (image_inputs.CaltechBirdsInput, 200)):
      inp = cls.Params().Set(batch_size=2).Instantiate()
      self.assertEqual(inp.num_classes, classes)
    batch = _FirstBatch(image_inputs.OxfordPetsInput.Params().Set(
        batch_size=2, image_size=(16, 16), shuffle_buffer=4))
    self.assertEqual(batch.image.shape, (2, 16, 16, 3))

  def testFashionMnistBatch(self):
    p = image_inputs.FashionMnistInput.Params().Set(batch_size=4,
                                                    shuffle_buffer=8)
    batch = _FirstBatch(p)
    self.assertEqual(batch.image.shape, (4, 28, 28, 1))
    self.assertEqual(batch.label.dtype, tf.int32)

  def testAugmentationIsReproducible(self):
    p = image_inputs.Cifar10Input.Params().Set(batch_size=4, shuffle_buffer=8)
    a, b = _FirstBatch(p), _FirstBatch(p)
    self.assertAllEqual(a.image, b.image)

  def testMissingDataRaisesAtOnceNamingTheFix(self):
    with tempfile.TemporaryDirectory() as d:
      start = time.time()
      inp = image_inputs.Cifar10Input.Params().Set(data_dir=d).Instantiate()
      with self.assertRaisesRegex(tfds_utils.DataNotPreparedError,
                                  "'cifar10'.*download_and_prepare"):
        inp.Dataset()
      inp = image_inputs.FashionMnistInput.Params().Set(
          data_dir=d).Instantiate()
      with self.assertRaisesRegex(tfds_utils.DataNotPreparedError,
                                  'tools/prepare_data.sh'):
        inp.Dataset()
      inp = image_inputs.ImageTfdsInput.Params().Set(
          dataset_name='fgvc_aircraft', num_classes=100, image_size=(8, 8),
          mean=(0.5,) * 3, stddev=(0.5,) * 3, data_dir=d).Instantiate()
      with self.assertRaisesRegex(tfds_utils.DataNotPreparedError,
                                  'FGVC Aircraft has no builder'):
        inp.Dataset()
      self.assertLess(time.time() - start, 5.0)

  def testBadParamsRaise(self):
    with self.assertRaisesRegex(ValueError, "preprocessing='nope'"):
      image_inputs.Cifar10Input.Params().Set(
          preprocessing='nope').Instantiate()
    with self.assertRaisesRegex(ValueError, 'num_classes=None'):
      image_inputs.ImageTfdsInput.Params().Set(
          dataset_name='svhn_cropped').Instantiate()


def _WriteIdx(folder, prefix, images, labels):
  with gzip.open(os.path.join(folder, f'{prefix}-images-idx3-ubyte.gz'),
                 'wb') as f:
    f.write(struct.pack('>IIII', 2051, len(images), 28, 28))
    f.write(images.tobytes())
  with gzip.open(os.path.join(folder, f'{prefix}-labels-idx1-ubyte.gz'),
                 'wb') as f:
    f.write(struct.pack('>II', 2049, len(labels)))
    f.write(labels.tobytes())


class LocalFashionMnistBuilderTest(tf.test.TestCase):

  def testBuildsFromLocalIdxFilesAndLoadsWithStockName(self):
    rng = np.random.RandomState(0)
    images = {s: rng.randint(0, 256, [n, 28, 28], dtype=np.uint8)
              for s, n in (('train', 5), ('t10k', 3))}
    labels = {s: rng.randint(0, 10, [len(images[s])], dtype=np.uint8)
              for s in images}
    with tempfile.TemporaryDirectory() as src, \
         tempfile.TemporaryDirectory() as data_dir:
      for s in images:
        _WriteIdx(src, s, images[s], labels[s])
      builder = fashion_mnist_builder.LocalFashionMnist(
          data_dir=data_dir, source_dir=src,
          num_examples={'train': 5, 'test': 3})
      builder.download_and_prepare()
      self.assertTrue(tfds_utils.IsPrepared('fashion_mnist', data_dir))
      ds = tfds.load('fashion_mnist', split='test', data_dir=data_dir,
                     download=False)
      got = sorted((ex['image'][:, :, 0].tobytes(), int(ex['label']))
                   for ex in tfds.as_numpy(ds))
      want = sorted((im.tobytes(), int(l))
                    for im, l in zip(images['t10k'], labels['t10k']))
      self.assertEqual(got, want)

  def testMissingSourceFilesNameThePackage(self):
    with tempfile.TemporaryDirectory() as src, \
         tempfile.TemporaryDirectory() as data_dir:
      builder = fashion_mnist_builder.LocalFashionMnist(data_dir=data_dir,
                                                        source_dir=src)
      with self.assertRaisesRegex(FileNotFoundError, 'dataset-fashion-mnist'):
        builder.download_and_prepare()


if __name__ == '__main__':
  tf.test.main()
