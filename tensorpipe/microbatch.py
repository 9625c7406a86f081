"""Split a batch into micro-batches and merge them back, for nested inputs.

GPipe (Huang et al. 2018, arXiv 1811.06965, section 2.2) divides every
mini-batch of size N into T equal micro-batches of size N / T and pipelines
them through the partitions. Here the T micro-batches of a tensor are stacked
along a new leading axis: `Split` turns [..., N, ...] (batch at `batch_dim`)
into [T, ..., N / T, ...], `Slice` picks micro-batch t out of that stack (t may
be a tensor, e.g. a `tf.while_loop` counter), and `Merge` is the inverse of
`Split`. Micro-batch t holds examples t * m .. (t + 1) * m - 1, m = N / T, so
merged outputs line up with the inputs. Sizes must be static and divisible:
uneven micro-batches would change the batch statistics and the pipeline's
shapes from one micro-batch to the next.

Inputs may be any `tf.nest` structure (a tensor, tuple, list, dict, or a dict
subclass such as `NestedMap`, whose type is kept). Tensor leaves (`tf.Tensor`,
`tf.Variable`, `np.ndarray`) are split; other leaves such as None or an int
pass through unchanged. `FlattenTensors` / `PackTensors` list and refill only
the tensor leaves, for code that feeds them to a loop or a `tf.function` and
keeps the static leaves in the structure.
"""

import numbers
from typing import Any, Iterator, List, Optional, Tuple

import numpy as np
import tensorflow as tf

# A tf.nest structure of tensors (and pass-through leaves such as None).
Nested = Any


def _IsTensor(value: Any) -> bool:
  return isinstance(value, (tf.Tensor, tf.Variable, np.ndarray))


def _CheckInt(name: str, value: Any, minimum: int) -> int:
  """Returns `value` as an int, or raises if it is not an int >= minimum."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise TypeError(
        f'{name} must be an integer, got {value!r} of type '
        f'{type(value).__name__}; pass a Python int')
  if value < minimum:
    raise ValueError(
        f'{name} must be >= {minimum}, got {name}={value}; use '
        f'{name} >= {minimum}')
  return int(value)


def _Divisors(n: int) -> str:
  return ', '.join(str(d) for d in range(1, n + 1) if n % d == 0)


def CheckMicroBatchParams(num_micro_batches: Optional[int] = None,
                          micro_batch_size: Optional[int] = None) -> None:
  """Checks the two micro-batch knobs before the batch size is known.

  At most one may be set (not None); a set one must be an int >= 1. Neither
  set means one micro-batch (no split).

  Raises:
    TypeError: if a set value is not an integer (bool included).
    ValueError: if both are set or a value is < 1.
  """
  if num_micro_batches is not None and micro_batch_size is not None:
    raise ValueError(
        f'set exactly one of num_micro_batches and micro_batch_size, got '
        f'num_micro_batches={num_micro_batches!r} and '
        f'micro_batch_size={micro_batch_size!r}; set num_micro_batches=None '
        f'to use micro_batch_size={micro_batch_size!r}, or '
        f'micro_batch_size=None')
  if num_micro_batches is not None:
    _CheckInt('num_micro_batches', num_micro_batches, 1)
  if micro_batch_size is not None:
    _CheckInt('micro_batch_size', micro_batch_size, 1)


def NumMicroBatches(batch_size: int,
                    num_micro_batches: Optional[int] = None,
                    micro_batch_size: Optional[int] = None) -> int:
  """Resolves the number of micro-batches from at most one of two knobs.

  Args:
    batch_size: N, the mini-batch size.
    num_micro_batches: T, the number of micro-batches; N must be a multiple.
    micro_batch_size: m, the examples per micro-batch; N must be a multiple.

  Returns:
    T = num_micro_batches, or N / micro_batch_size, or 1 when neither is set.

  Raises:
    TypeError: if a given value is not an integer.
    ValueError: if both knobs are given, a value is < 1, or N is not
      divisible.
  """
  CheckMicroBatchParams(num_micro_batches, micro_batch_size)
  batch_size = _CheckInt('batch_size', batch_size, 1)
  if micro_batch_size is None:
    num_micro_batches = 1 if num_micro_batches is None else num_micro_batches
    if batch_size % num_micro_batches:
      raise ValueError(
          f'batch size {batch_size} is not divisible by '
          f'num_micro_batches={num_micro_batches}; use a batch size that is a '
          f'multiple of {num_micro_batches} or set micro_batch_size')
    return int(num_micro_batches)
  if batch_size % micro_batch_size:
    raise ValueError(
        f'batch size {batch_size} is not divisible by '
        f'micro_batch_size={micro_batch_size}; use a batch size that is a '
        f'multiple of {micro_batch_size} or a micro_batch_size that divides '
        f'{batch_size} (one of {_Divisors(batch_size)})')
  return batch_size // int(micro_batch_size)


def IsTensorLeaf(value: Any) -> bool:
  """Whether a leaf is split / merged (a tensor, variable, array or spec)."""
  return _IsTensor(value) or isinstance(value, tf.TensorSpec)


def FlattenTensors(structure: Nested) -> List[Any]:
  """The tensor leaves of `structure` in `tf.nest.flatten` order.

  Other leaves (None, Python numbers, strings) are static: they are not
  listed here and `PackTensors` takes them from the structure itself.
  """
  return [x for x in tf.nest.flatten(structure) if IsTensorLeaf(x)]


def PackTensors(structure: Nested, flat: List[Any]) -> Nested:
  """Inverse of `FlattenTensors`: `structure` with its tensor leaves replaced.

  Args:
    structure: a structure whose tensor leaves (tensors or tf.TensorSpecs)
      mark the slots to fill; other leaves are kept as they are.
    flat: the new tensor leaves, in `FlattenTensors(structure)` order.

  Returns:
    The same structure holding `flat` in place of its tensor leaves.

  Raises:
    ValueError: if `flat` has not one entry per tensor leaf.
  """
  leaves = tf.nest.flatten(structure)
  num = sum(1 for x in leaves if IsTensorLeaf(x))
  if num != len(flat):
    raise ValueError(f'{len(flat)} tensors for a structure with {num} tensor '
                     f'leaves; pass the output of FlattenTensors')
  it = iter(flat)
  return tf.nest.pack_sequence_as(
      structure, [next(it) if IsTensorLeaf(x) else x for x in leaves])


def _Leaves(structure: Nested, path: str = '') -> Iterator[Tuple[str, Any]]:
  """Yields (path, leaf) for error messages, e.g. ('inputs.ids', tensor)."""
  if isinstance(structure, dict):
    try:
      keys = sorted(structure)
    except TypeError:
      keys = list(structure)
    for key in keys:
      yield from _Leaves(structure[key], f'{path}.{key}' if path else str(key))
  elif isinstance(structure, (list, tuple)):
    fields = getattr(structure, '_fields', None)  # namedtuple
    for i, value in enumerate(structure):
      name = fields[i] if fields else f'[{i}]'
      sep = '.' if fields and path else ''
      yield from _Leaves(value, f'{path}{sep}{name}')
  else:
    yield path or '<inputs>', structure


def _TensorLeaves(structure: Nested) -> List[Tuple[str, Any]]:
  return [(path, leaf) for path, leaf in _Leaves(structure) if _IsTensor(leaf)]


def _Rank(path: str, x: Any, min_rank: int, what: str) -> int:
  """Static rank of x, or raises if unknown or below min_rank."""
  rank = x.shape.rank if not isinstance(x, np.ndarray) else x.ndim
  if rank is None:
    raise ValueError(
        f'{path} has unknown rank; {what} needs a static rank, e.g. set the '
        f'shape in the input signature or call tf.ensure_shape')
  if rank < min_rank:
    raise ValueError(
        f'{path} has shape {list(x.shape)} (rank {rank}), too small for '
        f'{what}, which needs rank >= {min_rank}; pass tensors with that axis')
  return rank


def BatchSize(inputs: Nested, batch_dim: int = 0) -> int:
  """The static batch size shared by all tensors in `inputs`.

  Args:
    inputs: a structure of tensors [..., N (at batch_dim), ...]; non-tensor
      leaves are ignored.
    batch_dim: the batch axis, >= 0.

  Returns:
    N.

  Raises:
    ValueError: if there is no tensor, a tensor has rank <= batch_dim, its
      batch size is not static, or two tensors disagree.
  """
  batch_dim = _CheckInt('batch_dim', batch_dim, 0)
  leaves = _TensorLeaves(inputs)
  if not leaves:
    raise ValueError(
        f'inputs hold no tensor to take a batch size from: {inputs!r}; pass '
        f'at least one tf.Tensor with a batch axis')
  first_path, batch_size = None, None
  for path, x in leaves:
    _Rank(path, x, batch_dim + 1, f'batch_dim={batch_dim}')
    size = x.shape[batch_dim]
    if size is None:
      raise ValueError(
          f'{path} has shape {list(x.shape)}: its batch size (axis '
          f'{batch_dim}) is not static; micro-batching needs a fixed batch '
          f'size, e.g. batch with drop_remainder=True')
    if batch_size is None:
      first_path, batch_size = path, int(size)
    elif size != batch_size:
      raise ValueError(
          f'batch sizes disagree at axis {batch_dim}: {first_path} has '
          f'{batch_size} but {path} has {size}; all tensors need the same '
          f'batch size')
  return batch_size


def _Shape(x: tf.Tensor) -> List[Any]:
  """Static dims where known, scalar tensors elsewhere (for tf.reshape)."""
  dynamic = None
  dims = []
  for i, dim in enumerate(x.shape):
    if dim is None:
      if dynamic is None:
        dynamic = tf.shape(x)
      dim = dynamic[i]
    dims.append(dim)
  return dims


def Split(inputs: Nested, num_micro_batches: int, batch_dim: int = 0) -> Nested:
  """Splits every tensor into `num_micro_batches` stacked micro-batches.

  Args:
    inputs: a structure of tensors [d_0, .., d_{b-1}, N, ...] with the batch
      at b = batch_dim; other leaves pass through.
    num_micro_batches: T; N must be a multiple of T.
    batch_dim: b, the batch axis, >= 0.

  Returns:
    The same structure with tensors [T, d_0, .., d_{b-1}, N / T, ...]; for
    batch_dim=0 simply [N, ...] -> [T, N / T, ...]. Entry [t] holds examples
    t * m .. (t + 1) * m - 1 of the batch, m = N / T.

  Raises:
    TypeError: if num_micro_batches is not an integer.
    ValueError: if the batch size is not static, the tensors disagree on it,
      or it is not divisible by num_micro_batches.
  """
  num_micro_batches = _CheckInt('num_micro_batches', num_micro_batches, 1)
  batch_size = BatchSize(inputs, batch_dim)
  if batch_size % num_micro_batches:
    raise ValueError(
        f'batch size {batch_size} is not divisible by '
        f'num_micro_batches={num_micro_batches}; use a batch size that is a '
        f'multiple of {num_micro_batches} or num_micro_batches that divides '
        f'{batch_size} (one of {_Divisors(batch_size)})')
  micro_batch_size = batch_size // num_micro_batches

  def SplitOne(x: Any) -> Any:
    if not _IsTensor(x):
      return x
    x = tf.convert_to_tensor(x)
    shape = _Shape(x)
    x = tf.reshape(
        x, shape[:batch_dim] + [num_micro_batches, micro_batch_size] +
        shape[batch_dim + 1:])
    if batch_dim:
      # [d_0, .., T, m, ...] -> [T, d_0, .., m, ...].
      rank = len(shape) + 1
      x = tf.transpose(x, [batch_dim] + list(range(batch_dim)) +
                       list(range(batch_dim + 1, rank)))
    return x

  return tf.nest.map_structure(SplitOne, inputs)


def Merge(stacked: Nested, batch_dim: int = 0) -> Nested:
  """Inverse of `Split`: concatenates stacked micro-batches along the batch.

  Args:
    stacked: a structure of tensors [T, d_0, .., d_{b-1}, m, ...] with the
      micro-batch index first and the batch at b + 1, b = batch_dim; other
      leaves pass through.
    batch_dim: b, the batch axis of the merged result, >= 0.

  Returns:
    The same structure with tensors [d_0, .., d_{b-1}, T * m, ...].

  Raises:
    ValueError: if a tensor has rank < batch_dim + 2 or an unknown rank, or
      the tensors disagree on a static T.
  """
  batch_dim = _CheckInt('batch_dim', batch_dim, 0)
  first_path, num_micro_batches = None, None
  for path, x in _TensorLeaves(stacked):
    _Rank(path, x, batch_dim + 2, f'Merge with batch_dim={batch_dim}')
    size = x.shape[0]
    if size is None:
      continue
    if num_micro_batches is None:
      first_path, num_micro_batches = path, size
    elif size != num_micro_batches:
      raise ValueError(
          f'numbers of micro-batches (axis 0) disagree: {first_path} has '
          f'{num_micro_batches} but {path} has {size}; merge outputs of one '
          f'Split')

  def MergeOne(x: Any) -> Any:
    if not _IsTensor(x):
      return x
    x = tf.convert_to_tensor(x)
    rank = x.shape.rank
    if batch_dim:
      # [T, d_0, .., m, ...] -> [d_0, .., T, m, ...].
      x = tf.transpose(x, list(range(1, batch_dim + 1)) + [0] +
                       list(range(batch_dim + 1, rank)))
    shape = _Shape(x)
    merged = shape[batch_dim] * shape[batch_dim + 1]
    return tf.reshape(x, shape[:batch_dim] + [merged] + shape[batch_dim + 2:])

  return tf.nest.map_structure(MergeOne, stacked)


def Slice(stacked: Nested, t: Any) -> Nested:
  """Micro-batch `t` of the output of `Split`.

  Args:
    stacked: a structure of tensors [T, ...]; other leaves pass through.
    t: the micro-batch index, a Python int in [0, T) or a scalar int tensor
      (e.g. a loop counter; out-of-range values then fail at run time).

  Returns:
    The same structure with tensors [...] = stacked[t], e.g. [m, ...] for
    batch_dim=0.

  Raises:
    TypeError: if t is neither an integer nor an integer tensor.
    ValueError: if a Python int t is out of range for a static T, or a tensor
      t is not a scalar.
  """
  leaves = _TensorLeaves(stacked)
  for path, x in leaves:
    _Rank(path, x, 1, 'Slice')
  if _IsTensor(t):
    if not tf.as_dtype(t.dtype).is_integer:
      raise TypeError(
          f'micro-batch index t must be an integer, got dtype {t.dtype}; '
          f'cast it with tf.cast(t, tf.int32)')
    if tf.TensorShape(t.shape).rank != 0:
      raise ValueError(
          f'micro-batch index t must be a scalar, got shape {list(t.shape)}; '
          f'pass one index')
  else:
    t = _CheckInt('t', t, 0)
    for path, x in leaves:
      size = x.shape[0]
      if size is not None and t >= size:
        raise ValueError(
            f'micro-batch index t={t} is out of range: {path} has {size} '
            f'micro-batches (shape {list(x.shape)}); use 0 <= t < {size}')

  def SliceOne(x: Any) -> Any:
    if not _IsTensor(x):
      return x
    return tf.gather(tf.convert_to_tensor(x), t, axis=0)

  return tf.nest.map_structure(SliceOne, stacked)
