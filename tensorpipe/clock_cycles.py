"""GPipe and 1F1B clock schedules: index functions and generators (see schedules).

Re-exported by `schedules.py`, whose `gpipe` and `1f1b` tables are built
from the generators here; today's engines index with the functions.

GPipe (Huang et al. 2018, arXiv 1811.06965, figure 2c) splits a mini-batch into
T micro-batches and a model into K partitions, one per device. On clock tick
`clock` of the forward pass, partition k runs micro-batch t = clock - k, so
micro-batch t reaches partition k only after partition k - 1 has finished it
and each partition sees the micro-batches in order. The pass takes T + K - 1
ticks; during the first and last K - 1 of them some devices idle (the
"bubble"), a fraction (K - 1) / (T + K - 1) of each device's time. The backward
pass is the mirror image: the last partition starts on the last micro-batch.

This module is the one definition of the schedule. The index functions
(`GPipeForwardMicroBatch`, `GPipeBackwardMicroBatch`, `NumClockTicks`) say
which micro-batch a partition runs on a tick; the generators list the (t, k)
cells of each tick and are written with them, and so are the pipeline's
tf.while_loop bodies (`pipeline.py`), the timeline's decoder (`timeline.py`)
and the simulator (`simulator.py`). 1F1B's index function
(`OneFOneBCell`) and generator (`OneFOneBClockCycles`) are defined beside
them; nothing here imports TensorFlow except that function when it is given
a tensor clock.

Example (K=3 partitions, T=4 micro-batches), forward:

  clock  0      1      2      3      4      5
  k=0   (0,0)  (1,0)  (2,0)  (3,0)
  k=1          (0,1)  (1,1)  (2,1)  (3,1)
  k=2                 (0,2)  (1,2)  (2,2)  (3,2)
"""

import numbers
from typing import Iterator, List, Tuple, TypeVar

# One unit of work: (micro-batch index t, partition index k).
Cell = Tuple[int, int]
# A clock tick: a Python int, or a scalar integer tf.Tensor (a loop's clock).
Clock = TypeVar('Clock')


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


def _CheckPartition(k: object, num_partitions: int) -> None:
  """Raises if `k` is not a partition index in [0, num_partitions)."""
  if isinstance(k, bool) or not isinstance(k, numbers.Integral):
    raise TypeError(f'partition index k must be an int, got {k!r} of type '
                    f'{type(k).__name__}')
  if not 0 <= k < num_partitions:
    raise ValueError(f'partition index k={k} is not in [0, {num_partitions}); '
                     f'use 0 <= k < num_partitions={num_partitions}')


def GPipeForwardMicroBatch(clock: Clock, k: int, num_partitions: int,
                           num_micro_batches: int) -> Clock:
  """The micro-batch partition k runs on forward tick `clock`: t = clock - k.

  The index functions use only `+` and `-` on `clock`, so `clock` may be a
  Python int (the generators below, the timeline's decoder) or a scalar
  integer tensor (the clock of the pipeline's tf.while_loop, whose body is
  traced once for all ticks). One expression thus serves both, and this
  module needs no TensorFlow: a pure-int function plus a TensorFlow copy in
  the pipeline would be two definitions again. On a tensor it builds exactly
  the ops the loop would build inline (one subtraction), so a tick costs
  nothing extra.

  Args:
    clock: the tick, an int or a scalar integer tensor (any value; ticks
      outside [0, NumClockTicks) just give an idle t).
    k: the partition, an int in [0, K).
    num_partitions: K, the number of pipeline partitions (devices).
    num_micro_batches: T, the number of micro-batches per mini-batch.

  Returns:
    t, of the type of `clock`. Partition k works on micro-batch t on this
    tick iff 0 <= t < T; any other value means it idles (a bubble tick).

  Raises:
    TypeError: if k, K or T is not an integer.
    ValueError: if K or T is < 1 or k is not in [0, K).
  """
  k_total = _CheckPositiveInt('num_partitions', num_partitions)
  _CheckPositiveInt('num_micro_batches', num_micro_batches)
  _CheckPartition(k, k_total)
  return clock - k


def GPipeBackwardMicroBatch(clock: Clock, k: int, num_partitions: int,
                            num_micro_batches: int) -> Clock:
  """The micro-batch partition k runs on backward tick `clock`.

  The mirror of `GPipeForwardMicroBatch`: the gradient of micro-batch T - 1
  enters at the last partition on tick 0 and partition k receives its first
  gradient K - 1 - k ticks later, so t = T - 1 - (clock - (K - 1 - k)).
  `clock` may be an int or a scalar integer tensor, as there.

  Args:
    clock: the backward tick, an int or a scalar integer tensor.
    k: the partition, an int in [0, K).
    num_partitions: K, the number of pipeline partitions (devices).
    num_micro_batches: T, the number of micro-batches per mini-batch.

  Returns:
    t, of the type of `clock`; partition k works on micro-batch t on this
    tick iff 0 <= t < T.

  Raises:
    TypeError: if k, K or T is not an integer.
    ValueError: if K or T is < 1 or k is not in [0, K).
  """
  k_total = _CheckPositiveInt('num_partitions', num_partitions)
  t_total = _CheckPositiveInt('num_micro_batches', num_micro_batches)
  _CheckPartition(k, k_total)
  return (t_total - 1) - (clock - (k_total - 1 - k))


def NumClockTicks(num_partitions: int, num_micro_batches: int) -> int:
  """Number of clock ticks of one GPipe forward (or backward) pass.

  Ticks beyond it give every partition an idle micro-batch index.

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

  Pseudo-code (t = GPipeForwardMicroBatch(clock, k, K, T) = clock - k):

    for clock in range(T + K - 1):
      yield [(t, k) for k in range(K) if 0 <= t < T]

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
    for clock in range(NumClockTicks(k_total, t_total)):
      cells = [(GPipeForwardMicroBatch(clock, k, k_total, t_total), k)
               for k in range(k_total)]
      yield [(t, k) for t, k in cells if 0 <= t < t_total]

  return _Cycles()


def GPipeBackwardClockCycles(num_partitions: int,
                             num_micro_batches: int) -> Iterator[List[Cell]]:
  """Yields, tick by tick, the (t, k) cells active in the GPipe backward pass.

  The mirror of `GPipeClockCycles`: the gradient of micro-batch T - 1 enters
  at the last partition first, and on backward tick `clock` partition k works
  on micro-batch t = T - 1 - (clock - (K - 1 - k)). So (t, k) runs strictly
  after (t, k + 1), and each partition sees the micro-batches in decreasing
  order.

  Pseudo-code (t = GPipeBackwardMicroBatch(clock, k, K, T)):

    for clock in range(T + K - 1):
      yield [(t, k) for k in reversed(range(K)) if 0 <= t < T]

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
    for clock in range(NumClockTicks(k_total, t_total)):
      cells = [(GPipeBackwardMicroBatch(clock, k, k_total, t_total), k)
               for k in reversed(range(k_total))]
      yield [(t, k) for t, k in cells if 0 <= t < t_total]

  return _Cycles()


# -- 1F1B (one forward, one backward; PipeDream-flush) ----------------------
#
# The loss is computed inside the pipeline, so a micro-batch's backward pass
# starts as soon as the last partition has finished its forward pass. With
# unit-length forward (F) and backward (B) cells on one clock, partition k
# runs micro-batch t's forward on tick f(t, k) and its backward on b(t, k):
#
#   f(t, k) = t + k            for t < K - k   (warm-up, as GPipe)
#   f(t, k) = 2 t + k          for t >= K - k  (steady state)
#   b(t, k) = 2 K - 1 - k + 2 t
#
# so b(t, K-1) = f(t, K-1) + 1, b(t, k) = b(t, k + 1) + 1, and partition k
# alternates B(t), F(t + K - k) from tick 2 K - 1 - k on. At most K - k
# micro-batches are in flight on partition k (forward done, backward not):
# a stage keeps at most K - k boundary inputs, where GPipe keeps T. The
# schedule takes 2 (T + K - 1) ticks, GPipe's forward plus backward ticks, so
# the bubble fraction is the same.
#
# Example (K=3, T=4): F<t> / B<t> per partition and tick.
#
#   clock  0   1   2   3   4   5   6   7   8   9   10  11
#   k=0    F0  F1  F2          B0  F3  B1      B2      B3
#   k=1        F0  F1      B0  F2  B1  F3  B2      B3
#   k=2            F0  B0  F1  B1  F2  B2  F3  B3

# Operation codes of the 1F1B index function.
IDLE = 0
FORWARD = 1
BACKWARD = 2


def OneFOneBCell(clock: Clock, k: int, num_partitions: int,
                 num_micro_batches: int) -> Tuple[Clock, Clock]:
  """What partition k does on 1F1B tick `clock`: (op, t).

  `clock` may be a Python int (the generator, the timeline's decoder, the
  simulator) or a scalar int32 tensor (the clock of the pipeline's
  tf.while_loop): one definition for both, as for GPipe. On a tensor the
  result is a pair of scalar int32 tensors built from a handful of integer
  ops (TensorFlow is imported only then).

  Args:
    clock: the tick, an int or a scalar int32 tensor.
    k: the partition, an int in [0, K).
    num_partitions: K.
    num_micro_batches: T.

  Returns:
    (op, t): op is IDLE, FORWARD or BACKWARD (0, 1, 2); t is the micro-batch,
    in [0, T) when op != IDLE (and 0 when IDLE).

  Raises:
    TypeError: if k, K or T is not an integer.
    ValueError: if K or T is < 1 or k is not in [0, K).
  """
  k_total = _CheckPositiveInt('num_partitions', num_partitions)
  t_total = _CheckPositiveInt('num_micro_batches', num_micro_batches)
  _CheckPartition(k, k_total)
  where, both, either = _Ops(clock)
  # Warm-up: F(clock - k) on ticks [k, K), while t < T.
  t_warm = clock - k
  is_warm = both(both(clock >= k, clock < k_total), t_warm < t_total)
  # Steady state from B(0)'s tick on: d = clock - (2 K - 1 - k); even d
  # runs B(d / 2), odd d runs F(K - k + (d - 1) / 2).
  d = clock - (2 * k_total - 1 - k)
  d_pos = where(d >= 0, d, 0 * d)         # // and % of non-negatives only
  half = d_pos // 2
  odd = d_pos % 2
  t_fwd = (k_total - k) + half
  is_back = both(both(d >= 0, odd == 0), half < t_total)
  is_fwd = both(both(d >= 0, odd == 1), t_fwd < t_total)
  zero = 0 * clock
  op = where(is_back, zero + BACKWARD,
             where(either(is_warm, is_fwd), zero + FORWARD, zero + IDLE))
  t = where(is_back, half,
            where(is_warm, t_warm, where(is_fwd, t_fwd, zero)))
  return op, t


def _Ops(clock):
  """(where, and, or) for a Python int clock or a TensorFlow tensor clock."""
  if isinstance(clock, numbers.Integral):
    return ((lambda c, a, b: a if c else b), (lambda a, b: bool(a and b)),
            (lambda a, b: bool(a or b)))
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.where, tf.logical_and, tf.logical_or


def OneFOneBNumClockTicks(num_partitions: int, num_micro_batches: int) -> int:
  """Ticks of one 1F1B step (forward and backward): 2 (T + K - 1)."""
  k = _CheckPositiveInt('num_partitions', num_partitions)
  t = _CheckPositiveInt('num_micro_batches', num_micro_batches)
  return 2 * (t + k - 1)


def OneFOneBMaxInFlight(k: int, num_partitions: int,
                        num_micro_batches: int) -> int:
  """Most micro-batches partition k holds (forward done, backward not).

  min(K - k, T): the number of boundary inputs the stage must keep with
  recompute (GPipe keeps T).
  """
  k_total = _CheckPositiveInt('num_partitions', num_partitions)
  t_total = _CheckPositiveInt('num_micro_batches', num_micro_batches)
  _CheckPartition(k, k_total)
  return min(k_total - k, t_total)


# One unit of 1F1B work: (op, micro-batch t, partition k), op FORWARD or
# BACKWARD.
OpCell = Tuple[int, int, int]


def OneFOneBClockCycles(num_partitions: int,
                        num_micro_batches: int) -> Iterator[List[OpCell]]:
  """Yields, tick by tick, the (op, t, k) cells active in one 1F1B step.

  Warm-up (partition k runs forwards of micro-batches 0 .. K-k-1 as GPipe
  does), steady state (from tick 2K-1-k partition k alternates the backward
  of its oldest micro-batch in flight with the forward of a new one) and
  cool-down (the remaining backwards), all from `OneFOneBCell`. The forward
  and backward of one step share one clock.

  Pseudo-code ((op, t) = OneFOneBCell(clock, k, K, T)):

    for clock in range(2 (T + K - 1)):
      yield [(op, t, k) for k in range(K) if op != IDLE]

  Example (K=3, T=4), as in the diagram above:

    clock 0: [(F, 0, 0)]
    clock 1: [(F, 1, 0), (F, 0, 1)]
    clock 2: [(F, 2, 0), (F, 1, 1), (F, 0, 2)]
    clock 3: [(B, 0, 2)]
    clock 4: [(B, 0, 1), (F, 1, 2)]
    ...

  Args:
    num_partitions: K, the number of pipeline partitions (devices).
    num_micro_batches: T, the number of micro-batches per mini-batch.

  Returns:
    An iterator over 2 (T + K - 1) lists of (op, t, k) triples, each list in
    increasing k, op FORWARD or BACKWARD. Every (FORWARD, t, k) and
    (BACKWARD, t, k) with 0 <= t < T, 0 <= k < K appears exactly once.

  Raises:
    TypeError: if an argument is not an integer.
    ValueError: if an argument is < 1. Raised by this call, not on the first
      `next()`.
  """
  k_total = _CheckPositiveInt('num_partitions', num_partitions)
  t_total = _CheckPositiveInt('num_micro_batches', num_micro_batches)

  def _Cycles() -> Iterator[List[OpCell]]:
    for clock in range(OneFOneBNumClockTicks(k_total, t_total)):
      cells = [OneFOneBCell(clock, k, k_total, t_total) + (k,)
               for k in range(k_total)]
      yield [cell for cell in cells if cell[0] != IDLE]

  return _Cycles()
