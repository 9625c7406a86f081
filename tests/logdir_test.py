"""Tests of tensorpipe.logdir: the logdir lock and the params.txt history."""

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

from tensorpipe import logdir as logdir_lib

# A process that takes the lock, says so, and waits to be killed. It loads
# logdir.py alone (importing the tensorpipe package would load TensorFlow).
_HOLDER = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location('logdir', sys.argv[2])
logdir = importlib.util.module_from_spec(spec)
spec.loader.exec_module(logdir)
logdir.LogdirLock(sys.argv[1]).Acquire()
print('locked', flush=True)
time.sleep(120)
"""


def _DeadPid() -> int:
  proc = subprocess.Popen([sys.executable, '-c', 'pass'])
  proc.wait(timeout=60)
  return proc.pid


class LogdirLockTest(unittest.TestCase):

  def setUp(self):
    super().setUp()
    self.logdir = os.path.join(
        tempfile.mkdtemp(dir=os.environ.get('TEST_TMPDIR')), 'run')
    self.addCleanup(shutil.rmtree, os.path.dirname(self.logdir), True)
    self.log = []

  def _Lock(self):
    return logdir_lib.LogdirLock(self.logdir, log_fn=self.log.append)

  def _WriteRecord(self, **record):
    os.makedirs(self.logdir, exist_ok=True)
    with open(os.path.join(self.logdir, logdir_lib.LOCK_FILE), 'w') as f:
      json.dump(record, f)

  def testSecondProcessIsRefusedNamingTheHolderAndAKilledHolderIsStale(self):
    holder = subprocess.Popen(
        [sys.executable, '-c', _HOLDER, self.logdir, logdir_lib.__file__],
        stdout=subprocess.PIPE, text=True)
    try:
      self.assertEqual(holder.stdout.readline().strip(), 'locked')
      with self.assertRaisesRegex(
          logdir_lib.LogdirLockedError,
          rf'logdir .*run is in use: a trainer, PID {holder.pid} on host '
          rf'{socket.gethostname()} since .*; wait for it to finish or stop '
          r'it, or use another --logdir \(evaluation, --mode=eval, needs no '
          r'lock\)'):
        self._Lock().Acquire()
    finally:
      os.kill(holder.pid, signal.SIGKILL)
      holder.wait(timeout=60)
      holder.stdout.close()
    # SIGKILL left the file with the dead holder's record: taken over.
    lock = self._Lock()
    lock.Acquire()
    self.assertTrue(lock.held)
    self.assertEqual(len(self.log), 1, self.log)
    self.assertRegex(self.log[0], rf'taking over a stale lock of PID '
                     rf'{holder.pid} on host {socket.gethostname()}')
    with open(lock.path) as f:
      self.assertEqual(json.load(f)['pid'], os.getpid())
    lock.Release()
    self.assertFalse(os.path.exists(lock.path))

  def testTwoLocksInOneProcessExcludeEachOther(self):
    with self._Lock():
      with self.assertRaisesRegex(logdir_lib.LogdirLockedError,
                                  r'\(this process\)'):
        self._Lock().Acquire()
    with self._Lock() as lock:  # released: free again, without a warning
      self.assertTrue(lock.held)
    self.assertEqual(self.log, [])

  def testLogdirThatCannotBeCreatedRaisesOSError(self):
    parent = os.path.dirname(self.logdir)
    os.makedirs(parent, exist_ok=True)
    a_file = os.path.join(parent, 'a_file')
    with open(a_file, 'w') as f:
      f.write('x')
    below = os.path.join(a_file, 'logdir')
    with self.assertRaisesRegex(
        NotADirectoryError, rf'^logdir {below} is below a file, not a '
        "folder: pass a new folder or a trainer's logdir as --logdir$"):
      logdir_lib.LogdirLock(below).Acquire()
    with self.assertRaisesRegex(
        FileExistsError, rf'^logdir {a_file} is a file, not a folder: pass '
        "a new folder or a trainer's logdir as --logdir$"):
      logdir_lib.LogdirLock(a_file).Acquire()

  def testReadOnlyLogdirIsOneLineWithTheFix(self):
    os.makedirs(self.logdir)
    # What open() raises in a read-only folder (root would write anyway).
    denied = PermissionError(errno.EACCES, 'Permission denied')
    with mock.patch.object(os, 'open', side_effect=denied), \
        self.assertRaisesRegex(
        PermissionError, rf'^logdir {self.logdir} cannot be written '
        r'\(Permission denied\): pass a folder you can write to as '
        rf'--logdir, or make it writable \(chmod u\+w {self.logdir}\)$'):
      logdir_lib.LogdirLock(self.logdir).Acquire()

  def testWithoutFlockTheRecordDecides(self):
    no_flock = OSError(errno.ENOLCK, 'No locks available')
    sleeper = subprocess.Popen([sys.executable, '-c',
                                'import time; time.sleep(120)'])
    self.addCleanup(sleeper.wait, 60)
    self.addCleanup(os.kill, sleeper.pid, signal.SIGKILL)
    host = socket.gethostname()
    start = logdir_lib._ProcessStartTime(sleeper.pid)
    with mock.patch.object(logdir_lib.fcntl, 'flock', side_effect=no_flock):
      # A live process on this host holds it.
      self._WriteRecord(pid=sleeper.pid, host=host, start_time=start)
      with self.assertRaisesRegex(logdir_lib.LogdirLockedError,
                                  f'PID {sleeper.pid} on host {host}'):
        self._Lock().Acquire()
      # Another host: cannot be checked, so respected, with the way out.
      self._WriteRecord(pid=sleeper.pid, host='elsewhere', start_time=start)
      with self.assertRaisesRegex(logdir_lib.LogdirLockedError,
                                  'on host elsewhere.*if it does not, delete '
                                  '.*trainer.lock'):
        self._Lock().Acquire()
      # The PID now belongs to a process started later: stale.
      self._WriteRecord(pid=sleeper.pid, host=host,
                        start_time=(start or 0) + 1)
      with self._Lock() as lock:
        self.assertTrue(lock.held)
      # A dead PID: stale.
      dead = _DeadPid()
      self._WriteRecord(pid=dead, host=host, start_time=None)
      with self._Lock() as lock:
        self.assertTrue(lock.held)
    self.assertEqual(len(self.log), 2, self.log)
    self.assertIn(f'stale lock of PID {dead}', self.log[1])


class ParamsHistoryTest(unittest.TestCase):

  def setUp(self):
    super().setUp()
    self.logdir = tempfile.mkdtemp(dir=os.environ.get('TEST_TMPDIR'))
    self.addCleanup(shutil.rmtree, self.logdir, True)
    self.log = []

  def _Files(self):
    return sorted(f for f in os.listdir(self.logdir) if f.startswith('params'))

  def _Read(self, name):
    with open(os.path.join(self.logdir, name)) as f:
      return f.read()

  def testHistoryKeepsEachChangedConfigOnce(self):
    v1 = "name : 'Exp'\ntask.lr : 0.1\ntask.steps : 10\n"
    v2 = "name : 'Exp'\ntask.lr : 0.5\ntask.steps : 10\ntask.new : 1\n"
    v3 = "name : 'Exp'\ntask.lr : 0.7\ntask.steps : 10\ntask.new : 1\n"
    self.assertIsNone(logdir_lib.WriteParams(self.logdir, v1, 0,
                                             self.log.append))
    self.assertIsNone(logdir_lib.WriteParams(self.logdir, v1, 20,
                                             self.log.append))
    self.assertEqual(self._Files(), ['params.txt'])
    self.assertEqual(self.log, [])
    diff = logdir_lib.WriteParams(self.logdir, v2, 20, self.log.append)
    self.assertEqual(diff.splitlines(), ['  task.lr: 0.1 -> 0.5',
                                         '  task.new: (absent) -> 1'])
    self.assertEqual(self._Files(), ['params.20.txt', 'params.txt'])
    self.assertEqual(self._Read('params.20.txt'), v1)
    self.assertEqual(self._Read('params.txt'), v2)
    self.assertIn('kept as params.20.txt', self.log[0])
    self.assertIn('task.lr: 0.1 -> 0.5', self.log[0])
    # Changed again at the same step: v2 trained nothing after step 20, so
    # params.20.txt keeps v1, the config that trained up to 20.
    logdir_lib.WriteParams(self.logdir, v3, 20, self.log.append)
    self.assertEqual(self._Read('params.20.txt'), v1)
    self.assertEqual(self._Read('params.txt'), v3)

  def testLargerMaxStepsIsNoChangeOfHyperParameters(self):
    # A finished run extended with a larger --max_steps, twice.
    v1 = "name : 'Exp'\ntask.lr : 0.1\ntask.train.max_steps : 20\n"
    v2 = v1.replace('max_steps : 20', 'max_steps : 40')
    v3 = v1.replace('max_steps : 20', 'max_steps : 60')
    logdir_lib.WriteParams(self.logdir, v1, 0, self.log.append)
    self.assertIsNone(logdir_lib.WriteParams(self.logdir, v2, 20,
                                             self.log.append))
    self.assertIsNone(logdir_lib.WriteParams(self.logdir, v3, 40,
                                             self.log.append))
    self.assertEqual(self.log, [])
    self.assertEqual(self._Files(), ['params.txt'])
    self.assertEqual(self._Read('params.txt'), v3)  # the run as it is now

  def testMaxStepsIsLeftOutOfARealChangesDiff(self):
    v1 = "name : 'Exp'\ntask.lr : 0.1\ntask.train.max_steps : 20\n"
    v2 = "name : 'Exp'\ntask.lr : 0.5\ntask.train.max_steps : 40\n"
    logdir_lib.WriteParams(self.logdir, v1, 0, self.log.append)
    diff = logdir_lib.WriteParams(self.logdir, v2, 20, self.log.append)
    self.assertEqual(diff.splitlines(), ['  task.lr: 0.1 -> 0.5'])
    self.assertEqual(self._Files(), ['params.20.txt', 'params.txt'])
    self.assertEqual(self._Read('params.20.txt'), v1)
    self.assertEqual(len(self.log), 1)
    # Only the last component names a run-length key.
    self.assertIn('  task.max_steps_x: 1 -> 2', logdir_lib.ParamsDiff(
        'task.max_steps_x : 1\n', 'task.max_steps_x : 2\n',
        ignore_run_length=True))
    self.assertIn('max_steps: 20 -> 40', logdir_lib.ParamsDiff(v1, v2))

  def testChangedCsvScheduleIsLoggedInOneShortLine(self):
    """A resume whose CSV schedule file changed: the trainer records the
    table (overrides.RecordCsvSchedules), so the change is logged and the
    former params kept; the line tells the tables apart without pasting
    them."""
    row = ','.join(f'0F{t}' for t in range(40))
    v1 = f"name : 'Exp'\ntask.model.schedule : 'csv:{row}/{row}'\n"
    v2 = v1.replace('0F39', '0F38')
    logdir_lib.WriteParams(self.logdir, v1, 0, self.log.append)
    diff = logdir_lib.WriteParams(self.logdir, v2, 20, self.log.append)
    self.assertEqual(self._Files(), ['params.20.txt', 'params.txt'])
    (line,) = diff.splitlines()
    self.assertRegex(line, r"^  task.model.schedule: 'csv:0F0,0F1,.*\.\.\. "
                     r'\(\d+ characters, sha256 (\w{8})\) -> .* sha256 '
                     r'(?!\1)\w{8}\)$')
    self.assertLess(len(line), 200)
    self.assertIn(line, self.log[0])

  def testRunDescriptionNamesTheKeysThatChangeTheVariables(self):
    """What a checkpoint that does not fit is said to be: the run's name
    and the differing task keys, not the input, run length or schedule
    (an optimizer's keys do change the slots)."""
    self.assertEqual(logdir_lib.RunDescription(self.logdir, 'name : 1\n'),
                     'a run of another model (no params.txt)')
    old = ("name : 'Exp'\ninput.batch_size : 8\ntask.dim : 4\n"
           'task.train.max_steps : 10\ntask.train.optimizer.beta : 0.9\n')
    logdir_lib.WriteParams(self.logdir, old, 0, self.log.append)
    new = (old.replace('8', '16').replace(': 4', ': 5')
           .replace('10', '20').replace('0.9', '0.8') + 'task.extra : 1\n')
    self.assertEqual(
        logdir_lib.ChangedKeys(old, new),
        ['input.batch_size', 'task.dim', 'task.extra',
         'task.train.max_steps', 'task.train.optimizer.beta'])
    self.assertNotIn('task.train.max_steps',
                     logdir_lib.ChangedKeys(old, new, ignore_run_length=True))
    self.assertEqual(
        logdir_lib.RunDescription(self.logdir, new),
        "a run of Exp whose params.txt differs from these Params in "
        'task.dim, task.extra, task.train.optimizer.beta')
    many = ''.join(f'task.k{i} : {i}\n' for i in range(7))
    self.assertTrue(logdir_lib.RunDescription(self.logdir, old + many)
                    .endswith('task.k3, task.k4 and 2 more'))

  def testReadExperimentName(self):
    self.assertIsNone(logdir_lib.ReadExperimentName(self.logdir))
    logdir_lib.WriteParams(self.logdir, "input.x : 1\nname : 'Consistency16'"
                           '\n', 0, self.log.append)
    self.assertEqual(logdir_lib.ReadExperimentName(self.logdir),
                     'Consistency16')


if __name__ == '__main__':
  unittest.main()
