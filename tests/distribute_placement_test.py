"""Where a replicated pipeline's ops run: R=2 replicas x K=2 stages.

Every op of a layer of partition k in replica r, in the forward pass, the
recompute and the backward pass, must run on device k of replica r's device
group; the weights and optimizer slots too (distribute_test checks those).
The devices are the ones TensorFlow's placer assigns when the step runs
(the log_device_placement report of a child process), not the graph's
device attributes. Replica r's ops carry the strategy's `replica_<r>/` name
prefix (none for replica 0), but for the ops inside the pipeline's cells,
functions of their own named alike in every replica (schedule_cells.
Cells._Cell): those must run on stage k's device of some replica, and
each replica's stage device must run its share.
"""

import json
import os
import re

import tensorflow as tf

from tensorpipe import test_utils

_CHILD_ENV = 'TENSORPIPE_DISTRIBUTE_PLACEMENT_CHILD'
_GROUPS = [['/CPU:0', '/CPU:1'], ['/CPU:2', '/CPU:3']]
# Layer names, in order; two per partition. Distinct prefixes so the op
# names' scopes tell the layers apart.
_LAYERS = ['pl_fc0', 'pl_bn', 'pl_drop', 'pl_fc1']
_PER_PARTITION = 2


def _Child(out_path):
  """Runs one replicated train step with placement logging."""
  # pylint: disable=g-import-not-at-top
  from tensorpipe import pipeline
  from tensorpipe import tasks
  from tensorpipe.layers import dropout
  from tensorpipe.layers import linear
  from tensorpipe.layers import normalization
  from tensorpipe.nested_map import NestedMap
  # pylint: enable=g-import-not-at-top
  test_utils.ConfigureTestDevices(4)
  tf.debugging.set_log_device_placement(True)
  layers = [
      linear.FCLayer.Params().Set(name='pl_fc0', input_dim=5, output_dim=6),
      normalization.BatchNormLayer.Params().Set(name='pl_bn', dim=6),
      dropout.DropoutLayer.Params().Set(name='pl_drop', keep_prob=0.6),
      linear.FCLayer.Params().Set(name='pl_fc1', input_dim=6, output_dim=3,
                                  activation='NONE'),
  ]
  n = _PER_PARTITION
  pipe = pipeline.TensorPipeLayer.Params().Set(
      name='TensorPipe', num_micro_batches=2,
      partitions=[layers[k * n:(k + 1) * n] for k in range(len(_GROUPS[0]))])
  task_p = tasks.ClassificationTask.Params().Set(
      name='task', model=pipe, num_classes=3, input_key='image')
  _, replicas, _, step = test_utils.ReplicatedSgdStep(task_p, _GROUPS)
  batch = NestedMap(image=tf.random.stateless_normal([8, 5], seed=[1, 2]),
                    label=tf.constant([0, 1, 2, 0, 1, 2, 0, 1]))
  step(batch, tf.constant(0, tf.int64))
  with open(out_path, 'w') as f:
    json.dump({'devices': [r.children.model.devices for r in replicas]}, f)


class ReplicatedPlacementTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.report, placed = test_utils.RunPlacementChild(__file__, _CHILD_ENV)
    # {(replica, layer): [(op name, op type, device index)]}
    cls.ops = {}
    for name, op_type, device in placed:
      parts = name.split('/')
      layer = next((p for p in parts if p in _LAYERS), None)
      if layer is None:
        continue
      replica = next((int(p[len('replica_'):]) for p in parts
                      if re.fullmatch(r'replica_\d+', p)), 0)
      cls.ops.setdefault((replica, layer), []).append(
          (name, op_type, test_utils.DeviceIndex(device)))

  def testPipelinesUseTheirReplicasDeviceGroup(self):
    want = [[test_utils.DeviceIndex(d) for d in group] for group in _GROUPS]
    got = [[test_utils.DeviceIndex(d) for d in devices]
           for devices in self.report['devices']]
    self.assertEqual(got, want)

  def _Stage(self, i):
    """The device index of layer i's stage in each replica."""
    return [test_utils.DeviceIndex(group[i // _PER_PARTITION])
            for group in _GROUPS]

  def testEveryLayerOpRunsOnItsStageDeviceOfItsReplica(self):
    for i, layer in enumerate(_LAYERS):
      want = self._Stage(i)
      seen = set()
      for r in range(len(_GROUPS)):
        for op in self.ops.get((r, layer), []):
          # A prefixed op is replica r's; an unprefixed one may be a
          # cell's of any replica.
          ok = [want[r]] if r else want
          self.assertIn(op[2], ok, f'replica {r} {layer}: {op}')
          seen.add(op[2])
      self.assertEqual(seen, set(want), f'{layer}: ops on {sorted(seen)}')

  def testForwardRecomputeAndBackwardMatMulsOfEveryReplicaWereSeen(self):
    """The check above saw all passes: FC layers have >= 4 MatMuls.
    Forward, recomputed forward, and the two gradient MatMuls (inputs and
    weights) of each FC layer, on each replica's stage device.
    """
    for i, layer in enumerate(_LAYERS):
      if layer not in ('pl_fc0', 'pl_fc1'):
        continue
      ops = [op for r in range(len(_GROUPS))
             for op in self.ops.get((r, layer), []) if op[1] == 'MatMul']
      for device in self._Stage(i):
        self.assertGreaterEqual(len([op for op in ops if op[2] == device]),
                                4, f'{layer} on CPU:{device}')


if __name__ == '__main__':
  if os.environ.get(_CHILD_ENV):
    _Child(os.environ[_CHILD_ENV])
  else:
    tf.test.main()
