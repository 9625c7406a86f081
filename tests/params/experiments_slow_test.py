"""The AmoebaNet experiments' one training step (minutes each on a CPU)."""

import tensorflow as tf

from tests.params import experiments_testlib


class SlowExperimentsTest(experiments_testlib.ExperimentStepsMixin,
                          tf.test.TestCase):

  RUN_SLOW = True


if __name__ == '__main__':
  tf.test.main()
