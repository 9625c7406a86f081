"""Stops and start-up faults of multi-worker runs (slow tier only).

- SIGTERM to tools/launch mid-run: both workers stop after the same step,
  the chief saves it, everything exits 143, and a relaunch ends bitwise
  equal to an uninterrupted 2-worker run. SIGTERM to one of two workers
  started on their own with TF_CONFIG stops both at one step.
- Ctrl-C (SIGINT) to a single-process run: it saves the step reached,
  exits 130 with one line, and the resume ends bitwise equal to an
  uninterrupted run.
- Workers started with different --max_steps stop before step 1, each with
  one line naming task.train.max_steps.
- A lone worker with a 20 s wait ends with one line in under 30 s; SIGTERM
  while it waits ends it within 5 s.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

from tensorpipe import peer_wait
from tests.tools import tool_testlib
from tools import launch

_MODEL = 'consistency.Consistency16'
_STEPS = 30


def _Flags(logdir, *extra):
  return [f'--model={_MODEL}', f'--logdir={logdir}', '--mode=train',
          f'--max_steps={_STEPS}',
          '--model_params_override=task.model.num_partitions=2; '
          'task.model.num_micro_batches=4; task.train.save_interval_steps=4; '
          'task.train.log_interval_steps=1', *extra]


def _Accepts(port):
  return peer_wait.Accepts(f'127.0.0.1:{port}')


class PreemptionSlowTest(unittest.TestCase):

  def setUp(self):
    self.tmp = tempfile.mkdtemp(prefix='preemption_slow_')
    self.addCleanup(shutil.rmtree, self.tmp, True)

  def _Popen(self, cmd, log, **kwargs):
    out = open(log, 'w')
    self.addCleanup(out.close)
    proc = subprocess.Popen(cmd, cwd=tool_testlib.ROOT, stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            **kwargs)

    def End():
      if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
      proc.wait(timeout=30)
    self.addCleanup(End)
    return proc

  def _WaitFor(self, log, pattern, proc, timeout_s=300):
    deadline = time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None:
      with open(log) as f:
        if re.search(pattern, f.read()):
          return True
      time.sleep(0.01)
    return False

  def testSigtermToLaunchStopsBothWorkersAtOneStepAndResumesExactly(self):
    full = os.path.join(self.tmp, 'full')
    run = tool_testlib.RunTool('launch', '--num_workers=2', '--',
                               *_Flags(full), timeout_s=300)
    self.assertEqual(run.returncode, 0, run.stdout[-3000:])
    logdir = os.path.join(self.tmp, 'stopped')
    log = os.path.join(self.tmp, 'launch.log')
    proc = self._Popen([sys.executable, '-m', 'tools.launch',
                        '--num_workers=2', '--', *_Flags(logdir)], log)
    self.assertTrue(self._WaitFor(log, r'\[worker 0\].*step 3/', proc))
    proc.send_signal(signal.SIGTERM)
    t0 = time.time()
    proc.wait(timeout=120)
    print(f'2 workers: SIGTERM to exit {time.time() - t0:.2f} s',
          file=sys.stderr)
    with open(log) as f:
      text = f.read()
    self.assertEqual(proc.returncode, 143, text[-3000:])
    self.assertNotIn('SIGKILL', text)
    steps = {r: re.findall(rf'\[worker {r}\] trainer: stopped by SIGTERM at '
                           r'step (\d+);', text) for r in (0, 1)}
    self.assertEqual(len(steps[0]), 1, text[-3000:])
    self.assertEqual(steps[0], steps[1])
    step = int(steps[0][0])
    self.assertLess(step, _STEPS)
    self.assertIn(f'saved ckpt-{step}; run the same command', text)
    run = tool_testlib.RunTool('launch', '--num_workers=2', '--',
                               *_Flags(logdir), timeout_s=300)
    self.assertEqual(run.returncode, 0, run.stdout[-3000:])
    self.assertIn(f'at step {step}', run.stdout)
    want = tool_testlib.CheckpointTensors(full)
    got = tool_testlib.CheckpointTensors(logdir)
    self.assertEqual(sorted(got), sorted(want))
    for name, value in want.items():
      np.testing.assert_array_equal(got[name], value, err_msg=name)

  def testCtrlCStopsASingleProcessRunAndTheResumeIsExact(self):
    flags = _Flags(os.path.join(self.tmp, 'full1'), '--num_replicas=1')
    run = tool_testlib.RunTool('trainer', *flags, timeout_s=300)
    self.assertEqual(run.returncode, 0, run.stderr[-3000:])
    logdir = os.path.join(self.tmp, 'interrupted')
    log = os.path.join(self.tmp, 'interrupted.log')
    proc = self._Popen([sys.executable, '-m', 'tools.trainer',
                        *_Flags(logdir, '--num_replicas=1')], log)
    self.assertTrue(self._WaitFor(log, r'step 3/', proc))
    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
    t0 = time.time()
    proc.wait(timeout=60)
    print(f'1 process: SIGINT to exit {time.time() - t0:.2f} s',
          file=sys.stderr)
    with open(log) as f:
      text = f.read()
    self.assertEqual(proc.returncode, 130, text[-3000:])
    self.assertNotIn('Traceback', text)
    self.assertNotIn('KeyboardInterrupt', text)
    stopped = re.search(r'trainer: stopped by SIGINT at step (\d+); saved '
                        r'ckpt-(\d+)', text)
    self.assertTrue(stopped, text[-3000:])
    step = int(stopped.group(1))
    run = tool_testlib.RunTool('trainer', *_Flags(logdir, '--num_replicas=1'),
                               timeout_s=300)
    self.assertEqual(run.returncode, 0, run.stderr[-3000:])
    self.assertIn(f'at step {step}', run.stderr)
    want = tool_testlib.CheckpointTensors(os.path.join(self.tmp, 'full1'))
    got = tool_testlib.CheckpointTensors(logdir)
    self.assertEqual(sorted(got), sorted(want))
    for name, value in want.items():
      np.testing.assert_array_equal(got[name], value, err_msg=name)

  def testSigtermToOneOfTwoTfConfigWorkersStopsBothAtOneStep(self):
    # Separate processes with their own TF_CONFIG (as on two VMs); only
    # worker 1 is preempted: the flag in the step's all-reduce stops both.
    ports = launch.FreePorts(2)
    workers = [f'127.0.0.1:{p}' for p in ports]
    logdir = os.path.join(self.tmp, 'tf_config')
    procs, logs = [], []
    for r in (0, 1):
      env = dict(os.environ, TF_CONFIG=json.dumps(
          {'cluster': {'worker': workers},
           'task': {'type': 'worker', 'index': r}}))
      logs.append(os.path.join(self.tmp, f'tfc{r}.log'))
      procs.append(self._Popen([sys.executable, '-m', 'tools.trainer',
                                *_Flags(logdir)], logs[r], env=env))
    self.assertTrue(self._WaitFor(logs[0], r'step 3/', procs[0]))
    procs[1].send_signal(signal.SIGTERM)
    t0 = time.time()
    for proc in procs:
      proc.wait(timeout=120)
    print(f'2 TF_CONFIG workers: SIGTERM to both exited '
          f'{time.time() - t0:.2f} s', file=sys.stderr)
    texts = []
    for r, proc in enumerate(procs):
      with open(logs[r]) as f:
        texts.append(f.read())
      self.assertEqual(proc.returncode, 143, texts[r][-3000:])
      self.assertNotIn('Traceback', texts[r])
    steps = [re.findall(rf'trainer: stopped by {why} at step (\d+);', t)
             for why, t in zip(("another worker's stop signal", 'SIGTERM'),
                               texts)]
    self.assertEqual(len(steps[0]), 1, texts[0][-3000:])
    self.assertEqual(steps[0], steps[1], texts[1][-3000:])
    step = int(steps[0][0])
    self.assertLess(step, _STEPS)
    self.assertIn(f'saved ckpt-{step}; run the same command', texts[0])

  def testWorkersWithDifferentMaxStepsStopBeforeStepOneNamingIt(self):
    hosts = ','.join(f'127.0.0.1:{p}' for p in launch.FreePorts(2))
    procs = [self._Popen(
        [sys.executable, '-m', 'tools.trainer',
         *_Flags(os.path.join(self.tmp, 'differ')), f'--max_steps={10 + r}',
         f'--worker_hosts={hosts}', f'--task_index={r}'],
        os.path.join(self.tmp, f'w{r}.log')) for r in (0, 1)]
    for r, proc in enumerate(procs):
      proc.wait(timeout=120)
      with open(os.path.join(self.tmp, f'w{r}.log')) as f:
        text = f.read()
      self.assertEqual(proc.returncode, 2, text[-3000:])
      self.assertRegex(text, r'trainer: error: ValueError: the 2 workers were '
                       r'started with different settings: '
                       rf'task.train.max_steps \(here: {10 + r}\) differ')
      self.assertNotIn('step 1', text)
      self.assertNotIn('Traceback', text)

  def testLoneWorkerWith20sWaitEndsInUnder30s(self):
    ports = launch.FreePorts(2)
    t0 = time.monotonic()
    run = tool_testlib.RunTool(
        'trainer', *_Flags(os.path.join(self.tmp, 'lone')),
        f'--worker_hosts=127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}',
        '--task_index=1', '--peer_wait_s=20', timeout_s=90)
    seconds = time.monotonic() - t0
    self.assertEqual(run.returncode, 2, run.stderr[-3000:])
    self.assertIn(f'trainer: error: PeersMissingError: worker[0] at '
                  f'127.0.0.1:{ports[0]} did not start within 20 s',
                  run.stderr)
    self.assertRegex(run.stderr, rf'worker\[1\]: waiting for worker\[0\] at '
                     rf'127.0.0.1:{ports[0]}')
    self.assertLess(seconds, 30)

  def testSigtermWhileWaitingForPeersEndsAtOnce(self):
    ports = launch.FreePorts(2)
    log = os.path.join(self.tmp, 'waiting.log')
    proc = self._Popen(
        [sys.executable, '-m', 'tools.trainer',
         *_Flags(os.path.join(self.tmp, 'waiting')),
         f'--worker_hosts=127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}',
         '--task_index=0', '--peer_wait_s=60'], log)
    # Past TF's import and into the wait: its listener accepts.
    deadline = time.time() + 60
    while time.time() < deadline and not _Accepts(ports[0]):
      time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    t0 = time.time()
    proc.wait(timeout=30)
    self.assertLess(time.time() - t0, 5)
    self.assertEqual(proc.returncode, 143)
    with open(log) as f:
      self.assertIn('trainer: stopped by SIGTERM before the first step',
                    f.read())


if __name__ == '__main__':
  unittest.main()
