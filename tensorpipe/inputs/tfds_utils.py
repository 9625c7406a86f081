"""Where prepared TFDS data lives, and fast checks that it is there and sound.

`tfds.load(..., download=False)` on a data set that was never prepared can spend
minutes before it fails (it probes remote GCS mirrors first). Inputs therefore
call `CheckPrepared` before touching TFDS: it only looks at the local
directory layout `{data_dir}/{name}[/{config}]/{version}/dataset_info.json`.

Damaged prepared data fails with one line naming the file and the fix
(CorruptDataError): `CheckFiles` (before reading: dataset_info.json parses,
the split's record files exist) and `DiagnoseFiles` (after a read error:
reads the split's files through and names the first one that is damaged or
shorter than dataset_info.json says).
"""

import glob
import json
import os
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from tensorpipe import base_input
from tensorpipe import errors

# Environment variable that overrides the default data directory.
DATA_DIR_ENV = 'TENSORPIPE_DATA_DIR'

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.realpath(__file__))))

# The command that prepares the data sets built from local packages.
PREPARE_COMMAND = 'bash tools/prepare_data.sh'


# What re-prepares a data set of PREPARE_COMMAND once its folder is deleted
# (without --force the script's stamp file says "data ready").
REPREPARE_COMMAND = 'bash tools/prepare_data.sh --force'


class DataNotPreparedError(FileNotFoundError):
  """A data set's prepared TFDS files are missing from the data directory."""


class CorruptDataError(base_input.DataFileError):
  """A prepared data set's files are damaged or partly missing."""


def DefaultDataDir() -> str:
  """$TENSORPIPE_DATA_DIR if set, else `<repo>/data/tfds`."""
  return os.environ.get(DATA_DIR_ENV) or os.path.join(_REPO_ROOT, 'data',
                                                      'tfds')


def ResolveDataDir(data_dir: Optional[str]) -> str:
  """`data_dir` with ~ expanded, or DefaultDataDir() when None."""
  return os.path.expanduser(data_dir) if data_dir else DefaultDataDir()


def IsPrepared(name: str, data_dir: str) -> bool:
  """True if `{data_dir}/{name}` holds a prepared version of data set `name`.

  Args:
    name: TFDS name, optionally with a config: 'cifar10', 'foo/bar'.
    data_dir: TFDS data directory.
  """
  base = os.path.join(data_dir, *name.split(':')[0].split('/'))
  return bool(
      glob.glob(os.path.join(base, '*', 'dataset_info.json')) or
      glob.glob(os.path.join(base, '*', '*', 'dataset_info.json')))


def CheckPrepared(name: str, data_dir: str, how: str) -> None:
  """Raises DataNotPreparedError naming `name`, `data_dir` and `how`.

  Args:
    name: TFDS data set name.
    data_dir: TFDS data directory searched.
    how: the command or steps that prepare the data set.
  """
  if not IsPrepared(name, data_dir):
    raise DataNotPreparedError(
        f"data set '{name}' is not prepared in data_dir={data_dir!r} "
        f'(no {name}/<version>/dataset_info.json there). To prepare it: {how}')


def ManualPrepareHint(name: str, data_dir: str) -> str:
  """How to prepare a stock TFDS data set whose files the user downloads."""
  return (
      f"download the '{name}' source files yourself (see "
      f'https://www.tensorflow.org/datasets/catalog/{name}) into a folder M, '
      'then run: .venv/bin/python -c "import tensorflow_datasets as tfds; '
      f"tfds.builder('{name}', data_dir='{data_dir}').download_and_prepare("
      "download_config=tfds.download.DownloadConfig(manual_dir='M'))\" "
      f'(or set the input\'s data_dir / ${DATA_DIR_ENV} to a directory that '
      'already holds it)')


def DatasetDir(name: str, data_dir: str) -> str:
  """{data_dir}/{name}: the folder to delete before preparing it again."""
  return os.path.join(data_dir, *name.split(':')[0].split('/')[:1])


def ReprepareHint(name: str, data_dir: str, how: str) -> str:
  """How to replace a damaged data set: delete its folder, prepare again."""
  return f'delete {DatasetDir(name, data_dir)} and prepare it again: {how}'


def _InfoFiles(name: str, data_dir: str) -> List[str]:
  base = os.path.join(data_dir, *name.split(':')[0].split('/'))
  return sorted(glob.glob(os.path.join(base, '*', 'dataset_info.json')) +
                glob.glob(os.path.join(base, '*', '*', 'dataset_info.json')))


def SplitFiles(builder, split: str) -> List[Tuple[str, int]]:
  """[(record file path, examples dataset_info.json gives it)] of `split`."""
  instructions = builder.info.splits[split].file_instructions
  return [(os.fspath(fi.filename), int(fi.examples_in_shard))
          for fi in instructions]


def CheckFiles(name: str, data_dir: str, split: str, how: str,
               make_builder: Optional[Callable[[], object]] = None) -> None:
  """Checks a prepared data set before reading it; names what is damaged.

  Args:
    name: TFDS name of the data set.
    data_dir: TFDS data directory.
    split: split to be read (slices such as 'train[:90%]' allowed).
    how: how to prepare the data set (see ReprepareHint).
    make_builder: () -> the TFDS builder; default tfds.builder(name).

  Raises:
    CorruptDataError: dataset_info.json does not parse, or a record file of
      the split is missing or empty. A data set with no dataset_info.json at
      all passes (CheckPrepared reports that).
  """
  fix = ReprepareHint(name, data_dir, how)
  infos = _InfoFiles(name, data_dir)
  if not infos:
    return  # not prepared at all: CheckPrepared's error
  for info in infos:
    try:
      with open(info) as f:
        json.load(f)
    except (OSError, ValueError) as e:
      raise CorruptDataError(f'{info} is damaged ({type(e).__name__}: '
                             f'{str(e)[:200]}); {fix}') from None
  try:
    if make_builder is None:
      import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
      builder = tfds.builder(name, data_dir=data_dir)
    else:
      builder = make_builder()
    splits = builder.info.splits
  except Exception as e:  # pylint: disable=broad-except
    # TFDS raises many types for a damaged dataset_info.json / features.json.
    first = errors.FirstLine(e, 200)
    raise CorruptDataError(
        f"the prepared data set '{name}' in {data_dir} cannot be opened "
        f'({type(e).__name__}: {first}); {fix}') from None
  if not splits:
    return  # no split information (e.g. under tfds.testing.mock_data)
  try:
    files = SplitFiles(builder, split)
  except (KeyError, ValueError) as e:
    first = errors.FirstLine(e, 200)
    raise ValueError(f"split={split!r} of '{name}': {first}; its splits are "
                     f'{sorted(splits)}') from None
  for path, count in files:
    if not os.path.exists(path):
      raise CorruptDataError(f'{path} is missing (split {split!r} of '
                             f"'{name}'); {fix}")
    if count and os.path.getsize(path) == 0:
      raise CorruptDataError(f'{path} is empty but should hold {count} '
                             f'examples; {fix}')


def DiagnoseFiles(files: List[Tuple[str, int]]) -> Optional[str]:
  """Reads record files through; describes the first damaged one, or None.

  Args:
    files: [(TFRecord path, expected number of records)].

  Returns:
    e.g. '<path> is damaged (corrupted record at 626)' or '<path> holds 4000
    of its 10000 records (truncated)', or None if all read fine.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  for path, expected in files:
    if not os.path.exists(path):
      return f'{path} is missing'
    try:
      count = int(tf.data.TFRecordDataset(path).reduce(
          tf.constant(0, tf.int64), lambda n, _: n + 1).numpy())
    except tf.errors.OpError as e:
      first = errors.FirstLine(e, 200)
      return f'{path} is damaged ({first})'
    if expected and count != expected:
      return (f'{path} holds {count} of its {expected} records '
              f'({"truncated" if count < expected else "too many"})')
  return None


def ReadColumns(ds, batch: int = 8192) -> Dict[str, np.ndarray]:
  """A split's examples as one NumPy array per feature, in the data set's
  order.

  Read in batches: `tfds.as_numpy` one example at a time costs a Python
  round trip per example (the 50,561 Brown training sentences took 17.6 s
  that way, about 3 s batched). Raises what reading raises
  (tf.errors.OpError on damaged files).
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  parts = {}
  for rows in tfds.as_numpy(ds.batch(batch)):
    for key, value in rows.items():
      parts.setdefault(key, []).append(value)
  if not parts:  # an empty split
    return {key: np.zeros([0]) for key in ds.element_spec}
  return {key: np.concatenate(value) for key, value in parts.items()}


def DescribeDamage(name: str, data_dir: str, split: str,
                   files: List[Tuple[str, int]], error: Exception,
                   how: str) -> str:
  """One line on a read error of a prepared split: the file and the fix.

  Args:
    name: TFDS name of the data set.
    data_dir: TFDS data directory.
    split: the split read.
    files: its record files (SplitFiles), read through to find the bad one.
    error: what reading raised.
    how: how to prepare the data set (see ReprepareHint).
  """
  fix = ReprepareHint(name, data_dir, how)
  found = DiagnoseFiles(files)
  if found is None:
    first = errors.FirstLine(error, 200)
    return (f"reading split {split!r} of '{name}' failed "
            f'({type(error).__name__}: {first}); if it persists, {fix}')
  return f"{found} (split {split!r} of '{name}'); {fix}"
