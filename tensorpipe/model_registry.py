"""Registry of experiments: `params/` classes looked up by key.

An experiment is a class in a module below `params/` decorated with
`@model_registry.RegisterSingleTaskModel`; its key is the module path below
`params/` plus the class name, e.g. class `AmoebaNetD4x8` in
`params/image/fashion_mnist.py` is `image.fashion_mnist.AmoebaNetD4x8`.

Importing this module imports no experiment (as paxml's registry): a lookup of
`a.b.Cls` imports `params.a.b` on demand, which runs its decorators.
`ListKeys()` imports every module below `params/` first.

Class names follow one scheme, <Model><K>x<T> (K partitions, T micro-batches,
e.g. `ResNet4x8`, `AmoebaNetB4x8`). A renamed experiment keeps its old key
working through `RegisterAlias` (users type the keys they know).

Usage:
  @model_registry.RegisterSingleTaskModel
  class MyExperiment(base_experiment.BaseExperiment):
    ...
  model_registry.RegisterAlias('My_Experiment', MyExperiment)  # old name
  p = model_registry.GetParams('image.fashion_mnist.MyExperiment', 'Train')
"""

import difflib
import importlib
import pkgutil
from typing import Any, Dict, List

_PARAMS_PACKAGE = 'params'
_DATASETS = ('Train', 'Test', 'Dev')

_registry: Dict[str, type] = {}
_aliases: Dict[str, str] = {}     # old key -> key


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
                      'subclass tensorpipe.base_experiment.BaseExperiment')
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
  if key in _aliases:
    raise ValueError(f'experiment key {key!r} is already an alias of '
                     f'{_aliases[key]!r}; rename the class')
  _registry[key] = cls
  return cls


def RegisterAlias(alias: str, cls: type) -> None:
  """Makes `<module>.<alias>` another key of the registered class `cls`.

  For a renamed experiment: its old key keeps working. The alias is a class
  name in `cls`'s module; `ListKeys()` lists only the new key.

  Usage (below the class, in its params module):
    model_registry.RegisterAlias('AmoebaNetB_4x8', AmoebaNetB4x8)

  Raises:
    ValueError: `cls` is not registered, or the alias is taken.
  """
  key = _KeyOf(cls)
  if _registry.get(key) is not cls:
    raise ValueError(f'{cls.__name__} is not registered; decorate it with '
                     '@model_registry.RegisterSingleTaskModel first')
  module = key[:-len(cls.__name__)]
  if not isinstance(alias, str) or not alias.isidentifier():
    raise ValueError(f'alias {alias!r} must be a class name such as '
                     f'{cls.__name__!r}')
  alias_key = module + alias
  if alias_key in _registry:
    raise ValueError(f'alias {alias_key!r} is already the key of '
                     f'{_registry[alias_key].__qualname__}')
  if _aliases.get(alias_key, key) != key:
    raise ValueError(f'alias {alias_key!r} already names '
                     f'{_aliases[alias_key]!r}')
  _aliases[alias_key] = key


def Aliases() -> Dict[str, str]:
  """{old key: key} of every alias (imports every module below params/)."""
  _ImportAll()
  return {k: v for k, v in sorted(_aliases.items())
          if not k.startswith('__main__')}


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
  if key not in _registry and key not in _aliases:
    _ImportFor(key)
  key = _aliases.get(key, key)
  if key not in _registry:
    raise UnknownModelError(f'no experiment registered as {key!r}'
                            f'{_Suggestion(key)}')
  return _registry[key]


def _Suggestion(key: str) -> str:
  """'. Did you mean ...?' for an unknown key: the keys and aliases (the
  names users know, e.g. the README's) that match it without surrounding
  spaces or by class name alone, then close ones; else the known keys."""
  keys = ListKeys()
  names = keys + sorted(Aliases())
  bare = key.strip()
  cls = bare.rpartition('.')[2].lower()
  same = [n for n in names if n == bare or n.rpartition('.')[2].lower() ==
          cls]
  close = difflib.get_close_matches(bare, names, n=5, cutoff=0.5)
  found = list(dict.fromkeys(same + close))[:5]
  space = (' (it has spaces around it; drop them)' if bare != key and
           bare else '')
  if not found:
    return f'{space}. Known keys: {keys}.'
  return f'{space}. Did you mean {" or ".join(map(repr, found))}?'


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
