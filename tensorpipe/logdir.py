"""A training run's logdir: one writer at a time, and a record of its Params.

What a logdir holds:

  trainer.lock      while a trainer trains in it: its PID, host and start time
  params.txt        the Params of the run now training (written only once the
                    checkpoint restore is known to fit them)
  params.<S>.txt    the Params that trained the steps up to S, kept when a run
                    resumed at step S with changed hyper-parameters
  checkpoints/      tf.train.Checkpoint files (see tensorpipe/checkpoints.py)
  train/, eval/     TensorBoard summaries; eval_metrics.json

The lock (`LogdirLock`) keeps a second trainer from writing its checkpoints and
params.txt over a running one; readers (evaluation) take no lock. The holder
keeps an exclusive `fcntl.flock` on the lock file, which the kernel drops when
the process ends however it ends (SIGKILL included), so a lock file left by a
dead trainer is found unlocked and taken over with a warning. Where the file
system has no flock (some network file systems) the record in the file
decides: a holder on this host whose PID no longer runs (or now belongs to a
process started later) is stale; a holder on another host is respected.

In a multi-worker run only the chief takes the lock and writes params.txt
(`trainer_lib.Trainer(..., is_chief=False)` on the other workers).
"""

import errno
import fcntl
import hashlib
import json
import os
import socket
import time
from typing import Callable, Dict, List, Optional

from absl import logging

from tensorpipe import params_format

LOCK_FILE = 'trainer.lock'
PARAMS_FILE = 'params.txt'

# flock errors that mean "this file system cannot lock", not "it is locked".
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class LogdirLockedError(RuntimeError):
  """Another live trainer holds the logdir's lock."""


def _Unusable(logdir: str, e: OSError) -> OSError:
  """`e` (same class) as one line naming the logdir and the fix."""
  if isinstance(e, (FileExistsError, NotADirectoryError)):
    what = ('is a file, not a folder' if os.path.isfile(logdir) else
            'is below a file, not a folder')
    fix = 'pass a new folder or a trainer\'s logdir as --logdir'
  elif isinstance(e, PermissionError):
    what = f'cannot be written ({e.strerror})'
    fix = ('pass a folder you can write to as --logdir, or make it '
           f'writable (chmod u+w {logdir})')
  else:
    what = f'cannot be used ({e.strerror or e})'
    fix = 'pass another --logdir'
  return type(e)(f'logdir {logdir} {what}: {fix}')


def _ProcessStartTime(pid: int) -> Optional[int]:
  """Start time of `pid` in clock ticks since boot (Linux), else None."""
  try:
    with open(f'/proc/{pid}/stat', 'rb') as f:
      stat = f.read().decode('ascii', 'replace')
  except OSError:
    return None
  # Field 2 (comm) is in parentheses and may hold spaces: split after it.
  fields = stat[stat.rfind(')') + 2:].split()
  try:
    return int(fields[19])  # field 22 of stat(5); fields[0] is field 3
  except (IndexError, ValueError):
    return None


def _PidRuns(pid: int, start_time: Optional[int]) -> bool:
  """True if process `pid` exists and, when known, started at `start_time`."""
  if not isinstance(pid, int) or pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass  # exists, owned by another user
  if start_time is not None:
    now = _ProcessStartTime(pid)
    if now is not None and now != start_time:
      return False  # the PID was reused by a later process
  return True


def _Describe(record: Dict) -> str:
  pid, host = record.get('pid', '?'), record.get('host', '?')
  since = record.get('time')
  when = (time.strftime(' since %Y-%m-%d %H:%M:%S', time.localtime(since))
          if isinstance(since, (int, float)) else '')
  return f'PID {pid} on host {host}{when}'


class LogdirLock:
  """Exclusive lock of a logdir for the one process that trains in it.

  Usage:
    lock = LogdirLock(logdir)
    lock.Acquire()   # LogdirLockedError names the holder's PID and host
    ...              # train: write checkpoints and params.txt
    lock.Release()   # also on exit: the kernel drops the flock
  or `with LogdirLock(logdir): ...`.

  Acquire creates the logdir if needed (an OSError such as NotADirectoryError
  or PermissionError if it cannot). Two LogdirLocks on one logdir exclude each
  other even in one process.
  """

  def __init__(self, logdir: str,
               log_fn: Optional[Callable[[str], None]] = None):
    self._logdir = logdir
    self._path = os.path.join(logdir, LOCK_FILE)
    self._log = log_fn or logging.warning
    self._fd = None

  @property
  def path(self) -> str:
    return self._path

  @property
  def held(self) -> bool:
    return self._fd is not None

  def __enter__(self) -> 'LogdirLock':
    self.Acquire()
    return self

  def __exit__(self, *unused_exc) -> None:
    self.Release()

  def _Record(self) -> Dict:
    pid = os.getpid()
    return dict(pid=pid, host=socket.gethostname(),
                start_time=_ProcessStartTime(pid), time=time.time())

  @staticmethod
  def _ReadRecord(fd: int) -> Dict:
    try:
      data = os.pread(fd, 4096, 0)
      record = json.loads(data.decode('utf-8')) if data else {}
    except (OSError, ValueError):
      return {}
    return record if isinstance(record, dict) else {}

  def Acquire(self) -> None:
    """Takes the lock or raises LogdirLockedError naming the holder.

    Raises:
      LogdirLockedError: a live process holds the lock.
      OSError: the logdir cannot be created or written.
    """
    if self._fd is not None:
      return
    try:
      os.makedirs(self._logdir, exist_ok=True)
    except OSError as e:
      raise _Unusable(self._logdir, e) from None
    for _ in range(10):
      try:
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
      except OSError as e:
        raise _Unusable(self._logdir, e) from None
      try:
        previous = self._Lock(fd)
        # The file may have been unlinked by a holder releasing it between
        # our open and our flock: then the lock we hold is on a dead inode.
        try:
          same = os.fstat(fd).st_ino == os.stat(self._path).st_ino
        except FileNotFoundError:
          same = False
        if not same:
          os.close(fd)
          continue
      except BaseException:
        os.close(fd)
        raise
      if previous.get('pid') is not None:
        self._log(f'{self._path}: taking over a stale lock of '
                  f'{_Describe(previous)}, which no longer runs (a trainer '
                  'that was killed)')
      data = json.dumps(self._Record()).encode('utf-8')
      os.ftruncate(fd, 0)
      os.pwrite(fd, data, 0)
      os.fsync(fd)
      self._fd = fd
      return
    raise LogdirLockedError(f'{self._path}: could not take the lock (it kept '
                            'being replaced); is another trainer starting in '
                            f'{self._logdir}?')

  def _Lock(self, fd: int) -> Dict:
    """Locks fd; returns the record found in the file (stale or empty)."""
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      record = self._ReadRecord(fd)
      if not record:  # the holder is writing it: read again shortly
        time.sleep(0.2)
        record = self._ReadRecord(fd)
      raise LogdirLockedError(self._HeldMessage(record)) from None
    except OSError as e:
      if e.errno not in _NO_FLOCK:
        raise
      return self._LockByRecord(fd)
    return self._ReadRecord(fd)

  def _LockByRecord(self, fd: int) -> Dict:
    """No flock here: the record alone decides whether the lock is held."""
    record = self._ReadRecord(fd)
    if not record.get('pid'):
      return record
    if record.get('host') != socket.gethostname():
      raise LogdirLockedError(
          self._HeldMessage(record) + '; this file system cannot tell if '
          f'that process still runs: if it does not, delete {self._path}')
    if record['pid'] == os.getpid() or _PidRuns(record['pid'],
                                                 record.get('start_time')):
      raise LogdirLockedError(self._HeldMessage(record))
    return record

  def _HeldMessage(self, record: Dict) -> str:
    holder = _Describe(record) if record else 'another process'
    this = ' (this process)' if record.get('pid') == os.getpid() and (
        record.get('host') == socket.gethostname()) else ''
    return (f'logdir {self._logdir} is in use: a trainer, {holder}{this}, '
            f'holds {self._path}; wait for it to finish or stop it, or use '
            'another --logdir (evaluation, --mode=eval, needs no lock)')

  def Release(self) -> None:
    """Releases the lock (and removes the lock file)."""
    if self._fd is None:
      return
    fd, self._fd = self._fd, None
    try:
      os.ftruncate(fd, 0)  # no stale record, even if the unlink fails
      os.unlink(self._path)
    except OSError:
      pass
    os.close(fd)


# Params keys (last dotted component) that say how long a run goes on, not
# what it trains: extending a finished run with a larger --max_steps is the
# same run, so WriteParams neither logs them as a change nor keeps a history
# file for them. (Workers of one run still compare them.)
RUN_LENGTH_KEYS = frozenset(['max_steps'])


def _IsRunLength(key: str) -> bool:
  return key.rpartition('.')[2] in RUN_LENGTH_KEYS


def _WithoutRunLength(text: str) -> str:
  """`text` without its RUN_LENGTH_KEYS lines."""

  def RunLength(line: str) -> bool:
    item = params_format.ParseTextLine(line)
    return item is not None and _IsRunLength(item[0])

  return '\n'.join(line for line in text.splitlines() if not RunLength(line))


def _Values(text: str) -> Dict[str, str]:
  """{key: value text} of params.txt (lines of another form skipped: the
  file may have been edited, and is read here only for messages)."""
  return params_format.TextValues(text, skip_malformed=True)


def ChangedKeys(old_text: str, new_text: str,
                ignore_run_length: bool = False) -> List[str]:
  """The keys whose value differs (or that one text lacks), sorted.

  With ignore_run_length, RUN_LENGTH_KEYS (max_steps) are left out.
  """
  old, new = _Values(old_text), _Values(new_text)
  return [key for key in sorted(set(old) | set(new))
          if old.get(key) != new.get(key) and
          not (ignore_run_length and _IsRunLength(key))]


def ParamsDiff(old_text: str, new_text: str,
               ignore_run_length: bool = False) -> str:
  """'key: old -> new' lines (one per changed, added or removed key).

  With ignore_run_length, RUN_LENGTH_KEYS (max_steps) are left out.
  """
  old, new = _Values(old_text), _Values(new_text)
  return '\n'.join(
      f'  {key}: {_Short(old.get(key, "(absent)"))} -> '
      f'{_Short(new.get(key, "(absent)"))}'
      for key in ChangedKeys(old_text, new_text, ignore_run_length))


def _Short(value: str, limit: int = 80) -> str:
  """A value as it reads in a diff line; a long one (a CSV schedule's table)
  cut, with its length and a digest that tells two tables apart."""
  if len(value) <= limit:
    return value
  digest = hashlib.sha256(value.encode('utf-8')).hexdigest()[:8]
  return f'{value[:40]}... ({len(value)} characters, sha256 {digest})'


def _AtomicWrite(path: str, text: str) -> None:
  tmp = f'{path}.tmp{os.getpid()}'
  with open(tmp, 'w') as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def HistoryFile(step: int) -> str:
  """Name of the file that keeps the Params that trained up to `step`."""
  return f'params.{step}.txt'


def WriteParams(logdir: str, text: str, step: int,
                log_fn: Callable[[str], None]) -> Optional[str]:
  """Writes params.txt; keeps a changed predecessor as params.<step>.txt.

  Call once the restored checkpoint (at `step`; 0 for a new run) is known to
  fit these Params. A change of the run's length only (RUN_LENGTH_KEYS:
  max_steps, e.g. a finished run extended with a larger --max_steps) is no
  change of hyper-parameters: params.txt is updated, nothing is logged and
  no history file is kept.

  Args:
    logdir: the run's logdir.
    text: `Params.ToText()` of the run starting now.
    step: the step it starts (resumes) at.
    log_fn: where the diff of a change is logged.

  Returns:
    The diff lines when the Params changed (beyond max_steps), else None.
  """
  path = os.path.join(logdir, PARAMS_FILE)
  try:
    with open(path) as f:
      old = f.read()
  except FileNotFoundError:
    old = None
  diff = None
  if old is not None and _WithoutRunLength(old) != _WithoutRunLength(text):
    diff = ParamsDiff(old, text, ignore_run_length=True)
    history = os.path.join(logdir, HistoryFile(step))
    # An existing params.<step>.txt trained the steps up to `step`; the
    # params.txt now replaced trained none after it: keep the former.
    if not os.path.exists(history):
      _AtomicWrite(history, old)
    log_fn(f'the hyper-parameters differ from those of the run in {logdir} '
           f'(kept as {HistoryFile(step)}), resuming at step {step}:\n'
           f'{diff or "  (formatting only)"}')
  if old != text:
    _AtomicWrite(path, text)
  return diff


def ReadExperimentName(logdir: str) -> Optional[str]:
  """The `name` line of the logdir's params.txt, or None."""
  try:
    with open(os.path.join(logdir, PARAMS_FILE)) as f:
      fields = _Values(f.read())
  except (OSError, UnicodeDecodeError):
    return None
  name = fields.get('name')
  if name and len(name) >= 2 and name[0] == name[-1] and name[0] in '\'"':
    name = name[1:-1]
  return name or None


def RunDescription(logdir: str, params_text: str) -> str:
  """'a run of X ...': what the logdir holds, for the error of a checkpoint
  that does not fit the Params `params_text` (checkpoints.RestoreNewest).

  Names the keys of params.txt that differ and can change the variables:
  not the input, the run length or the schedule (an optimizer change does
  change the slots).
  """
  name = ReadExperimentName(logdir)
  text = 'a run of ' + (name or 'another model (no params.txt)')
  try:
    with open(os.path.join(logdir, PARAMS_FILE)) as f:
      keys = ChangedKeys(f.read(), params_text)
  except OSError:
    keys = []
  keys = [key for key in keys if key.startswith('task.') and (
      not key.startswith('task.train.') or
      key.startswith('task.train.optimizer.'))]
  if keys:
    more = f' and {len(keys) - 5} more' if len(keys) > 5 else ''
    text += (f' whose params.txt differs from these Params in '
             f'{", ".join(keys[:5])}{more}')
  return text
