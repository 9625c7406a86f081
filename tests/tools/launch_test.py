"""Tests of tools/launch.py with tiny fake workers (no TensorFlow in them).

The fake worker module is written to a temporary folder and run by the
launcher as `python -m <module>`; its arguments say what worker r does
(`--w1=exit3`: worker 1 exits with code 3). Every launcher and worker runs
under a timeout and every test checks, by PID, that no worker is left.
The real-TF test (MultiWorkerMirroredStrategy over the launcher's workers)
is launch_slow_test.py.
"""

import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

from absl import app
from absl import flags

from tensorpipe import cluster
from tools import launch

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

_FAKE_WORKER = r'''
import json, os, signal, sys, time
r = json.loads(os.environ['TF_CONFIG'])['task']['index']
print('tf_config ' + os.environ['TF_CONFIG'])
print('args ' + json.dumps(sys.argv[1:]))
action = dict(a[2:].split('=') for a in sys.argv[1:]
              if a.startswith('--w')).get('w%d' % r, 'exit0')
if action == 'ignore_term':
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
print('ready', flush=True)
if action.startswith('exit'):
  time.sleep(0.2)
  sys.exit(int(action[4:]))
if action == 'sigkill':
  os.kill(os.getpid(), signal.SIGKILL)
time.sleep(120)   # 'sleep', 'ignore_term': until the launcher ends us
'''


def _Alive(pid: int) -> bool:
  """Whether a process exists and is not a zombie."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except FileNotFoundError:
    return False


class _FakeWorkerTest(unittest.TestCase):

  def setUp(self):
    self._tmp = tempfile.TemporaryDirectory()
    self.addCleanup(self._tmp.cleanup)
    self.module = f'fake_worker_{os.getpid()}'
    with open(os.path.join(self._tmp.name, self.module + '.py'), 'w') as f:
      f.write(_FAKE_WORKER)
    path = os.environ.get('PYTHONPATH', '')
    self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (self._tmp.name, _REPO, path) if p))
    self.env.pop('TF_CONFIG', None)
    self.pids = []
    self.addCleanup(self._KillLeftovers)

  def _KillLeftovers(self):
    for pid in self.pids:
      if _Alive(pid):
        os.kill(pid, signal.SIGKILL)

  def _Launch(self, *args, num_workers=2, **kwargs):
    out = io.StringIO()
    kwargs.setdefault('timeout_s', 60.0)
    start = time.monotonic()
    result = launch.Launch(list(args), num_workers, worker_module=self.module,
                           out=out, env=self.env, **kwargs)
    self.pids = result.pids
    return result, out.getvalue().splitlines(), time.monotonic() - start

  def assertNoWorkerLeft(self, pids):
    self.assertEqual([p for p in pids if _Alive(p)], [])


class LaunchTest(_FakeWorkerTest):

  def testWorkersGetTheirTfConfigArgsAndPrefixedLines(self):
    result, lines, _ = self._Launch('--x=1', 'pos', num_workers=3)
    self.assertEqual((result.exit_code, result.failed_worker), (0, None))
    self.assertEqual(result.returncodes, [0, 0, 0])
    configs = {}
    for r in range(3):
      mine = [l[len(f'[worker {r}] '):] for l in lines
              if l.startswith(f'[worker {r}] ')]
      self.assertEqual(mine[1:], ['args ["--x=1", "pos"]', 'ready'])
      self.assertTrue(mine[0].startswith('tf_config '))
      configs[r] = cluster.ParseTfConfig(mine[0][len('tf_config '):])
    addresses = configs[0].addresses
    self.assertEqual(len(set(addresses)), 3)
    for r, c in configs.items():
      self.assertEqual((c.addresses, c.worker_index, c.is_chief),
                       (addresses, r, r == 0))
      self.assertTrue(c.address.startswith('127.0.0.1:'))
    self.assertIn('[launch] worker 0: pid %d, %s (chief)' % (
        result.pids[0], addresses[0]), lines)
    self.assertEqual(lines[-1], '[launch] all workers exited with code 0; '
                     'exit code 0')
    # Nothing but whole prefixed lines.
    self.assertTrue(all(re.match(r'\[(worker \d|launch)\] ', l)
                        for l in lines), lines)
    self.assertNoWorkerLeft(result.pids)

  def testOneFailureEndsTheOthersAndGivesItsExitCode(self):
    result, lines, elapsed = self._Launch('--w0=sleep', '--w1=exit3',
                                          '--w2=sleep', num_workers=3,
                                          grace_period_s=5.0)
    self.assertEqual((result.exit_code, result.failed_worker), (3, 1))
    self.assertEqual(result.returncodes,
                     [-signal.SIGTERM, 3, -signal.SIGTERM])
    self.assertLess(elapsed, 30.0)   # the sleepers would run 120 s
    self.assertIn('[launch] worker 1 (pid %d) failed with exit code 3; exit '
                  'code 3' % result.pids[1], lines)
    self.assertNoWorkerLeft(result.pids)

  def testWorkerIgnoringSigtermIsKilledAfterTheGracePeriod(self):
    result, lines, elapsed = self._Launch('--w0=ignore_term', '--w1=exit2',
                                          grace_period_s=1.0)
    self.assertEqual(result.exit_code, 2)
    self.assertEqual(result.returncodes, [-signal.SIGKILL, 2])
    self.assertLess(elapsed, 30.0)
    self.assertTrue(any('still running 1 s after SIGTERM: SIGKILL' in l
                        for l in lines), lines)
    self.assertNoWorkerLeft(result.pids)

  def testWorkerKilledBySignalGives128PlusN(self):
    result, lines, _ = self._Launch('--w0=sleep', '--w1=sigkill')
    self.assertEqual((result.exit_code, result.failed_worker),
                     (128 + signal.SIGKILL, 1))
    self.assertIn('[launch] worker 1 (pid %d) was killed by SIGKILL; exit '
                  'code 137' % result.pids[1], lines)
    self.assertNoWorkerLeft(result.pids)

  def testWorkerStoppedBySigtermIsReportedSo(self):
    """A trainer stopped by a SIGTERM sent to it (saved, exit 143) did not
    fail."""
    result, lines, _ = self._Launch('--w0=sleep', '--w1=exit143',
                                    grace_period_s=5.0)
    self.assertEqual((result.exit_code, result.failed_worker), (143, 1))
    self.assertIn('[launch] worker 1 (pid %d) stopped by SIGTERM (exit code '
                  '143); exit code 143' % result.pids[1], lines)
    self.assertNoWorkerLeft(result.pids)

  def testTimeoutEndsEverythingWith124(self):
    result, lines, elapsed = self._Launch('--w0=sleep', '--w1=sleep',
                                          timeout_s=3.0, grace_period_s=1.0)
    self.assertEqual((result.exit_code, result.failed_worker), (124, None))
    self.assertLess(elapsed, 30.0)
    self.assertIn('[launch] timed out after 3 s; exit code 124', lines)
    self.assertNoWorkerLeft(result.pids)

  def testStopRequestEndsEverything(self):
    stop = launch.StopRequest()
    threading.Timer(2.0, stop.Request, args=(130,)).start()
    result, _, elapsed = self._Launch('--w0=sleep', '--w1=sleep', stop=stop,
                                      grace_period_s=1.0)
    self.assertEqual(result.exit_code, 130)
    self.assertLess(elapsed, 30.0)
    self.assertNoWorkerLeft(result.pids)


class PortsTest(unittest.TestCase):

  def testFreePortsAreDistinctAndPortBaseIsConsecutive(self):
    ports = launch.WorkerPorts(4)
    self.assertEqual(len(set(ports)), 4)
    self.assertEqual(launch.WorkerPorts(3, port_base=20000),
                     [20000, 20001, 20002])

  def testPortBaseWithAPortInUseIsNamedBeforeAnyWorkerStarts(self):
    import socket  # pylint: disable=g-import-not-at-top
    with socket.socket() as busy:
      busy.bind(('127.0.0.1', 0))
      busy.listen(1)
      port = busy.getsockname()[1]
      with self.assertRaisesRegex(ValueError, rf'port {port} of worker 0 '
                                  rf'\(--port_base={port} \+ 0\) is not '
                                  'free'):
        launch.WorkerPorts(2, port_base=port)

  def testPortBaseOutOfRange(self):
    with self.assertRaisesRegex(ValueError, r'--port_base=65535 with 2 '
                                r'workers needs ports 65535\.\.65536; use a '
                                r'base in 1024\.\.65534'):
      launch.WorkerPorts(2, port_base=65535)
    fv = flags.FlagValues()
    launch.DefineFlags(fv)
    fv(['launch', '--port_base=80'])
    with self.assertRaisesRegex(app.UsageError, '--port_base=80'):
      launch.main(['launch'], flag_values=fv)

  def testTfConfigsNameEveryWorker(self):
    configs = [cluster.ParseTfConfig(t)
               for t in launch.WorkerTfConfigs([5000, 5001])]
    self.assertEqual([(c.addresses, c.worker_index) for c in configs],
                     [(('127.0.0.1:5000', '127.0.0.1:5001'), 0),
                      (('127.0.0.1:5000', '127.0.0.1:5001'), 1)])
    self.assertEqual(json.loads(launch.WorkerTfConfigs([5000])[0]), {
        'cluster': {'worker': ['127.0.0.1:5000']},
        'task': {'type': 'worker', 'index': 0}})


class LauncherBinaryTest(_FakeWorkerTest):
  """The launcher as its own process: signals to it, and its death."""

  def _Start(self, *worker_args):
    cmd = [sys.executable, '-m', 'tools.launch', '--num_workers=2',
           f'--worker_module={self.module}', '--grace_period_s=1',
           '--timeout_s=120', '--', *worker_args]
    proc = subprocess.Popen(cmd, cwd=_REPO, env=self.env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    self.addCleanup(proc.stdout.close)
    self.addCleanup(lambda: proc.poll() is None and proc.kill())
    lines, ready = [], threading.Event()

    def Read():
      for line in proc.stdout:
        lines.append(line.rstrip('\n'))
        if sum(l.endswith('] ready') for l in lines) == 2:
          ready.set()
    threading.Thread(target=Read, daemon=True).start()
    self.assertTrue(ready.wait(120), lines)
    pids = [int(m.group(1)) for l in lines
            for m in [re.match(r'\[launch\] worker \d: pid (\d+)', l)] if m]
    self.assertEqual(len(pids), 2, lines)
    self.pids = pids
    return proc, lines, pids

  def testSigintToTheLauncherEndsAllWorkers(self):
    proc, lines, pids = self._Start('--w0=sleep', '--w1=ignore_term')
    proc.send_signal(signal.SIGINT)
    self.assertEqual(proc.wait(timeout=60), 128 + signal.SIGINT)
    self.assertNoWorkerLeft(pids)
    self.assertTrue(any('worker 1' in l and 'SIGKILL' in l for l in lines),
                    lines)

  def testKilledLauncherTakesItsWorkersAlong(self):
    # The workers are not our children: they get SIGTERM from the kernel
    # (PR_SET_PDEATHSIG) when the launcher dies.
    proc, _, pids = self._Start('--w0=sleep', '--w1=sleep')
    proc.kill()
    proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_Alive(p) for p in pids):
      time.sleep(0.1)
    self.assertNoWorkerLeft(pids)


if __name__ == '__main__':
  unittest.main()
