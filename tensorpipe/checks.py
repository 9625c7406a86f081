"""Argument checks shared by layers, models and the analysis tools.

Each check raises a one-line ValueError that names the owner, the key and
the value received, e.g. "FCLayer 'fc': input_dim=0 must be a positive int".
Pure Python: no TensorFlow.

Usage:
  checks.CheckPositiveInts(f'{cls.__name__} {p.name!r}',
                           input_dim=p.input_dim, output_dim=p.output_dim)
"""

from typing import Any


def IsPositiveInt(value: Any) -> bool:
  """True for an int >= 1 (bool, although an int subclass, is not one)."""
  return (isinstance(value, int) and not isinstance(value, bool) and
          value >= 1)


def CheckPositiveInts(owner: str, **values: Any) -> None:
  """Raises ValueError for the first keyword whose value is not an int >= 1.

  Args:
    owner: what the values belong to, e.g. "FCLayer 'fc'" or 'AmoebaNet';
      '' for plain function arguments.
    **values: name=value pairs, checked in the order given.

  Raises:
    ValueError: "<owner>: <name>=<value!r> must be a positive int".
  """
  for name, value in values.items():
    if not IsPositiveInt(value):
      prefix = f'{owner}: ' if owner else ''
      raise ValueError(f'{prefix}{name}={value!r} must be a positive int')
