"""Where prepared TFDS data lives, and a fast check that it is there.

`tfds.load(..., download=False)` on a data set that was never prepared can spend
minutes before it fails (it probes remote GCS mirrors first). Inputs therefore
call `CheckPrepared` before touching TFDS: it only looks at the local
directory layout `{data_dir}/{name}[/{config}]/{version}/dataset_info.json`.
"""

import glob
import os
from typing import Optional

# Environment variable that overrides the default data directory.
DATA_DIR_ENV = 'TENSORPIPE_DATA_DIR'

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.realpath(__file__))))

# The command that prepares the data sets built from local packages.
PREPARE_COMMAND = 'bash tools/prepare_data.sh'


class DataNotPreparedError(FileNotFoundError):
  """A data set's prepared TFDS files are missing from the data directory."""


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
