"""Tests for tensorpipe.partitioning."""

import itertools
import math
import unittest

import numpy as np

from tensorpipe import partitioning


def _Compositions(num_layers, num_partitions):
  """All size lists of `num_partitions` positive parts summing to num_layers."""
  for cuts in itertools.combinations(range(1, num_layers), num_partitions - 1):
    bounds = (0,) + cuts + (num_layers,)
    yield [end - start for start, end in zip(bounds, bounds[1:])]


def _Sums(costs, sizes):
  sums, start = [], 0
  for size in sizes:
    sums.append(sum(costs[start:start + size]))
    start += size
  return sums


def _SumSquares(costs, sizes):
  return sum(s * s for s in _Sums(costs, sizes))


def _MaxCost(costs, sizes):
  return max(_Sums(costs, sizes))


def _BruteForce(costs, num_partitions, key):
  """The lexicographically smallest size list minimizing `key`, exactly."""
  return min(_Compositions(len(costs), num_partitions),
             key=lambda sizes: (key(costs, sizes), sizes))


def _RandomCases(seed_count, integer):
  """Yields (costs, num_partitions) for small random problems."""
  rng = np.random.default_rng(1234 if integer else 5678)
  for _ in range(seed_count):
    num_layers = int(rng.integers(1, 10))
    num_partitions = int(rng.integers(1, min(4, num_layers) + 1))
    if integer:
      # A small range with zeros makes ties and empty-cost layers common.
      costs = rng.integers(0, 5, num_layers).tolist()
    else:
      costs = rng.exponential(3.0, num_layers).tolist()
    yield costs, num_partitions


def _GreedySizes(costs, num_partitions):
  """A simple baseline: close each partition once it would pass total / K."""
  target = sum(costs) / num_partitions
  sizes, current, count = [], 0.0, 0
  for i, cost in enumerate(costs):
    layers_left = len(costs) - i
    parts_to_open = num_partitions - len(sizes) - 1
    if count and parts_to_open and (current + cost > target or
                                    layers_left <= parts_to_open):
      sizes.append(count)
      current, count = 0.0, 0
    current += cost
    count += 1
  sizes.append(count)
  return sizes


class MinVarianceTest(unittest.TestCase):

  def testMatchesBruteForceOnIntegerCosts(self):
    # Integer sums are exact in float64, so even the tie-break must agree.
    for costs, num_partitions in _RandomCases(400, integer=True):
      expected = _BruteForce(costs, num_partitions, _SumSquares)
      self.assertEqual(
          partitioning.PartitionMinVariance(costs, num_partitions), expected,
          (costs, num_partitions))

  def testMatchesBruteForceOnFloatCosts(self):
    for costs, num_partitions in _RandomCases(400, integer=False):
      expected = _BruteForce(costs, num_partitions, _SumSquares)
      sizes = partitioning.PartitionMinVariance(costs, num_partitions)
      self.assertEqual(len(sizes), num_partitions)
      self.assertTrue(all(size >= 1 for size in sizes))
      self.assertAlmostEqual(
          _SumSquares(costs, sizes), _SumSquares(costs, expected), places=9)

  def testKnownExamples(self):
    self.assertEqual(partitioning.PartitionMinVariance([1, 1, 1, 1], 2), [2, 2])
    self.assertEqual(
        partitioning.PartitionMinVariance([10, 1, 1, 1, 1, 1], 2), [1, 5])
    self.assertEqual(
        partitioning.PartitionMinVariance([2, 8, 1, 5, 1, 3], 3), [2, 2, 2])
    self.assertEqual(partitioning.PartitionMinVariance([7], 1), [1])
    self.assertEqual(partitioning.PartitionMinVariance([1, 2, 3], 3), [1, 1, 1])

  def testTiesGoToTheShortestLeadingPartitions(self):
    # [2, 3] and [3, 2] are equally balanced.
    self.assertEqual(partitioning.PartitionMinVariance([1] * 5, 2), [2, 3])
    self.assertEqual(partitioning.PartitionMinVariance([0, 0, 0], 2), [1, 2])


class MinMaxTest(unittest.TestCase):

  def _MinMaxKey(self, costs, sizes):
    return (_MaxCost(costs, sizes), _SumSquares(costs, sizes))

  def testMatchesBruteForceOnIntegerCosts(self):
    for costs, num_partitions in _RandomCases(400, integer=True):
      expected = _BruteForce(costs, num_partitions, self._MinMaxKey)
      self.assertEqual(
          partitioning.PartitionMinMax(costs, num_partitions), expected,
          (costs, num_partitions))

  def testMatchesBruteForceOnFloatCosts(self):
    for costs, num_partitions in _RandomCases(400, integer=False):
      expected = _BruteForce(costs, num_partitions, self._MinMaxKey)
      sizes = partitioning.PartitionMinMax(costs, num_partitions)
      self.assertEqual(len(sizes), num_partitions)
      self.assertAlmostEqual(
          _MaxCost(costs, sizes), _MaxCost(costs, expected), places=9)
      self.assertAlmostEqual(
          _SumSquares(costs, sizes), _SumSquares(costs, expected), places=9)

  def testKnownExamples(self):
    self.assertEqual(partitioning.PartitionMinMax([1, 1, 1, 1], 2), [2, 2])
    self.assertEqual(partitioning.PartitionMinMax([10, 1, 1, 1, 1, 1], 2),
                     [1, 5])
    self.assertEqual(partitioning.PartitionMinMax([1, 2, 3, 4], 4),
                     [1, 1, 1, 1])

  def testDiffersFromMinVarianceWhenALargeLayerForcesIt(self):
    # min_max: [2] [8 1] [5 1 3] costs 2, 9, 9: the largest part is 9.
    # min_variance: [2 8] [1 5] [1 3] costs 10, 6, 4: sum of squares 152 < 166.
    costs = [2, 8, 1, 5, 1, 3]
    self.assertEqual(partitioning.PartitionMinMax(costs, 3), [1, 2, 3])
    self.assertEqual(partitioning.PartitionMinVariance(costs, 3), [2, 2, 2])

  def testTieBreakPrefersTheSmallerVariance(self):
    # With [9] alone the other layers can go [1 1 1] [1 1 1] or [1] [1 1 1 1 1]
    # (max 9 either way); the even one has the smaller variance.
    costs = [9, 1, 1, 1, 1, 1, 1]
    self.assertEqual(partitioning.PartitionMinMax(costs, 3), [1, 3, 3])


class LargeProblemTest(unittest.TestCase):

  def testTwoThousandLayersOnSixteenPartitions(self):
    rng = np.random.default_rng(0)
    costs = rng.uniform(1.0, 10.0, 2000)
    costs[::97] *= 20.0  # A few expensive layers, like attention blocks.
    num_partitions = 16
    min_max = partitioning.PartitionMinMax(costs, num_partitions)
    min_var = partitioning.PartitionMinVariance(costs, num_partitions)
    for sizes in (min_max, min_var):
      self.assertEqual(len(sizes), num_partitions)
      self.assertEqual(sum(sizes), len(costs))
      self.assertTrue(all(size >= 1 for size in sizes))

    best_max = max(partitioning.PartitionCosts(costs, min_max))
    # Lower bounds no split can beat.
    self.assertGreaterEqual(best_max,
                            max(costs.sum() / num_partitions, costs.max()))
    # Upper bounds from simple splits: equal layer counts, and greedy filling.
    uniform = [len(costs) // num_partitions] * num_partitions
    self.assertLessEqual(best_max, max(partitioning.PartitionCosts(costs,
                                                                   uniform)))
    greedy = _GreedySizes(costs, num_partitions)
    self.assertEqual(len(greedy), num_partitions)
    self.assertLessEqual(best_max,
                         max(partitioning.PartitionCosts(costs, greedy)))
    # Each solver is best at its own objective.
    self.assertLessEqual(
        best_max, max(partitioning.PartitionCosts(costs, min_var)) + 1e-9)
    squares = lambda sizes: sum(
        c * c for c in partitioning.PartitionCosts(costs, sizes))
    self.assertLessEqual(squares(min_var), squares(min_max) * (1 + 1e-12))


class HelpersTest(unittest.TestCase):

  def testSplitPoints(self):
    self.assertEqual(
        partitioning.SplitPoints([2, 3, 1]), [(0, 2), (2, 5), (5, 6)])
    self.assertEqual(partitioning.SplitPoints([4]), [(0, 4)])

  def testPartitionCosts(self):
    self.assertEqual(
        partitioning.PartitionCosts([1, 2, 3, 4, 5], [2, 3]), [3.0, 12.0])

  def testLoadImbalance(self):
    self.assertAlmostEqual(partitioning.LoadImbalance([3.0, 12.0]), 12 / 7.5)
    self.assertEqual(partitioning.LoadImbalance([5, 5, 5]), 1.0)
    self.assertEqual(partitioning.LoadImbalance([0, 0]), 1.0)

  def testPartitionCostsRaisesOnWrongTotal(self):
    with self.assertRaisesRegex(
        ValueError, r'sizes \[2, 2\] cover 4 layers but costs has 5'):
      partitioning.PartitionCosts([1, 2, 3, 4, 5], [2, 2])

  def testSplitPointsRaisesOnEmptyPartition(self):
    with self.assertRaisesRegex(ValueError, r'sizes\[1\] = 0'):
      partitioning.SplitPoints([2, 0, 3])


class PartitionPlanTest(unittest.TestCase):

  def testPlanFieldsAreConsistent(self):
    costs = [2, 8, 1, 5, 1, 3]
    plan = partitioning.Partition(costs, 3)
    self.assertEqual(plan.method, 'min_max')
    self.assertEqual(plan.sizes, [1, 2, 3])
    self.assertEqual(plan.boundaries, [(0, 1), (1, 3), (3, 6)])
    self.assertEqual(plan.partition_costs, [2.0, 9.0, 9.0])
    self.assertAlmostEqual(plan.imbalance, 9.0 / (20.0 / 3))

  def testMethodSelectsTheSolver(self):
    plan = partitioning.Partition([2, 8, 1, 5, 1, 3], 3, method='min_variance')
    self.assertEqual(plan.method, 'min_variance')
    self.assertEqual(plan.sizes, [2, 2, 2])

  def testReportListsPartitionsSharesAndImbalance(self):
    plan = partitioning.Partition([1, 1, 2], 2)
    report = plan.Report(['embed', 'block', 'softmax'])
    lines = report.splitlines()
    self.assertIn('min_max', lines[0])
    self.assertIn('3 layers on 2 partitions', lines[0])
    self.assertEqual(lines[1].split(),
                     ['partition', 'layers', 'count', 'cost', 'share', 'names'])
    self.assertEqual(lines[2].split(),
                     ['0', '0-1', '2', '2', '50.0%', 'embed,', 'block'])
    self.assertEqual(lines[3].split(), ['1', '2', '1', '2', '50.0%', 'softmax'])
    self.assertEqual(lines[4], 'load imbalance (max / mean cost): 1.000')

  def testReportWithoutNamesAndLongPartitionsAbbreviated(self):
    plan = partitioning.Partition([1.0] * 10, 1)
    self.assertNotIn('names', plan.Report())
    report = plan.Report([f'l{i}' for i in range(10)])
    self.assertIn('l0, l1, ..., l8, l9', report)
    self.assertIn('100.0%', report)

  def testReportRaisesOnWrongNumberOfNames(self):
    plan = partitioning.Partition([1, 1, 2], 2)
    with self.assertRaisesRegex(ValueError, r'layer_names has 2 names.*3'):
      plan.Report(['a', 'b'])


class ValidationTest(unittest.TestCase):

  def testRaisesWhenMorePartitionsThanLayers(self):
    expected = ('cannot split 3 layers into 4 partitions: each partition needs '
                'at least one layer; use num_partitions <= 3')
    for solver in (partitioning.PartitionMinMax,
                   partitioning.PartitionMinVariance, partitioning.Partition):
      with self.assertRaises(ValueError) as context:
        solver([1, 2, 3], 4)
      self.assertEqual(str(context.exception), expected)

  def testRaisesOnZeroPartitions(self):
    with self.assertRaisesRegex(ValueError, r'num_partitions=0.*>= 1'):
      partitioning.PartitionMinMax([1, 2], 0)

  def testRaisesOnNonIntegerPartitions(self):
    with self.assertRaisesRegex(TypeError, r'2\.0.*float'):
      partitioning.PartitionMinVariance([1, 2], 2.0)

  def testRaisesOnNegativeCost(self):
    with self.assertRaisesRegex(ValueError, r'costs\[2\] = -0\.5 is negative'):
      partitioning.PartitionMinMax([1, 2, -0.5], 2)

  def testRaisesOnNonFiniteCost(self):
    with self.assertRaisesRegex(ValueError, r'costs\[1\] = inf is not a fin'):
      partitioning.PartitionMinVariance([1, math.inf], 1)
    with self.assertRaisesRegex(ValueError, r'costs\[0\] = nan'):
      partitioning.Partition(np.array([np.nan, 1.0]), 1)

  def testRaisesOnEmptyCosts(self):
    with self.assertRaisesRegex(ValueError, r'costs is empty.*at least one'):
      partitioning.PartitionMinMax([], 1)

  def testRaisesOnNestedCosts(self):
    with self.assertRaisesRegex(ValueError, r'shape \(2, 2\).*flatten'):
      partitioning.PartitionMinMax([[1, 2], [3, 4]], 2)

  def testRaisesOnNonNumericCosts(self):
    with self.assertRaisesRegex(TypeError, r"costs must be a sequence of num"):
      partitioning.PartitionMinMax(['a', 'b'], 1)

  def testRaisesOnUnknownMethod(self):
    with self.assertRaisesRegex(ValueError,
                                r"'min_mean'.*\('min_max', 'min_variance'\)"):
      partitioning.Partition([1, 2], 1, method='min_mean')


if __name__ == '__main__':
  unittest.main()
