"""Tests of temperature sampling weights: closed form and tf.data frequencies."""

import collections

import numpy as np
import tensorflow as tf

from tensorpipe.inputs import sampling


class TemperatureSamplingWeightsTest(tf.test.TestCase):

  def testMatchesClosedForm(self):
    sizes = [1000, 100, 10]
    t = 5.0
    expected = np.array(sizes, float) / sum(sizes)
    expected = expected**(1 / t) / np.sum(expected**(1 / t))
    self.assertAllClose(sampling.TemperatureSamplingWeights(sizes, t),
                        expected)

  def testTemperatureOneIsProportionalAndLargeIsUniform(self):
    self.assertAllClose(sampling.TemperatureSamplingWeights([3, 1], 1.0),
                        [0.75, 0.25])
    self.assertAllClose(sampling.TemperatureSamplingWeights([3, 1], 1e6),
                        [0.5, 0.5], atol=1e-5)

  def testHigherTemperatureFlattens(self):
    w1 = sampling.TemperatureSamplingWeights([90, 10], 1.0)
    w5 = sampling.TemperatureSamplingWeights([90, 10], 5.0)
    self.assertGreater(w5[1], w1[1])
    self.assertAlmostEqual(sum(w5), 1.0)

  def testBadArgumentsRaise(self):
    with self.assertRaisesRegex(ValueError, 'sizes=\\[\\]'):
      sampling.TemperatureSamplingWeights([])
    with self.assertRaisesRegex(ValueError, '> 0'):
      sampling.TemperatureSamplingWeights([5, 0])
    with self.assertRaisesRegex(ValueError, 'temperature=0'):
      sampling.TemperatureSamplingWeights([5], 0)

  def testEmpiricalFrequenciesOfSampleFromDatasets(self):
    sizes = [800, 150, 50]
    weights = sampling.TemperatureSamplingWeights(sizes, 5.0)
    datasets = [tf.data.Dataset.from_tensors(i).repeat() for i in range(3)]
    ds = tf.data.Dataset.sample_from_datasets(datasets, weights=weights,
                                              seed=1)
    n = 6000
    counts = collections.Counter(ds.take(n).as_numpy_iterator())
    for i, w in enumerate(weights):
      # 5 standard deviations of a binomial frequency.
      tol = 5 * np.sqrt(w * (1 - w) / n)
      self.assertAllClose(counts[i] / n, w, atol=tol)


if __name__ == '__main__':
  tf.test.main()
