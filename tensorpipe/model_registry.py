"""Registry of experiments: `params/` classes looked up by key.

An experiment is a class in a module below `params/` decorated with
`@model_registry.RegisterSingleTaskModel`; its key is the module path below
`params/` plus the class name, e.g. class `AmoebaNetD4x8` in
`params/image/fashion_mnist.py` is `image.fashion_mnist.AmoebaNetD4x8`.

Importing this module imports no experiment (as paxml's registry): a lookup of
`a.b.Cls` imports `params.a.b` on demand, which runs its decorators.
`ListKeys()` imports every module below `params/` first.

Usage:
  @model_registry.RegisterSingleTaskModel
  class MyExperiment(base_experiment.BaseExperiment):
    ...
  p = model_registry.GetParams('image.fashion_mnist.MyExperiment', 'Train')
"""

import difflib
import importlib
import os
import pkgutil
from typing import Any, Dict, List

_PARAMS_PACKAGE = 'params'
_DATASETS = ('Train', 'Test', 'Dev')

_registry: Dict[str, type] = {}


class UnknownModelError(ValueError):
  """A key names no registered experiment; the message lists close keys."""


def _KeyOf(cls: type) -> str:
  module = cls.__module__
  prefix = _PARAMS_PACKAGE + '.'
  if module.startswith(prefix):
    module = module[len(prefix):]
  elif module == '__main__':
    module = '__main__'
  return f'{module}.{cls.__name__}'


def RegisterSingleTaskModel(cls: type) -> type:
  """Class decorator: registers an experiment under its key.

  Raises:
    TypeError: `cls` is not a class with Task() and Train() methods.
    ValueError: another class is already registered under the same key.
  """
  if not isinstance(cls, type):
    raise TypeError(f'RegisterSingleTaskModel decorates a class, got {cls!r}')
  for method in ('Task', 'Train'):
    if not callable(getattr(cls, method, None)):
      raise TypeError(f'experiment {cls.__name__} has no {method}() method; '
                      'subclass params.base_experiment.BaseExperiment')
  key = _KeyOf(cls)
  old = _registry.get(key)
  if old is not None and old is not cls:
    # Reloading a module re-creates its classes under the same key: only a
    # class from a different module or qualname is a real clash.
    if (old.__module__, old.__qualname__) != (cls.__module__,
                                               cls.__qualname__) or (
                                                   key.startswith('__main__')):
      raise ValueError(f'experiment key {key!r} is already registered by '
                       f'{old.__module__}.{old.__qualname__}; rename the class')
  _registry[key] = cls
  return cls


def _ImportFor(key: str) -> None:
  """Imports the params module a key names, if it exists."""
  parts = key.split('.')
  for n in range(len(parts) - 1, 0, -1):
    name = '.'.join([_PARAMS_PACKAGE] + parts[:n])
    try:
      importlib.import_module(name)
      return
    except ModuleNotFoundError as e:
      # Only swallow "this module does not exist", never a missing import
      # inside an existing module.
      if e.name is None or not name.startswith(e.name):
        raise


def _ImportAll() -> None:
  try:
    package = importlib.import_module(_PARAMS_PACKAGE)
  except ModuleNotFoundError:
    return
  paths = list(getattr(package, '__path__', []))
  for info in pkgutil.walk_packages(paths, prefix=_PARAMS_PACKAGE + '.'):
    if info.name.rsplit('.', 1)[-1].startswith('_'):
      continue
    importlib.import_module(info.name)


def ListKeys() -> List[str]:
  """All experiment keys (imports every module below params/)."""
  _ImportAll()
  return sorted(k for k in _registry if not k.startswith('__main__'))


def GetClass(key: str) -> type:
  """The experiment class registered under `key`.

  Raises:
    UnknownModelError: (a ValueError) no such key; lists close matches.
  """
  if not isinstance(key, str) or not key:
    raise UnknownModelError(f'experiment key must be a non-empty string like '
                            f"'image.fashion_mnist.ResNet4x8', got {key!r}")
  if key not in _registry:
    _ImportFor(key)
  if key not in _registry:
    keys = ListKeys()
    close = difflib.get_close_matches(key, keys, n=5, cutoff=0.5)
    hint = (f' Did you mean {" or ".join(map(repr, close))}?' if close else
            f' Known keys: {keys}.')
    raise UnknownModelError(f'no experiment registered as {key!r}.{hint}')
  return _registry[key]


def GetExperiment(key: str) -> Any:
  """An instance of the experiment class registered under `key`."""
  return GetClass(key)()


def GetParams(key: str, dataset: str = 'Train') -> Any:
  """The experiment's Params for `dataset`.

  'Train' gives the task Params with `input` set to the training input (the
  `p.train` settings included); 'Test' / 'Dev' give the task Params with the
  eval input.
  """
  if dataset not in _DATASETS:
    raise ValueError(f'dataset={dataset!r} must be one of {_DATASETS}')
  exp = GetExperiment(key)
  return exp.TaskWithInput(dataset)
