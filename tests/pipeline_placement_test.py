"""Where TensorPipeLayer's ops run: forward, recompute and backward, per device.

Every op of a layer of partition k, in the forward pass, the recompute and the
backward pass, must run on device k. The devices are those TensorFlow's placer
assigns when the train step runs (its log_device_placement report), not the
device attributes of the traced graph: an op with no device attribute is
placed by the placer, and the gradient ops of a differentiated while loop are
built outside the partitions' tf.device blocks. The report is read in a child
process (the placer prints it on the process's stdout).

The partitions run on explicitly named devices (`devices=['/CPU:3',
'/CPU:1']`), so neither is the default CPU:0 and the order is not 0, 1.
"""

import json
import os

import tensorflow as tf

from tensorpipe import test_utils

_CHILD_ENV = 'TENSORPIPE_PLACEMENT_CHILD'
_DEVICES = ['/CPU:3', '/CPU:1']
_LAYERS_PER_PARTITION = 2
# (layer-name prefix, TensorPipeLayer settings); the prefix tells the modes'
# ops apart in one placement report.
_MODES = {
    'explicit': dict(recompute=True, recompute_impl='explicit'),
    'norecompute': dict(recompute=False),
    'tfrecompute': dict(recompute=True, recompute_impl='tf_recompute_grad'),
}


def _LayerName(mode, i):
  return f'{mode}conv{i}'


def _Child(out_path):
  """Runs one train step per mode with placement logging; writes variables."""
  import tensorpipe  # pylint: disable=g-import-not-at-top
  from tensorpipe.layers import conv  # pylint: disable=g-import-not-at-top
  tensorpipe.SetNumLogicalCpuDevices(4)
  tf.debugging.set_log_device_placement(True)
  report = {}
  for mode, settings in _MODES.items():
    layers = [conv.Conv2DLayer.Params().Set(
        name=_LayerName(mode, i), filter_shape=(3, 3, 1, 1))
              for i in range(_LAYERS_PER_PARTITION * len(_DEVICES))]
    n = _LAYERS_PER_PARTITION
    layer = tensorpipe.TensorPipeLayer.Params().Set(
        name=f'{mode}pipe', num_micro_batches=2, devices=list(_DEVICES),
        partitions=[layers[k * n:(k + 1) * n] for k in range(len(_DEVICES))],
        **settings).Instantiate()
    variables = layer.trainable_variables

    @tf.function
    def Step(x, layer=layer, variables=variables):
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer.FPropDefaultTheta(x))
      grads = tape.gradient(loss, variables)
      return [v.assign_sub(0.1 * g) for v, g in zip(variables, grads)]
    Step(tf.ones([4, 6, 6, 1]))
    report[mode] = dict(
        devices=layer.devices,
        variables={f'{l.layer_name}/{name}': v.device
                   for part in layer.PartitionLayers() for l in part
                   for name, v in l.vars.items()})
  with open(out_path, 'w') as f:
    json.dump(report, f)


class PlacementTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.report, placed = test_utils.RunPlacementChild(__file__, _CHILD_ENV)
    # Op placements, per layer: {layer name: [(op name, op type, device)]}.
    cls.ops = {}
    for op in placed:
      for part in op[0].split('/'):
        if part.startswith(tuple(_MODES)) and 'conv' in part:
          cls.ops.setdefault(part, []).append(op)
          break

  def _AssertOpsOnTheirPartitionsDevice(self, mode):
    want_devices = [test_utils.DeviceIndex(d) for d in _DEVICES]
    self.assertEqual([test_utils.DeviceIndex(d) for d in self.report[mode]['devices']],
                     want_devices)
    for i in range(_LAYERS_PER_PARTITION * len(_DEVICES)):
      name = _LayerName(mode, i)
      want = want_devices[i // _LAYERS_PER_PARTITION]
      ops = self.ops.get(name, [])
      # The forward conv and both of its gradients ran somewhere.
      self.assertContainsSubset(
          {'Conv2D', 'Conv2DBackpropInput', 'Conv2DBackpropFilter'},
          {op_type for _, op_type, _ in ops}, msg=name)
      wrong = [(op, op_type, device) for op, op_type, device in ops
               if test_utils.DeviceIndex(device) != want]
      self.assertEqual(wrong, [], f'{mode}: ops of {name} not on CPU:{want}')
      for var_name, device in self.report[mode]['variables'].items():
        if var_name.startswith(name + '/'):
          self.assertEqual(test_utils.DeviceIndex(device), want, var_name)

  def testRecomputingPipelineRunsEveryOpOnItsPartitionsDevice(self):
    self._AssertOpsOnTheirPartitionsDevice('explicit')

  # Without explicit recompute (recompute=False, or the comparison-only
  # recompute_impl='tf_recompute_grad'), TF's autodiff of the forward
  # tf.while_loop builds the backward ops outside the partitions' tf.device
  # blocks; each stage call's gradient is built on its device by
  # cell_algebra.GradientOnDevice. (Still on the default device there: the
  # while loop's own accumulation of the loop-invariant weights' gradients
  # over ticks, one AddN per weight, which TF builds without a device.)
  def testPipelineWithoutRecomputeRunsGradientsOnThePartitionsDevice(self):
    self._AssertOpsOnTheirPartitionsDevice('norecompute')

  def testTfRecomputeGradRunsRecomputeAndGradientsOnThePartitionsDevice(self):
    self._AssertOpsOnTheirPartitionsDevice('tfrecompute')


if __name__ == '__main__':
  if os.environ.get(_CHILD_ENV):
    _Child(os.environ[_CHILD_ENV])
  else:
    tf.test.main()
