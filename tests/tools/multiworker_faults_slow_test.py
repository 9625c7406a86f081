"""A worker killed mid-run: the others stop with one line, a relaunch resumes.

Two trainer workers (K=2 each) run on 127.0.0.1 with their own TF_CONFIG,
started here directly (not through tools/launch, which would end the
survivor itself). Worker 1 is SIGKILLed once the chief has saved a
checkpoint; worker 0 must exit non-zero within a bounded time with the
trainer's one-line error, no traceback. Relaunching both (tools/launch)
resumes from the chief's newest checkpoint and must end with weights
bitwise equal to an uninterrupted 2-worker run.
"""

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

from tests.tools import tool_testlib
from tools import launch

_MODEL = 'consistency.Consistency16'
_STEPS = 12
# Heartbeat timeout (cluster.FaultTimeouts: 10 s) plus exit and slack on a
# loaded 2-core machine.
_SURVIVOR_BOUND_S = 60


def _Flags(logdir):
  return [f'--model={_MODEL}', f'--logdir={logdir}', '--mode=train',
          f'--max_steps={_STEPS}',
          '--model_params_override=task.model.num_partitions=2; '
          'task.model.num_micro_batches=4; task.train.save_interval_steps=2; '
          'task.train.log_interval_steps=1']


class WorkerFaultTest(unittest.TestCase):

  def setUp(self):
    self.tmp = tempfile.mkdtemp(prefix='multiworker_faults_')
    self.procs = []

  def tearDown(self):
    for proc in self.procs:
      if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    shutil.rmtree(self.tmp, ignore_errors=True)

  def _Start(self, logdir, tf_config, r):
    log = open(os.path.join(self.tmp, f'worker{r}.log'), 'w')
    proc = subprocess.Popen(
        [sys.executable, '-m', 'tools.trainer', *_Flags(logdir)],
        cwd=tool_testlib.ROOT, stdout=log, stderr=subprocess.STDOUT,
        env=dict(os.environ, TF_CONFIG=tf_config), start_new_session=True)
    self.procs.append(proc)
    return proc

  def _Log(self, r):
    with open(os.path.join(self.tmp, f'worker{r}.log')) as f:
      return f.read()

  def testKilledWorkerStopsThePeerAndARelaunchResumesBitwise(self):
    want_dir = os.path.join(self.tmp, 'uninterrupted')
    run = tool_testlib.RunTool('launch', '--num_workers=2', '--timeout_s=280',
                               '--', *_Flags(want_dir), timeout_s=300)
    self.assertEqual(run.returncode, 0, msg=run.stderr[-3000:])

    logdir = os.path.join(self.tmp, 'killed')
    configs = launch.WorkerTfConfigs(launch.FreePorts(2))
    chief, worker = (self._Start(logdir, configs[r], r) for r in (0, 1))
    deadline = time.time() + 240
    while not re.search(r'saved .*ckpt-4', self._Log(0)):
      self.assertLess(time.time(), deadline, msg=self._Log(0)[-3000:])
      self.assertIsNone(chief.poll(), msg=self._Log(0)[-3000:])
      time.sleep(0.2)
    os.killpg(worker.pid, signal.SIGKILL)
    killed_at = time.time()
    try:
      rc = chief.wait(timeout=_SURVIVOR_BOUND_S)
    except subprocess.TimeoutExpired:
      self.fail(f'the chief did not stop within {_SURVIVOR_BOUND_S} s of its '
                'peer being killed')
    stopped_after = time.time() - killed_at
    out = self._Log(0)
    self.assertNotEqual(rc, 0)
    errors = [l for l in out.splitlines() if l.startswith('trainer: error:')]
    self.assertEqual(len(errors), 1, msg=out[-3000:])
    # The hint leads; TF's graph trace is cut (it was 1.5k characters).
    self.assertTrue(errors[0].startswith(
        'trainer: error: another worker failed or cannot be reached: '
        'relaunch every worker'), msg=errors[0])
    self.assertLess(len(errors[0]), 400, msg=errors[0])
    self.assertNotIn('Traceback', out)
    print(f'survivor stopped {stopped_after:.1f} s after the kill')

    run = tool_testlib.RunTool('launch', '--num_workers=2', '--timeout_s=280',
                               '--', *_Flags(logdir), timeout_s=300)
    self.assertEqual(run.returncode, 0, msg=run.stderr[-3000:])
    self.assertRegex(run.stdout + run.stderr, r'restored .*ckpt-\d+')
    want = tool_testlib.CheckpointTensors(want_dir)
    got = tool_testlib.CheckpointTensors(logdir)
    self.assertEqual(sorted(got), sorted(want))
    for key in want:
      np.testing.assert_array_equal(got[key], want[key], err_msg=key)


if __name__ == '__main__':
  unittest.main()
