"""tools/benchmark_lib/remote with real TF servers on 127.0.0.1: the
transfer floor child, a pipelined setting with its stages on the servers,
and the servers ended by their process groups."""

import math
import unittest

from tools.benchmark_lib import remote
from tools.benchmark_lib import spawn


class RemoteCheckTest(unittest.TestCase):

  def testFloorAndRemoteStepThenTheServersAreGone(self):
    procs, addresses = remote.StartServers(2)
    try:
      self.assertEqual(len(addresses), 2)
      self.assertTrue(all(a.startswith('127.0.0.1:') for a in addresses))
      [row] = remote.TransferFloorSubprocess(addresses, [[2, 8]])
      self.assertEqual(row['shape'], [2, 8])
      self.assertEqual(row['bytes'], 64)
      for key in ('remote_s', 'local_s'):
        self.assertTrue(math.isfinite(row[key]) and row[key] > 0, row)
      r = spawn.RunSettingSubprocess('tiny', 'K2-T2-1f1b-rc', steps=2,
                                     warmup=1, partition_costs=False,
                                     remote_workers=addresses)
      self.assertEqual(len(r.step_times_s), 2)
      self.assertTrue(all(t > 0 for t in r.step_times_s))
      # A setting the remote mode cannot run is refused by the child with
      # the reason, not run locally.
      with self.assertRaisesRegex(RuntimeError, 'remote_workers runs one '
                                  "pipelined setting.*'plain'"):
        spawn.RunSettingSubprocess('tiny', 'plain', steps=1, warmup=1,
                                   partition_costs=False,
                                   remote_workers=addresses)
    finally:
      remote.StopServers(procs)
    self.assertTrue(all(p.poll() is not None for p in procs))


if __name__ == '__main__':
  unittest.main()
