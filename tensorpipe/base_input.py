"""BaseInput: Params-configured input pipelines yielding NestedMap batches.

An input is built from Params like a layer (`p.Instantiate()`), and gives a
`tf.data.Dataset` of fixed-size batches, each a NestedMap of tensors with the
batch on axis 0. The trainer checkpoints the dataset iterator, so the input
position survives a restart. Conventions for the batch keys:

  images:       image [b, h, w, c] float32, label [b] int32
  translation:  src_ids [b, Ls] int32, src_paddings [b, Ls] float32 (1 = pad),
                tgt_ids [b, Lt] int32 (decoder input, starts with <s> or the
                target-language token), tgt_labels [b, Lt] int32,
                tgt_paddings [b, Lt] float32
  language model: ids [b, L] int32, labels [b, L] int32, paddings [b, L]

A split read once (repeat off: evaluation) is covered completely: the last,
partial batch is padded up to batch_size with copies of its last example, and
such batches carry EXAMPLE_WEIGHT [b] float32 (1 for an example of the split,
0 for padding), which the tasks use to leave the padding out of every metric
(tensorpipe/tasks.py) and decoding metrics to skip it (decode_metrics.py).
"""

import os
from typing import Any, Callable, List, Optional, Sequence, Tuple

import tensorflow as tf

from tensorpipe import checks
from tensorpipe import errors
from tensorpipe import hyperparams
from tensorpipe.nested_map import NestedMap


# Batch key of the example weights of a non-repeating input (see above).
EXAMPLE_WEIGHT = 'example_weight'


class DataFileError(OSError):
  """An input's data files are missing or damaged (message: file and fix)."""


class BaseInput:
  """Base class of inputs. Subclasses implement `_Dataset()`.

  Usage:
    p = SomeInput.Params().Set(batch_size=32, split='train')
    inp = p.Instantiate()
    for batch in inp.Dataset():   # NestedMap of [batch_size, ...] tensors
      ...
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = hyperparams.InstantiableParams(cls)
    p.Define('name', 'input', 'Name of this input.')
    p.Define('batch_size', 32, 'Examples per batch (the mini-batch N, across '
             'all replicas).')
    p.Define('split', 'train', "Data split to read, e.g. 'train' or 'test'.")
    p.Define('data_dir', None, 'Directory of prepared data (TFDS data_dir); '
             'None means the default of the input.')
    p.Define('shuffle_buffer', 10000, 'Shuffle buffer size in examples for '
             'training splits; 0 disables shuffling.')
    p.Define('repeat', None, 'Repeat the data forever; None means repeat for '
             "training splits ('train') and not for others.")
    p.Define('seed', 1234, 'Seed of shuffling and random augmentation.')
    p.Define('max_examples', None, 'Read at most this many examples of the '
             'split (for quick runs and tests); None reads all.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams):
    p = params.Copy()
    checks.CheckPositiveInts('', batch_size=p.batch_size)
    p.Freeze()
    self._params = p

  @property
  def params(self) -> hyperparams.InstantiableParams:
    return self._params

  @property
  def is_training(self) -> bool:
    return self._params.split.startswith('train')

  def Dataset(self) -> tf.data.Dataset:
    """The batched dataset of NestedMaps, every batch batch_size examples.

    A repeating input drops nothing (it never ends); one read once pads its
    last batch and adds EXAMPLE_WEIGHT (module docstring).
    """
    return self._Dataset()

  def _Dataset(self) -> tf.data.Dataset:
    raise NotImplementedError(f'{type(self).__name__}._Dataset')

  def Detokenizer(self) -> Optional[Callable[[Sequence[int]], str]]:
    """Token ids of one row -> text, for decoding metrics (e.g. BLEU).

    Default None: the input has no vocabulary.
    """
    return None

  def ReferenceTexts(self) -> Optional[List[str]]:
    """The split's target texts in Dataset() order (repeat off), untruncated.

    Decoding metrics prefer them to detokenised labels, which are cut at the
    input's maximum length. Default None: the input has no texts.
    """
    return None

  def ReferenceGroups(self) -> Optional[List[Tuple[str, int]]]:
    """[(name, count)]: consecutive groups of ReferenceTexts(), in order.

    Decoding metrics report each group too (e.g. BLEU per translation
    direction). Default None: one group.
    """
    return None

  def DescribeReadError(self, error: Exception) -> str:
    """One line on a failure while iterating Dataset(), with the fix.

    The trainer raises DataFileError with it. Inputs that read files
    override this to name the damaged file and how to prepare it again.

    Args:
      error: what iterating the dataset raised (a tf.errors.OpError).
    """
    return (f'reading the {self._params.name!r} input (split '
            f'{self._params.split!r}) failed: {type(error).__name__}: '
            f'{errors.FirstLine(error)}')

  def _Repeat(self) -> bool:
    return self.is_training if self._params.repeat is None else bool(
        self._params.repeat)

  def _Finish(self, ds: tf.data.Dataset,
              shuffle: Optional[bool] = None,
              augment: Optional[Callable[[Any, tf.Tensor], Any]] = None
              ) -> tf.data.Dataset:
    """Shared tail: limit, shuffle, repeat, augment, batch, prefetch, NestedMap.

    Args:
      ds: dataset of single examples (dicts of tensors).
      shuffle: shuffle the examples; None means shuffle training splits.
      augment: optional `augment(example, seed) -> example`, applied after
        shuffling and repeating, where `seed` is an int64 [2] stateless seed
        (p.seed, running example count): each example of each epoch gets its
        own, reproducible random augmentation.
    """
    p = self._params
    if p.max_examples:
      ds = ds.take(p.max_examples)
    if (self.is_training if shuffle is None else shuffle) and p.shuffle_buffer:
      ds = ds.shuffle(p.shuffle_buffer, seed=p.seed,
                      reshuffle_each_iteration=True)
    if self._Repeat():
      ds = ds.repeat()
    if augment is not None:
      ds = ds.enumerate().map(
          lambda i, d: augment(d, tf.stack([tf.constant(p.seed, tf.int64), i])),
          num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if self._Repeat() or not isinstance(ds.element_spec, dict):
      ds = ds.batch(p.batch_size, drop_remainder=True)
    else:
      ds = ds.batch(p.batch_size, drop_remainder=False).map(
          lambda d: PadBatch(d, p.batch_size))
    ds = ds.map(lambda d: NestedMap(d) if isinstance(d, dict) else d)
    return _MaybeWithoutAutotune(ds.prefetch(tf.data.AUTOTUNE))


# TENSORPIPE_DATA_AUTOTUNE=0 turns tf.data's autotuning off for every input
# (tools/test.sh sets it). Deleting an iterator whose autotuning thread has
# gone to sleep waits out the sleep, which grows with the iterator's age: an
# iterator idle for 12 s took 8 s to delete (TF 2.21), in a test process
# once per trainer or evaluation the garbage collector frees. The batches do
# not change: the parallel map keeps its order (deterministic=True) and
# autotuning only sizes the parallelism and the prefetch buffer.
AUTOTUNE_ENV = 'TENSORPIPE_DATA_AUTOTUNE'


def AutotuneOff() -> bool:
  """Whether TENSORPIPE_DATA_AUTOTUNE=0 is set."""
  return os.environ.get(AUTOTUNE_ENV, '1') == '0'


def WithoutAutotune(ds: tf.data.Dataset) -> tf.data.Dataset:
  options = tf.data.Options()
  options.autotune.enabled = False
  return ds.with_options(options)


def _MaybeWithoutAutotune(ds: tf.data.Dataset) -> tf.data.Dataset:
  return WithoutAutotune(ds) if AutotuneOff() else ds


def PadBatch(batch: dict, batch_size: int) -> dict:
  """Pads a batch dict of n <= batch_size rows to batch_size rows.

  The padding repeats the last row (a valid example, so no model sees an
  empty sequence); EXAMPLE_WEIGHT [batch_size] float32 is 1 on the n rows
  and 0 on the padding. Shapes become static in the batch dimension.
  """
  n = tf.shape(tf.nest.flatten(batch)[0])[0]
  rows = tf.minimum(tf.range(batch_size), n - 1)

  def Pad(x):
    x = tf.gather(x, rows)
    x.set_shape(tf.TensorShape([batch_size]).concatenate(x.shape[1:]))
    return x

  out = tf.nest.map_structure(Pad, dict(batch))
  out[EXAMPLE_WEIGHT] = tf.cast(tf.range(batch_size) < n, tf.float32)
  return out
