"""Recompute saves activation memory: TF's allocator peak during a train step.

GPipe's re-materialisation keeps only each partition's input per micro-batch
and recomputes the rest in the backward pass; without it, autodiff of the
forward loop keeps every layer's activations of every micro-batch. On a model
whose activations dominate its weights, the allocator's peak above what was
allocated before the step must therefore be much lower with recompute.

TF's CPU allocator keeps statistics only when it is the BFC allocator, which
is chosen by an environment variable read when TensorFlow starts: the
measurement runs in a child process.
"""

import json
import os
import subprocess
import sys

import tensorflow as tf

_CHILD_ENV = 'TENSORPIPE_MEMORY_CHILD'
# 16 FC layers 64 -> 64 on 1024 examples: 256 KiB of activations per layer,
# 16 KiB of weights.
_NUM_LAYERS, _DIM, _BATCH = 16, 64, 1024
_K, _T = 2, 8


def _ActivationPeak(recompute):
  """Allocator peak during one train step minus the bytes held before it."""
  import tensorpipe  # pylint: disable=g-import-not-at-top
  from tensorpipe.layers import linear  # pylint: disable=g-import-not-at-top
  layer = tensorpipe.TensorPipeLayer.Params().Set(
      name='pipe', num_partitions=_K, num_micro_batches=_T,
      recompute=recompute,
      input_shapes=[[_BATCH, _DIM]],
      layers=[linear.FCLayer.Params().Set(
          name=f'fc{i}', input_dim=_DIM, output_dim=_DIM)
              for i in range(_NUM_LAYERS)]).Instantiate()
  variables = layer.trainable_variables

  @tf.function
  def Step(x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(layer.FPropDefaultTheta(x)))
    grads = tape.gradient(loss, variables)
    return [v.assign_sub(0.01 * g) for v, g in zip(variables, grads)]
  x = tf.random.stateless_normal([_BATCH, _DIM], [1, 2])
  Step(x)  # trace and warm up
  before = tf.config.experimental.get_memory_info('CPU:0')['current']
  tf.config.experimental.reset_memory_stats('CPU:0')
  Step(x)
  return tf.config.experimental.get_memory_info('CPU:0')['peak'] - before


def _Child(out_path):
  import tensorpipe  # pylint: disable=g-import-not-at-top
  tensorpipe.SetNumLogicalCpuDevices(_K)
  with open(out_path, 'w') as f:
    json.dump({str(rc): _ActivationPeak(rc) for rc in (True, False)}, f)


class RecomputeMemoryTest(tf.test.TestCase):

  def testRecomputeLowersTheActivationPeak(self):
    out_path = os.path.join(self.get_temp_dir(), 'peaks.json')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path),
               TF_CPU_ALLOCATOR_USE_BFC='true', TF_CPP_MIN_LOG_LEVEL='2')
    env[_CHILD_ENV] = out_path
    proc = subprocess.run([sys.executable, os.path.abspath(__file__)],
                          env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    with open(out_path) as f:
      peaks = json.load(f)
    with_rc, without = peaks['True'], peaks['False']
    # Without recompute the step keeps every layer's input (the matmul's
    # gradient needs it) for the whole mini-batch: 16 layers' worth. With
    # recompute: one input per partition and micro-batch, the outputs, and
    # one partition's activations of one micro-batch during its backward
    # pass; measured here about 0.35x. The margin is generous (0.7x), and
    # the peak without recompute must show the activations dominate.
    layer_bytes = _BATCH * _DIM * 4
    self.assertGreater(without, 0.5 * _NUM_LAYERS * layer_bytes, peaks)
    self.assertLess(with_rc, 0.7 * without, peaks)

if __name__ == '__main__':
  if os.environ.get(_CHILD_ENV):
    _Child(os.environ[_CHILD_ENV])
  else:
    tf.test.main()
