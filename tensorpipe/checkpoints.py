"""A logdir's checkpoints: restore the newest intact one that fits the model.

`tf.train.CheckpointManager` trusts the `checkpoint` state file and restores
the checkpoint it names. A damaged file then ends in a raw TensorFlow error,
and a garbage state file is ignored with a warning, so a trainer starts again
from step 0 and overwrites the old run. Here a restore goes:

  CleanUp(dir)                      # folders and files of killed saves
  RepairStateFile(dir)              # an unreadable state file is rebuilt
  for ckpt-N, newest N first (state file and files on disk together):
    index missing or unreadable  -> warn naming the file; try the next
    variables differ from ours   -> IncompatibleCheckpointError (a different
                                    model, not a damaged file: no fallback)
    restore; a data file that is missing, truncated or fails its checksum
                                 -> warn naming the file; try the next
  checkpoint files there but none usable -> CheckpointError naming them

A failed restore may have assigned some variables; the next restore assigns
all of them again, so nothing of the damaged checkpoint survives.

Variables are compared by checkpoint key, the object path TensorFlow saves
them under (`model/model/conv0/w/.ATTRIBUTES/VARIABLE_VALUE`), computed here
from the objects the same way (breadth-first, first path wins).
"""

import collections
import os
import re
import shutil
import signal
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from google.protobuf import message as protobuf_message
import tensorflow as tf

from tensorpipe import errors

# The run's checkpoints live in <logdir>/CHECKPOINT_DIR (the trainer writes
# them, export and eval read them).
CHECKPOINT_DIR = 'checkpoints'
STATE_FILE = 'checkpoint'
CHECKPOINT_NAME = 'ckpt'  # tf.train.CheckpointManager's default prefix

_VALUE_SUFFIX = '/.ATTRIBUTES/VARIABLE_VALUE'
_NUMBER = re.compile(r'^ckpt-(\d+)(?:\.index|\.data-\d+-of-\d+)?$')
# Left by a save killed part way: TF writes ckpt-N_temp/, index files through
# '<name>.tempstate<n>' and the state file through 'checkpoint.tmp<hex>'.
_TEMP = re.compile(r'^(ckpt-\d+_temp|.*\.tempstate\d*|checkpoint\.tmp[0-9a-f]*)$')

# Errors of a damaged checkpoint file (not of a model that does not fit it):
# TF's read errors, 'Read less bytes than requested' (IndexError) of a
# truncated file and a damaged object graph (protobuf DecodeError).
_DAMAGE_ERRORS = (tf.errors.OpError, IndexError, OSError,
                  protobuf_message.DecodeError)

LogFn = Callable[[str], None]


class CheckpointError(RuntimeError):
  """Checkpoint files exist but none can be restored."""


class NoCheckpointError(CheckpointError):
  """The logdir has no checkpoint (e.g. evaluation of an untrained logdir)."""


class IncompatibleCheckpointError(CheckpointError):
  """The checkpoint holds other variables than the model it is restored to."""


def CheckpointNumber(path: str) -> Optional[int]:
  """N of '.../ckpt-N' (or one of its files), else None."""
  m = _NUMBER.match(os.path.basename(path))
  return int(m.group(1)) if m else None


def CleanUp(ckpt_dir: str, log_fn: LogFn) -> List[str]:
  """Removes what killed saves left in ckpt_dir; returns the names removed.

  Only the logdir's lock holder may call this: a running save of another
  process would lose its files.
  """
  removed = []
  try:
    names = sorted(os.listdir(ckpt_dir))
  except FileNotFoundError:
    return removed
  for name in names:
    if not _TEMP.match(name):
      continue
    path = os.path.join(ckpt_dir, name)
    if os.path.isdir(path) and not os.path.islink(path):
      shutil.rmtree(path, ignore_errors=True)
    else:
      try:
        os.remove(path)
      except FileNotFoundError:
        pass
    removed.append(name)
  if removed:
    log_fn(f'removed {len(removed)} leftovers of interrupted checkpoint '
           f'saves in {ckpt_dir}: {", ".join(removed)}')
  return removed


def _ReadState(ckpt_dir: str) -> Tuple[bool, List[int], str]:
  """(state file usable, its checkpoint numbers, what is wrong with it)."""
  path = os.path.join(ckpt_dir, STATE_FILE)
  if not os.path.exists(path):
    return True, [], ''
  try:
    state = tf.train.get_checkpoint_state(ckpt_dir)
  except (ValueError, tf.errors.OpError) as e:  # empty: no model path
    return False, [], errors.FirstLine(e)
  if state is None:  # TF logged a parse error and ignored the file
    return False, [], 'not a checkpoint state (unparseable text)'
  paths = list(state.all_model_checkpoint_paths) + [
      state.model_checkpoint_path]
  numbers = {CheckpointNumber(p) for p in paths}
  numbers.discard(None)
  return True, sorted(numbers), ''


def _FilesOnDisk(ckpt_dir: str) -> Dict[int, List[str]]:
  """{N: file names of ckpt-N} in ckpt_dir."""
  out = collections.defaultdict(list)
  try:
    names = os.listdir(ckpt_dir)
  except FileNotFoundError:
    return {}
  for name in names:
    n = CheckpointNumber(name)
    if n is not None and name != f'{CHECKPOINT_NAME}-{n}':
      out[n].append(name)
  return dict(out)


def _WriteState(ckpt_dir: str, numbers: Sequence[int]) -> None:
  names = [f'{CHECKPOINT_NAME}-{n}' for n in sorted(numbers)]
  lines = [f'model_checkpoint_path: "{names[-1]}"'] + [
      f'all_model_checkpoint_paths: "{name}"' for name in names]
  path = os.path.join(ckpt_dir, STATE_FILE)
  tmp = f'{path}.tmp{os.getpid():x}'
  with open(tmp, 'w') as f:
    f.write('\n'.join(lines) + '\n')
  os.replace(tmp, path)


def RepairStateFile(ckpt_dir: str, log_fn: LogFn) -> bool:
  """Rebuilds an unreadable state file from the checkpoint files on disk.

  The bad file is kept as 'checkpoint.bad'. Only the lock holder may call
  this. Returns True if the state file was rebuilt or removed.
  """
  ok, _, problem = _ReadState(ckpt_dir)
  if ok:
    return False
  path = os.path.join(ckpt_dir, STATE_FILE)
  os.replace(path, path + '.bad')
  numbers = sorted(n for n, files in _FilesOnDisk(ckpt_dir).items()
                   if f'{CHECKPOINT_NAME}-{n}.index' in files)
  if numbers:
    _WriteState(ckpt_dir, numbers)
  log_fn(f'the checkpoint state file {path} is damaged ({problem}); kept it '
         f'as {path}.bad and rebuilt it from the checkpoint files there: '
         f'{", ".join(f"{CHECKPOINT_NAME}-{n}" for n in numbers) or "none"}')
  return True


def Candidates(ckpt_dir: str, log_fn: LogFn) -> List[int]:
  """Checkpoint numbers named by the state file or found on disk, newest first.

  An unreadable state file is reported (with log_fn) and the files on disk
  alone decide.
  """
  ok, listed, problem = _ReadState(ckpt_dir)
  if not ok:
    log_fn(f'the checkpoint state file {os.path.join(ckpt_dir, STATE_FILE)} '
           f'is damaged ({problem}); using the checkpoint files on disk')
  return sorted(set(listed) | set(_FilesOnDisk(ckpt_dir)), reverse=True)


def _Escape(name: str) -> str:
  # TF's object-graph path escaping: '.' -> '..', '/' -> '.S'.
  return name.replace('.', '..').replace('/', '.S')


def VariableKeys(roots: Dict[str, tf.Module]) -> Dict[str, tf.Variable]:
  """{checkpoint key: variable} that `tf.train.Checkpoint(**roots)` saves.

  Keys are the breadth-first object paths TF uses, e.g.
  'model/model/conv0/w/.ATTRIBUTES/VARIABLE_VALUE'.
  """
  out = {}
  seen = set()
  queue = collections.deque()
  for name in sorted(roots):
    seen.add(id(roots[name]))
    queue.append((roots[name], _Escape(name)))
  while queue:
    obj, path = queue.popleft()
    if isinstance(obj, tf.Variable):
      out[path + _VALUE_SUFFIX] = obj
    for name, child in tf.train.TrackableView(obj).children(obj).items():
      if id(child) in seen:
        continue
      seen.add(id(child))
      queue.append((child, f'{path}/{_Escape(name)}'))
  return out


def _Unescape(part: str) -> str:
  out, i = [], 0
  while i < len(part):
    if part[i] == '.' and i + 1 < len(part):
      out.append('/' if part[i + 1] == 'S' else part[i + 1])
      i += 2
    else:
      out.append(part[i])
      i += 1
  return ''.join(out)


def _Short(key: str) -> str:
  """A checkpoint key as shown to users: no suffix, names unescaped."""
  if key.endswith(_VALUE_SUFFIX):
    key = key[:-len(_VALUE_SUFFIX)]
  return '/'.join(_Unescape(part) for part in key.split('/'))


def _Listed(items: Sequence[str], limit: int = 8) -> str:
  more = f' and {len(items) - limit} more' if len(items) > limit else ''
  return ', '.join(items[:limit]) + more


def VariableDiff(expected: Dict[str, tf.Variable],
                 saved: Dict[str, Sequence[int]],
                 saved_dtypes: Optional[Dict[str, tf.DType]] = None,
                 strict_prefixes: Iterable[str] = ('model/',)) -> List[str]:
  """What differs between our variables and a checkpoint's, one item each.

  Args:
    expected: {key: variable} (VariableKeys of the objects restored).
    saved: {key: shape} of the checkpoint (reader.get_variable_to_shape_map).
    saved_dtypes: {key: dtype} of the checkpoint, if dtypes are compared.
    strict_prefixes: keys under these must match both ways; elsewhere (e.g.
      optimizer slots, which may be created after the restore) the checkpoint
      may hold more than we have.

  Returns:
    Items like 'model/x/w (not in the checkpoint)', 'model/y/b (only in the
    checkpoint)', 'model/z/w: shape [4] here, [3, 3, 1, 1] in the
    checkpoint'. Empty when they fit.
  """
  roots = {key.split('/', 1)[0] + '/' for key in expected}
  strict = tuple(strict_prefixes)
  missing, extra, shapes = [], [], []
  for key in sorted(expected):
    if key not in saved:
      missing.append(f'{_Short(key)} (not in the checkpoint)')
      continue
    want = expected[key].shape.as_list()
    have = list(saved[key])
    if want != have:
      shapes.append(f'{_Short(key)}: shape {want} here, {have} in the '
                    'checkpoint')
    elif saved_dtypes and key in saved_dtypes and (
        saved_dtypes[key] != expected[key].dtype):
      shapes.append(f'{_Short(key)}: {expected[key].dtype.name} here, '
                    f'{saved_dtypes[key].name} in the checkpoint')
  for key in sorted(saved):
    if (key.endswith(_VALUE_SUFFIX) and key not in expected and
        key.startswith(strict) and any(key.startswith(r) for r in roots)):
      extra.append(f'{_Short(key)} (only in the checkpoint)')
  # The model's own variables first: they say what changed; the optimizer
  # slots of the same variables only repeat it.
  items = shapes + missing + extra
  return ([i for i in items if i.startswith(strict)] +
          [i for i in items if not i.startswith(strict)])


def _Describe(n: int, problem: str) -> str:
  return f'{CHECKPOINT_NAME}-{n}: {problem}'


def RestoreNewest(checkpoint: tf.train.Checkpoint, roots: Dict[str, tf.Module],
                  ckpt_dir: str, log_fn: LogFn,
                  run_description: Callable[[], str]) -> Optional[str]:
  """Restores the newest intact checkpoint of ckpt_dir into `checkpoint`.

  Args:
    checkpoint: the tf.train.Checkpoint to restore (its children: `roots`
      plus possibly others, e.g. an input iterator, that are not compared).
    roots: {name: object} whose variables must fit the checkpoint's.
    ckpt_dir: the checkpoints folder.
    log_fn: gets a warning for each damaged checkpoint skipped.
    run_description: () -> 'a run of X' for the error of a checkpoint that
      does not fit.

  Returns:
    The path restored, or None when ckpt_dir holds no checkpoint at all.

  Raises:
    IncompatibleCheckpointError: the newest readable checkpoint holds other
      variables than `roots`.
    CheckpointError: checkpoint files exist but none is usable.
  """
  numbers = Candidates(ckpt_dir, log_fn)
  if not numbers:
    return None
  expected = VariableKeys(roots)
  files = _FilesOnDisk(ckpt_dir)
  problems = []
  for n in numbers:
    prefix = os.path.join(ckpt_dir, f'{CHECKPOINT_NAME}-{n}')
    index = prefix + '.index'
    if not os.path.exists(index):
      what = ('is missing' if files.get(n) else
              'is missing (the state file names it, no file of it is there)')
      problems.append(_Describe(n, f'{index} {what}'))
      log_fn(f'skipping checkpoint {prefix}: its index file {index} {what}')
      continue
    try:
      reader = tf.train.load_checkpoint(prefix)
      saved = reader.get_variable_to_shape_map()
      saved_dtypes = reader.get_variable_to_dtype_map()
    except _DAMAGE_ERRORS as e:
      problems.append(
          _Describe(n, f'{index} is damaged ({errors.FirstLine(e)})'))
      log_fn(f'skipping checkpoint {prefix}: its index file {index} is '
             f'damaged: {errors.FirstLine(e)}')
      continue
    diff = VariableDiff(expected, saved, saved_dtypes)
    if diff:
      raise IncompatibleCheckpointError(
          f'{ckpt_dir} holds {run_description()}; its variables differ from '
          f'this model\'s: {_Listed(diff)}. Use a new --logdir for this '
          'model, or the experiment and overrides of that run (its '
          'params.txt)')
    try:
      status = checkpoint.restore(prefix)
    except _DAMAGE_ERRORS as e:
      data = ', '.join(sorted(f for f in files.get(n, []) if '.data-' in f))
      problems.append(_Describe(n, f'data file {data or "(none)"} is '
                                f'damaged ({errors.FirstLine(e)})'))
      log_fn(f'skipping checkpoint {prefix}: reading its data file '
             f'{os.path.join(ckpt_dir, data) if data else "(none found)"} '
             f'failed: {errors.FirstLine(e)}')
      continue
    try:
      status.assert_existing_objects_matched()
    except AssertionError as e:
      raise IncompatibleCheckpointError(
          f'{ckpt_dir} holds {run_description()}, which does not fit this '
          f'model: {errors.FirstLine(e)}') from None
    status.expect_partial()  # values of objects not restored here are fine
    if problems:
      log_fn(f'restored {prefix}, the newest intact checkpoint (newer ones '
             f'are damaged: {"; ".join(problems)})')
    return prefix
  raise CheckpointError(
      f'no usable checkpoint in {ckpt_dir}: {"; ".join(problems)}. Move the '
      'damaged files away to start again from step 0, or restore them from '
      'a backup')


# Test-only: SIGKILL the process in the save of this step, leaving what a
# kill between the data file and the index leaves (see TestKillInSave).
TEST_KILL_ENV = 'TENSORPIPE_TEST_KILL_DURING_SAVE'


def TestKillInSave(path: str, previous: Optional[str]) -> None:
  """Test-only fault injection, when TENSORPIPE_TEST_KILL_DURING_SAVE=<step>.

  If `path` (just written by CheckpointManager.save) is the checkpoint of
  that step: removes its index and takes it back out of the state file
  (TensorFlow writes the data file, then the index, then the state file),
  then SIGKILLs this process. What is left is what a kill between the data
  file and the index leaves, at a point a test can choose: a resume must
  skip the data file without index and restore `previous`.

  Args:
    path: the checkpoint prefix just saved, e.g. '.../ckpt-8'.
    previous: the checkpoint before it (None: there was none).
  """
  want = os.environ.get(TEST_KILL_ENV)
  if not want or CheckpointNumber(path) != int(want):
    return
  os.remove(path + '.index')
  ckpt_dir = os.path.dirname(path)
  _, listed, _ = _ReadState(ckpt_dir)
  kept = sorted(n for n in listed if n != CheckpointNumber(path))
  if previous is None or not kept:
    os.remove(os.path.join(ckpt_dir, STATE_FILE))
  else:
    _WriteState(ckpt_dir, kept)
  os.kill(os.getpid(), signal.SIGKILL)
