"""Every registered experiment builds; the cheap ones run one step, tiny.

The test and the reasons for the split are in experiments_testlib.py;
experiments_slow_test.py steps the rest.
"""

import tensorflow as tf

from tests.params import experiments_testlib


class ExperimentsTest(experiments_testlib.ExperimentStepsMixin,
                      tf.test.TestCase):
  pass


if __name__ == '__main__':
  tf.test.main()
