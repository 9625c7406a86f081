"""Tests of tfds_utils' checks of damaged prepared data, on a tiny data set.

A 40 + 10 image Fashion-MNIST is built from generated IDX files with the
project's own builder, then damaged the ways the reliability probe found
(D3-D6): flipped bytes in a record file, a record file cut short, a record
file deleted, a dataset_info.json that is not JSON.
"""

import gzip
import os
import shutil
import struct
import tempfile

import numpy as np
import tensorflow as tf

from tensorpipe.inputs import fashion_mnist_builder
from tensorpipe.inputs import image_inputs
from tensorpipe.inputs import tfds_utils

_NUM = {'train': 40, 'test': 10}
_FIX = (r'delete .*fashion_mnist and prepare it again: `bash '
        r'tools/prepare_data.sh --force`')


def _WriteIdx(folder, prefix, n, rng):
  images = rng.randint(0, 256, [n, 28, 28], dtype=np.uint8)
  labels = rng.randint(0, 10, [n], dtype=np.uint8)
  with gzip.open(os.path.join(folder, f'{prefix}-images-idx3-ubyte.gz'),
                 'wb') as f:
    f.write(struct.pack('>IIII', 2051, n, 28, 28) + images.tobytes())
  with gzip.open(os.path.join(folder, f'{prefix}-labels-idx1-ubyte.gz'),
                 'wb') as f:
    f.write(struct.pack('>II', 2049, n) + labels.tobytes())


def _RecordBoundary(path, n):
  offset = 0
  with open(path, 'rb') as f:
    for _ in range(n):
      f.seek(offset)
      (length,) = struct.unpack('<Q', f.read(8))
      offset += 16 + length
  return offset


class DamagedDataTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.prepared = tempfile.mkdtemp()
    src = os.path.join(cls.prepared, 'src')
    os.makedirs(src)
    rng = np.random.RandomState(0)
    _WriteIdx(src, 'train', _NUM['train'], rng)
    _WriteIdx(src, 't10k', _NUM['test'], rng)
    fashion_mnist_builder.LocalFashionMnist(
        data_dir=os.path.join(cls.prepared, 'tfds'), source_dir=src,
        num_examples=_NUM).download_and_prepare()

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.prepared, ignore_errors=True)
    super().tearDownClass()

  def setUp(self):
    super().setUp()
    self.data_dir = os.path.join(tempfile.mkdtemp(dir=self.get_temp_dir()),
                                 'tfds')
    shutil.copytree(os.path.join(self.prepared, 'tfds'), self.data_dir)
    version_dir = os.path.join(self.data_dir, 'fashion_mnist')
    self.dir = os.path.join(version_dir, os.listdir(version_dir)[0])
    self.train_file = os.path.join(
        self.dir, 'fashion_mnist-train.tfrecord-00000-of-00001')

  def _Input(self):
    return image_inputs.FashionMnistInput.Params().Set(
        batch_size=8, data_dir=self.data_dir, shuffle_buffer=64,
        repeat=False).Instantiate()

  def _ReadError(self):
    """Iterates the train split; returns the input's one-line diagnosis."""
    inp = self._Input()
    with self.assertRaises(tf.errors.OpError) as error:
      for _ in inp.Dataset():
        pass
    return inp.DescribeReadError(error.exception)

  def testIntactDataPassesAndReads(self):
    tfds_utils.CheckFiles('fashion_mnist', self.data_dir, 'train', 'x')
    batches = list(self._Input().Dataset())
    self.assertLen(batches, _NUM['train'] // 8)
    builder_files = [(self.train_file, _NUM['train'])]
    self.assertIsNone(tfds_utils.DiagnoseFiles(builder_files))

  def testFlippedBytesNameTheFile(self):
    with open(self.train_file, 'r+b') as f:
      f.seek(2000)
      data = f.read(64)
      f.seek(2000)
      f.write(bytes(b ^ 0xff for b in data))
    self.assertRegex(self._ReadError(),
                     rf'^{self.train_file} is damaged \(.*\) \(split .train. '
                     rf"of 'fashion_mnist'\); {_FIX}$")

  def testFileCutAtARecordBoundaryNamesTheCount(self):
    with open(self.train_file, 'r+b') as f:
      f.truncate(_RecordBoundary(self.train_file, 25))
    self.assertRegex(self._ReadError(),
                     rf'^{self.train_file} holds 25 of its 40 records '
                     rf'\(truncated\) .*; {_FIX}$')

  def testDeletedRecordFileFailsBeforeReading(self):
    os.remove(self.train_file)
    with self.assertRaisesRegex(
        tfds_utils.CorruptDataError,
        rf"^{self.train_file} is missing \(split 'train' of "
        rf"'fashion_mnist'\); {_FIX}$"):
      self._Input().Dataset()

  def testDatasetInfoThatIsNotJsonFailsBeforeReading(self):
    info = os.path.join(self.dir, 'dataset_info.json')
    with open(info, 'w') as f:
      f.write('{not json')
    with self.assertRaisesRegex(
        tfds_utils.CorruptDataError,
        rf'^{info} is damaged \(JSONDecodeError: .*\); {_FIX}$'):
      self._Input().Dataset()

  def testUnknownSplitIsAValueErrorListingTheSplits(self):
    with self.assertRaisesRegex(ValueError, r"split='valid' of "
                                r"'fashion_mnist': .*its splits are "
                                r"\['test', 'train'\]"):
      tfds_utils.CheckFiles('fashion_mnist', self.data_dir, 'valid', 'x')

  def testDiagnoseFilesCountsRecords(self):
    path = os.path.join(self.get_temp_dir(), 'records')
    with tf.io.TFRecordWriter(path) as w:
      for i in range(5):
        w.write(b'x' * i)
    self.assertIsNone(tfds_utils.DiagnoseFiles([(path, 5)]))
    self.assertEqual(tfds_utils.DiagnoseFiles([(path, 7)]),
                     f'{path} holds 5 of its 7 records (truncated)')
    self.assertEqual(tfds_utils.DiagnoseFiles([(path + 'x', 1)]),
                     f'{path}x is missing')


if __name__ == '__main__':
  tf.test.main()
