"""NestedMap: a dict with attribute access, for structures of tensors.

Layers take and return NestedMaps (`theta.fc1.w`, `batch.images`). A NestedMap
is a plain `dict` subclass, so `tf.nest` (and `tf.function` signatures) treat it
as a mapping: `tf.nest.flatten` visits keys in sorted order, exactly like
`Flatten()`, and `tf.nest.map_structure` rebuilds a NestedMap. Pure Python.

Usage:

  m = NestedMap(x=1, y=NestedMap(z=[2, 3]))
  m.y.z[0]                  # 2
  m.Flatten()               # [1, 2, 3]
  m.FlattenItems()          # [('x', 1), ('y.z[0]', 2), ('y.z[1]', 3)]
  m.Transform(lambda v: v * 10).y.z  # [20, 30]
"""

import difflib
import keyword
from typing import Any, Callable, Iterable, List, Tuple


def _IsNamedTuple(value: Any) -> bool:
  return isinstance(value, tuple) and hasattr(value, '_fields')


def _MakeSequence(like: Any, items: List[Any]) -> Any:
  """Returns a list/tuple/namedtuple of the type of `like` holding `items`."""
  if _IsNamedTuple(like):
    return type(like)(*items)
  return type(like)(items)


def _FlattenInto(value: Any, key: str, out: List[Tuple[str, Any]]) -> None:
  """Appends (dotted key, leaf) pairs of `value`, dict keys in sorted order."""
  if isinstance(value, dict):
    for k in sorted(value):
      _FlattenInto(value[k], f'{key}.{k}' if key else str(k), out)
  elif isinstance(value, (list, tuple)):
    for i, v in enumerate(value):
      _FlattenInto(v, f'{key}[{i}]', out)
  else:
    out.append((key, value))


def _PackFrom(like: Any, leaves: Iterable[Any]) -> Any:
  """Rebuilds the structure of `like`, taking leaves from iterator `leaves`."""
  if isinstance(like, dict):
    # Leaves come in sorted-key order; the result keeps `like`'s key order.
    values = {k: _PackFrom(like[k], leaves) for k in sorted(like)}
    return type(like)((k, values[k]) for k in like)
  if isinstance(like, (list, tuple)):
    return _MakeSequence(like, [_PackFrom(v, leaves) for v in like])
  return next(leaves)


def _Skeleton(value: Any) -> Any:
  """`value` with every leaf replaced by None, dicts made plain."""
  if isinstance(value, dict):
    return {k: _Skeleton(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return (type(value).__name__, [_Skeleton(v) for v in value])
  return None


class NestedMap(dict):
  """A dict whose keys are also attributes: `m.x` is `m['x']`.

  Keys must be Python identifiers that are not names of dict or NestedMap
  attributes (so `m.items` and `m.Flatten` always mean the methods). Values may
  be anything; dicts, lists and tuples inside are traversed by `Flatten`,
  `Pack`, `Transform` and `Filter`, other values are leaves (None included).
  """

  __slots__ = ()
  _RESERVED = frozenset()  # Filled in after the class body.

  def __init__(self, *args: Any, **kwargs: Any) -> None:
    super().__init__(*args, **kwargs)
    for key in self:
      NestedMap.CheckKey(key)

  @staticmethod
  def CheckKey(key: Any) -> None:
    """Raises ValueError unless `key` can be a NestedMap key."""
    if not isinstance(key, str) or not key.isidentifier() or keyword.iskeyword(
        key):
      raise ValueError(f'NestedMap key {key!r} is not a valid Python '
                       'identifier; use letters, digits and "_", e.g. "conv_1"')
    if key in NestedMap._RESERVED:
      raise ValueError(f'NestedMap key {key!r} clashes with the method '
                       f'{key!r}; rename it, e.g. "{key}_"')

  # dict methods that bypass __setitem__ in subclasses are routed through it.

  def __setitem__(self, key: str, value: Any) -> None:
    NestedMap.CheckKey(key)
    super().__setitem__(key, value)

  # pylint: disable=invalid-name
  def update(self, *args: Any, **kwargs: Any) -> None:
    for key, value in dict(*args, **kwargs).items():
      self[key] = value

  def setdefault(self, key: str, default: Any = None) -> Any:
    if key not in self:
      self[key] = default
    return self[key]

  def copy(self) -> 'NestedMap':  # pylint: disable=invalid-name
    """Shallow copy that stays a NestedMap (dict.copy would return a dict)."""
    return type(self)(self)
  # pylint: enable=invalid-name

  def __getattr__(self, name: str) -> Any:
    if name.startswith('__'):  # Protocol probes (copy, pickle): be quick.
      raise AttributeError(name)
    try:
      return self[name]
    except KeyError:
      close = difflib.get_close_matches(name, [str(k) for k in self], n=3)
      hint = f' Did you mean {" or ".join(map(repr, close))}?' if close else ''
      if len(self) <= 20:
        hint += f' Keys: {sorted(self)}.'
      raise AttributeError(f'NestedMap has no key {name!r}.{hint}') from None

  def __setattr__(self, name: str, value: Any) -> None:
    self[name] = value

  def __delattr__(self, name: str) -> None:
    if name not in self:
      raise AttributeError(f'NestedMap has no key {name!r} to delete; keys: '
                           f'{sorted(self)}')
    del self[name]

  def __dir__(self) -> List[str]:
    return sorted(set(super().__dir__()) | set(self))

  @classmethod
  def FromNestedDict(cls, value: Any) -> Any:
    """Returns `value` with every dict in it (also in lists) a NestedMap."""
    if isinstance(value, dict):
      return cls((k, cls.FromNestedDict(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
      return _MakeSequence(value, [cls.FromNestedDict(v) for v in value])
    return value

  def DeepCopy(self) -> 'NestedMap':
    """Copies the structure (dicts, lists, tuples); leaves are shared.

    Leaves are usually tensors or variables, which must not be duplicated.
    """
    return self.Pack(self.Flatten())

  def Flatten(self) -> List[Any]:
    """Returns the leaves; dict keys in sorted order, as tf.nest.flatten."""
    return [leaf for _, leaf in self.FlattenItems()]

  def FlattenItems(self) -> List[Tuple[str, Any]]:
    """Returns (key, leaf) pairs, keys like 'a.b[0].c', in Flatten() order."""
    out = []
    _FlattenInto(self, '', out)
    return out

  def Pack(self, flat: Iterable[Any]) -> 'NestedMap':
    """Returns a NestedMap of this structure with the leaves `flat`.

    Args:
      flat: As many values as `Flatten()` returns, in the same order.

    Raises:
      ValueError: If `flat` has the wrong number of values.
    """
    flat = list(flat)
    keys = [key for key, _ in self.FlattenItems()]
    if len(flat) != len(keys):
      raise ValueError(f'Pack got {len(flat)} values but this NestedMap has '
                       f'{len(keys)} leaves ({keys}); pass exactly '
                       f'{len(keys)} values in Flatten() order')
    return _PackFrom(self, iter(flat))

  def Transform(self, fn: Callable[[Any], Any]) -> 'NestedMap':
    """Returns a NestedMap of the same structure with leaves `fn(leaf)`."""
    return self.Pack([fn(leaf) for leaf in self.Flatten()])

  def Filter(self, fn: Callable[[Any], bool]) -> 'NestedMap':
    """Returns a NestedMap of the leaves for which `fn(leaf)` is true.

    Dicts, lists and tuples that end up empty are dropped; lists and tuples
    keep their surviving elements in order (a namedtuple that loses fields
    becomes a plain tuple).
    """
    dropped = object()

    def Keep(value):
      if isinstance(value, dict):
        kept = {k: Keep(v) for k, v in value.items()}
        kept = type(value)((k, v) for k, v in kept.items() if v is not dropped)
      elif isinstance(value, (list, tuple)):
        items = [v for v in map(Keep, value) if v is not dropped]
        if len(items) == len(value):
          kept = _MakeSequence(value, items)
        else:
          kept = tuple(items) if _IsNamedTuple(value) else type(value)(items)
      else:
        return value if fn(value) else dropped
      return kept if kept else dropped

    result = Keep(self)
    return type(self)() if result is dropped else result

  def IsCompatible(self, other: Any) -> bool:
    """Whether `other` is a dict with the same keys, nesting and lengths."""
    return isinstance(other, dict) and _Skeleton(self) == _Skeleton(other)


NestedMap._RESERVED = frozenset(  # pylint: disable=protected-access
    name for name in dir(NestedMap) if not name.startswith('__'))
