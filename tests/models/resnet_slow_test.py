"""Slow test of models/resnet.py: a whole tiny ResNet-50 pipelined."""

import importlib.util
import os

import tensorflow as tf

from tensorpipe import test_utils

test_utils.ConfigureTestDevices()

# The fast test module holds the model builder and the oracle comparison.
_SPEC = importlib.util.spec_from_file_location(
    'resnet_test', os.path.join(os.path.dirname(__file__), 'resnet_test.py'))
resnet_test = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(resnet_test)


class ResNetWholeModelPipelineTest(tf.test.TestCase):

  def testResNet50FourPartitionsTwoMicroBatches(self):
    resnet_test.ComparePipelined(self, resnet_test.TinyLayers(50), 4, 2,
                                 resnet_test.Images())


if __name__ == '__main__':
  tf.test.main()
