"""Multi-process tests of tensorpipe.cluster on 127.0.0.1 (slow: TF workers).

- tools/launch.py starts two workers that build MultiWorkerMirroredStrategy
  with `cluster.MultiWorkerStrategy` from their TF_CONFIG and all-reduce:
  the sums are right in both and replica ids follow `Cluster.worker_index`.
- A worker SIGKILLed while its peer waits in an all-reduce, or a hung
  (SIGSTOPped) coordination leader: the other worker fails with an error
  naming the dead task within the heartbeat timeout plus a margin, instead of
  hanging.
- The coordination leader started without its peer fails after the
  registration timeout.

Every process runs under a timeout and is ended by PID.
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

from tools import launch

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Step i: worker w all-reduces one_hot(w) * (replica id + 1) + i, so the sum
# is [1 + 2i, 2 + 2i] for R = 2 exactly when replica id == worker_index.
_WORKER = r'''
import os, signal, sys, time
from tensorpipe import cluster
c = cluster.ClusterFromFlagsOrEnvironment()
import tensorflow as tf
strategy = cluster.MultiWorkerStrategy(c, cluster.FaultTimeouts(
    heartbeat_timeout_s=float(os.environ['HEARTBEAT_S']),
    cluster_register_timeout_s=float(os.environ['REGISTER_S'])))
print('replicas %d worker %d chief %s' % (
    strategy.num_replicas_in_sync, c.worker_index, c.is_chief), flush=True)

@tf.function
def Step(i):
  def Fn():
    ctx = tf.distribute.get_replica_context()
    v = tf.one_hot(c.worker_index, c.num_workers, dtype=tf.float64) * (
        tf.cast(ctx.replica_id_in_sync_group, tf.float64) + 1.0)
    return ctx.all_reduce(tf.distribute.ReduceOp.SUM,
                          v + tf.cast(i, tf.float64))
  return strategy.run(Fn)

die = os.environ.get('DIE', '')   # 'w:step:kill' or 'w:step:stop'
for i in range(int(os.environ['STEPS'])):
  if die and int(die.split(':')[0]) == c.worker_index and i == int(
      die.split(':')[1]):
    print('dying at %.3f' % time.time(), flush=True)
    os.kill(os.getpid(), signal.SIGKILL if die.endswith('kill')
            else signal.SIGSTOP)
  print('step %d sum %s' % (i, Step(tf.constant(i)).numpy().tolist()),
        flush=True)
'''


def _Alive(pid: int) -> bool:
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except FileNotFoundError:
    return False


class ClusterSlowTest(unittest.TestCase):

  def setUp(self):
    self._tmp = tempfile.TemporaryDirectory()
    self.addCleanup(self._tmp.cleanup)
    self.module = f'allreduce_worker_{os.getpid()}'
    with open(os.path.join(self._tmp.name, self.module + '.py'), 'w') as f:
      f.write(_WORKER)
    path = os.environ.get('PYTHONPATH', '')
    self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (self._tmp.name, _REPO, path) if p),
                    HEARTBEAT_S='10', REGISTER_S='300', STEPS='3',
                    TF_CPP_MIN_LOG_LEVEL='1', PYTHONUNBUFFERED='1')
    self.env.pop('TF_CONFIG', None)

  def testLaunchedWorkersAllReduce(self):
    proc = subprocess.run(
        [sys.executable, '-m', 'tools.launch', '--num_workers=2',
         f'--worker_module={self.module}', '--timeout_s=400', '--'],
        cwd=_REPO, env=self.env, capture_output=True, text=True, timeout=500)
    out = proc.stdout
    self.assertEqual(proc.returncode, 0, out + proc.stderr[-3000:])
    for w in range(2):
      self.assertIn(f'[worker {w}] replicas 2 worker {w} chief {w == 0}',
                    out)
      for i in range(3):
        self.assertIn(f'[worker {w}] step {i} sum [{1.0 + 2 * i}, '
                      f'{2.0 + 2 * i}]', out)

  def _RunPair(self, die: str, heartbeat_s: float):
    """Two workers, one dies as `die` says; returns (survivor rc, output,
    seconds from the death to the survivor's exit)."""
    env = dict(self.env, DIE=die, STEPS='100000',
               HEARTBEAT_S=str(heartbeat_s))
    victim = int(die.split(':')[0])
    configs = launch.WorkerTfConfigs(launch.FreePorts(2))
    logs = [open(os.path.join(self._tmp.name, f'w{r}.log'), 'w+')
            for r in range(2)]
    procs = []
    for r in range(2):
      self.addCleanup(logs[r].close)
      procs.append(subprocess.Popen(
          [sys.executable, '-m', self.module], cwd=_REPO,
          env=dict(env, TF_CONFIG=configs[r]), stdout=logs[r],
          stderr=subprocess.STDOUT))
      # Cleanups run last-in first-out: kill by PID (a stopped one too),
      # then reap.
      self.addCleanup(procs[-1].wait)
      self.addCleanup(lambda p=procs[-1]: _Alive(p.pid) and os.kill(
          p.pid, signal.SIGKILL))
    survivor = procs[1 - victim]
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and survivor.poll() is None:
      time.sleep(0.05)
    ended = time.time()
    self.assertIsNotNone(survivor.poll(), 'the survivor hung')
    text = [open(l.name).read() for l in logs]
    died = re.search(r'dying at ([\d.]+)', text[victim])
    self.assertIsNotNone(died, text[victim][-3000:])
    seconds = ended - float(died.group(1))
    print(f'{die}: the survivor exited {seconds:.1f} s after the death')
    return survivor.returncode, text[1 - victim], seconds

  def testKilledWorkerMidAllReduceFailsThePeerInBoundedTime(self):
    rc, out, seconds = self._RunPair('1:2:kill', heartbeat_s=5.0)
    self.assertNotEqual(rc, 0)
    self.assertIn('step 1 sum', out)
    self.assertNotIn('step 2 sum', out)
    self.assertRegex(out, r'tasks are unhealthy \(stopped sending '
                     r'heartbeats\):\s*/job:worker/replica:0/task:1')
    # Measured here: the error after 3.4-3.6 s, the exit after 5.4-8 s.
    self.assertLess(seconds, 5.0 + 25.0)

  def testHungLeaderFailsThePeerInBoundedTime(self):
    # SIGSTOP keeps the sockets open, as a hung or unplugged host would.
    rc, out, seconds = self._RunPair('0:2:stop', heartbeat_s=5.0)
    self.assertNotEqual(rc, 0)
    self.assertIn('CoordinationService/Heartbeat', out)
    # Measured here: the error after 3.7 s, the exit after 7.5 s.
    self.assertLess(seconds, 5.0 + 25.0)

  def testLeaderWithoutItsPeerFailsAfterTheRegisterTimeout(self):
    env = dict(self.env, REGISTER_S='5',
               TF_CONFIG=launch.WorkerTfConfigs(launch.FreePorts(2))[0])
    start = time.monotonic()
    proc = subprocess.run([sys.executable, '-m', self.module], cwd=_REPO,
                          env=env, capture_output=True, text=True,
                          timeout=300)
    self.assertNotEqual(proc.returncode, 0)
    self.assertIn('Wait_for_all_tasks_to_register', proc.stderr)
    self.assertIn('/job:worker/replica:0/task:1', proc.stderr)
    # Python and TF start-up (up to ~30 s on a loaded machine) + 5 s.
    self.assertLess(time.monotonic() - start, 5.0 + 90.0)


if __name__ == '__main__':
  unittest.main()
