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
_HEAVY_LAYERS, _HEAVY_DIM = 4, 512
_GROUPS = ('recompute', 'stash', 'heavy')


def _FcParams(num_layers, dim):
  from tensorpipe.layers import linear  # pylint: disable=g-import-not-at-top
  return [linear.FCLayer.Params().Set(name=f'fc{i}', input_dim=dim,
                                      output_dim=dim)
          for i in range(num_layers)]


def _ActivationPeak(recompute, kk=_K, tt=_T, schedule='gpipe',
                    num_layers=_NUM_LAYERS, dim=_DIM, batch=_BATCH):
  """Allocator peak during one train step minus the bytes held before it."""
  import tensorpipe  # pylint: disable=g-import-not-at-top
  layer = tensorpipe.TensorPipeLayer.Params().Set(
      name='pipe', num_partitions=kk, num_micro_batches=tt,
      recompute=recompute, schedule=schedule,
      input_shapes=[[batch, dim]],
      layers=_FcParams(num_layers, dim)).Instantiate()
  variables = layer.trainable_variables

  @tf.function
  def Step(x):
    if schedule != 'gpipe':  # the loss inside the pipeline
      grads = tf.nest.flatten(layer.FPropLossAndGrads(
          layer.theta, (x,), None,
          lambda y, unused_targets: tf.reduce_sum(tf.square(y)),
          float(batch * dim)).grads)
      return [v.assign_sub(0.01 * g)
              for v, g in zip(tf.nest.flatten(layer.theta), grads)]
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(layer.FPropDefaultTheta(x)))
    grads = tape.gradient(loss, variables)
    return [v.assign_sub(0.01 * g) for v, g in zip(variables, grads)]
  x = tf.random.stateless_normal([batch, dim], [1, 2])
  Step(x)  # trace and warm up
  before = tf.config.experimental.get_memory_info('CPU:0')['current']
  tf.config.experimental.reset_memory_stats('CPU:0')
  Step(x)
  return tf.config.experimental.get_memory_info('CPU:0')['peak'] - before


def _Child(group, out_path):
  """Measures one group of settings (a process each: a setting built after
  another in one process can read another peak, tools/benchmark_lib/
  memory_check.Run)."""
  import tensorpipe  # pylint: disable=g-import-not-at-top
  tensorpipe.SetNumLogicalCpuDevices(_K)
  if group == 'recompute':
    peaks = {str(rc): _ActivationPeak(rc) for rc in (True, False)}
  elif group == 'stash':
    # One device (one allocator peak per device), T=4, recompute.
    peaks = {name: _ActivationPeak(True, 1, 4, name)
             for name in ('1f1b', 'zb_h1')}
  else:
    # Weight-heavy: 4 FC layers 512 -> 512 (4 MiB of weights) on 64
    # examples, 1F1B, K=1, T=4; and the memory model's peak for it.
    from tensorpipe import model_analysis, schedule_builders, schedule_plan  # pylint: disable=g-import-not-at-top
    report = model_analysis.AnalyzeLayers(
        _FcParams(_HEAVY_LAYERS, _HEAVY_DIM), [[64, _HEAVY_DIM]],
        num_partitions=1, num_micro_batches=4, exact_optimizer_state=False)
    peaks = {
        'heavy': _ActivationPeak(True, 1, 4, '1f1b', _HEAVY_LAYERS,
                                 _HEAVY_DIM, 64),
        'heavy predicted': schedule_plan.TableMemory(
            report, schedule_builders.Build('1f1b', 1, 4, 1),
            [(0, _HEAVY_LAYERS)], True)[0][0]}
  with open(out_path, 'w') as f:
    json.dump(peaks, f)


class RecomputeMemoryTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path),
               TF_CPU_ALLOCATOR_USE_BFC='true', TF_CPP_MIN_LOG_LEVEL='2')
    children = {}
    for group in _GROUPS:
      out_path = os.path.join(tf.compat.v1.test.get_temp_dir(),
                              f'peaks_{group}.json')
      children[group] = (out_path, subprocess.Popen(
          [sys.executable, os.path.abspath(__file__)],
          env=dict(env, **{_CHILD_ENV: f'{group}:{out_path}'}),
          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    cls.peaks = {}
    for group, (out_path, proc) in children.items():
      try:
        _, err = proc.communicate(timeout=300)
      except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f'the {group} child ran past 300 s') from None
      if proc.returncode:
        raise AssertionError(f'the {group} child failed:\n{err[-3000:]}')
      with open(out_path) as f:
        cls.peaks.update(json.load(f))

  def testRecomputeLowersTheActivationPeak(self):
    peaks = self.peaks
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

  def testAStashEntryIsFreedAtItsWeightCell(self):
    # ZB-H1 at K=1, T=4, recompute: each micro-batch's I cell stashes its
    # 16 weight ops' inputs x and output gradients dz (2 x 16 x 64 KiB)
    # for its W cell, which follows it. Its peak is 1F1B's with its B cell
    # split, plus the dz of one micro-batch: 1 MiB above 1F1B's here
    # (0.4-1.0 measured). An entry left in its TensorArray after its W
    # cell lived until the next I cell's outputs replaced it, so two
    # micro-batches' stashes were held: 2.6-3.1 MiB above.
    stash = 2 * _NUM_LAYERS * (_BATCH // 4) * _DIM * 4
    self.assertGreater(self.peaks['1f1b'], stash / 2, self.peaks)
    self.assertLess(self.peaks['zb_h1'] - self.peaks['1f1b'], stash,
                    self.peaks)

  def testABackwardCellHoldsItsGradientSumsTwice(self):
    # A B cell is a function of its own: its running sums come in, the new
    # ones are made beside them (added after the cell instead, its weight
    # gradients all leave it together: the same), so a weight-heavy stage
    # holds its weights' bytes twice, and the memory model counts it
    # (schedule_plan: B cells). Inline cells held them once.
    weights = _HEAVY_LAYERS * (_HEAVY_DIM + 1) * _HEAVY_DIM * 4
    peak, predicted = self.peaks['heavy'], self.peaks['heavy predicted']
    self.assertGreater(peak, 1.75 * weights, self.peaks)
    # The model adds a cell's largest layer input, output and weight
    # (1 MiB) on top: measured 0.88-0.99 of it.
    self.assertBetween(peak / predicted, 0.8, 1.1,
                       msg=f'{self.peaks} (0.8 to 1.1 of the model)')

if __name__ == '__main__':
  if os.environ.get(_CHILD_ENV):
    _Child(*os.environ[_CHILD_ENV].split(':', 1))
  else:
    tf.test.main()
