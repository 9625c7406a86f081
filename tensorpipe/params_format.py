"""The Params text format: one `key : value` line per leaf, parsed.

`hyperparams.Params.ToText` writes the format; this module reads it back:
`TextLines` / `TextValues` split a text into its lines (the one parser of
Params text: `Params.FromText`, params.txt in a logdir, the workers'
agreement), and `DecodeValue` turns one value's text into a Python value.
Pure Python: TensorFlow is imported only when a `dtype:` value is decoded.

Value grammar (what `ToText` writes):

  value := 'string' | "string"             (Python literal, repr escapes)
         | [value, ...] | (value, ...) | {value: value, ...}
         | atom                              (_ATOM_RE)
  atom  := None | True | False | int | float
         | type/module.Class | callable/module.function
         | enum/module.Enum.MEMBER | dtype:float32
"""

import ast
import importlib
import re
import sys
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

# A bare (unquoted) word in a value: numbers, None/True/False, and the
# `type/`, `callable/`, `enum/` and `dtype:` forms.
_ATOM_RE = re.compile(r'[A-Za-z0-9_.+\-/<>]+(?::[A-Za-z_][A-Za-z0-9_]*)?')
_INT_RE = re.compile(r'[-+]?\d+$')
# Deepest nesting of brackets a text value may have. Real values nest a few
# levels; the limit turns a runaway value into a ValueError before Python's
# recursion limit (a RecursionError) is reached.
MAX_TEXT_NESTING = 100


def _Resolve(path: str) -> Any:
  """Imports `module.path.QualName` (the longest importable module prefix)."""
  parts = path.split('.')
  for i in range(len(parts) - 1, 0, -1):
    module_name = '.'.join(parts[:i])
    module = sys.modules.get(module_name)
    if module is None:
      try:
        module = importlib.import_module(module_name)
      except ImportError:
        continue
    obj = module
    try:
      for attr in parts[i:]:
        obj = getattr(obj, attr)
    except AttributeError:
      continue
    return obj
  raise ValueError(f'cannot resolve {path!r}: no importable module defines '
                   'it; write module.path.Name of a module-level object')


def _DecodeAtom(atom: str) -> Any:
  """Decodes one bare word (see _ATOM_RE)."""
  if atom in ('None', 'True', 'False'):
    return {'None': None, 'True': True, 'False': False}[atom]
  if _INT_RE.match(atom):
    return int(atom)
  for prefix in ('type/', 'callable/'):
    if atom.startswith(prefix):
      return _Resolve(atom[len(prefix):])
  if atom.startswith('enum/'):
    cls_path, _, member = atom[len('enum/'):].rpartition('.')
    return _Resolve(cls_path)[member]
  if atom.startswith('dtype:'):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf.as_dtype(atom[len('dtype:'):])
  try:
    return float(atom)
  except ValueError:
    raise ValueError(f'cannot parse {atom!r}') from None


def _SkipSpace(text: str, i: int) -> int:
  while i < len(text) and text[i].isspace():
    i += 1
  return i


def _ParseValue(text: str, i: int, depth: int = 0) -> Tuple[Any, int]:
  """Parses one value of `text` starting at `i`; returns (value, next index).

  `depth` counts the brackets enclosing position `i`.
  """
  i = _SkipSpace(text, i)
  if i >= len(text):
    raise ValueError('expected a value, found the end of the text')
  ch = text[i]
  if ch in '\'"':
    j = i + 1
    while j < len(text) and text[j] != ch:
      j += 2 if text[j] == '\\' else 1
    if j >= len(text):
      raise ValueError(f'unterminated string starting at {text[i:]!r}')
    return ast.literal_eval(text[i:j + 1]), j + 1
  if ch in '[({':
    if depth >= MAX_TEXT_NESTING:
      raise ValueError(f'the value nests brackets more than '
                       f'{MAX_TEXT_NESTING} levels deep; flatten it')
    close = {'[': ']', '(': ')', '{': '}'}[ch]
    items, i = [], i + 1
    while text[_SkipSpace(text, i):_SkipSpace(text, i) + 1] != close:
      item, i = _ParseValue(text, i, depth + 1)
      if ch == '{':
        i = _SkipSpace(text, i)
        if text[i:i + 1] != ':':
          raise ValueError(f'expected ":" at {text[i:]!r}')
        value, i = _ParseValue(text, i + 1, depth + 1)
        item = (item, value)
      items.append(item)
      i = _SkipSpace(text, i)
      if text[i:i + 1] == ',':
        i += 1
      elif text[i:i + 1] != close:
        raise ValueError(f'expected "," or {close!r} at {text[i:]!r}')
    i = _SkipSpace(text, i)
    kind = {'[': list, '(': tuple, '{': dict}[ch]
    return kind(items), i + 1
  match = _ATOM_RE.match(text, i)
  if not match:
    raise ValueError(f'cannot parse {text[i:]!r}')
  return _DecodeAtom(match.group()), match.end()


def DecodeValue(text: str) -> Any:
  """The Python value of one value's text (the grammar above).

  Raises:
    ValueError: (or SyntaxError from a bad string literal) text that is
      not one value.
  """
  value, i = _ParseValue(text, 0)
  if text[i:].strip():
    raise ValueError(f'unexpected trailing text {text[i:]!r}')
  return value


class TextLine(NamedTuple):
  """One `key : value` line of the ToText format (see `TextLines`)."""
  number: int  # 1-based, in the text given
  key: str  # 'task.model.layers[0].dim'
  value: str  # the value's text as ToText writes it, e.g. "'a : b'"


def ParseTextLine(line: str) -> Optional[Tuple[str, str]]:
  """(key, value text) of one line of the ToText format, or None.

  The key is the text before the first ':' (keys hold none: names are
  identifiers, indices '[i]'), the value the rest (which may hold ': ',
  e.g. a quoted string or a dict), both stripped. None for a blank line, a
  '#' comment and a line of any other form (no ':' or no key).
  """
  line = line.strip()
  if not line or line.startswith('#'):
    return None
  key, sep, value = (s.strip() for s in line.partition(':'))
  if not sep or not key:
    return None
  return key, value


def TextLines(text: str, skip_malformed: bool = False) -> List[TextLine]:
  """The `key : value` lines of `text` (the ToText format), in order.

  The one parser of Params text: FromText, params.txt in a logdir
  (logdir.py, export.py) and the workers' agreement all read it here.
  ToText writes every value on one line (strings quoted with repr's
  escapes, so no line break inside), hence one line per leaf.

  Args:
    text: lines of `key : value`; blank lines and '#' comments are skipped.
    skip_malformed: skip lines of another form instead of raising (for a
      file a person may have edited, read only for messages).

  Raises:
    ValueError: a line of another form, naming its number (1-based).
  """
  out = []
  for number, line in enumerate(text.splitlines(), 1):
    item = ParseTextLine(line)
    if item is not None:
      out.append(TextLine(number, *item))
    elif not skip_malformed and line.strip() and (
        not line.strip().startswith('#')):
      raise ValueError(f'line {number}: {line.strip()!r} is not of the form '
                       '"key : value"')
  return out


def TextValues(text: str, skip_malformed: bool = False) -> Dict[str, str]:
  """{key: value text} of `TextLines(text)`; a key given twice keeps its
  last value."""
  return {line.key: line.value for line in TextLines(text, skip_malformed)}
