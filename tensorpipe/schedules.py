"""GPipe pipeline clock schedules as pure Python generators.

GPipe (Huang et al. 2018, arXiv 1811.06965, figure 2c) splits a mini-batch into
T micro-batches and a model into K partitions, one per device. On clock tick
`clock` of the forward pass, partition k runs micro-batch t = clock - k, so
micro-batch t reaches partition k only after partition k - 1 has finished it
and each partition sees the micro-batches in order. The pass takes T + K - 1
ticks; during the first and last K - 1 of them some devices idle (the
"bubble"), a fraction (K - 1) / (T + K - 1) of each device's time. The backward
pass is the mirror image: the last partition starts on the last micro-batch.

The schedules are plain lists of (t, k) pairs so that the pipeline engine, the
tests and any tooling (e.g. a printed timeline) share one definition. Nothing
here imports TensorFlow.

Example (K=3 partitions, T=4 micro-batches), forward:

  clock  0      1      2      3      4      5
  k=0   (0,0)  (1,0)  (2,0)  (3,0)
  k=1          (0,1)  (1,1)  (2,1)  (3,1)
  k=2                 (0,2)  (1,2)  (2,2)  (3,2)
"""

import numbers
from typing import Iterator, List, Tuple

# One unit of work: (micro-batch index t, partition index k).
Cell = Tuple[int, int]


def _CheckPositiveInt(name: str, value: object) -> int:
  """Returns `value` as an int, or raises if it is not a positive integer."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise TypeError(
        f'{name} must be a positive integer, got {value!r} of type '
        f'{type(value).__name__}; pass an int such as {name}=4')
  if value < 1:
    raise ValueError(
        f'{name} must be a positive integer, got {name}={value!r}; '
        f'use {name} >= 1')
  return int(value)


def NumClockTicks(num_partitions: int, num_micro_batches: int) -> int:
  """Number of clock ticks of one GPipe forward (or backward) pass.

  Args:
    num_partitions: K, the number of pipeline partitions (devices).
    num_micro_batches: T, the number of micro-batches per mini-batch.

  Returns:
    T + K - 1.

  Raises:
    TypeError: if an argument is not an integer.
    ValueError: if an argument is < 1.
  """
  k = _CheckPositiveInt('num_partitions', num_partitions)
  t = _CheckPositiveInt('num_micro_batches', num_micro_batches)
  return t + k - 1


def BubbleFraction(num_partitions: int, num_micro_batches: int) -> float:
  """Fraction of each device's time spent idle in one GPipe pass.

  Each partition is busy T of the T + K - 1 ticks, so the idle share is
  (K - 1) / (T + K - 1); it vanishes for K = 1 and shrinks as T grows, which is
  why the paper recommends T >= 4 K.

  Args:
    num_partitions: K, the number of pipeline partitions (devices).
    num_micro_batches: T, the number of micro-batches per mini-batch.

  Returns:
    (K - 1) / (T + K - 1), a float in [0, 1).

  Raises:
    TypeError: if an argument is not an integer.
    ValueError: if an argument is < 1.
  """
  k = _CheckPositiveInt('num_partitions', num_partitions)
  t = _CheckPositiveInt('num_micro_batches', num_micro_batches)
  return (k - 1) / (t + k - 1)


def GPipeClockCycles(num_partitions: int,
                     num_micro_batches: int) -> Iterator[List[Cell]]:
  """Yields, tick by tick, the (t, k) cells active in the GPipe forward pass.

  Pseudo-code:

    for clock in range(T + K - 1):
      yield [(clock - k, k) for k in range(K) if 0 <= clock - k < T]

  Args:
    num_partitions: K, the number of pipeline partitions (devices).
    num_micro_batches: T, the number of micro-batches per mini-batch.

  Returns:
    An iterator over T + K - 1 lists of (t, k) pairs, each list in increasing
    k. Every (t, k) with 0 <= t < T, 0 <= k < K appears exactly once.

  Raises:
    TypeError: if an argument is not an integer.
    ValueError: if an argument is < 1. Raised by this call, not on the first
      `next()`.
  """
  k_total = _CheckPositiveInt('num_partitions', num_partitions)
  t_total = _CheckPositiveInt('num_micro_batches', num_micro_batches)

  def _Cycles() -> Iterator[List[Cell]]:
    for clock in range(t_total + k_total - 1):
      # Partition k is busy iff 0 <= clock - k < T.
      k_first = max(0, clock - t_total + 1)
      k_last = min(clock, k_total - 1)
      yield [(clock - k, k) for k in range(k_first, k_last + 1)]

  return _Cycles()


def GPipeBackwardClockCycles(num_partitions: int,
                             num_micro_batches: int) -> Iterator[List[Cell]]:
  """Yields, tick by tick, the (t, k) cells active in the GPipe backward pass.

  The mirror of `GPipeClockCycles`: the gradient of micro-batch T - 1 enters
  at the last partition first, and on backward tick `clock` partition k works
  on micro-batch t = T - 1 - (clock - (K - 1 - k)). So (t, k) runs strictly
  after (t, k + 1), and each partition sees the micro-batches in decreasing
  order.

  Pseudo-code:

    for clock in range(T + K - 1):
      yield [(T - 1 - (clock - (K - 1 - k)), k) for k in reversed(range(K))
             if 0 <= clock - (K - 1 - k) < T]

  Args:
    num_partitions: K, the number of pipeline partitions (devices).
    num_micro_batches: T, the number of micro-batches per mini-batch.

  Returns:
    An iterator over T + K - 1 lists of (t, k) pairs, each list in decreasing
    k (last partition first). Every (t, k) appears exactly once.

  Raises:
    TypeError: if an argument is not an integer.
    ValueError: if an argument is < 1. Raised by this call, not on the first
      `next()`.
  """
  k_total = _CheckPositiveInt('num_partitions', num_partitions)
  t_total = _CheckPositiveInt('num_micro_batches', num_micro_batches)

  def _Cycles() -> Iterator[List[Cell]]:
    for clock in range(t_total + k_total - 1):
      cells = []
      for k in reversed(range(k_total)):
        # Steps since partition k received its first gradient.
        step = clock - (k_total - 1 - k)
        if 0 <= step < t_total:
          cells.append((t_total - 1 - step, k))
      yield cells

  return _Cycles()
