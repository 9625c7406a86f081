"""Partition solvers: split a sequence of layer costs into pipeline partitions.

GPipe (Huang et al. 2018, arXiv 1811.06965, section 2.2) places consecutive
layers on K devices and, since every micro-batch waits for the slowest
partition, "partitions the network to minimize the variance in each cell's
estimated cost". Given per-layer costs c_0 .. c_{L-1} (FLOPs from `FPropMeta`,
or measured seconds), this module finds contiguous splits into K non-empty
partitions that are exactly optimal for one of two objectives:

  * 'min_variance': the paper's objective. With the total fixed, the variance
    of the partition costs is minimal exactly when the sum of their squares is.
  * 'min_max': the cost of the most expensive partition, which bounds the
    pipeline's clock period; ties are broken by the smallest variance.

Both are solved by dynamic programming over prefix sums, O(K L^2) time and
O(K L) memory, vectorized with NumPy (L=2000, K=16 takes about a second). Any
remaining tie goes to the lexicographically smallest list of sizes, so results
are deterministic. Everything here is pure functions on Python / NumPy values.

Usage:

  plan = partitioning.Partition(layer_flops, num_partitions=4)
  logging.info('%s', plan.Report(layer_names))
  layers_per_partition = plan.sizes
"""

import dataclasses
import numbers
from typing import List, Optional, Sequence, Tuple

import numpy as np

METHODS = ('min_max', 'min_variance')

# Rows of the O(L^2) DP matrix computed per NumPy call: bounds peak memory to
# ~32 MB per temporary at any L.
_BLOCK_ELEMENTS = 1 << 22


def _CheckCosts(costs: Sequence[float]) -> np.ndarray:
  """Returns `costs` as a float64 vector, or raises on a malformed list."""
  try:
    array = np.asarray(costs, dtype=np.float64)
  except (TypeError, ValueError) as e:
    raise TypeError(
        f'costs must be a sequence of numbers, got {costs!r}; pass one '
        f'non-negative cost (e.g. FLOPs) per layer') from e
  if array.ndim != 1:
    raise ValueError(
        f'costs must be a flat sequence with one number per layer, got shape '
        f'{array.shape}; flatten it first')
  if array.size == 0:
    raise ValueError(
        f'costs is empty ({costs!r}); pass one cost per layer, at least one '
        f'layer')
  bad = np.flatnonzero(~np.isfinite(array))
  if bad.size:
    i = int(bad[0])
    raise ValueError(
        f'costs[{i}] = {_Item(costs, i)!r} is not a finite number; every layer '
        f'cost must be finite and >= 0')
  bad = np.flatnonzero(array < 0)
  if bad.size:
    i = int(bad[0])
    raise ValueError(
        f'costs[{i}] = {_Item(costs, i)!r} is negative; every layer cost must '
        f'be >= 0')
  return array


def _Item(values: Sequence[float], i: int) -> object:
  """values[i] as the user wrote it (NumPy scalars as plain Python)."""
  value = values[i]
  return value.item() if isinstance(value, np.generic) else value


def _CheckNumPartitions(num_partitions: int, num_layers: int) -> int:
  """Returns `num_partitions` as an int, or raises if it cannot be used."""
  if (isinstance(num_partitions, bool) or
      not isinstance(num_partitions, numbers.Integral)):
    raise TypeError(
        f'num_partitions must be an integer, got {num_partitions!r} of type '
        f'{type(num_partitions).__name__}; pass an int such as '
        f'num_partitions=4')
  if num_partitions < 1:
    raise ValueError(
        f'num_partitions must be >= 1, got num_partitions={num_partitions}; '
        f'use num_partitions >= 1')
  if num_partitions > num_layers:
    raise ValueError(
        f'cannot split {num_layers} layers into {num_partitions} partitions: '
        f'each partition needs at least one layer; use num_partitions <= '
        f'{num_layers}')
  return int(num_partitions)


def _CheckSizes(sizes: Sequence[int]) -> List[int]:
  """Returns `sizes` as a list of ints, or raises unless all are >= 1."""
  sizes = list(sizes)
  if not sizes:
    raise ValueError('sizes is empty; pass one layer count per partition')
  for k, size in enumerate(sizes):
    if (isinstance(size, bool) or not isinstance(size, numbers.Integral) or
        size < 1):
      raise ValueError(
          f'sizes[{k}] = {size!r} is not a positive integer; every partition '
          f'needs at least one layer')
  return [int(size) for size in sizes]


def _SuffixTables(prefix: np.ndarray, num_partitions: int, combine: str,
                  cap: float) -> List[np.ndarray]:
  """Dynamic program over suffixes of the layer list.

  tables[n][i] is the optimal value of splitting layers i..L-1 into n + 1
  non-empty partitions, np.inf where impossible:

    tables[0][i] = f(S(i, L))
    tables[n][i] = min over i < j < L of  f(S(i, j)) (+ or max) tables[n-1][j]

  where S(i, j) = prefix[j] - prefix[i] is the cost of layers i..j-1, f is the
  square for combine='sum_squares' and the identity for combine='max', and a
  partition with S > cap is not allowed.

  Args:
    prefix: [L + 1] prefix sums of the layer costs, prefix[0] = 0.
    num_partitions: K, the number of partitions.
    combine: 'sum_squares' or 'max'.
    cap: the largest allowed partition cost (np.inf for no limit).

  Returns:
    A list of K arrays of shape [L + 1].
  """
  num_layers = prefix.size - 1
  positions = np.arange(num_layers + 1)

  def PartValue(part: np.ndarray) -> np.ndarray:
    value = np.square(part) if combine == 'sum_squares' else part.copy()
    value[part > cap] = np.inf
    return value

  first = PartValue(prefix[-1] - prefix)
  first[num_layers] = np.inf  # An empty suffix cannot form a partition.
  tables = [first]
  rows_per_block = max(1, _BLOCK_ELEMENTS // (num_layers + 1))
  for _ in range(1, num_partitions):
    previous = tables[-1]
    current = np.full(num_layers + 1, np.inf)
    for start in range(0, num_layers + 1, rows_per_block):
      rows = positions[start:start + rows_per_block]
      # value[r, j]: first partition is layers rows[r]..j-1, the rest from j.
      value = PartValue(prefix[None, :] - prefix[rows, None])
      if combine == 'sum_squares':
        value += previous[None, :]
      else:
        np.maximum(value, previous[None, :], out=value)
      value[positions[None, :] <= rows[:, None]] = np.inf
      current[rows] = value.min(axis=1)
    tables.append(current)
  return tables


def _LexicographicSizes(prefix: np.ndarray, tables: List[np.ndarray],
                        cap: float) -> List[int]:
  """Walks sum-of-squares tables from the front, taking the shortest parts.

  At each step the first partition is made as short as possible while the
  remainder can still reach the optimum, which yields the lexicographically
  smallest size list among the optimal splits.

  Args:
    prefix: [L + 1] prefix sums of the layer costs.
    tables: the output of `_SuffixTables(..., combine='sum_squares', ...)`.
    cap: the partition cost limit the tables were built with.

  Returns:
    The K partition sizes.
  """
  num_layers = prefix.size - 1
  # Ties that are exact in real arithmetic can differ by rounding here.
  tolerance = 1e-12 * max(prefix[-1]**2, np.finfo(np.float64).tiny)
  sizes = []
  start = 0
  for n in range(len(tables) - 1, 0, -1):
    ends = np.arange(start + 1, num_layers + 1)
    part = prefix[ends] - prefix[start]
    value = np.square(part) + tables[n - 1][ends]
    value[part > cap] = np.inf
    ok = np.flatnonzero(value <= tables[n][start] + tolerance)
    assert ok.size, 'partition DP tables are inconsistent'
    end = int(ends[ok[0]])
    sizes.append(end - start)
    start = end
  sizes.append(num_layers - start)
  return sizes


def _Prefix(costs: np.ndarray) -> np.ndarray:
  return np.concatenate([[0.0], np.cumsum(costs)])


def PartitionMinVariance(costs: Sequence[float],
                         num_partitions: int) -> List[int]:
  """Contiguous split minimizing the variance of the partition costs.

  This is GPipe's heuristic objective. Since the total cost is fixed, it is
  the split with the smallest sum of squared partition costs; solved exactly
  by dynamic programming in O(K L^2). Among equally good splits the
  lexicographically smallest size list is returned.

  Args:
    costs: [L] non-negative, finite per-layer costs.
    num_partitions: K, with 1 <= K <= L.

  Returns:
    The K partition sizes (layers per partition, each >= 1), summing to L.

  Raises:
    TypeError: if `costs` is not numeric or `num_partitions` not an integer.
    ValueError: if `costs` is empty, negative or not finite, or K is not in
      [1, L].
  """
  costs = _CheckCosts(costs)
  num_partitions = _CheckNumPartitions(num_partitions, costs.size)
  prefix = _Prefix(costs)
  tables = _SuffixTables(prefix, num_partitions, 'sum_squares', np.inf)
  return _LexicographicSizes(prefix, tables, np.inf)


def PartitionMinMax(costs: Sequence[float], num_partitions: int) -> List[int]:
  """Contiguous split minimizing the largest partition cost.

  Exact, in two dynamic programs of O(K L^2) each:

    best_max = min over splits of max_k cost_k
    among splits with every cost_k <= best_max:
      return the one with the smallest sum_k cost_k^2 (= smallest variance),
      and among those the lexicographically smallest size list.

  The largest partition bounds the pipeline's clock period, so this is the
  better objective when one layer dominates; the variance tie-break spreads
  the remaining layers evenly over the other partitions.

  Args:
    costs: [L] non-negative, finite per-layer costs.
    num_partitions: K, with 1 <= K <= L.

  Returns:
    The K partition sizes (layers per partition, each >= 1), summing to L.

  Raises:
    TypeError: if `costs` is not numeric or `num_partitions` not an integer.
    ValueError: if `costs` is empty, negative or not finite, or K is not in
      [1, L].
  """
  costs = _CheckCosts(costs)
  num_partitions = _CheckNumPartitions(num_partitions, costs.size)
  prefix = _Prefix(costs)
  # best_max is one of the prefix differences, computed the same way as in the
  # second pass, so the optimal splits stay within the cap exactly.
  best_max = _SuffixTables(prefix, num_partitions, 'max', np.inf)[-1][0]
  tables = _SuffixTables(prefix, num_partitions, 'sum_squares', best_max)
  return _LexicographicSizes(prefix, tables, best_max)


def SplitPoints(sizes: Sequence[int]) -> List[Tuple[int, int]]:
  """Converts partition sizes to half-open layer index ranges.

  Args:
    sizes: [K] positive layer counts, e.g. [2, 3].

  Returns:
    [(start, end)] per partition, e.g. [(0, 2), (2, 5)]: partition k holds
    layers start..end-1.

  Raises:
    ValueError: if `sizes` is empty or holds a non-positive or non-integer.
  """
  sizes = _CheckSizes(sizes)
  ends = np.cumsum(sizes).tolist()
  return [(end - size, end) for size, end in zip(sizes, ends)]


def PartitionCosts(costs: Sequence[float],
                   sizes: Sequence[int]) -> List[float]:
  """Sums the layer costs of each partition.

  Args:
    costs: [L] per-layer costs.
    sizes: [K] positive layer counts summing to L.

  Returns:
    [K] partition costs.

  Raises:
    ValueError: if the costs are malformed or `sizes` does not sum to L.
  """
  costs = _CheckCosts(costs)
  sizes = _CheckSizes(sizes)
  if sum(sizes) != costs.size:
    raise ValueError(
        f'sizes {sizes} cover {sum(sizes)} layers but costs has {costs.size}; '
        f'the partition sizes must sum to the number of layers')
  return [float(costs[start:end].sum()) for start, end in SplitPoints(sizes)]


def LoadImbalance(partition_costs: Sequence[float]) -> float:
  """Ratio of the most expensive partition to the mean partition cost.

  1.0 is perfect balance; K would mean one partition does all the work. The
  pipeline's throughput is bounded by 1 / imbalance of the ideal speedup.

  Args:
    partition_costs: [K] non-negative partition costs.

  Returns:
    max / mean, or 1.0 if every cost is zero.

  Raises:
    ValueError: if the list is empty, negative or not finite.
  """
  array = _CheckCosts(partition_costs)
  mean = array.mean()
  if mean == 0:
    return 1.0
  return float(array.max() / mean)


@dataclasses.dataclass(frozen=True)
class PartitionPlan:
  """A chosen split of a layer list into pipeline partitions.

  Attributes:
    sizes: [K] layers per partition.
    boundaries: [K] half-open (start, end) layer index ranges.
    partition_costs: [K] summed layer costs per partition.
    imbalance: max / mean of `partition_costs`.
    method: the objective that chose the split, one of `METHODS`.
  """
  sizes: List[int]
  boundaries: List[Tuple[int, int]]
  partition_costs: List[float]
  imbalance: float
  method: str

  def Report(self, layer_names: Optional[Sequence[str]] = None) -> str:
    """A small text table of the plan, for logging before training.

    Args:
      layer_names: optional [L] layer names, listed per partition (long
        partitions show only the first and last two).

    Returns:
      A multi-line string: one row per partition with its layer range, layer
      count, cost, share of the total cost and names, then the imbalance.

    Raises:
      ValueError: if `layer_names` does not have one name per layer.
    """
    num_layers = sum(self.sizes)
    if layer_names is not None:
      layer_names = [str(name) for name in layer_names]
      if len(layer_names) != num_layers:
        raise ValueError(
            f'layer_names has {len(layer_names)} names but the plan covers '
            f'{num_layers} layers; pass one name per layer')
    total = sum(self.partition_costs)
    header = ['partition', 'layers', 'count', 'cost', 'share']
    if layer_names is not None:
      header.append('names')
    rows = [header]
    for k, ((start, end), cost) in enumerate(
        zip(self.boundaries, self.partition_costs)):
      share = 100.0 * cost / total if total > 0 else 100.0 / len(self.sizes)
      layers = str(start) if end - start == 1 else f'{start}-{end - 1}'
      row = [str(k), layers, str(end - start), f'{cost:.6g}', f'{share:.1f}%']
      if layer_names is not None:
        names = layer_names[start:end]
        if len(names) > 5:
          names = names[:2] + ['...'] + names[-2:]
        row.append(', '.join(names))
      rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        f'Partition plan ({self.method}): {num_layers} layers on '
        f'{len(self.sizes)} partitions, total cost {total:.6g}'
    ]
    for row in rows:
      lines.append('  '.join(
          cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    lines.append(f'load imbalance (max / mean cost): {self.imbalance:.3f}')
    return '\n'.join(lines)


def Partition(costs: Sequence[float],
              num_partitions: int,
              method: str = 'min_max') -> PartitionPlan:
  """Chooses a contiguous split of the layers into `num_partitions` parts.

  Args:
    costs: [L] non-negative, finite per-layer costs.
    num_partitions: K, with 1 <= K <= L.
    method: 'min_max' (`PartitionMinMax`) or 'min_variance'
      (`PartitionMinVariance`, the paper's objective).

  Returns:
    The `PartitionPlan`.

  Raises:
    TypeError: if `costs` is not numeric or `num_partitions` not an integer.
    ValueError: if `method` is unknown, `costs` is empty, negative or not
      finite, or K is not in [1, L].
  """
  if method == 'min_max':
    sizes = PartitionMinMax(costs, num_partitions)
  elif method == 'min_variance':
    sizes = PartitionMinVariance(costs, num_partitions)
  else:
    raise ValueError(
        f'unknown partitioning method {method!r}; use one of {METHODS}')
  partition_costs = PartitionCosts(costs, sizes)
  return PartitionPlan(
      sizes=sizes,
      boundaries=SplitPoints(sizes),
      partition_costs=partition_costs,
      imbalance=LoadImbalance(partition_costs),
      method=method)
