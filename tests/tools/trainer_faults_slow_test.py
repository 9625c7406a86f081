"""Fault tests of the trainer binary (subprocesses; slow).

- SIGKILL at random points (during startup and tracing, between steps, and
  while a checkpoint is being written), at least 10 kills, then a resume:
  the final checkpoint equals that of an uninterrupted run bit for bit.
- A damaged newest checkpoint and a garbage state file: the run resumes from
  the newest intact checkpoint (named in a warning) and still ends with the
  uninterrupted run's weights.
- Two trainers on one logdir: the second stops at once naming the first's
  PID and host; an evaluation alongside is allowed.

Every subprocess runs under a timeout and is ended by its PID; logdirs live in
a fresh tempfile.mkdtemp() folder removed afterwards. The kill schedule comes
from a seeded random generator (TENSORPIPE_FAULT_SEED, default 14).
"""

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np
import tensorflow as tf

from tests.tools import tool_testlib

_REPO = tool_testlib.ROOT
_MODEL = 'consistency.Consistency16'
_TIMEOUT_S = 600


def _TrainerCmd(logdir, max_steps, *extra):
  return [sys.executable, '-m', 'tools.trainer', f'--model={_MODEL}',
          f'--logdir={logdir}', '--mode=train', f'--max_steps={max_steps}',
          '--model_params_override=task.train.save_interval_steps=2; '
          'task.train.log_interval_steps=1; '
          'task.train.summary_interval_steps=1000; '
          'task.train.max_checkpoints_to_keep=3', *extra]


class _Trainer:
  """A trainer subprocess, stderr to a file; always ended by its PID."""

  def __init__(self, cmd, log_path):
    self.log_path = log_path
    self._log = open(log_path, 'w')
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(
        p for p in (_REPO, env.get('PYTHONPATH')) if p)
    self.proc = subprocess.Popen(cmd, cwd=_REPO, stdout=self._log,
                                 stderr=subprocess.STDOUT, env=env)
    self.started = time.time()

  @property
  def pid(self):
    return self.proc.pid

  def Running(self):
    return self.proc.poll() is None

  def Log(self):
    with open(self.log_path) as f:
      return f.read()

  def WaitFor(self, pattern, timeout=_TIMEOUT_S):
    """Waits until the log matches `pattern`; False if the process ended."""
    deadline = time.time() + timeout
    while time.time() < deadline:
      if re.search(pattern, self.Log(), re.M):
        return True
      if not self.Running():
        return bool(re.search(pattern, self.Log(), re.M))
      time.sleep(0.02)
    raise AssertionError(f'timeout waiting for {pattern!r}:\n'
                         f'{self.Log()[-3000:]}')

  def Kill(self):
    if self.Running():
      os.kill(self.proc.pid, signal.SIGKILL)
    self.proc.wait(timeout=60)
    self._log.close()

  def Wait(self, timeout=_TIMEOUT_S):
    try:
      rc = self.proc.wait(timeout=timeout)
    finally:
      self.Kill()
    return rc


def _Tensors(logdir):
  """Every saved value but the input iterator's state, by checkpoint key."""
  prefix = tf.train.latest_checkpoint(os.path.join(logdir, 'checkpoints'))
  reader = tf.train.load_checkpoint(prefix)
  return prefix, {
      k: reader.get_tensor(k)
      for k, dtype in reader.get_variable_to_dtype_map().items()
      if dtype != tf.variant and k != '_CHECKPOINTABLE_OBJECT_GRAPH' and
      not k.startswith('save_counter')}


def _InterruptedSave(ckpt_dir):
  """Evidence that a kill hit a checkpoint write: a temp folder left, or
  an index newer than the state file's latest."""
  names = os.listdir(ckpt_dir)
  if any(n.endswith('_temp') for n in names):
    return True
  done = [int(m.group(1)) for m in (re.match(r'ckpt-(\d+)\.index$', n)
                                     for n in names) if m]
  latest = tf.train.latest_checkpoint(ckpt_dir)
  listed = int(latest.rsplit('-', 1)[1]) if latest else -1
  return bool(done) and max(done) > listed


class TrainerFaultsTest(unittest.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = tempfile.mkdtemp(prefix='trainer_faults_',
                                dir=os.environ.get('TEST_TMPDIR'))
    self.addCleanup(shutil.rmtree, self.tmp, True)
    self.procs = []
    self.addCleanup(self._KillAll)

  def _KillAll(self):
    for p in self.procs:
      p.Kill()

  def _Start(self, cmd, name):
    p = _Trainer(cmd, os.path.join(self.tmp, f'{name}.log'))
    self.procs.append(p)
    return p

  def _Run(self, cmd, name, rc=0):
    p = self._Start(cmd, name)
    got = p.Wait()
    self.assertEqual(got, rc, p.Log()[-3000:])
    self.assertNotIn('Traceback', p.Log())
    return p.Log()

  def _AssertSameFinalCheckpoint(self, want_logdir, got_logdir):
    want_prefix, want = _Tensors(want_logdir)
    got_prefix, got = _Tensors(got_logdir)
    self.assertEqual(os.path.basename(got_prefix),
                     os.path.basename(want_prefix))
    self.assertEqual(sorted(got), sorted(want))
    self.assertTrue(any(k.startswith('optimizer/') for k in want), want)
    for key in want:
      np.testing.assert_array_equal(got[key], want[key], err_msg=key)

  def testSigkillAtRandomPointsThenResumeIsBitwiseEqual(self):
    max_steps = 80
    seed = int(os.environ.get('TENSORPIPE_FAULT_SEED', '14'))
    rng = random.Random(seed)
    full = os.path.join(self.tmp, 'full')
    self._Run(_TrainerCmd(full, max_steps), 'full')
    logdir = os.path.join(self.tmp, 'killed')
    ckpt_dir = os.path.join(logdir, 'checkpoints')
    # startup: while restoring / tracing; step: between steps; save: while
    # a checkpoint is written (its ckpt-N_temp folder exists).
    plan = ['save', 'step', 'save', 'startup', 'save', 'step', 'save',
            'step', 'save', 'startup', 'save', 'step']
    kills, interrupted_saves, i = [], 0, 0
    deadline = time.time() + 2400
    while (len(kills) < 10 or interrupted_saves < 3) and time.time() < deadline:
      mode = plan[i % len(plan)]
      i += 1
      p = self._Start(_TrainerCmd(logdir, max_steps), f'run{i}')
      if kills:
        # The killed trainer left its lock file: taken over as stale.
        p.WaitFor(r'taking over a stale lock of PID \d+')
      if mode == 'startup':
        if not p.WaitFor(r'training \S+ from step'):
          break
        time.sleep(rng.uniform(0.0, 3.0))  # while tracing the step
      else:
        if not p.WaitFor(r'step \d+: loss .*first step'):
          break
        if mode == 'step':
          time.sleep(rng.uniform(0.0, 0.6))
        else:
          seen = False
          end = time.time() + 60
          while not seen and p.Running() and time.time() < end:
            seen = os.path.isdir(ckpt_dir) and any(
                n.endswith('_temp') for n in os.listdir(ckpt_dir))
            time.sleep(0.0005)
      if not p.Running():
        break  # finished before the kill: the campaign ran out of steps
      os.kill(p.pid, signal.SIGKILL)
      p.proc.wait(timeout=60)
      latest = tf.train.latest_checkpoint(ckpt_dir)
      hit_save = _InterruptedSave(ckpt_dir) if os.path.isdir(ckpt_dir) else (
          False)
      interrupted_saves += hit_save
      kills.append((mode, latest and os.path.basename(latest), hit_save))
    summary = ', '.join(f'{m}@{c}{"(in save)" if h else ""}'
                        for m, c, h in kills)
    print(f'seed {seed}: {len(kills)} SIGKILLs, {interrupted_saves} during '
          f'a checkpoint write: {summary}')
    self.assertGreaterEqual(len(kills), 10, summary)
    self.assertGreaterEqual(interrupted_saves, 3, summary)
    log = self._Run(_TrainerCmd(logdir, max_steps), 'final')
    self.assertRegex(log, r'restored .*ckpt-\d+ at step \d+')
    self.assertFalse([n for n in os.listdir(ckpt_dir) if n.endswith('_temp')])
    self._AssertSameFinalCheckpoint(full, logdir)

  def testDamagedNewestCheckpointAndStateFileFallBack(self):
    full = os.path.join(self.tmp, 'full')
    self._Run(_TrainerCmd(full, 14), 'full')
    logdir = os.path.join(self.tmp, 'damaged')
    ckpt_dir = os.path.join(logdir, 'checkpoints')
    self._Run(_TrainerCmd(logdir, 10), 'to10')
    data = os.path.join(ckpt_dir, 'ckpt-10.data-00000-of-00001')
    with open(data, 'r+b') as f:
      f.truncate(os.path.getsize(data) // 2)
    log = self._Run(_TrainerCmd(logdir, 12), 'to12')
    self.assertIn(f'skipping checkpoint {ckpt_dir}/ckpt-10: reading its data '
                  f'file {data} failed', log)
    self.assertRegex(log, r'restored .*ckpt-8 at step 8')
    with open(os.path.join(ckpt_dir, 'checkpoint'), 'w') as f:
      f.write('garbage {{ not a checkpoint state')
    log = self._Run(_TrainerCmd(logdir, 14), 'to14')
    self.assertRegex(log, r'checkpoint state file .*checkpoint is damaged')
    self.assertRegex(log, r'restored .*ckpt-12 at step 12')
    self._AssertSameFinalCheckpoint(full, logdir)

  def testSecondTrainerOnTheSameLogdirRefusesAtOnce(self):
    logdir = os.path.join(self.tmp, 'shared')
    # Long enough to outlive the other two runs; killed at the end.
    first = self._Start(_TrainerCmd(logdir, 10**6), 'first')
    first.WaitFor(r'saved .*ckpt-2\b')
    with open(os.path.join(logdir, 'params.txt')) as f:
      params = f.read()
    started = time.time()
    second = self._Start(
        _TrainerCmd(logdir, 10**6, '--seed=99', '--model_params_override='
                    'task.train.lr_schedule.value=0.01'), 'second')
    self.assertEqual(second.Wait(), 2, second.Log()[-3000:])
    log = second.Log()
    self.assertNotIn('Traceback', log)
    errors = [line for line in log.splitlines()
              if line.startswith('trainer: error:')]
    self.assertEqual(len(errors), 1, log[-3000:])
    self.assertRegex(
        errors[0], rf'LogdirLockedError: logdir {re.escape(logdir)} is in '
        rf'use: a trainer, PID {first.pid} on host '
        rf'{re.escape(socket.gethostname())}')
    self.assertNotIn('first step', log)  # it stopped before any step
    # An evaluation alongside needs no lock.
    reader = self._Start(
        [sys.executable, '-m', 'tools.trainer', f'--model={_MODEL}',
         f'--logdir={logdir}', '--mode=eval', '--eval_steps=2'], 'eval')
    self.assertEqual(reader.Wait(), 0, reader.Log()[-3000:])
    self.assertIn('final eval:', reader.Log())
    self.assertTrue(first.Running(), first.Log()[-3000:])
    first.Kill()
    with open(os.path.join(logdir, 'params.txt')) as f:
      self.assertEqual(f.read(), params)
    self.assertFalse([f for f in os.listdir(logdir)
                      if re.match(r'params\.\d+\.txt', f)])
    print(f'second trainer refused after {time.time() - started:.1f} s')


if __name__ == '__main__':
  unittest.main()
