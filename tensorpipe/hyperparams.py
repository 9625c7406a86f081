"""Hyperparameters: `Params` and `InstantiableParams`, Lingvo style.

A `Params` is a tree of named, documented values. Layers describe themselves
with one (`SomeLayer.Params()`), experiments tweak it (`p.Set(**{'a.b': 3})`),
and a layer freezes it once built so `FProp` can never change its own
configuration. The text format (`ToText` / `FromText` / `TextDiff`) is one
`key : value` line per leaf, so two experiments can be compared with a plain
diff and a value can be overridden from a command line. The module is pure
Python: TensorFlow is imported only when a `dtype:` value is parsed.

Usage:

  p = InstantiableParams(MyLayer)
  p.Define('dim', 128, 'Width of the hidden layer, in units.')
  p.Set(dim=256)
  layer = p.Instantiate()  # MyLayer(p)
"""

import copy
import difflib
import enum
import keyword
import re
import types
from typing import Any, Iterator, Optional, Tuple

from tensorpipe import params_format

# pylint: disable=protected-access

_KEY_PART_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)((?:\[\d+\])*)$')


class UnknownParamError(AttributeError):
  """An undefined key was read or written; the message suggests close keys."""


def _DidYouMean(name: str, known: list) -> str:
  close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
  hint = f' Did you mean {" or ".join(map(repr, close))}?' if close else ''
  if len(known) <= 20:
    hint += f' Known keys: {sorted(known)}.'
  return hint


def _IsDType(value: Any) -> bool:
  return any(c.__name__ == 'DType' and c.__module__.startswith('tensorflow')
             for c in type(value).__mro__)


def _ContainsParams(value: Any) -> bool:
  if isinstance(value, Params):
    return True
  if isinstance(value, (list, tuple)):
    return any(_ContainsParams(v) for v in value)
  if isinstance(value, dict):
    return any(_ContainsParams(v) for v in value.values())
  return False


def _QualifiedName(obj: Any) -> str:
  return f'{obj.__module__}.{obj.__qualname__}'


def _MakeSequence(like: tuple, items: list) -> tuple:
  """A tuple (or namedtuple) of the type of `like` holding `items`."""
  return type(like)(*items) if hasattr(like, '_fields') else type(like)(items)


def _CopyValue(value: Any) -> Any:
  """Deep-copies Params, lists, dicts; shares classes, functions, TF objects."""
  if isinstance(value, Params):
    return value.Copy()
  if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType,
                        types.MethodType, types.ModuleType, enum.Enum)):
    return value
  if type(value).__module__.split('.')[0] in ('tensorflow', 'tf_keras'):
    return value  # DTypes, tensors and variables are shared, never copied.
  if type(value) is list:  # pylint: disable=unidiomatic-typecheck
    return [_CopyValue(v) for v in value]
  if isinstance(value, tuple):
    return _MakeSequence(value, [_CopyValue(v) for v in value])
  if type(value) is dict:  # pylint: disable=unidiomatic-typecheck
    return {k: _CopyValue(v) for k, v in value.items()}
  return copy.deepcopy(value)


def _Encode(value: Any) -> str:
  """Returns the one-line text of a leaf value, as written by ToText."""
  if isinstance(value, enum.Enum):
    return f'enum/{_QualifiedName(type(value))}.{value.name}'
  if value is None or type(value) in (bool, int, float, str):
    return repr(value)
  if isinstance(value, type):
    return f'type/{_QualifiedName(value)}'
  if _IsDType(value):
    return f'dtype:{value.name}'
  if isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
    return f'callable/{_QualifiedName(value)}'
  if isinstance(value, Params):
    # Only reached for Params inside a dict; FromText cannot parse this.
    return 'Params(' + ', '.join(
        f'{k}={_Encode(v)}' for k, v in value.IterParams()) + ')'
  if isinstance(value, list):
    return '[' + ', '.join(_Encode(v) for v in value) + ']'
  if isinstance(value, tuple):
    body = ', '.join(_Encode(v) for v in value)
    return '(' + body + (',' if len(value) == 1 else '') + ')'
  if isinstance(value, dict):
    return '{' + ', '.join(
        f'{_Encode(k)}: {_Encode(v)}' for k, v in value.items()) + '}'
  if type(value).__repr__ is object.__repr__ and hasattr(value, '__dict__'):
    # The default repr holds an address: TextDiff would report equal configs.
    return f'{_QualifiedName(type(value))}(' + ', '.join(
        f'{k}={_Encode(v)}' for k, v in sorted(vars(value).items())) + ')'
  return ' '.join(repr(value).split())  # Unparseable, but kept on one line.




def _IsAuto(value: Any) -> bool:
  return isinstance(value, str) and value == 'auto'


def _Coerce(key: str, old: Any, new: Any, text: str) -> Any:
  """Returns `new` converted to the type of `old`, or raises ValueError.

  'auto' (a setting the planner resolves: schedule, num_micro_batches,
  recompute) takes a value of any type and may replace one: params.txt
  holds the resolved value of an experiment's 'auto', and an override may
  ask for 'auto' again.
  """
  if old is None or new is None or _IsAuto(old) or _IsAuto(new):
    return new
  number = isinstance(new, (int, float)) and not isinstance(new, bool)
  if isinstance(old, enum.Enum):
    ok = isinstance(new, type(old))
  elif isinstance(old, bool):
    ok = isinstance(new, bool)
  elif isinstance(old, int):
    ok = number and isinstance(new, int)
  elif isinstance(old, float):
    ok, new = number, (float(new) if number else new)
  elif isinstance(old, (list, tuple)) and type(old) in (list, tuple):
    ok = isinstance(new, (list, tuple))
    new = type(old)(new) if ok else new
  elif isinstance(old, type):
    ok = isinstance(new, type)
  elif _IsDType(old):
    ok = _IsDType(new)
  elif isinstance(old, (types.FunctionType, types.BuiltinFunctionType)):
    ok = callable(new)
  else:
    ok = isinstance(new, type(old))
  if not ok:
    old_type = type(old).__name__
    raise ValueError(
        f'FromText: {key!r} has type {old_type} (value {_Encode(old)}), but '
        f'the text {text!r} is of type {type(new).__name__}; write a value of '
        f'type {old_type}')
  return new


def _ParseKey(key: str) -> list:
  """Splits 'a.b[0].c' into ['a', 'b', 0, 'c']."""
  tokens = []
  for part in key.split('.'):
    match = _KEY_PART_RE.match(part)
    if not match:
      raise ValueError(f'invalid key {key!r}: write names joined by dots, with '
                       'optional list indices, e.g. "encoder.layers[0].dim"')
    tokens.append(match.group(1))
    tokens.extend(int(n) for n in re.findall(r'\d+', match.group(2)))
  return tokens


def _JoinKey(tokens: list) -> str:
  key = ''
  for t in tokens:
    key += f'[{t}]' if isinstance(t, int) else (f'.{t}' if key else t)
  return key


def _KeySortKey(key: str) -> list:
  return [(1, t) if isinstance(t, int) else (0, t) for t in _ParseKey(key)]


def _Assign(container: Any, tokens: list, value: Any, owner: 'Params',
            done: list) -> Any:
  """Sets `value` at `tokens` under `container`; rebuilds tuples on the way.

  Returns the container, or a new tuple when `container` was a tuple.
  """
  token, rest, where = tokens[0], tokens[1:], _JoinKey(done)
  if isinstance(container, Params):
    if not rest:
      container._SetOne(token, value, where)
      return container
    child = container._GetOne(token, where)
    new_child = _Assign(child, rest, value, container, done + [token])
    if new_child is not child:
      container._SetOne(token, new_child, where)
    return container
  owner._CheckMutable(_JoinKey(done + [token]))
  items = list(container)
  items[token] = (value if not rest else
                  _Assign(container[token], rest, value, owner, done + [token]))
  if isinstance(container, list):
    container[:] = items
    return container
  return _MakeSequence(container, items)




class Params:
  """A tree of named, documented hyperparameters with attribute access.

  Usage:

    p = Params()
    p.Define('dim', 8, 'Width of the layer, in units.')
    p.Define('sub', Params(), 'Nested params.')
    p.sub.Define('rate', 0.1, 'Dropout rate, in [0, 1).')
    p.Set(dim=16, **{'sub.rate': 0.2})
    p.Freeze()  # From now on, p.Copy() gives a mutable copy.
  """

  def __init__(self) -> None:
    object.__setattr__(self, '_values', {})
    object.__setattr__(self, '_descriptions', {})
    object.__setattr__(self, '_frozen', False)

  # Attribute access.

  def __getattr__(self, name: str) -> Any:
    if name.startswith('_'):  # Internals; keeps copy/pickle protocols sane.
      raise AttributeError(name)
    return self._GetOne(name)

  def __setattr__(self, name: str, value: Any) -> None:
    if name.startswith('_'):
      object.__setattr__(self, name, value)
    else:
      self._SetOne(name, value)

  def __dir__(self):
    return sorted(set(super().__dir__()) | set(self._values))

  def _GetOne(self, name: str, where: str = '') -> Any:
    if name not in self._values:
      key = f'{where}.{name}' if where else name
      raise UnknownParamError(
          f'Unknown param {key!r}.{_DidYouMean(name, list(self._values))} '
          'To add a new param, call Define(name, default, description).')
    return self._values[name]

  def _SetOne(self, name: str, value: Any, where: str = '') -> None:
    self._CheckMutable(f'{where}.{name}' if where else name)
    self._GetOne(name, where)
    self._values[name] = value

  def _CheckMutable(self, what: str) -> None:
    if self._frozen:
      raise TypeError(f'Cannot change {what!r}: these params are frozen (e.g. '
                      'a layer was built from them). Use p.Copy() to get a '
                      'mutable copy.')

  # Definition and access.

  def Define(self, name: str, default: Any, description: str) -> None:
    """Defines a new param.

    Args:
      name: A Python identifier not starting with '_' and not the name of a
        Params method, e.g. 'num_layers'.
      default: The initial value; may be None or a nested Params.
      description: A non-empty sentence saying what the param means, with units.

    Raises:
      TypeError: If the params are frozen.
      ValueError: If the name is invalid or already defined, or the description
        is empty.
    """
    self._CheckMutable(name)
    if (not isinstance(name, str) or not name.isidentifier() or
        keyword.iskeyword(name) or name.startswith('_') or
        hasattr(type(self), name)):
      raise ValueError(f'Invalid param name {name!r}: use a Python '
                       'identifier that does not start with "_" and is not a '
                       'Params method name, e.g. "num_layers"')
    if name in self._values:
      raise ValueError(f'Param {name!r} is already defined (value '
                       f'{_Encode(self._values[name])}); set it with '
                       f'p.{name} = ... or Delete it first')
    if not isinstance(description, str) or not description.strip():
      raise ValueError(f'Param {name!r} needs a non-empty description, got '
                       f'{description!r}; say what it means and its units')
    self._values[name] = default
    self._descriptions[name] = description

  def Set(self, **kwargs: Any) -> 'Params':
    """Sets params by name; dotted keys ('a.b[0].c') reach nested values.

    Args:
      **kwargs: Key-value pairs. Use `p.Set(**{'a.b': 1})` for dotted keys.

    Returns:
      self, for chaining.

    Raises:
      UnknownParamError: (an AttributeError) for an undefined key.
      TypeError: If the params are frozen.
    """
    self._CheckMutable(', '.join(kwargs))
    for key, value in kwargs.items():
      tokens = _ParseKey(key)
      self._GetPath(tokens, key)  # Validates the whole path first.
      _Assign(self, tokens, value, self, [])
    return self

  def Get(self, key: str) -> Any:
    """Returns the value at `key`, which may be dotted ('a.b[0].c')."""
    return self._GetPath(_ParseKey(key), key)

  def Delete(self, *keys: str) -> 'Params':
    """Deletes params; keys may be dotted. Returns self."""
    for key in keys:
      tokens = _ParseKey(key)
      if not isinstance(tokens[-1], str):
        raise ValueError(f'Cannot delete list element {key!r}; set the list')
      owner = self._GetPath(tokens[:-1], key) if len(tokens) > 1 else self
      if not isinstance(owner, Params):
        raise ValueError(f'Cannot delete {key!r}: {_JoinKey(tokens[:-1])!r} '
                         f'is of type {type(owner).__name__}, not Params')
      owner._CheckMutable(key)
      owner._GetOne(tokens[-1], _JoinKey(tokens[:-1]))
      del owner._values[tokens[-1]]
      del owner._descriptions[tokens[-1]]
    return self

  def _GetPath(self, tokens: list, key: str) -> Any:
    current = self
    for i, token in enumerate(tokens):
      where = _JoinKey(tokens[:i])
      if isinstance(token, str):
        if not isinstance(current, Params):
          raise ValueError(f'Cannot look up {key!r}: {where!r} is of type '
                           f'{type(current).__name__}, not Params')
        current = current._GetOne(token, where)
      else:
        if not isinstance(current, (list, tuple)):
          raise ValueError(f'Cannot index {key!r}: {where!r} is of type '
                           f'{type(current).__name__}, not a list')
        if not 0 <= token < len(current):
          raise ValueError(f'Cannot look up {key!r}: index {token} is out of '
                           f'range, {where!r} has {len(current)} elements')
        current = current[token]
    return current

  # Container protocol.

  def __contains__(self, key: str) -> bool:
    try:
      self.Get(key)
      return True
    except (AttributeError, ValueError):
      return False

  def IterParams(self) -> Iterator[Tuple[str, Any]]:
    """Yields (name, value) pairs in definition order."""
    yield from list(self._values.items())

  def __iter__(self) -> Iterator[Tuple[str, Any]]:
    return self.IterParams()

  def __len__(self) -> int:
    return len(self._values)

  def __eq__(self, other: Any) -> bool:
    return isinstance(other, Params) and self._values == other._values

  __hash__ = None  # Mutable.

  def Description(self, name: str) -> str:
    """Returns the description given to Define for `name` (not dotted)."""
    self._GetOne(name)
    return self._descriptions[name]

  # Copy and freeze.

  def Copy(self) -> 'Params':
    """Returns a deep, unfrozen copy; classes, functions, TF objects shared."""
    new = object.__new__(type(self))
    Params.__init__(new)
    for name, value in self._values.items():
      new._values[name] = _CopyValue(value)
    new._descriptions.update(self._descriptions)
    return new

  def __deepcopy__(self, memo: Optional[dict]) -> 'Params':
    return self.Copy()

  def Freeze(self) -> 'Params':
    """Makes these params and all nested Params read-only. Returns self."""
    object.__setattr__(self, '_frozen', True)
    stack = list(self._values.values())
    while stack:
      value = stack.pop()
      if isinstance(value, Params):
        value.Freeze()
      elif isinstance(value, (list, tuple)):
        stack.extend(value)
      elif isinstance(value, dict):
        stack.extend(value.values())
    return self

  def IsFrozen(self) -> bool:
    return self._frozen

  # Text.

  def __str__(self) -> str:
    return _Pretty(self, 0)

  __repr__ = __str__

  def _Leaves(self) -> list:
    """Returns [(key, value)] for every leaf, sorted by key."""
    leaves = []

    def Walk(key, value):
      if isinstance(value, Params):
        for name, v in value.IterParams():
          Walk(f'{key}.{name}' if key else name, v)
      elif isinstance(value, (list, tuple)) and _ContainsParams(value):
        for i, v in enumerate(value):
          Walk(f'{key}[{i}]', v)
      else:
        leaves.append((key, value))

    Walk('', self)
    return sorted(leaves, key=lambda kv: _KeySortKey(kv[0]))

  def ToText(self) -> str:
    """Returns one `key : value` line per leaf, sorted by key.

    Nested Params are flattened with dots ('encoder.dim : 8'); lists and tuples
    that contain Params are flattened with indices ('layers[0].dim : 8').
    Values: Python literals (strings quoted, repr escaping), lists, tuples,
    dicts, `type/module.Class`, `callable/module.function`,
    `enum/module.Enum.MEMBER` and `dtype:float32`.
    """
    return ''.join(f'{k} : {_Encode(v)}\n' for k, v in self._Leaves())

  def FromText(self, text: str) -> 'Params':
    """Sets the values in `text` (the ToText format) in place. Returns self.

    Blank lines and lines starting with '#' are skipped. All lines are
    checked before any value is set, so on error the params are unchanged.

    - Each new value must have the type of the old one; an int is accepted for
      a float, any value replaces None, and None replaces any value.
    - A line whose text equals the current value's text is skipped without
      parsing, so `p.FromText(p.ToText())` always works.
    - A key whose current value is a list or tuple containing Params (e.g.
      'layers') cannot be given one value: text cannot express Params, so
      'layers : []' raises instead of silently keeping or dropping the
      layers. Set their fields through indexed keys ('layers[0].dim : 8').
    - Values that ToText can only write with repr (arbitrary objects, Params
      inside dicts, local classes, lambdas) cannot be parsed back.

    Args:
      text: Lines of `key : value`.

    Returns:
      self.

    Raises:
      UnknownParamError: (an AttributeError) for an undefined key.
      TypeError: If the params are frozen.
      ValueError: For a malformed line, an unparseable value or a type mismatch.
    """
    self._CheckMutable('FromText')
    updates = {}
    try:
      lines = params_format.TextLines(text)
    except ValueError as e:
      raise ValueError(f'FromText {e}') from None
    for _, key, value_text in lines:
      old = self.Get(key)
      if isinstance(old, (list, tuple)) and _ContainsParams(old):
        raise ValueError(
            f'FromText: {key!r} holds Params in a {type(old).__name__} of '
            f'length {len(old)}, which a text value cannot replace (got '
            f'{value_text!r}); set their fields with indexed keys, e.g. '
            f'"{key}[0].name : value", or change the list in Python')
      if isinstance(old, Params):
        raise ValueError(f'FromText: {key!r} holds nested Params; set its '
                         f'leaves ("{key}.name : value"), not {value_text!r}')
      if value_text == _Encode(old):
        continue
      try:
        new = params_format.DecodeValue(value_text)
      except (ValueError, TypeError, SyntaxError, KeyError) as e:
        raise ValueError(f'FromText: cannot parse the value of {key!r}, '
                         f'{value_text!r}: {e}') from e
      updates[key] = _Coerce(key, old, new, value_text)
    return self.Set(**updates)

  def TextDiff(self, other: 'Params') -> str:
    """Returns '- key : mine' / '+ key : theirs' lines, or '' when equal."""
    mine = {k: _Encode(v) for k, v in self._Leaves()}
    theirs = {k: _Encode(v) for k, v in other._Leaves()}
    lines = []
    for key in sorted(set(mine) | set(theirs), key=_KeySortKey):
      if mine.get(key) == theirs.get(key):
        continue
      if key in mine:
        lines.append(f'- {key} : {mine[key]}\n')
      if key in theirs:
        lines.append(f'+ {key} : {theirs[key]}\n')
    return ''.join(lines)


def _Pretty(value: Any, depth: int) -> str:
  """Multi-line, indented text of a value for __str__."""
  pad, inner = '  ' * depth, '  ' * (depth + 1)
  if isinstance(value, Params):
    if not len(value):
      return '{}'
    body = ''.join(f'{inner}{k}: {_Pretty(v, depth + 1)}\n'
                   for k, v in value.IterParams())
    return '{\n' + body + pad + '}'
  if isinstance(value, (list, tuple)) and _ContainsParams(value):
    body = ''.join(f'{inner}{_Pretty(v, depth + 1)},\n' for v in value)
    brackets = '[]' if isinstance(value, list) else '()'
    return brackets[0] + '\n' + body + pad + brackets[1]
  return _Encode(value)


class InstantiableParams(Params):
  """Params that build an object: `p.Instantiate()` calls `p.cls(p)`."""

  def __init__(self, cls: Optional[type] = None) -> None:
    super().__init__()
    self.Define('cls', cls, 'The class to instantiate; Instantiate() calls '
                'cls(params, **kwargs).')

  def Instantiate(self, **kwargs: Any) -> Any:
    """Returns `self.cls(self, **kwargs)`.

    Raises:
      ValueError: If `cls` is None.
    """
    if self.cls is None:
      raise ValueError('Instantiate() was called on params whose cls is None; '
                       'set the class to build first, e.g. p.cls = MyLayer or '
                       'InstantiableParams(MyLayer)')
    return self.cls(self, **kwargs)
