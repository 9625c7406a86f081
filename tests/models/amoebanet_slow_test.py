"""Slow tests of models/amoebanet.py: whole tiny models pipelined."""

import importlib.util
import os

import tensorflow as tf

from tensorpipe import test_utils

test_utils.ConfigureTestDevices()

# The fast test module holds the model builders and the oracle comparison.
_SPEC = importlib.util.spec_from_file_location(
    'amoebanet_test', os.path.join(os.path.dirname(__file__),
                                   'amoebanet_test.py'))
amoebanet_test = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(amoebanet_test)


class AmoebaNetWholeModelPipelineTest(tf.test.TestCase):

  def testAmoebaNetDFourPartitionsFourMicroBatches(self):
    amoebanet_test.ComparePipelined(self, amoebanet_test.TinyLayers('D'), 4, 4,
                                    amoebanet_test.Images())

  def testAmoebaNetBTwoPartitionsTwoMicroBatches(self):
    amoebanet_test.ComparePipelined(self, amoebanet_test.TinyLayers('B'), 2, 2,
                                    amoebanet_test.Images(seed=2))


if __name__ == '__main__':
  tf.test.main()
