"""EXPERIMENTAL cross-host stages: one client, partitions on 2 TF servers.

Two `tf.distribute.Server` processes on 127.0.0.1 stand for two hosts; the
test process connects to them (`distribute.ConnectRemoteStages`) and runs a
2-partition TensorPipeLayer with partition k on server k. Outputs and
gradients must equal the same layers run locally (float64).
"""

import os
import signal
import subprocess
import sys
import time

import tensorflow as tf

from tools import launch

_SERVER = '''
import sys
import tensorflow as tf
workers = sys.argv[1].split(",")
server = tf.distribute.Server(
    tf.train.ClusterSpec({"worker": workers}), job_name="worker",
    task_index=int(sys.argv[2]), start=True)
print("ready", flush=True)
server.join()
'''
_TIMEOUT_S = 120


class CrossHostStagesTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.workers = [f'127.0.0.1:{p}' for p in launch.FreePorts(2)]
    cls.procs = []
    env = dict(os.environ, CUDA_VISIBLE_DEVICES='')
    for i in range(2):
      cls.procs.append(subprocess.Popen(
          [sys.executable, '-c', _SERVER, ','.join(cls.workers), str(i)],
          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
          start_new_session=True))
    deadline = time.time() + _TIMEOUT_S
    for proc in cls.procs:
      line = proc.stdout.readline().decode()
      if 'ready' not in line or time.time() > deadline:
        cls.tearDownClass()
        raise RuntimeError(f'a TF server did not start: {line!r}')

  @classmethod
  def tearDownClass(cls):
    for proc in cls.procs:
      if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
      proc.wait(timeout=30)
    super().tearDownClass()

  def testRemotePartitionsMatchLocalLayers(self):
    # pylint: disable=g-import-not-at-top
    from tensorpipe import distribute
    from tensorpipe import pipeline
    from tensorpipe import schedule_program
    from tensorpipe import test_utils
    from tensorpipe.layers import composite
    from tensorpipe.layers import linear
    devices = distribute.ConnectRemoteStages(self.workers)
    self.assertEqual(devices, [
        '/job:worker/replica:0/task:0/device:CPU:0',
        '/job:worker/replica:0/task:1/device:CPU:0'])
    layers = [linear.FCLayer.Params().Set(name=f'fc{i}', input_dim=4,
                                          output_dim=4) for i in range(4)]
    pipe = pipeline.TensorPipeLayer.Params().Set(
        name='TensorPipe', layers=layers, num_partitions=2,
        num_micro_batches=4, input_shapes=[[8, 4]], devices=devices,
        dtype=tf.float64).Instantiate()
    for k, part in enumerate(pipe.PartitionLayers()):
      for layer in part:
        for var in layer.vars.values():
          self.assertEqual(var.device, devices[k])
    with tf.device('/job:localhost/replica:0/task:0/device:CPU:0'):
      local = composite.SequentialLayer.Params().Set(
          name='TensorPipe', sub=layers, dtype=tf.float64).Instantiate()
    x = tf.random.stateless_normal([8, 4], seed=[1, 2], dtype=tf.float64)
    loss = lambda y: tf.reduce_sum(tf.square(y))
    out, l, grads = test_utils.LossAndGrads(pipe, loss, x)
    want_out, want_l, want_grads = test_utils.LossAndGrads(local, loss, x)
    rtol = test_utils.DEFAULT_RTOL[tf.float64]
    test_utils.AssertAllCloseScaled(self, out, want_out, rtol)
    test_utils.AssertAllCloseScaled(self, l, want_l, rtol)
    test_utils.AssertAllCloseScaled(self, grads, want_grads, rtol,
                                    scale=test_utils.MaxAbs(want_grads))

    # A loss-inside schedule of two stages per server (ZB-V's V) runs its
    # whole table in one pass (the default, spelled out here), with no
    # tf.while_loop to cost a round of messages per iteration
    # (schedule_program.UnrollsAll).
    zbv = pipeline.TensorPipeLayer.Params().Set(
        name='TensorPipe', layers=layers, num_partitions=2,
        num_micro_batches=4, input_shapes=[[8, 4]], devices=devices,
        schedule='zb_v', dtype=tf.float64).Instantiate()
    sum_sq = lambda y, unused_targets: tf.reduce_sum(tf.square(y))

    @tf.function(autograph=False)
    def ZbvStep(x):
      with tf.GradientTape() as tape:
        loss = zbv.FPropLoss(zbv.theta, (x,), None, sum_sq, 1.0).loss
      return loss, tape.gradient(loss, zbv.trainable_variables)
    with schedule_program.UnrollAcrossProcesses(
        schedule_program.ONE_PASS_CELLS):
      self.assertEmpty(test_utils.WhileOps(
          ZbvStep.get_concrete_function(x).graph))
    self.assertEqual(
        [v.name for v in zbv.trainable_variables],
        [v.name for v in pipe.trainable_variables])
    for a, b in zip(pipe.variables, zbv.variables):
      b.assign(a)
    got_l, got_grads = ZbvStep(x)
    test_utils.AssertAllCloseScaled(self, got_l, want_l, rtol)
    test_utils.AssertAllCloseScaled(self, got_grads, want_grads, rtol,
                                    scale=test_utils.MaxAbs(want_grads))


if __name__ == '__main__':
  tf.test.main()
