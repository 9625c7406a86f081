"""TensorPipe: GPipe pipeline parallelism for TensorFlow 2, Lingvo style.

Importing the package defines no flags and runs no TensorFlow op. Its
top-level names (`tensorpipe.TensorPipeLayer`, `tensorpipe.Params`, ...) are
imported on first use (PEP 562), so a pure-Python module such as
`tensorpipe.schedules` or `tensorpipe.hyperparams` imports without TensorFlow
(the schedule tools and their tests start in a fraction of a second).
"""

import importlib
from typing import Any

# Top-level name -> the module that defines it.
_EXPORTS = {
    'BaseLayer': 'tensorpipe.base_layer',
    'WeightInit': 'tensorpipe.base_layer',
    'WeightParams': 'tensorpipe.base_layer',
    'SetNumLogicalCpuDevices': 'tensorpipe.devices',
    'InstantiableParams': 'tensorpipe.hyperparams',
    'Params': 'tensorpipe.hyperparams',
    'NestedMap': 'tensorpipe.nested_map',
    'TensorPipeLayer': 'tensorpipe.pipeline',
    'EvalMode': 'tensorpipe.py_utils',
    'StepSeed': 'tensorpipe.py_utils',
    'TrainingMode': 'tensorpipe.py_utils',
}

__all__ = sorted(_EXPORTS) + ['layers']


def __getattr__(name: str) -> Any:
  if name in _EXPORTS:
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
  else:
    # A submodule not imported yet (`tensorpipe.layers`, `tensorpipe.pipeline`
    # after a bare `import tensorpipe`), as the eager imports used to give.
    try:
      value = importlib.import_module(f'{__name__}.{name}')
    except ModuleNotFoundError as e:
      if e.name != f'{__name__}.{name}':
        raise
      raise AttributeError(
          f'module {__name__!r} has no attribute {name!r}') from None
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(__all__))
