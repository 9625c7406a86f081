"""tools/benchmark_lib/remote with real TF servers on 127.0.0.1: the
transfer floor child, a pipelined setting with its stages on the servers
(they do its work), and the servers ended on every path."""

import math
import unittest
from unittest import mock

from tools.benchmark_lib import remote
from tools.benchmark_lib import runner
from tools.benchmark_lib import spawn


class RemoteCheckTest(unittest.TestCase):

  def testFloorAndARemoteStepRunOnTheServers(self):
    procs, addresses = remote.StartServers(2)
    try:
      self.assertEqual(len(addresses), 2)
      self.assertTrue(all(a.startswith('127.0.0.1:') for a in addresses))
      [row] = remote.TransferFloorSubprocess(addresses, [[2, 8]])
      self.assertEqual(row['shape'], [2, 8])
      self.assertEqual(row['bytes'], 64)
      for key in ('remote_s', 'local_s'):
        self.assertTrue(math.isfinite(row[key]) and row[key] > 0, row)
      before = [runner.ProcessCpuS(p.pid) for p in procs]
      r = spawn.RunSettingSubprocess('dense4w256', 'K2-T4-1f1b-rc', steps=3,
                                     warmup=1, partition_costs=False,
                                     remote_workers=addresses,
                                     cpu_pids=[p.pid for p in procs])
      self.assertEqual(len(r.step_times_s), 3)
      # Both servers ran kernels of the step (tracing alone is the
      # client's): each used CPU while the client ran its steps, and the
      # child measured each one's CPU over its timed steps.
      used = [runner.ProcessCpuS(p.pid) - b for p, b in zip(procs, before)]
      self.assertTrue(all(u > 0 for u in used), used)
      self.assertEqual(len(r.pid_cpu_s), 2)
      for per_step, total in zip(r.pid_cpu_s, used):
        self.assertGreaterEqual(per_step, 0.0)
        self.assertLessEqual(per_step * 3, total + 1e-9)
      self.assertGreater(r.cpu_s, 0.0)
      # A setting the remote mode cannot run is refused by the child with
      # the reason, not run locally.
      with self.assertRaisesRegex(RuntimeError, 'remote_workers runs one '
                                  "pipelined setting.*'plain'"):
        spawn.RunSettingSubprocess('tiny', 'plain', steps=1, warmup=1,
                                   partition_costs=False,
                                   remote_workers=addresses)
    finally:
      remote.StopServers(procs)
    for p in procs:
      self.assertEqual(p.returncode, -9)  # killed, not still running

  def testAServerThatDoesNotStartIsReportedAndNoneIsLeft(self):
    started = []
    real_popen = remote.subprocess.Popen

    def Popen(args, **kwargs):
      proc = real_popen(args, **kwargs)
      started.append(proc)
      return proc
    broken = ('import sys; sys.stderr.write("no port for me\\n"); '
              'sys.exit(3)')
    with mock.patch.object(remote, '_SERVER', broken), \
         mock.patch.object(remote.subprocess, 'Popen', Popen):
      with self.assertRaisesRegex(RuntimeError,
                                  '(?s)TF server 0 .* did not start.*'
                                  'no port for me'):
        remote.StartServers(2, timeout_s=60)
    self.assertEqual(len(started), 2)
    self.assertTrue(all(p.returncode is not None for p in started))


if __name__ == '__main__':
  unittest.main()
