"""Slow test of models/resnet.py: a whole tiny ResNet-50 pipelined."""

import tensorflow as tf

from tensorpipe import test_utils
from tests.models import resnet_testlib as testlib

test_utils.ConfigureTestDevices()


class ResNetWholeModelPipelineTest(tf.test.TestCase):

  def testResNet50FourPartitionsTwoMicroBatches(self):
    testlib.ComparePipelined(self, testlib.TinyLayers(50), 4, 2,
                             testlib.Images())


if __name__ == '__main__':
  tf.test.main()
