"""Slow tests of models/amoebanet.py: whole tiny models pipelined."""

import tensorflow as tf

from tensorpipe import test_utils
from tests.models import amoebanet_testlib as testlib

test_utils.ConfigureTestDevices()


class AmoebaNetWholeModelPipelineTest(tf.test.TestCase):

  def testAmoebaNetDFourPartitionsFourMicroBatches(self):
    testlib.ComparePipelined(self, testlib.TinyLayers('D'), 4, 4,
                             testlib.Images())

  def testAmoebaNetBTwoPartitionsTwoMicroBatches(self):
    testlib.ComparePipelined(self, testlib.TinyLayers('B'), 2, 2,
                             testlib.Images(seed=2))


if __name__ == '__main__':
  tf.test.main()
