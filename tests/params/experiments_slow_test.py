"""The AmoebaNet experiments' one training step (minutes each on a CPU)."""

import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from experiments_test import ExperimentStepsMixin  # pylint: disable=g-import-not-at-top,wrong-import-position


class SlowExperimentsTest(ExperimentStepsMixin, tf.test.TestCase):

  RUN_SLOW = True


if __name__ == '__main__':
  tf.test.main()
