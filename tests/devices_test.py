"""Tests of tensorpipe.devices: device names are checked against the machine."""

import os
import subprocess
import sys
import textwrap

import tensorflow as tf

from tensorpipe import devices
from tensorpipe import test_utils

test_utils.ConfigureTestDevices()


class SharedDevicesTest(tf.test.TestCase):

  def testDistinctDevicesShareNothing(self):
    self.assertEqual(devices.SharedDevices(['/CPU:0', '/CPU:1', '/GPU:0']),
                     [])
    self.assertEqual(devices.SharedDevices([
        '/job:worker/task:0/device:CPU:0',
        '/job:worker/task:1/device:CPU:0']), [])

  def testDeviceGivenTwiceInAnySpellingIsFound(self):
    self.assertEqual(
        devices.SharedDevices(['/CPU:0', '/CPU:0', '/CPU:1', '/CPU:1']),
        [('/CPU:0', [0, 1]), ('/CPU:1', [2, 3])])
    self.assertEqual(devices.SharedDevices(
        ['/cpu:1', '/CPU:0', '/job:localhost/replica:0/task:0/device:CPU:1',
         '/device:CPU:1']), [('/cpu:1', [0, 2, 3])])


class NumProcessesTest(tf.test.TestCase):

  def testLogicalDevicesAreOneProcessAndEachServerTaskAnother(self):
    self.assertEqual(devices.NumProcesses(
        ['/CPU:0', '/device:CPU:1',
         '/job:localhost/replica:0/task:0/device:CPU:2']), 1)
    self.assertEqual(devices.NumProcesses(
        ['/job:worker/replica:0/task:0/device:CPU:0',
         '/job:worker/replica:0/task:1/device:CPU:0',
         '/job:worker/replica:0/task:1/device:CPU:1']), 2)
    self.assertEqual(devices.NumProcesses(
        ['/CPU:0', '/job:worker/task:0/device:CPU:0']), 2)


class ResolveDevicesTest(tf.test.TestCase):

  def testExistingDevicesAreAcceptedInAnySpelling(self):
    names = ['/CPU:0', '/cpu:7', '/device:CPU:3',
             '/job:localhost/replica:0/task:0/device:CPU:1']
    self.assertEqual(devices.ResolveDevices(names, 4), names)

  def testMissingCpuIsAnErrorListingTheDevices(self):
    with self.assertRaisesRegex(
        ValueError, r"device '/CPU:9' does not exist on this machine; the "
        r"devices are \['/device:CPU:0', .*'/device:CPU:7'\].*"
        r'SetNumLogicalCpuDevices\(n\)'):
      devices.ResolveDevices(['/CPU:0', '/CPU:9'], 2)

  def testMissingGpuIsAnError(self):
    if tf.config.list_logical_devices('GPU'):
      self.skipTest('this machine has GPUs')
    with self.assertRaisesRegex(
        ValueError, r"device '/GPU:5' does not exist.*'/device:CPU:0'"):
      devices.ResolveDevices(['/GPU:5'], 1)

  def testRemoteDeviceWithoutClusterSaysToConnect(self):
    with self.assertRaisesRegex(
        ValueError, r"'/job:worker/task:1/device:CPU:0' does not exist.*"
        r'experimental_connect_to_cluster'):
      devices.ResolveDevices(['/job:worker/task:1/device:CPU:0'], 1)

  def testMalformedNames(self):
    with self.assertRaisesRegex(ValueError, r"'foo' is not a valid device"):
      devices.ResolveDevices(['foo'], 1)
    with self.assertRaisesRegex(ValueError, r"device '' names no device"):
      devices.ResolveDevices([''], 1)
    with self.assertRaisesRegex(TypeError, r'device 3 is not a string'):
      devices.ResolveDevices([3], 1)
    with self.assertRaisesRegex(TypeError, r"devices='/CPU:0' is a string; "
                                r"give a list.*\['/CPU:0'\]"):
      devices.ResolveDevices('/CPU:0', 1)
    with self.assertRaisesRegex(ValueError, r'has 2 entries for 3 partitions'):
      devices.ResolveDevices(['/CPU:0', '/CPU:1'], 3)


# Runs in a child process: connecting to a cluster changes the process's
# TensorFlow context for good. Two in-process servers on 127.0.0.1 ports.
_CLUSTER_SCRIPT = textwrap.dedent('''
    import socket
    import tensorflow as tf
    from tensorpipe import pipeline
    from tensorpipe.layers import linear

    def FreePort():
      with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]

    spec = tf.train.ClusterSpec(
        {'worker': [f'127.0.0.1:{FreePort()}', f'127.0.0.1:{FreePort()}']})
    servers = [tf.distribute.Server(spec, job_name='worker', task_index=i)
               for i in range(2)]
    tf.config.experimental_connect_to_cluster(spec)
    remote = [f'/job:worker/replica:0/task:{i}/device:CPU:0' for i in (0, 1)]
    fcs = [linear.FCLayer.Params().Set(name=f'fc{i}', input_dim=4,
                                       output_dim=4) for i in range(2)]
    layer = pipeline.TensorPipeLayer.Params().Set(
        name='TP', partitions=[fcs[:1], fcs[1:]], num_micro_batches=2,
        devices=remote).Instantiate()
    out = layer.FPropDefaultTheta(tf.ones([4, 4]))
    print('PLACED', layer.PartitionLayers()[1][0].vars.w.device)
    try:
      pipeline.TensorPipeLayer.Params().Set(
          name='TP2', partitions=[fcs[:1]],
          devices=['/job:worker/replica:0/task:2/device:CPU:0']).Instantiate()
    except ValueError as e:
      print('ERROR', e)
''')


class ClusterDevicesTest(tf.test.TestCase):

  def testConnectedRemoteDevicesAreAcceptedAndOthersRejected(self):
    # The parent's sys.path finds tensorpipe under pytest and Bazel alike.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run([sys.executable, '-c', _CLUSTER_SCRIPT],
                            capture_output=True, text=True, timeout=240,
                            env=env, check=False)
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn('PLACED /job:worker/replica:0/task:1/device:CPU:0',
                  result.stdout)
    self.assertRegex(result.stdout,
                     r"ERROR device '/job:worker/replica:0/task:2/device:"
                     r"CPU:0' does not exist.*'/job:worker/replica:0/task:1/"
                     r"device:CPU:0'")


if __name__ == '__main__':
  tf.test.main()
