"""Tests of tensorpipe.device_groups: R groups of K local devices, mirrored."""

import unittest

import tensorflow as tf

from tensorpipe import device_groups
from tensorpipe import test_utils

test_utils.ConfigureTestDevices()


class DeviceGroupsTest(unittest.TestCase):

  def testSplitIntoReplicaGroups(self):
    devices = [f'/CPU:{i}' for i in range(7)]
    self.assertEqual(device_groups.SplitDeviceGroups(devices, 2, 3),
                     [['/CPU:0', '/CPU:1', '/CPU:2'],
                      ['/CPU:3', '/CPU:4', '/CPU:5']])
    self.assertEqual(device_groups.SplitDeviceGroups(devices, 1, 1),
                     [['/CPU:0']])

  def testTooFewDevicesNamesTheNumbersAndTheFlag(self):
    with self.assertRaisesRegex(
        ValueError, r'2 replicas x 4 partitions need 8 devices but only 6 '
        r'are visible .*--num_cpu_devices=8'):
      device_groups.SplitDeviceGroups([f'/CPU:{i}' for i in range(6)], 2, 4)
    for r, k in ((0, 2), (2, 0), (1.5, 2), (True, 2)):
      with self.assertRaisesRegex(ValueError, 'must be a positive int'):
        device_groups.SplitDeviceGroups(['/CPU:0'] * 8, r, k)

  def testLocalGroupsAreTheLogicalCpus(self):
    groups = device_groups.LocalDeviceGroups(2, 4)
    self.assertEqual([[tf.DeviceSpec.from_string(d).device_index for d in g]
                      for g in groups], [[0, 1, 2, 3], [4, 5, 6, 7]])

  def testMirroredStrategyOverGroupsAllReduces(self):
    groups = device_groups.LocalDeviceGroups(4, 2)
    strategy = device_groups.MirroredStrategyOverGroups(groups)
    self.assertEqual(strategy.num_replicas_in_sync, 4)
    self.assertEqual([tf.DeviceSpec.from_string(d).device_index
                      for d in strategy.extended.worker_devices],
                     [0, 2, 4, 6])

    @tf.function
    def Step():
      def Fn():
        ctx = tf.distribute.get_replica_context()
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(
            ctx.replica_id_in_sync_group, tf.float64) + 1.0)
      return strategy.experimental_local_results(strategy.run(Fn))
    self.assertEqual([float(v) for v in Step()], [10.0] * 4)

  def testMirroredStrategyOverGroupsRejectsRaggedGroups(self):
    with self.assertRaisesRegex(ValueError, r'different sizes \[1, 2\]'):
      device_groups.MirroredStrategyOverGroups([['/CPU:0', '/CPU:1'],
                                                ['/CPU:2']])
    with self.assertRaisesRegex(ValueError, 'non-empty list'):
      device_groups.MirroredStrategyOverGroups([])


if __name__ == '__main__':
  unittest.main()
