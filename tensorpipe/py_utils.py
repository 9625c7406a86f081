"""FProp context: training mode, randomness and batch-statistics collection.

Layers are functional (`FProp(theta, *inputs)`), but a few things are not
inputs: whether we are training, the seed of the current step, which examples
of the mini-batch the current call sees, and where batch-norm layers report the
statistics they computed. They live in a thread-local stack of contexts that
the caller (a trainer, a test, or `TensorPipeLayer` for each micro-batch) sets
with `with` blocks. Because contexts are read while a function is traced, the
values may be Python numbers or tensors.

Randomness is counter based (Philox, `StatelessRandomUniformV2`): the random
number used for element i of example n of the mini-batch depends only on the
layer's seed, the step seed and (n, i). A micro-batch that starts at example
`example_offset` therefore draws exactly the numbers the whole batch would draw
for those examples, so dropout masks are the same for any number of partitions
K or micro-batches T, and the recompute pass reproduces the forward pass's masks.
"""

import contextlib
import dataclasses
import threading
import zlib
from typing import Any, Callable, Iterator, List, Optional, Sequence, Union

import tensorflow as tf

_local = threading.local()


@dataclasses.dataclass
class _Context:
  # None until a TrainingMode / EvalMode block sets it: FProp then trains,
  # while a plain `layer(x)` call runs in eval mode (BaseLayer.__call__).
  training: Optional[bool] = None
  step_seed: Any = 0
  example_offset: Any = 0
  stats_collector: Optional[List[Any]] = None


def _Stack() -> List[_Context]:
  if not hasattr(_local, 'stack'):
    _local.stack = [_Context()]
  return _local.stack


def Current() -> _Context:
  return _Stack()[-1]


@contextlib.contextmanager
def _Push(**changes) -> Iterator[_Context]:
  ctx = dataclasses.replace(Current(), **changes)
  _Stack().append(ctx)
  try:
    yield ctx
  finally:
    _Stack().pop()


def RestoreContext(ctx: _Context):
  """Context manager re-entering `ctx`'s mode and step seed.

  A recompute pass runs when the gradient is taken, possibly outside the
  `StepSeed` / `EvalMode` blocks of the forward pass; it re-enters the forward
  pass's context so that it draws the same random numbers.
  """
  return _Push(training=ctx.training, step_seed=ctx.step_seed)


def IsTraining() -> bool:
  """Whether layers run in training mode (batch statistics, dropout on).

  True inside `TrainingMode(True)`, False inside `EvalMode()`; outside both,
  True (Lingvo's FProp default), except under a plain `layer(x)` call, which
  enters eval mode itself.
  """
  return Current().training is not False


def ModeIsSet() -> bool:
  """Whether a `TrainingMode` / `EvalMode` block encloses the caller."""
  return Current().training is not None


def TrainingMode(training: bool = True):
  """Context manager: `with TrainingMode(False):` runs layers in eval mode."""
  if not isinstance(training, bool):
    raise TypeError(f'training must be a bool, got {training!r}')
  return _Push(training=training)


def EvalMode():
  """Context manager: layers use moving statistics and no dropout."""
  return TrainingMode(False)


def StepSeed(seed: Union[int, tf.Tensor]):
  """Context manager setting the per-step seed (e.g. the global step)."""
  return _Push(step_seed=seed)


def ExampleOffset(offset: Union[int, tf.Tensor]):
  """Context manager: the current inputs start at example `offset` of the batch."""
  return _Push(example_offset=offset)


def LayerSeed(path: str, random_seed: Optional[int]) -> int:
  """A stable 31-bit seed for a layer from its path and its `random_seed`."""
  return (zlib.crc32(path.encode('utf-8')) + 7919 * int(random_seed or 0)) % (
      2**31 - 1)


def StatelessUniform(shape: Sequence[int], layer_seed: int,
                     dtype=tf.float32) -> tf.Tensor:
  """Uniform [0, 1) numbers for the current examples, batch-major.

  `shape[0]` is the batch axis. The numbers equal the matching rows of the
  numbers the whole mini-batch would get (see the module docstring).

  Args:
    shape: [batch, ...] static shape of the numbers to draw.
    layer_seed: the drawing layer's seed (`LayerSeed`).
    dtype: float dtype of the result.

  Returns:
    A tensor of `shape` with values in [0, 1).
  """
  ctx = Current()
  shape = [int(d) for d in shape]
  per_example = 1
  for d in shape[1:]:
    per_example *= d
  n = per_example * shape[0]
  seed = tf.stack([tf.constant(layer_seed, tf.int64),
                   tf.cast(ctx.step_seed, tf.int64)])
  key, counter = tf.raw_ops.StatelessRandomGetKeyCounter(seed=seed)
  # Philox makes 4 numbers per counter value: start at the block holding the
  # first wanted number and drop the ones before it.
  offset = tf.cast(ctx.example_offset, tf.int64) * per_example
  start = tf.cast(offset // 4, tf.uint64)
  skip = offset % 4
  counter = tf.stack([start, counter[1]])
  flat = tf.raw_ops.StatelessRandomUniformV2(
      shape=[n + 4], key=key, counter=counter, alg=1, dtype=tf.float32)
  flat = tf.slice(flat, tf.reshape(skip, [1]), [n])
  return tf.cast(tf.reshape(flat, shape), dtype)


@dataclasses.dataclass
class BatchStats:
  """Sufficient statistics of a batch-norm layer's inputs over some examples.

  Attributes:
    count: number of values reduced per channel (scalar float).
    total: per-channel sum, [channels].
    total_sq: per-channel sum of squares, [channels].
  """
  count: tf.Tensor
  total: tf.Tensor
  total_sq: tf.Tensor

  def Flatten(self) -> List[tf.Tensor]:
    return [self.count, self.total, self.total_sq]

  @classmethod
  def Pack(cls, flat: Sequence[tf.Tensor]) -> 'BatchStats':
    return cls(*flat)

  def Merge(self, other: 'BatchStats') -> 'BatchStats':
    return BatchStats(self.count + other.count, self.total + other.total,
                      self.total_sq + other.total_sq)

  def MeanAndVariance(self):
    mean = self.total / self.count
    variance = tf.maximum(self.total_sq / self.count - tf.square(mean), 0.)
    return mean, variance


def AddBatchStats(layer: Any, stats: BatchStats) -> None:
  """Reports a layer's batch statistics for its moving-average update.

  Inside `CollectBatchStats()` the statistics are recorded for the caller to
  merge (a pipeline merges those of all micro-batches); otherwise the layer's
  `UpdateMovingStats(stats)` is called at once.
  """
  collector = Current().stats_collector
  if collector is None:
    layer.UpdateMovingStats(stats)
  else:
    collector.append((layer, stats))


@contextlib.contextmanager
def CollectBatchStats() -> Iterator[List[Any]]:
  """Collects (layer, BatchStats) pairs reported inside the block."""
  collected: List[Any] = []
  with _Push(stats_collector=collected):
    yield collected


def CallWithStats(fn: Callable[..., Any], *args, **kwargs):
  """Calls fn, returning (result, [(layer, BatchStats)]) it reported."""
  with CollectBatchStats() as collected:
    result = fn(*args, **kwargs)
  return result, collected
