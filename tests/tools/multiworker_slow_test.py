"""Data parallel x pipeline through the trainer binary, end to end.

The README's test command runs this file (tools/test.sh, end-to-end tier):
the consistency experiment with K=2 partitions trained for a few steps as

  * R=1, no cluster (T=8 micro-batches of 2): the reference;
  * R=2 replicas in one process (--num_replicas=2, T=4 each);
  * R=2 worker processes on 127.0.0.1 via tools/launch (T=4 each),

all with the same global batch of 16 and micro-batches of 2 examples, so the
three compute the same function. Per-step losses and the final checkpoint
must agree to float32 rounding (the all-reduce adds the replicas' gradient
sums in another order); the workers must agree with each other exactly
(the trainer checks their weight fingerprints at the end and logs it).
A successful run prints no error line on any worker; a lone worker whose
peer never starts ends with one line within a bounded time.
"""

import re
import shutil
import sys
import tempfile
import time
import unittest

import numpy as np

from tests.tools import tool_testlib
from tools import launch

_MODEL = 'consistency.Consistency16'
_STEPS = 6
_TIMEOUT_S = 300


def _Flags(logdir, num_micro_batches, *extra):
  return [f'--model={_MODEL}', f'--logdir={logdir}', '--mode=train',
          f'--max_steps={_STEPS}',
          '--model_params_override=task.model.num_partitions=2; '
          f'task.model.num_micro_batches={num_micro_batches}; '
          'task.train.summary_interval_steps=1; '
          'task.train.log_interval_steps=1', *extra]


class MultiWorkerTrainerTest(unittest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp(prefix='multiworker_')
    cls.logdirs = {name: f'{cls.tmp}/{name}'
                   for name in ('r1', 'r2_local', 'r2_workers')}
    cls.runs = {
        'r1': tool_testlib.RunTool(
            'trainer', *_Flags(cls.logdirs['r1'], 8), timeout_s=_TIMEOUT_S),
        'r2_local': tool_testlib.RunTool(
            'trainer', *_Flags(cls.logdirs['r2_local'], 4, '--num_replicas=2'),
            timeout_s=_TIMEOUT_S),
        'r2_workers': tool_testlib.RunTool(
            'launch', '--num_workers=2', f'--timeout_s={_TIMEOUT_S - 20}',
            # --tf_logs: TF's C++ lines shown, so that the check for
            # coordination-service error lines below can fail.
            '--', *_Flags(cls.logdirs['r2_workers'], 4), '--tf_logs',
            timeout_s=_TIMEOUT_S),
    }

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.tmp, ignore_errors=True)
    super().tearDownClass()

  def _Ok(self, name):
    run = self.runs[name]
    self.assertEqual(run.returncode, 0, msg=f'{name}:\n{run.stderr[-3000:]}')
    return run

  def testEveryRunFinishes(self):
    for name in self.runs:
      self._Ok(name)

  def testReplicatedLossesEqualTheSingleReplicaRun(self):
    want = tool_testlib.SummaryScalars(self.logdirs['r1'])
    self.assertEqual(len(want), _STEPS)
    for name in ('r2_local', 'r2_workers'):
      self._Ok(name)
      got = tool_testlib.SummaryScalars(self.logdirs[name])
      # float32 losses of ~1.4; sums reordered by the all-reduce.
      np.testing.assert_allclose(got, want, rtol=1e-6, atol=0, err_msg=name)

  def testReplicatedCheckpointEqualsTheSingleReplicaRun(self):
    want = tool_testlib.CheckpointTensors(self.logdirs['r1'])
    self.assertTrue(any(k.startswith('optimizer/slots/') for k in want))
    for name in ('r2_local', 'r2_workers'):
      self._Ok(name)
      got = tool_testlib.CheckpointTensors(self.logdirs[name])
      self.assertEqual(sorted(got), sorted(want), msg=name)
      for key, value in want.items():
        scale = max(float(np.max(np.abs(value))), 1e-30)
        np.testing.assert_allclose(got[key], value, rtol=1e-6,
                                   atol=1e-6 * scale, err_msg=f'{name} {key}')

  def testWorkersLogIdenticalLossesAndWeights(self):
    out = self._Ok('r2_workers').stdout + self.runs['r2_workers'].stderr
    losses = {r: re.findall(rf'\[worker {r}\].*step \d+/{_STEPS}: loss '
                            r'([0-9.]+)', out) for r in (0, 1)}
    self.assertEqual(len(losses[0]), _STEPS)
    self.assertEqual(losses[0], losses[1])
    for r in (0, 1):
      self.assertRegex(out, rf'\[worker {r}\].*the 2 replicas hold identical '
                       rf'weights and optimizer state after step {_STEPS}')
    # No coordination-service error (the chief used to exit first); TF's
    # "failed call to cuInit" on a machine without a GPU is not one.
    errors = [line for line in out.splitlines()
              if re.search(r'\] E0000 ', line) and 'cuInit' not in line]
    self.assertEqual(errors, [])
    # Only the chief writes the logdir.
    self.assertRegex(out, r'\[worker 0\].*saved .*ckpt-6')
    self.assertNotRegex(out, r'\[worker 1\].*saved ')


class LoneWorkerTest(unittest.TestCase):

  def testLoneWorkerEndsWithOneLineNamingTheMissingPeer(self):
    ports = launch.FreePorts(2)
    hosts = ','.join(f'127.0.0.1:{p}' for p in ports)
    tmp = tempfile.mkdtemp(prefix='lone_worker_')
    self.addCleanup(shutil.rmtree, tmp, True)
    t0 = time.monotonic()
    run = tool_testlib.RunTool(
        'trainer', *_Flags(f'{tmp}/lone', 4), f'--worker_hosts={hosts}',
        '--task_index=0', '--peer_wait_s=5', timeout_s=60)
    seconds = time.monotonic() - t0
    print(f'lone worker: exit {run.returncode} after {seconds:.1f} s',
          file=sys.stderr)
    self.assertEqual(run.returncode, 2, run.stderr[-3000:])
    lines = [l for l in run.stderr.splitlines() if 'trainer: error:' in l]
    self.assertEqual(lines, [
        f'trainer: error: PeersMissingError: worker[1] at 127.0.0.1:'
        f'{ports[1]} did not start within 5 s (no connection accepted): '
        'start every worker with the same cluster, or wait longer with '
        '--peer_wait_s'])
    self.assertNotIn('Traceback', run.stderr)
    # 5 s of waiting plus the process's start-up (TensorFlow's import and
    # the model's build: 3 s on a quiet 2-core machine, 15 s when it is
    # shared); TF's own registration barrier would wait over 60 s.
    self.assertLess(seconds, 35)


if __name__ == '__main__':
  unittest.main()
