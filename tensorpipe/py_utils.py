"""FProp context: training mode, randomness, batch layout and collectors.

Layers are functional (`FProp(theta, *inputs)`), but a few things are not
inputs: whether we are training, the seed of the current step, which examples
of the global batch the current call sees and on which axis they lie, the
training progress that scales drop-path, where batch-norm layers report the
statistics they computed, and the timeline recorder. They live in ONE
thread-local stack of immutable `FPropContext`s that the caller (a trainer, a
test, or `TensorPipeLayer` for each micro-batch) sets with `with` blocks.
Because contexts are read while a function is traced, the values may be
Python numbers or tensors.

Two places run layers outside the `with` blocks that set their context, and
re-enter a captured one:

  * the recompute pass (`RestoreContext`): the backward pass of a pipeline
    re-runs each partition's forward when the gradient is taken, possibly
    after the forward's `with` blocks have exited (the trainer takes
    `tape.gradient` outside them);
  * other threads (`CaptureContext` + `WithContext`): `tf.distribute`
    strategies run replica functions in threads of their own, which start
    with the default context:

      ctx = py_utils.CaptureContext()        # inside StepSeed, EvalMode, ...
      strategy.run(py_utils.WithContext(ctx, ReplicaFn), args=(batch,))

    and inside ReplicaFn, `with py_utils.ReplicaExampleOffset(n):` makes
    replica r's examples start at r * n of the global batch.

Randomness is counter based (Philox, `StatelessRandomUniformV2`): the random
number used for element i of example n of the global batch depends only on the
layer's seed, the step seed and (n, i). Example offsets compose: a replica
adds r * n, a pipeline's micro-batch t adds t * m on top. A call that starts
at example `example_offset` therefore draws exactly the numbers the whole
batch would draw for those examples, on whichever axis the batch lies
(`BatchAxis`), so dropout masks are the same for any number of replicas R,
partitions K or micro-batches T, and the recompute pass reproduces the forward
pass's masks.
"""

import contextlib
import dataclasses
import functools
import numbers
import threading
import zlib
from typing import (Any, Callable, Iterator, List, NamedTuple, Optional,
                    Sequence, Union)

from absl import logging
import tensorflow as tf

_local = threading.local()

# Whether IsTraining(layer=...) has warned that a mode-dependent layer trains
# because no mode block is set (once per process).
_warned_training_by_default = False
_warn_lock = threading.Lock()

# An int or a scalar integer tensor (e.g. the global step).
IntLike = Union[int, tf.Tensor]


@dataclasses.dataclass(frozen=True, eq=False)
class FPropContext:
  """What layers read besides their inputs; one per `with` block.

  Attributes:
    training: training mode (batch statistics, dropout, drop-path on);
      None until a `TrainingMode` / `EvalMode` block sets it: `FProp` then
      trains, while a plain `layer(x)` call runs in eval mode
      (`base_layer.BaseLayer.__call__`).
    step_seed: the per-step seed of counter-based randomness (int or scalar
      integer tensor, e.g. the global step).
    example_offset: index in the global batch of the first example the
      current inputs hold (int or scalar integer tensor); `ExampleOffset`
      adds to it.
    batch_axis: the axis of the batch in the tensors layers see (int >= 0);
      per-example randomness is drawn along it.
    drop_path_progress: training progress in [0, 1] scaling drop-path (float
      or scalar float tensor); 1.0, full drop-path, unless a trainer sets it.
    stats_collector: list receiving (layer, BatchStats) pairs, or None to
      update moving statistics at once (`AddBatchStats`).
    timeline_recorder: the `timeline.Recorder` of an active
      `timeline.Record()` block, or None (recording off).
  """
  training: Optional[bool] = None
  step_seed: Any = 0
  example_offset: Any = 0
  batch_axis: int = 0
  drop_path_progress: Any = 1.0
  stats_collector: Optional[List[Any]] = None
  timeline_recorder: Optional[Any] = None


def _Stack() -> List[FPropContext]:
  if not hasattr(_local, 'stack'):
    _local.stack = [FPropContext()]
  return _local.stack


def Current() -> FPropContext:
  """The innermost context of this thread."""
  return _Stack()[-1]


@contextlib.contextmanager
def EnterContext(ctx: FPropContext) -> Iterator[FPropContext]:
  """Context manager making `ctx`, unchanged, the current context."""
  if not isinstance(ctx, FPropContext):
    raise TypeError(f'EnterContext needs an FPropContext (from '
                    f'py_utils.CaptureContext()), got {ctx!r}')
  stack = _Stack()
  stack.append(ctx)
  try:
    yield ctx
  finally:
    stack.pop()


def _Push(**changes):
  """Enters a copy of the current context with `changes`."""
  return EnterContext(dataclasses.replace(Current(), **changes))


def CaptureContext() -> FPropContext:
  """The current context, to re-enter in another thread (`WithContext`).

  Contexts are immutable, so the captured value does not change when the
  caller's `with` blocks exit. It shares the caller's stats collector and
  timeline recorder (both lists/objects append-only and thread-safe), so
  replica threads report into the caller's blocks.
  """
  return Current()


def WithContext(ctx: FPropContext, fn: Callable[..., Any]) -> Callable[..., Any]:
  """`fn` wrapped to run inside `ctx`, in whatever thread calls it.

  Thread-local state does not cross threads: a `tf.distribute` strategy's
  `run` calls its function in one thread per replica, where a `StepSeed` or
  `EvalMode` set around `strategy.run` is not seen (layers would run in
  training mode with step seed 0). Wrap the replica function instead:

    ctx = py_utils.CaptureContext()
    strategy.run(py_utils.WithContext(ctx, ReplicaFn), args=(batch,))

  Args:
    ctx: a context from `CaptureContext()`.
    fn: the function to call.

  Returns:
    A function with fn's signature that calls fn inside `EnterContext(ctx)`.
  """
  if not isinstance(ctx, FPropContext):
    raise TypeError(f'WithContext needs an FPropContext (from '
                    f'py_utils.CaptureContext()), got {ctx!r}')

  @functools.wraps(fn)
  def Wrapped(*args, **kwargs):
    with EnterContext(ctx):
      return fn(*args, **kwargs)
  return Wrapped


def IsolatedFunction(fn: Callable[..., Any]) -> Callable[..., Any]:
  """`fn` as a tf.function (AutoGraph off) that is never inlined.

  Grappler then optimizes its body alone, so what it computes has the same
  bits whatever graph calls it. Inlined, Grappler's arithmetic optimizer
  and constant folding rewrite a computation by what surrounds it: a
  pipeline cell in a loop body against the same cell run once, a
  learning-rate formula in one training step against another (README
  "Cells in their own functions"). Users: schedule_cells.Cells._Cell,
  lr_schedules.BaseSchedule.
  """
  return tf.function(fn, autograph=False,
                     experimental_attributes={'_noinline': True})


def RestoreContext(ctx: FPropContext):
  """Context manager re-entering the forward pass's context for a recompute.

  A recompute pass runs when the gradient is taken, possibly outside the
  `with` blocks of the forward pass; it must compute the same function.
  Field by field:

    training, step_seed, drop_path_progress: restored, so that the same
      layers drop the same values with the same keep probabilities;
    example_offset, batch_axis: restored, so that per-example masks are
      drawn for the same examples along the same axis (a pipeline's
      micro-batch offset is added inside, as in the forward);
    timeline_recorder: restored: the backward loop records its cells iff
      the forward recorded, into the same recorder;
    stats_collector: NOT restored. The recomputed batch statistics repeat
      what the forward already reported; reporting them again (or, with no
      collector, calling `UpdateMovingStats`) would update the moving
      averages twice per step. They go to a fresh collector and are dropped.
  """
  return EnterContext(dataclasses.replace(ctx, stats_collector=[]))


def IsTraining(layer: Optional[str] = None) -> bool:
  """Whether layers run in training mode (batch statistics, dropout on).

  True inside `TrainingMode(True)`, False inside `EvalMode()`; outside both,
  True (Lingvo's FProp default), except under a plain `layer(x)` call, which
  enters eval mode itself.

  Args:
    layer: given by a layer whose output depends on the mode (batch norm,
      dropout, drop-path), naming it, e.g. "BatchNormLayer 'pipe/bn'". If no
      mode block is set, the first such call of the process logs a warning
      that it trains by default, naming TrainingMode / EvalMode.
  """
  training = Current().training
  if training is None and layer is not None:
    _WarnTrainingByDefault(layer)
  return training is not False


def _WarnTrainingByDefault(layer: str) -> None:
  """Logs once per process that `layer` trains for want of a mode block."""
  global _warned_training_by_default
  with _warn_lock:
    if _warned_training_by_default:
      return
    _warned_training_by_default = True
  logging.warning(
      '%s runs in training mode (batch statistics and moving-average '
      'updates, dropout on) because no py_utils.TrainingMode / EvalMode '
      'block is set: FProp and FPropDefaultTheta train by default (Lingvo), '
      'while a plain layer(x) call is inference. Wrap the call in '
      '`with tensorpipe.TrainingMode(True):` to train or `with '
      'tensorpipe.EvalMode():` for inference. (Warned once per process.)',
      layer)


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


def _CheckIntLike(name: str, value: Any) -> None:
  if isinstance(value, (tf.Tensor, tf.Variable)):
    if not value.dtype.is_integer:
      raise TypeError(f'{name} must be an integer tensor, got dtype '
                      f'{value.dtype.name}; cast it with tf.cast(..., '
                      'tf.int64)')
    return
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise TypeError(f'{name} must be an int or an integer tensor, got '
                    f'{value!r} of type {type(value).__name__}')
  if value < 0:
    raise ValueError(f'{name}={value} must be >= 0')


def StepSeed(seed: IntLike):
  """Context manager setting the per-step seed (e.g. the global step)."""
  return _Push(step_seed=seed)


def _AddOffsets(a: IntLike, b: IntLike) -> IntLike:
  """a + b, without an op when either is the Python int 0."""
  if isinstance(a, numbers.Integral) and a == 0:
    return b
  if isinstance(b, numbers.Integral) and b == 0:
    return a
  if isinstance(a, numbers.Integral) and isinstance(b, numbers.Integral):
    return a + b
  return tf.cast(a, tf.int64) + tf.cast(b, tf.int64)


def ExampleOffset(offset: IntLike):
  """Context manager: the inputs start `offset` examples further on.

  Offsets compose: inside `ExampleOffset(a)`, `ExampleOffset(b)` means the
  inputs start at example a + b of the global batch. A replica adds its
  shard's start (`ReplicaExampleOffset`), a pipeline then adds t * m for its
  micro-batch t, and a nested pipeline adds its own micro-batch's start.

  Args:
    offset: an int >= 0 or a scalar integer tensor.
  """
  _CheckIntLike('example offset', offset)
  return _Push(example_offset=_AddOffsets(Current().example_offset, offset))


def ReplicaExampleOffset(per_replica_batch_size: int):
  """Context manager: the current replica's examples start at r * n.

  Inside `strategy.run`, replica r of R holds examples [r n, (r + 1) n) of
  the global batch; with this block its masks are those rows of the global
  batch's masks, instead of every replica drawing replica 0's. Use it inside
  the replica function (the context does not reach replica threads from
  outside, see `WithContext`). Outside any strategy the replica is 0.

  Args:
    per_replica_batch_size: n, the examples per replica.

  Raises:
    ValueError: in a cross-replica context (`strategy.scope()` but not inside
      `strategy.run`), where there is no current replica.
  """
  if (isinstance(per_replica_batch_size, bool) or
      not isinstance(per_replica_batch_size, numbers.Integral) or
      per_replica_batch_size < 1):
    raise ValueError(f'per_replica_batch_size={per_replica_batch_size!r} '
                     'must be a positive int (the batch each replica gets)')
  replica_ctx = tf.distribute.get_replica_context()
  if replica_ctx is None:
    raise ValueError('ReplicaExampleOffset needs a replica context: use it '
                     'inside the function given to strategy.run, not in '
                     'strategy.scope()')
  replica = replica_ctx.replica_id_in_sync_group
  if isinstance(replica, numbers.Integral):
    return ExampleOffset(int(replica) * per_replica_batch_size)
  return ExampleOffset(tf.cast(replica, tf.int64) * per_replica_batch_size)


def BatchAxis(axis: int):
  """Context manager: the batch lies on `axis` of the tensors layers see.

  Per-example randomness (`StatelessUniform`) is drawn along this axis, so
  a layout with the batch on axis 1 (e.g. [time, batch, dim], a
  `TensorPipeLayer` with batch_dim=1, which sets it) gets per-example masks
  that do not depend on how the batch is split.
  """
  if isinstance(axis, bool) or not isinstance(axis, int) or axis < 0:
    raise ValueError(f'batch axis {axis!r} must be an int >= 0')
  return _Push(batch_axis=axis)


def CurrentBatchAxis() -> int:
  """The batch axis set by the innermost `BatchAxis` block (default 0)."""
  return Current().batch_axis


def PerExampleShape(shape: Sequence[int]) -> List[int]:
  """Shape of one value per example of a tensor of `shape`.

  1 on every axis except the context's batch axis, e.g. [8, 1, 1, 1] for
  [8, 4, 4, 16] with the batch on axis 0: a drop-path mask's shape.

  Raises:
    ValueError: if the batch axis is not an axis of `shape`.
  """
  shape = list(shape)
  axis = CurrentBatchAxis()
  if axis >= len(shape):
    raise ValueError(f'batch axis {axis} is out of range for shape {shape}; '
                     'set py_utils.BatchAxis / TensorPipeLayer batch_dim to '
                     'the axis of the batch')
  out = [1] * len(shape)
  out[axis] = int(shape[axis])
  return out


def DropPathProgress(progress: Union[float, tf.Tensor]):
  """Context manager setting the training progress that scales drop-path.

  Without it drop-path runs at full strength (progress 1.0). The trainer
  sets progress = step / max_steps in its train step (NASNet's schedule).

  Args:
    progress: a float in [0, 1] or a scalar float tensor, e.g.
      tf.minimum(1., tf.cast(step, tf.float32) / total_steps) computed in the
      train step; read when layers are traced. Not a tf.Variable: the
      pipeline's custom gradient cannot capture variables.

  Raises:
    TypeError: for a tf.Variable or a non-number.
    ValueError: for a Python number outside [0, 1].
  """
  if isinstance(progress, tf.Variable):
    raise TypeError(f'DropPathProgress got the variable {progress.name!r}; '
                    'pass a tensor: progress.read_value() inside the train '
                    'step')
  if not isinstance(progress, tf.Tensor):
    if isinstance(progress, bool) or not isinstance(progress, numbers.Real):
      raise TypeError(f'drop-path progress must be a float in [0, 1] or a '
                      f'scalar tensor, got {progress!r}')
    if not 0.0 <= progress <= 1.0:
      raise ValueError(f'drop-path progress={progress!r} must be in [0, 1] '
                       '(step / total steps)')
  return _Push(drop_path_progress=progress)


def CurrentDropPathProgress() -> Union[float, tf.Tensor]:
  """The progress of the innermost `DropPathProgress` block (default 1.0)."""
  return Current().drop_path_progress


def TimelineRecorder(recorder: Any):
  """Context manager installing a `timeline.Recorder` (see `timeline.Record`)."""
  return _Push(timeline_recorder=recorder)


def LayerSeed(path: str, random_seed: Optional[int]) -> int:
  """A stable 31-bit seed for a layer from its path and its `random_seed`."""
  return (zlib.crc32(path.encode('utf-8')) + 7919 * int(random_seed or 0)) % (
      2**31 - 1)


def StatelessUniform(shape: Sequence[int], layer_seed: int,
                     dtype=tf.float32,
                     batch_axis: Optional[int] = None) -> tf.Tensor:
  """Uniform [0, 1) numbers for the current examples.

  `shape[batch_axis]` is the batch. The numbers are drawn example by example
  (each example's numbers in row-major order of the other axes) starting at
  the context's example offset, so they equal the matching examples of the
  numbers the whole global batch would get (see the module docstring).

  Args:
    shape: shape of the numbers to draw, the batch on `batch_axis`: ints,
      except that the batch may be a scalar integer tensor (a dynamic batch,
      e.g. the last partial batch of a Keras `fit`).
    layer_seed: the drawing layer's seed (`LayerSeed`).
    dtype: float dtype of the result.
    batch_axis: the batch axis; None uses the context's (`BatchAxis`).

  Returns:
    A tensor of `shape` with values in [0, 1).

  Raises:
    ValueError: if the batch axis is not an axis of `shape`.
  """
  ctx = Current()
  axis = ctx.batch_axis if batch_axis is None else batch_axis
  shape = [d if i == axis and isinstance(d, tf.Tensor) else int(d)
           for i, d in enumerate(shape)]
  if not 0 <= axis < len(shape):
    raise ValueError(f'batch axis {axis} is out of range for random numbers '
                     f'of shape {shape}; the batch must be one of its axes '
                     '(set py_utils.BatchAxis / TensorPipeLayer batch_dim to '
                     'the axis of the batch)')
  batch_major = [shape[axis]] + shape[:axis] + shape[axis + 1:]
  per_example = 1
  for d in batch_major[1:]:
    per_example *= d
  batch = batch_major[0]
  n = (tf.cast(batch, tf.int64) if isinstance(batch, tf.Tensor) else
       batch) * per_example
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
  uniform = tf.reshape(flat, batch_major)
  if axis:
    # Move the batch from axis 0 to `axis`.
    perm = list(range(1, axis + 1)) + [0] + list(range(axis + 1, len(shape)))
    uniform = tf.transpose(uniform, perm)
  return tf.cast(uniform, dtype)


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


def AccumulationDtype(dtype: Any) -> tf.DType:
  """The dtype of statistics, losses and regularisers of `dtype` values.

  float64 for a float64 model, so that its oracle tests check that
  arithmetic too; float32 otherwise (bfloat16 and float16 models keep
  float32 statistics; a float32 model computes exactly as before).
  """
  return tf.float64 if tf.as_dtype(dtype) == tf.float64 else tf.float32


def AddBatchStats(layer: Any, stats: BatchStats) -> None:
  """Reports a layer's batch statistics for its moving-average update.

  Inside `CollectBatchStats()` the statistics are recorded for the caller to
  merge (a pipeline merges those of all micro-batches); otherwise the layer's
  `UpdateMovingStats(stats)` is called at once. Inside the replica function
  of a tf.distribute strategy with R > 1 replicas the statistics are first
  summed over the replicas (count, sum and sum of squares add exactly), so
  every replica's moving averages follow the global batch, as one replica's
  would (tensorpipe/distribute.py).
  """
  collector = Current().stats_collector
  if collector is not None:
    collector.append((layer, stats))
    return
  replica_ctx = tf.distribute.get_replica_context()
  if replica_ctx is not None and replica_ctx.num_replicas_in_sync > 1:
    stats = BatchStats.Pack(replica_ctx.all_reduce(
        tf.distribute.ReduceOp.SUM, stats.Flatten()))
  layer.UpdateMovingStats(stats)


@contextlib.contextmanager
def CollectBatchStats() -> Iterator[List[Any]]:
  """Collects (layer, BatchStats) pairs reported inside the block."""
  collected: List[Any] = []
  with _Push(stats_collector=collected):
    yield collected


class WeightOpCall(NamedTuple):
  """One call of `WeightOp`: z = fn(x, w)."""
  fn: Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
  x: tf.Tensor
  w: tf.Tensor
  z: tf.Tensor


def WeightOp(fn: Callable[[tf.Tensor, tf.Tensor], tf.Tensor], x: tf.Tensor,
             w: tf.Tensor) -> tf.Tensor:
  """z = fn(x, w): a layer's op on its weight w, which schedules that split
  the backward pass can differentiate on its own.

  The zero-bubble schedules (schedules.py: I and W cells) take the input
  gradient of a stage first (I: the gradient to the stage's inputs and to
  each weight op's output z, without any weight gradient) and its weight
  gradients later (W: dw = vjp of fn(x, .) at w with dz, one kernel per
  op, from the x and dz that I kept). A layer routes its weight ops
  through this (FCLayer's matmul, the four projections of
  MultiHeadedAttention, the kernels of Conv2DLayer, DepthwiseConv2DLayer
  and SeparableConv2DLayer, EmbeddingLayer's lookup with x = the ids, and
  in a KerasLayer the kernels of Keras' Dense, EinsumDense, Conv1D/2D/3D
  and ReversibleEmbedding: keras_weight_ops.py); `fn`
  must depend on its two arguments and Python values only (the engine
  calls it again in the W cell), and w must be the layer's weight as it
  comes in theta (cast inside fn). Weights used elsewhere (biases, batch
  norm) and layers that do not use this (other Keras layers) get their
  gradients in I. A weight that goes through a weight op must go through weight ops
  only: the I cell does not differentiate it, so a use outside its ops
  would lose its share of the gradient.
  """
  collector = getattr(_local, 'weight_ops', None)
  if collector is not None and collector[2]:
    z = _InputGradAfterWeightGrad(fn, x, w)
  else:
    z = fn(x, w)
  if collector is not None:
    calls, tape, _ = collector
    if tape is not None:
      # The gradient to z is asked for even when neither x nor w is
      # watched (the first layer of stage 0: data and an unwatched weight).
      tape.watch(z)
    calls.append(WeightOpCall(fn, x, w, z))
  return z


def _Differentiated(x: tf.Tensor) -> bool:
  """Whether an active tape differentiates x (True where TF does not
  say)."""
  try:
    from tensorflow.python.eager import record  # pylint: disable=g-direct-tensorflow-import,g-import-not-at-top
  except ImportError:
    return True
  return bool(record.should_record_backprop([x]))


def _InputGradAfterWeightGrad(fn: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
                              x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
  """fn(x, w), whose gradient hands dx on only once dw is made.

  The gradient kernels are fn's own (a tape inside, as autodiff of fn
  builds them), so the values are the same bits. Ordered so, a backward
  pass frees each weight op's output gradient dz at that op
  (cell_algebra.ORDER_WEIGHT_GRADS: what it saves and costs).
  """
  # No dx where no tape differentiates x (stage 0's data): nothing would
  # read it.
  float_x = x.dtype.is_floating and _Differentiated(x)

  @tf.custom_gradient
  def Call(x, w):
    with tf.GradientTape(watch_accessed_variables=False) as tape:
      tape.watch([x, w] if float_x else [w])
      z = fn(x, w)

    def Grad(dz, variables=None):
      if variables:
        raise ValueError(
            f'WeightOp: fn read the variables {[v.name for v in variables]}'
            ' beside its weight w; it must depend on its two arguments and '
            'Python values only (pass the weight as w)')
      if not float_x:
        return None, tape.gradient(z, w, output_gradients=dz)
      dx, dw = tape.gradient(z, [x, w], output_gradients=dz)
      with tf.control_dependencies([dw]):
        return tf.identity(dx), dw
    return z, Grad
  return Call(x, w)


@contextlib.contextmanager
def CollectWeightOps(tape: Optional[tf.GradientTape] = None,
                     order_grads: bool = False
                     ) -> Iterator[List[WeightOpCall]]:
  """Collects the `WeightOp` calls made in the block, in call order;
  `tape` (if given) watches each op's output z. With `order_grads` each
  op's gradient gives its dx only once its dw is made
  (`_InputGradAfterWeightGrad`: a backward pass of the block's ops frees
  each dz at its op)."""
  previous = getattr(_local, 'weight_ops', None)
  calls = []
  _local.weight_ops = (calls, tape, order_grads)
  try:
    yield calls
  finally:
    _local.weight_ops = previous
