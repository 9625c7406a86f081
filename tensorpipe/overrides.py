"""What a run changes in an experiment's Params: overrides, CSV tables.

Override text is what a user types after --model_params_override: items
`key=value` or `key : value`, separated by ';' or newlines. It is turned
into `Params.FromText` lines, which check every line before setting any.
Then `RecordCsvSchedules` puts the table of a CSV schedule given as a path
into the Params, so that params.txt records the table itself.
"""

import os
from typing import Callable, List

from tensorpipe import distribute
from tensorpipe import hyperparams
from tensorpipe import schedules


def _SplitOverrideItems(text: str) -> List[str]:
  """Splits on newlines, and on ';' outside quoted strings.

  A quote opened on a line ends there at the latest (values are one line),
  so an unterminated string cannot swallow the next line's items; FromText
  then reports it.
  """
  items, current, quote, i = [], [], None, 0
  while i < len(text):
    ch = text[i]
    if ch == '\n' or (ch == ';' and quote is None):
      items.append(''.join(current))
      current, quote = [], None
    else:
      current.append(ch)
      if quote is not None and ch == '\\' and i + 1 < len(text):
        current.append(text[i + 1])  # an escaped character, e.g. \'
        i += 1
      elif quote is None and ch in '\'"':
        quote = ch
      elif ch == quote:
        quote = None
    i += 1
  items.append(''.join(current))
  return items


def ParseOverrides(text: str) -> str:
  """Turns override text into FromText lines ('key : value').

  Accepts `key=value` or `key : value` items, separated by ';' or newlines;
  a ';' inside a quoted value ("task.name='a;b'") is part of the value.
  Blank items and '#' comments are skipped.

  Raises:
    ValueError: an item without '=' or ':'.
  """
  lines = []
  for item in _SplitOverrideItems(text or ''):
    item = item.strip()
    if not item or item.startswith('#'):
      continue
    eq, colon = item.find('='), item.find(':')
    positions = [i for i in (eq, colon) if i > 0]
    if not positions:
      raise ValueError(f'override {item!r} is not of the form key=value or '
                       "'key : value', e.g. task.train.max_steps=100")
    i = min(positions)
    key, value = item[:i].strip(), item[i + 1:].strip()
    if not value:
      raise ValueError(f'override {item!r} has no value after the '
                       f'{item[i]!r}')
    lines.append(f'{key} : {value}')
  return '\n'.join(lines)


def ApplyOverrides(p: hyperparams.Params, text: str) -> hyperparams.Params:
  """Applies --model_params_override text to `p` in place; returns p.

  Raises:
    ValueError: bad syntax, unknown key (with a did-you-mean) or bad value.
  """
  lines = ParseOverrides(text)
  if not lines:
    return p
  try:
    p.FromText(lines)
  except hyperparams.UnknownParamError as e:
    raise ValueError(f'--model_params_override: {e}') from None
  except (ValueError, TypeError) as e:
    hint = ''
    if 'cannot parse' in str(e):
      hint = (" (values are Python literals: quote strings, e.g. "
              "key='text'; numbers, True/False, None and lists as in Python)")
    raise ValueError(f'--model_params_override: {e}{hint}') from None
  return p


def IsCsvSchedulePath(value: object) -> bool:
  """Whether a pipeline's `schedule` value names a CSV file ('z.csv'), not
  a table recorded by `schedules.CsvParam` ('csv:...') nor a name."""
  return schedules.IsCsvParam(value) and not value.startswith(
      schedules.CSV_PREFIX)


def RecordCsvSchedules(p: hyperparams.Params,
                       resolve: Callable[[str], str] = os.path.abspath
                       ) -> List[str]:
  """Puts the table of every CSV schedule given as a path into the Params.

  A pipeline's `schedule` of 'path/z.csv' becomes `schedules.CsvParam`'s
  'csv:...' text (in place), so params.txt records the table itself: the
  run exports and evaluates anywhere once the file is gone, and a resume
  whose file changed logs the change like any other hyper-parameter.

  Args:
    p: the experiment's Params (mutable), overrides applied.
    resolve: maps a path as given to the one to read (the trainer resolves
      relative paths against the user's directory, paths.UserPath).

  Returns:
    The paths read, in the order of the pipelines.

  Raises:
    ValueError: a file cannot be read, naming it.
  """
  read = []
  for mp in distribute.PipelineParamsIn(p):
    value = mp.schedule
    if IsCsvSchedulePath(value):
      mp.schedule = schedules.CsvParam(resolve(value))
      read.append(value)
  return read
